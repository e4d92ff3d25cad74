"""Challenge sets drawn like client jobs: private prompts (no passage of the public corpus),
shapes that vary from job to job, and the members' check of a proposed set."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
from eth_utils import to_checksum_address

from market.model.corpus import CORPUS
from verifier.challenges import (
    ChallengeSet,
    ChallengeSetInvalid,
    check_challenge_set,
    draw_challenge_set,
)

MODEL = b"\x11" * 32
MINERS = [to_checksum_address(f"0x{i:040x}") for i in range(1, 41)]


def draw(epoch: int = 1, seed: int = 7) -> ChallengeSet:
    return draw_challenge_set(epoch, MODEL, "tiny", MINERS, requests=16, max_tokens=64,
                              rng=random.Random(seed))


def text_of(line: dict) -> str:
    body = line["body"]
    return body["prompt"] if "prompt" in body else body["messages"][-1]["content"]


def test_prompts_are_private_and_distinct() -> None:
    cs = draw()
    squeezed = "".join(CORPUS.split())
    texts = [text_of(line) for c in cs.challenges for line in c.lines]
    assert len(set(texts)) == len(texts)
    # No prompt is a passage of the public corpus a miner could look up.
    assert not any("".join(t.split()).rstrip(".?!") in squeezed for t in texts)
    assert draw().digest() == cs.digest() and draw(seed=8).digest() != cs.digest()


def test_shapes_vary_like_client_jobs() -> None:
    cs = draw()
    sizes = {len(c.lines) for c in cs.challenges}
    assert min(sizes) >= 16 and max(sizes) <= 24 and len(sizes) > 3
    urls = Counter(c.lines[0]["url"] for c in cs.challenges)
    assert set(urls) == {"/v1/completions", "/v1/chat/completions"}
    for c in cs.challenges:  # one endpoint and one max_tokens per job, as clients write them
        assert len({line["url"] for line in c.lines}) == 1
        assert len({line["body"]["max_tokens"] for line in c.lines}) == 1
    temps = Counter(line["body"]["temperature"] for c in cs.challenges for line in c.lines)
    assert temps[0.0] > 0 and len(temps) >= 4
    profiles = Counter(
        "greedy" if all(line["body"]["temperature"] == 0 for line in c.lines) else
        "sampled" if all(line["body"]["temperature"] > 0 for line in c.lines) else "mixed"
        for c in cs.challenges)
    assert profiles["mixed"] > profiles["sampled"] > 0 and profiles["greedy"] > 0
    ids = {c.lines[0]["custom_id"].rstrip("0123456789") for c in cs.challenges}
    assert len(ids) > 2  # several custom_id styles, not always request-i
    assert any(line["body"].get("top_p", 1.0) < 1.0 for c in cs.challenges for line in c.lines)


def test_members_check_the_proposed_set() -> None:
    cs = draw()
    check_challenge_set(cs, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                        max_tokens=64)
    with pytest.raises(ChallengeSetInvalid, match="epoch 1, expected 2"):
        check_challenge_set(cs, epoch=2, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    with pytest.raises(ChallengeSetInvalid, match="max_tokens .* is over 32"):
        check_challenge_set(cs, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=32)
    short = dataclasses.replace(cs.challenges[0], lines=cs.challenges[0].lines[:3])
    bad = dataclasses.replace(cs, challenges=(short, *cs.challenges[1:]))
    with pytest.raises(ChallengeSetInvalid, match="has 3 requests, expected 16 to 24"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    twice = dataclasses.replace(cs.challenges[1], lines=cs.challenges[0].lines)
    bad = dataclasses.replace(cs, challenges=(cs.challenges[0], twice, *cs.challenges[2:]))
    with pytest.raises(ChallengeSetInvalid, match="given twice"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    assert ChallengeSet.from_json(cs.to_json()) == cs
