"""The sampled test's support alternatives (`verifier.scoring.SUPPORT_TEST`) against the
cheats they aim at, on the trained test model (`testmodels/quarry-pydoc`, 2.4 nats of
entropy: the tiny model's peaked distributions leave these cheats nothing to cut).

Real forward passes: honest sampled answers, and the same requests answered by
`miner.cheats`' `likely-end-*` and `top-k-*` modes, are judged by `score_outputs` and
`judge` as a committee judges a challenge set.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from conftest import TRAINED_MODEL, TRAINED_PROMPTS

from market.engine.base import GenerationRequest

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(600)]

TRAINED, PROMPTS = TRAINED_MODEL, TRAINED_PROMPTS


@pytest.fixture(scope="module")
def engine(trained_engine: Any) -> Any:
    return trained_engine


def _requests(engine: Any, epoch: int) -> list[GenerationRequest]:
    """A challenge-sized set: the prompts twice, sampled at 1.0 and 0.8 (top_p 1 and 0.95),
    48 tokens, seeds of the epoch's own."""
    return [GenerationRequest(engine.encode_prompt(p), 48, temperature=(1.0, 0.8)[k],
                              top_p=(1.0, 0.95)[k], seed=1000 * epoch + 31 * k + i)
            for k in range(2) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def requests(engine: Any) -> list[GenerationRequest]:
    return _requests(engine, 0)


def _support_evidence(engine: Any, reqs: list[GenerationRequest], outs: list[Any],
                      prior: tuple[float, ...] = ()) -> tuple[Any, dict[str, float]]:
    """The set's verdict (after `prior`, the committee's carried evidence), and its own
    log evidence for each support alternative."""
    from verifier.scoring import (
        EXPONENTS,
        GREEDY_EXPONENTS,
        SUPPORT_TEST,
        judge,
        score_outputs,
    )

    verdict = judge(score_outputs(engine, reqs, [o.token_ids for o in outs],
                                  [o.finish_reason for o in outs]), prior=prior)
    start = len(GREEDY_EXPONENTS) + len(EXPONENTS)
    names = [f"stop c={c}" for c, _ in SUPPORT_TEST.stops] + [
        f"top-{k}" for k, _ in SUPPORT_TEST.top_ks]
    own = verdict.own[start: start + SUPPORT_TEST.width]
    return verdict, dict(zip(names, own, strict=True))


def test_honest_sampling_passes_and_gains_nothing_from_the_support_alternatives(
        engine: Any, requests: list[GenerationRequest]) -> None:
    verdict, own = _support_evidence(engine, requests, engine.generate(requests))
    print(own)
    assert verdict.passed, verdict.reason
    assert verdict.kind_log_evidence[1] < 0.5 * verdict.threshold
    assert max(own.values()) < 0.5 * verdict.threshold


@pytest.mark.parametrize(("mode", "aimed", "epochs"), [("likely-end-0.03", "stop c=0.03", 2),
                                                       ("top-k-5", "top-5", 1)])
def test_a_support_cheat_fails_within_two_challenge_sets(
        engine: Any, mode: str, aimed: str, epochs: int, tmp_path: Path) -> None:
    """Sampling from the 5 likeliest tokens fails one 24-output sampled set; ending wherever
    an end had 3% chance fails the second, its evidence carried from the first as the
    committee carries it (`Judgement.carry`): each through the alternative aimed at it,
    while honest answers to the same sets pass."""
    from market.engine.torch_engine import TorchEngine
    from miner.cheats import cheating_engine

    cheat = cheating_engine(mode, TorchEngine(TRAINED, max_batch_size=24), TRAINED,
                            cache_dir=tmp_path)
    carried: tuple[float, ...] = ()
    honest_carried: tuple[float, ...] = ()
    try:
        for epoch in range(epochs):
            reqs = _requests(engine, epoch)
            outs = cheat.generate(reqs)
            verdict, own = _support_evidence(engine, reqs, outs, carried)
            print(mode, epoch, verdict.reason, own)
            assert own[aimed] == max(own.values()) and own[aimed] > 0
            carried = verdict.carry
            honest, _ = _support_evidence(engine, reqs, engine.generate(reqs), honest_carried)
            assert honest.passed, honest.reason
            honest_carried = honest.carry
    finally:
        cheat.close()
    assert not verdict.passed and "sampled tokens" in verdict.reason
    if mode.startswith("likely-end"):  # what it saves
        assert sum(len(o.token_ids) for o in outs) < sum(
            len(o.token_ids) for o in engine.generate(reqs))
    assert all(math.isfinite(v) for v in own.values())
