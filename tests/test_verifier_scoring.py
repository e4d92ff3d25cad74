"""The statistical check with real forward passes on the tiny model: honest outputs pass
(greedy in every precision, sampled with evidence far under the threshold), every cheat
fails (random tokens, a cheaper model, greedy answers to sampled requests, a colder
temperature, truncation, a finish_reason that lies), the sampled evidence is an exact
martingale and the greedy evidence a supermartingale under its bound, the numbers are
deterministic, impossible outputs fail without a crash, and bad input is refused by name."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TRAINED_MODEL, TRAINED_PROMPTS

from market.engine.base import GenerationRequest
from market.engine.sampling import (
    GreedyTest,
    edge_distances,
    forgiven_gaps,
    greedy_ratios,
    likelihood_ratios,
    nucleus_probs,
)
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.model.tokenizer import EOS_ID
from market.protocol.commitments import checked_chunks
from verifier.error_models import CALIBRATED, DRIFT
from verifier.scoring import (
    COMMIT_ALTERNATIVES,
    EDGE_ALTERNATIVES,
    EDGE_FALSE_RATE,
    EVIDENCE_WIDTH,
    EXPONENTS,
    GREEDY_EXPONENTS,
    SAMPLED_WIDTH,
    SUPPORT_TEST,
    ChallengeScore,
    ScoringError,
    error_model,
    judge,
    score_outputs,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "Tell me about the ocean.",
    "Write a short story about tea.",
    "What is the capital of France?",
    "Describe music in one sentence.",
    "Why is the sky blue?",
    "The library was quiet.",
    "Once upon a time",
    "The weather today",
]
MAX_TOKENS = 32
THRESHOLD = math.log(1e6)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scoring")
    dirs = {"tiny": root / "tiny", "other-seed": root / "other", "two-layers": root / "small"}
    create_model(dirs["tiny"])
    create_model(dirs["other-seed"], seed=1)
    create_model(dirs["two-layers"], layers=2)
    return dirs


@pytest.fixture(scope="module")
def engine(models: dict[str, Path]) -> TorchEngine:
    return TorchEngine(models["tiny"])


def requests(engine: TorchEngine, temperature: float, top_p: float = 1.0) -> list:
    return [GenerationRequest(engine.encode_prompt(p), MAX_TOKENS, temperature=temperature,
                              top_p=top_p, seed=1000 + i) for i, p in enumerate(PROMPTS)]


def ids(outputs: list) -> list[tuple[int, ...]]:
    return [o.token_ids for o in outputs]


def finish(outputs: list) -> list[str]:
    return [o.finish_reason for o in outputs]


def test_the_ratios_are_an_exact_martingale() -> None:
    """Under honest sampling each exponent's factor has expectation exactly 1, nucleus or
    not: sum_v q(v) * exp(ratio(v)) == 1 over the whole vocabulary."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, generator=gen) * 4
    vocab = torch.arange(64)
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5)):
        ratios = likelihood_ratios(logits.repeat(64, 1), vocab, temperature, top_p, EXPONENTS)
        q = nucleus_probs(logits, temperature, top_p)
        assert torch.allclose((q[:, None] * ratios.exp()).sum(0),
                              torch.ones(len(EXPONENTS), dtype=torch.float64))
        assert torch.isfinite(ratios).all()  # outside the nucleus: finite, not -inf/inf


