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
    Terms,
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
    with pytest.raises(ChallengeSetInvalid, match="shaped Terms.requests=3"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    twice = dataclasses.replace(cs.challenges[1], lines=cs.challenges[0].lines)
    bad = dataclasses.replace(cs, challenges=(cs.challenges[0], twice, *cs.challenges[2:]))
    with pytest.raises(ChallengeSetInvalid, match="shaped|given twice"):
        check_challenge_set(bad, epoch=1, model_id=MODEL, eligible=MINERS, requests=16,
                            max_tokens=64)
    assert ChallengeSet.from_json(cs.to_json()) == cs


def client_mix(n: int = 60) -> list[Terms]:
    """Client jobs of many shapes, some with a precision mask or a reputation floor, and a few
    outside what a challenge may copy (too many tokens, too few, paying over twice the ask)."""
    rng = random.Random(3)
    jobs = [Terms(rng.choice((8, 16, 32, 50)), rng.choice((16, 32, 64, 128)),
                  rng.randrange(0, 5000), rng.random() < 0.3,
                  rng.choice((0, 0, 1 << 2, 1 << 3)), rng.choice((0, 0, 6000)))
            for _ in range(n)]
    return jobs + [Terms(400, 512, 0, False), Terms(1, 16, 0, True), Terms(16, 64, 30_000, False)]


def test_shapes_follow_the_client_jobs() -> None:
    """Each challenge copies the terms of a client job drawn uniformly from those within the
    bounds that its miner could claim: the drawn terms' frequencies match that empirical
    distribution (a chi-square test per standing), jobs out of bounds or out of a miner's
    reach never appear, so a miner on probation always gets a task that admits it."""
    jobs = client_mix(400)
    pool = drawable(jobs, requests=16, max_tokens=64)
    assert Terms(400, 512, 0, False) not in pool and Terms(1, 16, 0, True) not in pool
    assert Terms(16, 64, 30_000, False) not in pool
    miners = [to_checksum_address(f"0x{i:040x}") for i in range(1, 6001)]
    probation = set(miners[::3])
    bf16 = set(miners[1::3])  # declared precision 2, trusted at reputation 7000
    # The others: declared precision 3, reputation 5000.

    def claimable(m: str, t: Terms) -> bool:
        if m in probation:
            return t.allow_probation and t.min_reputation_bps == 0 and t.precisions == 0
        return t.min_reputation_bps <= (7000 if m in bf16 else 5000) and \
            t.precisions in (0, 1 << (2 if m in bf16 else 3))

    shapes = draw_shapes(b"\x01" * 32, miners, jobs, probation, requests=16, max_tokens=64,
                         claimable=claimable)
    for group in (probation, bf16, set(miners) - probation - bf16):
        member = next(iter(group))
        own = [j for j in pool if claimable(member, j)]
        assert len(own) >= MIN_JOBS
        want = Counter(own)  # jobs with equal terms are one outcome
        got = Counter(shapes[m] for m in group)
        assert set(got) <= set(want)
        expect = {k: len(group) * w / len(own) for k, w in want.items()}
        chi2 = sum((got[k] - e) ** 2 / e for k, e in expect.items())
        assert chi2 < 2 * len(want) + 30  # df = outcomes - 1; far below for a uniform draw
    assert all(shapes[m].allow_probation for m in probation)
    assert any(shapes[m].precisions for m in bf16) and \
        any(shapes[m].min_reputation_bps for m in bf16)
    # Too few client jobs: the fixed fallback (16 to 24 requests, 32 to 64 tokens, at most
    # 25% over the ask, any precision, no floor, open to probation only for a miner on it).
    few = draw_shapes(b"\x01" * 32, miners[:200], pool[:MIN_JOBS - 1], probation,
                      requests=16, max_tokens=64)
    assert all(16 <= s.requests <= 24 and 32 <= s.max_tokens <= 64 and
               0 <= s.premium_bps <= 2500 and s.allow_probation == (m in probation)
               and s.precisions == s.min_reputation_bps == 0 for m, s in few.items())


def test_shapes_are_deterministic_for_the_members_check() -> None:
    """A set drawn over client jobs is re-derived by every member from its seed, the same
    jobs and the same standings; a set whose terms do not follow (another job list, other
    standings, a changed premium, probation flag, precision mask or floor) is refused."""
    jobs = client_mix(400)

    def claimable(m: str, t: Terms) -> bool:  # even miners declared precision 2, odd 3
        return t.precisions in (0, 1 << (2 + int(m, 16) % 2)) and \
            (m != MINERS[0] or t.allow_probation) and t.min_reputation_bps <= 6000

    standing = dict(on_probation={MINERS[0]}, claimable=claimable)
    cs = draw_challenge_set(1, MODEL, "tiny", MINERS, requests=16, max_tokens=64, jobs=jobs,
                            block=123, rng=random.Random(5), **standing)  # type: ignore[arg-type]
    assert cs.block == 123 and ChallengeSet.from_json(cs.to_json()) == cs
    pool = drawable(jobs, requests=16, max_tokens=64)
    assert all(c.terms in pool and claimable(c.miner, c.terms) for c in cs.challenges)
    assert cs.challenges[0].allow_probation and any(c.precisions for c in cs.challenges)
    again = draw_shapes(cs.seed, MINERS, jobs, {MINERS[0]}, requests=16, max_tokens=64,
                        claimable=claimable)
    assert again == draw_shapes(cs.seed, list(reversed(MINERS)), jobs, {MINERS[0]},
                                requests=16, max_tokens=64, claimable=claimable)
    check = dict(epoch=1, model_id=MODEL, eligible=MINERS, requests=16, max_tokens=64)
    check_challenge_set(cs, **check, jobs=jobs, **standing)  # type: ignore[arg-type]
    with pytest.raises(ChallengeSetInvalid, match="shaped"):  # the fallback is not these
        check_challenge_set(cs, **check, **standing)  # type: ignore[arg-type]
    with pytest.raises(ChallengeSetInvalid, match="shaped"):
        check_challenge_set(cs, **check, jobs=jobs[5:], **standing)  # type: ignore[arg-type]
    with pytest.raises(ChallengeSetInvalid, match="shaped"):  # other standings
        check_challenge_set(cs, **check, jobs=jobs,  # type: ignore[arg-type]
                            on_probation={MINERS[0]})
    c = cs.challenges[3]
    for change in ({"premium_bps": c.premium_bps + 100},
                   {"allow_probation": not c.allow_probation},
                   {"precisions": 0 if c.precisions else 1 << 2},
                   {"min_reputation_bps": c.min_reputation_bps + 1}):
        bent = dataclasses.replace(c, **change)
        bad = dataclasses.replace(cs, challenges=(*cs.challenges[:3], bent,
                                                  *cs.challenges[4:]))
        with pytest.raises(ChallengeSetInvalid, match="shaped"):
            check_challenge_set(bad, **check, jobs=jobs, **standing)  # type: ignore[arg-type]
