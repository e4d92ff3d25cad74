"""The nucleus-edge test (`verifier.scoring`, `verifier.error_models.EDGE`) on real forward
passes of the trained test model (`testmodels/quarry-pydoc`): an honest bf16 miner's
sampled answers under top_p < 1 stay inside the fp32 verifier's edge, while the cheat that
adds logit noise to sampled requests only (`miner.cheats`' `sampled-noise-0.5`, which the
likelihood ratios alone miss for about 10 epochs) puts tokens beyond it and fails a
challenge-sized set by its second epoch, its evidence carried as the committee carries it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TRAINED_MODEL, TRAINED_PROMPTS

from market.engine.base import GenerationRequest

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(600)]

TRAINED, PROMPTS = TRAINED_MODEL, TRAINED_PROMPTS


@pytest.fixture(scope="module")
def verifier(trained_engine: Any) -> Any:
    return trained_engine


def _requests(engine: Any, epoch: int) -> list[GenerationRequest]:
    """A challenge-sized sampled set: the prompts at 1.0 with top_p 0.9 and at 0.8 with
    top_p 0.95, 48 tokens, seeds of the epoch's own."""
    return [GenerationRequest(engine.encode_prompt(p), 48, temperature=(1.0, 0.8)[k],
                              top_p=(0.9, 0.95)[k], seed=1000 * epoch + 31 * k + i)
            for k in range(2) for i, p in enumerate(PROMPTS)]


def _scores(verifier: Any, reqs: list[GenerationRequest], outs: list[Any],
            precision: str) -> list[Any]:
    from verifier.scoring import score_outputs

    return score_outputs(verifier, reqs, [o.token_ids for o in outs],
                         [o.finish_reason for o in outs], precision=precision)


def test_honest_bf16_sampling_stays_inside_the_edge(verifier: Any) -> None:
    from market.engine.torch_engine import TorchEngine
    from verifier.scoring import judge

    miner = TorchEngine(TRAINED, precision="bf16", max_batch_size=24)
    try:
        reqs = _requests(verifier, 0)
        outs = miner.generate(reqs)
    finally:
        miner.close()
    scores = _scores(verifier, reqs, outs, "bf16")
    verdict = judge(scores)
    assert verdict.passed, verdict.reason
    assert verdict.edge_tokens == sum(len(o.token_ids) for o in outs) > 1000
    assert verdict.beyond_edge == 0
    # Declared int8 weights have no calibrated margin: no token is checked.
    assert sum(s.edge_tokens for s in _scores(verifier, reqs, outs, "int8")) == 0


def test_sampled_only_noise_lands_beyond_the_edge_and_fails(verifier: Any,
                                                            tmp_path: Path) -> None:
    from market.engine.torch_engine import TorchEngine
    from miner.cheats import cheating_engine
    from verifier.scoring import EDGE_ALTERNATIVES, GREEDY_EXPONENTS, GRIDS, judge

    cheat = cheating_engine("sampled-noise-0.5",
                            TorchEngine(TRAINED, precision="bf16", max_batch_size=24),
                            TRAINED, cache_dir=tmp_path)
    carried: tuple[float, ...] = ()
    try:
        for epoch in range(2):
            reqs = _requests(verifier, epoch)
            verdict = judge(_scores(verifier, reqs, cheat.generate(reqs), "bf16"),
                            prior=carried)
            print(epoch, verdict.beyond_edge, verdict.edge_tokens, verdict.reason)
            assert verdict.beyond_edge >= 3
            carried = verdict.carry
    finally:
        cheat.close()
    assert not verdict.passed and "sampled tokens" in verdict.reason
    # The edge alternatives carry the evidence: the sampled kind's last ones (`Judgement.own`
    # lays out greedy, sampled with the edge test last, then commitments).
    end = len(GREEDY_EXPONENTS) + GRIDS["sampled"]
    sampled = verdict.pooled[len(GREEDY_EXPONENTS): end]
    assert max(sampled[-len(EDGE_ALTERNATIVES):]) == max(sampled) > verdict.threshold