def test_the_support_alternatives_are_an_exact_martingale_and_catch_their_cheats() -> None:
    """The stop and top-k alternatives (SUPPORT_TEST) have expectation exactly 1 under
    honest sampling at every stop mass, nucleus or not; an end chosen where it was likely
    and a token of the head weigh more than 1, a continuation there and a tail token less."""
    from market.engine.base import SupportTest

    gen = torch.Generator().manual_seed(5)
    vocab = torch.arange(64)
    stop_ids = {0, 7}
    width = SAMPLED_WIDTH
    for shift in (-6.0, 0.0, 2.0, 4.0):  # stop mass from ~0 to most of the distribution
        logits = torch.randn(64, generator=gen) * 3
        logits[[0, 7]] += shift
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5)):
            ratios = likelihood_ratios(logits.repeat(64, 1), vocab, temperature, top_p,
                                       EXPONENTS, SUPPORT_TEST, stop_ids)
            assert ratios.shape == (64, width) and torch.isfinite(ratios).all()
            q = nucleus_probs(logits, temperature, top_p)
            assert torch.allclose((q[:, None] * ratios.exp()).sum(0),
                                  torch.ones(width, dtype=torch.float64))
    # One stop alternative at c = 0.1: an end where the stop mass is 0.2 weighs
    # 0.2 + 0.8 / 0.2 = 4.2; a continuation there 0.2; under c, 1.
    test = SupportTest(stops=((0.1, 0.8),))
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.05, 0.5, 0.45]]))
    got = likelihood_ratios(logits, torch.tensor([0, 1]), 1.0, 1.0, (1.0,), test, {0})
    assert torch.allclose(got[:, 1].exp(), torch.tensor([4.2, 1.0], dtype=torch.float64))
    got = likelihood_ratios(logits[:1], torch.tensor([1]), 1.0, 1.0, (1.0,), test, {0})
    assert math.isclose(got[0, 1].exp().item(), 0.2)
    # Top-2 at lam 0.5: the head (mass 0.8) weighs 0.5 + 0.5 / 0.8, the tail 0.5.
    test = SupportTest(top_ks=((2, 0.5),))
    got = likelihood_ratios(logits[:1].repeat(3, 1), torch.tensor([0, 1, 2]), 1.0, 1.0, (1.0,),
                            test)
    assert torch.allclose(got[:, 1].exp(), torch.tensor([0.5, 1.125, 1.125],
                                                        dtype=torch.float64))


def test_the_greedy_ratios_are_a_supermartingale_under_the_bound() -> None:
    """Under the bound p = softmax(-g'/beta) each alternative's factor has expectation
    exactly 1; moving honest mass from other tokens onto the argmax or its ties (what
    honest rounding does) only lowers it; tokens within rounding of the argmax tie."""
    gen = torch.Generator().manual_seed(4)
    test = GreedyTest(0.05, (7, 23), GREEDY_EXPONENTS)
    for _ in range(5):
        logits = (torch.randn(48, generator=gen) * 3).to(torch.bfloat16).float()
        logits[7] = logits.max() - 0.01  # within bf16 rounding of the argmax: a tie
        vocab = torch.arange(48)
        ratios = greedy_ratios(logits.repeat(48, 1), vocab, test).exp()
        gaps = forgiven_gaps(logits[None], test)[0]
        p = torch.softmax(-gaps / test.beta, -1)
        assert torch.allclose((p[:, None] * ratios).sum(0),
                              torch.ones(len(GREEDY_EXPONENTS), dtype=torch.float64))
        tied = gaps == 0
        assert tied[7] and torch.allclose(ratios[7], ratios[int(logits.argmax())])
        honest = torch.where(tied, p * 3, p * 0.5)
        honest[tied] += 1 - honest.sum()
        assert ((honest[:, None] * ratios).sum(0) <= 1 + 1e-12).all()
        assert (ratios[~tied] >= ratios[tied][0]).all()  # leaving the ties costs evidence


def test_honest_greedy_passes_in_every_precision(engine: TorchEngine,
                                                 models: dict[str, Path]) -> None:
    reqs = requests(engine, 0.0)
    honest = engine.generate(reqs)
    scores = score_outputs(engine, reqs, ids(honest), finish(honest))
    assert all(s.greedy and s.possible and s.mismatches() == 0 for s in scores)
    assert all(s.log_ratios == () and len(s.greedy_log_ratios) == len(GREEDY_EXPONENTS)
               and s.log_evidence <= 0.0 for s in scores)
    verdict = judge(scores)
    assert verdict.passed and verdict.score_bps == 10_000
    assert verdict.greedy_tokens == sum(len(o.token_ids) for o in honest)
    for precision in ("bf16", "fp16", "int8", "fp8"):
        miner = TorchEngine(models["tiny"], precision=precision)
        outs = miner.generate(reqs)
        verdict = judge(score_outputs(engine, reqs, ids(outs), finish(outs),
                                      precision=precision,
                                      commitments=[o.commitment for o in outs]))
        assert verdict.passed and verdict.log_evidence < THRESHOLD / 2, (precision, verdict)


