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
    MIN_JOBS,
    ChallengeSet,
    ChallengeSetInvalid,
    ClientJob,
    check_challenge_set,
    draw_challenge_set,
    draw_shapes,
    drawable,
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
    with pytest.raises(ChallengeSetInvalid, match="shaped .* give"):
        check_challenge_set(cs, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=32)
    short = dataclasses.replace(cs.challenges[0], lines=cs.challenges[0].lines[:3])
    bad = dataclasses.replace(cs, challenges=(short, *cs.challenges[1:]))
    with pytest.raises(ChallengeSetInvalid, match="shaped Shape.requests=3"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    twice = dataclasses.replace(cs.challenges[1], lines=cs.challenges[0].lines)
    bad = dataclasses.replace(cs, challenges=(cs.challenges[0], twice, *cs.challenges[2:]))
    with pytest.raises(ChallengeSetInvalid, match="shaped|given twice"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    assert ChallengeSet.from_json(cs.to_json()) == cs


def client_mix(n: int = 60) -> list[ClientJob]:
    """Client jobs of many shapes, a few outside what a challenge may copy (too many tokens,
    too few, or paying more than twice the ask)."""
    rng = random.Random(3)
    jobs = [ClientJob(rng.choice((4, 8, 16, 32, 50)), rng.choice((16, 32, 64, 128, 256)),
                      rng.randrange(0, 5000), rng.random() < 0.2) for _ in range(n)]
    return jobs + [ClientJob(400, 512, 0, False), ClientJob(1, 16, 0, True),
                   ClientJob(16, 64, 30_000, False)]


def test_shapes_follow_the_client_jobs() -> None:
    """Each challenge copies the terms of a client job drawn uniformly from those within the
    bounds: the drawn shapes' frequencies match the empirical distribution (a chi-square
    test), jobs out of bounds never appear, and a miner on probation always gets a task that
    admits it."""
    jobs = client_mix()
    pool = drawable(jobs, requests=16, max_tokens=64)
    assert ClientJob(400, 512, 0, False) not in pool and ClientJob(1, 16, 0, True) not in pool
    assert ClientJob(16, 64, 30_000, False) not in pool and len(pool) >= MIN_JOBS
    miners = [to_checksum_address(f"0x{i:040x}") for i in range(1, 6001)]
    probation = set(miners[::10])
    shapes = draw_shapes(b"\x01" * 32, miners, jobs, probation, requests=16, max_tokens=64)
    # Jobs with equal terms are one outcome.
    want = Counter((j.requests, j.max_tokens, j.premium_bps) for j in pool)
    got = Counter((s.requests, s.max_tokens, s.premium_bps) for s in shapes.values())
    assert set(got) <= set(want)
    chi2 = sum((got[k] - len(miners) * w / len(pool)) ** 2 / (len(miners) * w / len(pool))
               for k, w in want.items())
    assert chi2 < 2 * len(want) + 30  # df = outcomes - 1; far below for a uniform draw
    flag = {(j.requests, j.max_tokens, j.premium_bps): j.allow_probation for j in pool}
    for m, s in shapes.items():
        assert s.allow_probation == (m in probation or flag[s.requests, s.max_tokens,
                                                             s.premium_bps])
    admitted = sum(s.allow_probation for m, s in shapes.items() if m not in probation)
    share = sum(j.allow_probation for j in pool) / len(pool)
    assert abs(admitted / (len(miners) - len(probation)) - share) < 0.03
    # Too few client jobs: the fixed fallback (16 to 24 requests, 32 to 64 tokens, at most
    # 25% over the ask, open to probation only for a miner on probation).
    few = draw_shapes(b"\x01" * 32, miners[:200], pool[:MIN_JOBS - 1], probation,
                      requests=16, max_tokens=64)
    assert all(16 <= s.requests <= 24 and 32 <= s.max_tokens <= 64 and
               0 <= s.premium_bps <= 2500 and s.allow_probation == (m in probation)
               for m, s in few.items())


def test_shapes_are_deterministic_for_the_members_check() -> None:
    """A set drawn over client jobs is re-derived by every member from its seed and the same
    jobs; a set whose shapes do not follow (another job list, a changed premium or probation
    flag) is refused."""
    jobs = client_mix()
    cs = draw_challenge_set(1, MODEL, "tiny", MINERS, requests=16, max_tokens=64, jobs=jobs,
                            on_probation={MINERS[0]}, block=123, rng=random.Random(5))
    assert cs.block == 123 and ChallengeSet.from_json(cs.to_json()) == cs
    pool = {(j.requests, j.max_tokens, j.premium_bps)
            for j in drawable(jobs, requests=16, max_tokens=64)}
    assert all((len(c.lines), c.max_tokens, c.premium_bps) in pool for c in cs.challenges)
    assert cs.challenges[0].allow_probation
    again = draw_shapes(cs.seed, MINERS, jobs, {MINERS[0]}, requests=16, max_tokens=64)
    assert again == draw_shapes(cs.seed, list(reversed(MINERS)), jobs, {MINERS[0]},
                                requests=16, max_tokens=64)
    check = dict(epoch=1, model_id=MODEL, eligible=MINERS, requests=16, max_tokens=64)
    check_challenge_set(cs, **check, jobs=jobs, on_probation={MINERS[0]})
    with pytest.raises(ChallengeSetInvalid, match="shaped"):  # the fallback is not these
        check_challenge_set(cs, **check, on_probation={MINERS[0]})
    with pytest.raises(ChallengeSetInvalid, match="shaped"):
        check_challenge_set(cs, **check, jobs=jobs[5:], on_probation={MINERS[0]})
    for change in ({"premium_bps": cs.challenges[3].premium_bps + 100},
                   {"allow_probation": not cs.challenges[3].allow_probation}):
        bent = dataclasses.replace(cs.challenges[3], **change)
        bad = dataclasses.replace(cs, challenges=(*cs.challenges[:3], bent,
                                                  *cs.challenges[4:]))
        with pytest.raises(ChallengeSetInvalid, match="shaped"):
            check_challenge_set(bad, **check, jobs=jobs, on_probation={MINERS[0]})