def test_drift_counts_chunks_of_real_commitments(engine: TorchEngine,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A calibrated drift counts a bf16 miner's passing chunks above it (real forward
    passes); a pair without one checks none."""
    reqs = requests(engine, 0.0)
    outs = TorchEngine(engine.model_dir, precision="bf16").generate(reqs)

    def scored() -> list[ChallengeScore]:
        return score_outputs(engine, reqs, ids(outs), finish(outs), precision="bf16",
                             commitments=[o.commitment for o in outs])

    plain = scored()
    assert all(s.chunks and s.drift_chunks == 0 for s in plain)
    key = "0x" + engine.manifest.model_id.hex()
    monkeypatch.setitem(DRIFT, key, {"bf16/fp32": 0.0})  # every inexact chunk drifts
    strict = scored()
    passing = sum(s.chunks - s.failed_chunks for s in strict)
    assert sum(s.drift_chunks for s in strict) == passing
    assert 0 < sum(s.drifted_chunks for s in strict) <= passing
    assert judge(strict).kind_log_evidence[2] > judge(plain).kind_log_evidence[2]
    monkeypatch.setitem(DRIFT, key, {"bf16/fp32": 100.0})
    assert all(s.drifted_chunks == 0 and s.drift_chunks == s.chunks - s.failed_chunks
               for s in scored())


def test_int8_weights_drift_under_an_fp16_declaration(trained_engine: TorchEngine) -> None:
    """On the trained model int8 weights' chunks fit inside fp16's tolerance but lie above
    its drift line, where an honest fp16 miner's stay under it (real forward passes): the
    commitments alone fail the int8 miner's outputs."""
    reqs = [GenerationRequest(trained_engine.encode_prompt(p), 64) for p in TRAINED_PROMPTS]
    found = {}
    for precision in ("fp16", "int8"):
        miner = TorchEngine(TRAINED_MODEL, precision=precision)
        outs = miner.generate(reqs)
        miner.close()
        found[precision] = score_outputs(trained_engine, reqs, ids(outs), finish(outs),
                                         precision="fp16",
                                         commitments=[o.commitment for o in outs])
    honest, int8 = found["fp16"], found["int8"]
    assert sum(s.failed_chunks for s in honest + int8) == 0  # the tolerance sees neither
    checked = sum(s.drift_chunks for s in int8)
    assert checked >= len(reqs) and sum(s.drifted_chunks for s in int8) > 0.9 * checked
    assert sum(s.drifted_chunks for s in honest) <= 1
    commitments_only = [replace(s, greedy_log_ratios=(0.0,) * len(GREEDY_EXPONENTS))
                        for s in int8]
    verdict = judge(commitments_only)
    assert not verdict.passed and "activation commitments" in verdict.reason
    assert judge(honest).passed


def test_a_short_last_chunk_is_counted_but_never_tested(engine: TorchEngine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An output one token past a full chunk ends in a one-position chunk, whose points
    include ordinary activations (hidden size 128): it counts as a chunk but is never failed,
    however strict the tolerance (real forward passes)."""
    assert checked_chunks(33, 128) == [True, False] and checked_chunks(40, 128) == [True, True]
    assert checked_chunks(1, 1024) == [True]
    reqs = [replace(r, max_tokens=33) for r in requests(engine, 0.0)]
    outs = TorchEngine(engine.model_dir, precision="bf16").generate(reqs)
    long = [i for i, o in enumerate(outs) if len(o.token_ids) == 33]  # not stopped early
    assert len(long) >= 2
    reqs, outs = [reqs[i] for i in long], [outs[i] for i in long]
    key = "0x" + engine.manifest.model_id.hex()
    monkeypatch.setitem(CALIBRATED, key, {"bf16/fp32": (0.2, (0, 0.0, 0.0))})  # exact only
    scores = score_outputs(engine, reqs, ids(outs), finish(outs), precision="bf16",
                           commitments=[o.commitment for o in outs])
    assert all(s.possible and s.chunks == 2 and s.failed_chunks <= 1 for s in scores)
    assert sum(s.failed_chunks for s in scores) > 0  # the full ones are tested


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9), (0.5, 1.0)])
def test_honest_sampled_passes_and_cheap_sampling_fails(engine: TorchEngine,
                                                        temperature: float,
                                                        top_p: float) -> None:
    reqs = requests(engine, temperature, top_p)
    honest = engine.generate(reqs)
    assert ids(honest) != ids(engine.generate(requests(engine, 0.0)))  # really sampled
    scores = score_outputs(engine, reqs, ids(honest), finish(honest))
    assert all(not s.greedy and len(s.log_ratios) == SAMPLED_WIDTH for s in scores)
    verdict = judge(scores)
    assert verdict.passed and verdict.log_evidence < THRESHOLD / 2, verdict
    # The same requests answered greedily: far MORE likely than honest sampling, and failed.
    greedy = engine.generate([replace(r, temperature=0.0) for r in reqs])
    lazy = judge(score_outputs(engine, reqs, ids(greedy), finish(greedy)))
    assert not lazy.passed and lazy.log_evidence > THRESHOLD, lazy
    assert "sampled tokens are not what honest sampling" in lazy.reason


def test_a_colder_temperature_fails(engine: TorchEngine) -> None:
    reqs = requests(engine, 1.0) * 2
    reqs = [replace(r, seed=r.seed + 100 * (i >= len(PROMPTS))) for i, r in enumerate(reqs)]
    cold = engine.generate([replace(r, temperature=0.5) for r in reqs])
    verdict = judge(score_outputs(engine, reqs, ids(cold), finish(cold)))
    assert not verdict.passed and verdict.log_evidence > THRESHOLD


def test_random_tokens_and_cheaper_models_fail(engine: TorchEngine,
                                               models: dict[str, Path]) -> None:
    rng = random.Random(5)
    for temperature in (0.0, 1.0):
        reqs = requests(engine, temperature)
        junk = [[rng.randrange(8, engine.vocab_size) for _ in range(MAX_TOKENS)] for _ in reqs]
        assert not judge(score_outputs(engine, reqs, junk)).passed
        for cheap in ("two-layers", "other-seed"):
            outs = TorchEngine(models[cheap]).generate(reqs)
            verdict = judge(score_outputs(engine, reqs, ids(outs), finish(outs)))
            assert not verdict.passed, (cheap, temperature, verdict)
            if temperature == 0.0:
                assert verdict.mismatches > 0


def test_truncation_and_lying_finish_reasons_fail(engine: TorchEngine) -> None:
    for temperature in (0.0, 1.0):
        reqs = requests(engine, temperature)
        outs = engine.generate([replace(r, max_tokens=MAX_TOKENS // 2) for r in reqs])
        cut = [(*o.token_ids, EOS_ID) if o.finish_reason == "length" else o.token_ids
               for o in outs]
        verdict = judge(score_outputs(engine, reqs, cut, ["stop"] * len(cut)))
        assert not verdict.passed, verdict
    reqs = requests(engine, 0.0)[:1]
    honest = engine.generate(reqs)[0]
    assert honest.finish_reason == "length"  # the tiny model rarely stops early
    (lie,) = score_outputs(engine, reqs, [honest.token_ids], ["stop"])
    assert lie.problem == "finish_reason 'stop' but the output does not end with a stop token"
    (odd,) = score_outputs(engine, reqs, [honest.token_ids], ["content_filter"])
    assert "neither 'stop' nor 'length'" in odd.problem
    (ok,) = score_outputs(engine, reqs, [honest.token_ids], ["length"])
    assert ok.possible


def test_deterministic_across_calls_and_engines(engine: TorchEngine,
                                                models: dict[str, Path]) -> None:
    reqs = requests(engine, 1.0)[:4] + requests(engine, 0.0)[4:]
    outputs = ids(engine.generate(reqs))
    first = score_outputs(engine, reqs, outputs)
    assert score_outputs(engine, reqs, outputs) == first
    # Another verifier: its own engine instance, batching differently.
    again = score_outputs(TorchEngine(models["tiny"], max_batch_size=2), reqs, outputs)
    for a, b in zip(first, again, strict=True):
        assert a.log_ratios == pytest.approx(b.log_ratios, rel=1e-4, abs=1e-3)
        assert a.greedy_log_ratios == pytest.approx(b.greedy_log_ratios, rel=1e-4, abs=1e-3)
        assert a.mismatches() == b.mismatches()


def test_empty_and_impossible_outputs(engine: TorchEngine) -> None:
    greedy = requests(engine, 0.0)[0]
    honest = engine.generate([greedy])[0].token_ids
    zero = GenerationRequest(greedy.prompt_ids, 0)
    stopped = (*honest[:3], EOS_ID)  # a legitimate-looking early stop is scored, not refused
    cases = [
        (zero, ()),  # nothing asked, nothing returned: fine
        (greedy, ()),  # nothing returned
        (greedy, honest[:5]),  # cut short without a stop token
        (greedy, (*honest, honest[0])),  # longer than max_tokens
        (greedy, (EOS_ID, *honest[1:])),  # went on after a stop token
        (greedy, (*honest[:-1], engine.vocab_size)),  # outside the vocabulary
        (greedy, stopped),
    ]
    scores = score_outputs(engine, [r for r, _ in cases], [o for _, o in cases])
    assert scores[0].possible and scores[0].tokens == 0 and judge(scores[:1]).passed
    for s in scores[1:6]:
        assert not s.possible and s.log_perplexity == math.inf
        assert ChallengeScore.from_json(s.to_json()) == s
        assert s.to_json()["log_perplexity"] is None
        assert not judge([s]).passed
    assert scores[6].possible and scores[6].tokens == 4
    assert scores[6].mismatches() == 1  # EOS was not the argmax at step 4, by a wide margin
    assert "greedy tokens left the reference's argmax" in judge(scores[6:]).reason


def test_bad_input_is_named(engine: TorchEngine) -> None:
    reqs = requests(engine, 0.0)[:2]
    with pytest.raises(ScoringError, match="2 requests but 1 outputs"):
        score_outputs(engine, reqs, [[5]])
    with pytest.raises(ScoringError, match="output 1: token id '7' is not an integer"):
        score_outputs(engine, reqs, [[5], ["7"]])
    with pytest.raises(ScoringError, match="each output needs one"):
        score_outputs(engine, reqs, [[5], [6]], ["stop"])
    with pytest.raises(ScoringError, match="request 0: expected a GenerationRequest"):
        score_outputs(engine, [{"prompt": "x"}, reqs[1]], [[5], [6]])  # type: ignore[list-item]
    with pytest.raises(ScoringError, match="empty prompt"):
        score_outputs(engine, [GenerationRequest((), 4)], [[5, 5, 5, 5]])
    with pytest.raises(ScoringError, match="engine must be an Engine"):
        score_outputs(object(), reqs, [[5], [6]])  # type: ignore[arg-type]
    with pytest.raises(ScoringError, match="unknown precision 'fp4'"):
        score_outputs(engine, reqs, [[5], [6]], precision="fp4")
    with pytest.raises(ScoringError, match="2 outputs but 1 commitments"):
        score_outputs(engine, reqs, [[5], [6]], commitments=[b""])


def test_json_round_trip_and_judge_rules() -> None:
    honest = ChallengeScore(greedy=False, tokens=7, log_ratios=(-1.0,) * SAMPLED_WIDTH,
                            log_perplexity=1.5)
    assert ChallengeScore.from_json(honest.to_json()) == honest
    with pytest.raises(ScoringError, match="lacks margins"):
        ChallengeScore.from_json({k: v for k, v in honest.to_json().items() if k != "margins"})
    with pytest.raises(ScoringError, match="unknown field"):
        ChallengeScore.from_json({**honest.to_json(), "extra": 1})
    with pytest.raises(ScoringError, match="2 log_ratios"):
        ChallengeScore.from_json({**honest.to_json(), "log_ratios": [1.0, 2.0]})
    with pytest.raises(ScoringError, match="3 failed of 2 chunks"):
        ChallengeScore.from_json({**honest.to_json(), "chunks": 2, "failed_chunks": 3})
    # Evidence pools across outputs: each alone passes, together they fail.
    weak = replace(honest, log_ratios=(0.0,) * (SAMPLED_WIDTH - 1) + (9.0,))
    assert judge([weak]).passed and not judge([weak, weak]).passed
    # Greedy evidence cannot hide in sampled evidence: the kinds are averaged, so a set
    # fails when either kind alone reaches twice the threshold.
    flips = ChallengeScore(greedy=True, tokens=3, margins=(0.5,),
                           greedy_log_ratios=(30.0,) * len(GREEDY_EXPONENTS))
    ties = ChallengeScore(greedy=True, tokens=3, margins=(0.005,),
                          greedy_log_ratios=(0.0,) * len(GREEDY_EXPONENTS))
    assert judge([ties, honest]).passed
    verdict = judge([flips] + [honest] * 50)
    assert not verdict.passed and "greedy tokens left" in verdict.reason
    # Commitment chunks: one failed chunk in many is honest bad luck; most failed is not.
    fine = replace(honest, chunks=8, failed_chunks=1)
    off = replace(honest, chunks=8, failed_chunks=6)
    assert judge([fine]).passed and not judge([off, off]).passed
    assert "activation commitments" in judge([off, off]).reason
    assert len(judge([fine]).own) == EVIDENCE_WIDTH
    assert judge([fine]).kind_log_evidence[2] < judge([off]).kind_log_evidence[2]
    assert judge([replace(honest, chunks=8)]).kind_log_evidence[2] < 0
    # The committee's carry (a CUSUM e-detector): a cheat's small evidence adds up over its
    # epochs, while honest (negative) evidence is floored at 0 and banks nothing.
    first = judge([weak])
    assert first.passed and not judge([weak], prior=first.carry).passed
    calm = judge([honest])
    assert any(x < 0 for x in calm.own) and not any(calm.carry)
    assert judge([weak], prior=calm.carry).log_evidence == first.log_evidence
    with pytest.raises(ScoringError, match="prior has 3 log ratios"):
        judge([honest], prior=(0.0, 0.0, 0.0))
    with pytest.raises(ScoringError, match="no outputs"):
        judge([])
    with pytest.raises(ScoringError, match="false_fault_rate"):
        judge([honest], false_fault_rate=0)
    assert len(COMMIT_ALTERNATIVES) == 3


def test_joined_shards_pool_their_evidence_each_judged_for_commitments_alone() -> None:
    """An epoch's audited shards join its challenge (`judge(joined=...)`): their evidence
    adds up exactly as one set's would, a shard alone passing; each shard is one engine's
    work, so a challenge without commitments beside a shard with them is fine, a shard
    committing only partly is not; and shards alone (no answer) are judged too."""
    honest = ChallengeScore(greedy=False, tokens=7, log_ratios=(-1.0,) * SAMPLED_WIDTH)
    weak = replace(honest, log_ratios=(0.0,) * (SAMPLED_WIDTH - 1) + (9.0,))
    assert judge([weak]).passed
    pooled = judge([weak], joined=[[weak]])
    assert not pooled.passed and pooled.outputs == 2
    assert pooled.own == judge([weak, weak]).own
    committed = replace(weak, chunks=2)
    assert judge([honest], joined=[[replace(honest, chunks=2)] * 2]).passed
    partial = judge([honest], joined=[[honest], [replace(honest, chunks=2), honest]])
    assert "output 1 of joined set 2 carries no activation commitment" in partial.reason
    alone = judge([], joined=[[committed], [weak]], prior=judge([honest]).carry)
    assert not alone.passed and alone.outputs == 2
    with pytest.raises(ScoringError, match="no outputs"):
        judge([], joined=[[]])


def test_drift_separates_a_cheaper_computation_inside_the_tolerance() -> None:
    """Chunks that pass the tolerance but drift: honest bf16's rate (at most 2.6% measured,
    10% allowed) banks nothing; int8 weights' (39% measured) fails a challenge's worth of
    chunks, where the tolerance alone sees nothing (none failed)."""
    base = ChallengeScore(greedy=False, tokens=64, log_ratios=(0.0,) * SAMPLED_WIDTH)
    honest = [replace(base, chunks=2, drift_chunks=2, drifted_chunks=int(i % 17 == 0))
              for i in range(24)]  # 2 of 48 chunks drifted: 4%
    int8 = [replace(base, chunks=2, drift_chunks=2, drifted_chunks=1)
            for _ in range(24)]  # 24 of 48 chunks drifted: 50%
    assert judge(honest).passed and judge(honest).kind_log_evidence[2] < 0
    verdict = judge(int8)
    assert not verdict.passed and "activation commitments" in verdict.reason
    assert verdict.failed_chunks == 0
    # Without a calibrated drift (drift_chunks 0) the same chunks are the tolerance's alone.
    assert judge([replace(s, drift_chunks=0, drifted_chunks=0) for s in int8]).passed
    # JSON: the drift counts round-trip; scores written before them read as 0; bad counts
    # are refused.
    assert ChallengeScore.from_json(int8[0].to_json()) == int8[0]
    old = {k: v for k, v in int8[0].to_json().items() if not k.startswith("drift")}
    assert ChallengeScore.from_json(old) == replace(int8[0], drift_chunks=0, drifted_chunks=0)
    with pytest.raises(ScoringError, match="2 drifted of 1 drift-checked"):
        ChallengeScore.from_json({**int8[0].to_json(), "drift_chunks": 1, "drifted_chunks": 2})


def test_the_edge_factor_has_expectation_at_most_one_at_the_honest_rate() -> None:
    """The nucleus-edge test's factor per checked token, q / eps beyond the edge and
    (1 - q) / (1 - eps) inside, averages exactly 1 at the honest bound eps and less at any
    lower rate (every alternative q is above eps), so its product is a test supermartingale;
    at the alternative's own rate it grows. A set's beyond-edge tokens join the sampled
    kind: a rate near the bound banks nothing, the sampled-noise cheat's (about 1%) fails
    a set."""
    assert all(q > EDGE_FALSE_RATE for q in EDGE_ALTERNATIVES)
    base = ChallengeScore(greedy=False, tokens=1, log_ratios=(0.0,) * SAMPLED_WIDTH,
                          edge_tokens=1)
    hit = [math.exp(x) for x in replace(base, beyond_edge=1).sampled_log_ratios()[-4:]]
    miss = [math.exp(x) for x in base.sampled_log_ratios()[-4:]]
    assert len(EDGE_ALTERNATIVES) == 4
    for h, m, q in zip(hit, miss, EDGE_ALTERNATIVES, strict=True):
        assert EDGE_FALSE_RATE * h + (1 - EDGE_FALSE_RATE) * m == pytest.approx(1, abs=1e-12)
        for rate in (0.0, EDGE_FALSE_RATE / 10, EDGE_FALSE_RATE / 2):
            assert rate * h + (1 - rate) * m < 1
        assert q * h + (1 - q) * m > 1
    outputs = [replace(base, tokens=64, edge_tokens=64, beyond_edge=int(i == 0))
               for i in range(24)]  # 1 of 1,536 tokens beyond: 0.07%, twice eps
    assert judge(outputs).passed and judge(outputs).kind_log_evidence[1] < 0
    cheat = [replace(o, beyond_edge=1) for o in outputs]  # 24 of 1,536: 1.6%
    verdict = judge(cheat)
    assert not verdict.passed and "top_p" in verdict.reason
    assert (verdict.edge_tokens, verdict.beyond_edge) == (1536, 24)
    # JSON: the counts round-trip; scores written before them read as 0; bad counts are
    # refused.
    assert ChallengeScore.from_json(cheat[0].to_json()) == cheat[0]
    old = {k: v for k, v in cheat[0].to_json().items() if "edge" not in k}
    assert ChallengeScore.from_json(old) == replace(cheat[0], edge_tokens=0, beyond_edge=0)
    with pytest.raises(ScoringError, match="2 beyond the edge of 1 edge-checked"):
        ChallengeScore.from_json({**cheat[0].to_json(), "edge_tokens": 1, "beyond_edge": 2})
    # A pair without a calibrated margin (int8 weights, or an uncalibrated model) checks
    # no token.
    assert not error_model("int8", "fp32", bytes(32)).checks_edge
    assert not error_model("bf16", "fp32", None).checks_edge


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_an_edge_distance_is_zero_inside_the_nucleus_and_within_twice_the_logit_error(
        temperature: float) -> None:
    """`edge_distances`: 0 for every token of the nucleus, positive outside it, and for a
    miner whose logits differ by at most delta from the verifier's, every token its nucleus
    holds lies within 2 delta of the verifier's edge (the bound the margin rests on)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(64, 200, generator=gen, dtype=torch.float64) * 2.5
    for top_p in (0.5, 0.9, 0.95):
        inside = nucleus_probs(logits[0], temperature, top_p) > 0
        every = torch.arange(200)
        found = edge_distances(logits[0].expand(200, -1), every, temperature, top_p)
        assert bool((found[inside] == 0).all()) and bool((found[~inside] > 0).all())
        for delta in (0.001, 0.05, 0.3):
            miner = logits + (torch.rand(logits.shape, generator=gen,
                                         dtype=torch.float64) * 2 - 1) * delta
            kept = [(r, t) for r in range(64)
                    for t in (nucleus_probs(miner[r], temperature, top_p) > 0).nonzero()
                    .flatten().tolist()]
            rows = torch.tensor([r for r, _ in kept])
            d = edge_distances(logits[rows], torch.tensor([t for _, t in kept]),
                               temperature, top_p)
            assert float(d.max()) <= 2 * delta + 1e-9
            if delta >= 0.05:
                assert float(d.max()) > 0  # the bound is not empty: the edge does move
