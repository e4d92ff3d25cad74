"""The statistical check with real forward passes on the tiny model: honest outputs pass
(greedy with no mismatch, sampled with evidence far under the threshold), every cheat fails
(random tokens, a cheaper model, greedy answers to sampled requests, a colder temperature,
truncation, a finish_reason that lies), the evidence is an exact martingale, the numbers are
deterministic, impossible outputs fail without a crash, and bad input is refused by name."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from market.engine.base import GenerationRequest
from market.engine.sampling import likelihood_ratios
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.model.tokenizer import EOS_ID
from verifier.scoring import (
    EXPONENTS,
    ChallengeScore,
    ScoringError,
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
        probs = torch.softmax(logits.double() / temperature, -1)
        ordered, order = torch.sort(probs, descending=True, stable=True)
        keep = (torch.cumsum(ordered, 0) - ordered) < top_p
        q = torch.zeros(64, dtype=torch.float64)
        q[order[keep]] = ordered[keep]
        q /= q.sum()
        assert torch.allclose((q[:, None] * ratios.exp()).sum(0),
                              torch.ones(len(EXPONENTS), dtype=torch.float64))
        assert torch.isfinite(ratios).all()  # outside the nucleus: finite, not -inf/inf


def test_honest_greedy_has_no_mismatch(engine: TorchEngine) -> None:
    reqs = requests(engine, 0.0)
    honest = engine.generate(reqs)
    scores = score_outputs(engine, reqs, ids(honest), finish(honest))
    assert all(s.greedy and s.possible and s.mismatches() == 0 for s in scores)
    assert all(s.log_ratios == () and s.log_evidence == 0.0 for s in scores)
    verdict = judge(scores)
    assert verdict.passed and verdict.score_bps == 10_000
    assert verdict.greedy_tokens == sum(len(o.token_ids) for o in honest)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9), (0.5, 1.0)])
def test_honest_sampled_passes_and_cheap_sampling_fails(engine: TorchEngine,
                                                        temperature: float,
                                                        top_p: float) -> None:
    reqs = requests(engine, temperature, top_p)
    honest = engine.generate(reqs)
    assert ids(honest) != ids(engine.generate(requests(engine, 0.0)))  # really sampled
    scores = score_outputs(engine, reqs, ids(honest), finish(honest))
    assert all(not s.greedy and len(s.log_ratios) == len(EXPONENTS) for s in scores)
    verdict = judge(scores)
    assert verdict.passed and verdict.log_evidence < THRESHOLD / 2, verdict
    # The same requests answered greedily: far MORE likely than honest sampling, and failed.
    greedy = engine.generate([replace(r, temperature=0.0) for r in reqs])
    lazy = judge(score_outputs(engine, reqs, ids(greedy), finish(greedy)))
    assert not lazy.passed and lazy.log_evidence > THRESHOLD, lazy
    assert "sampled outputs' evidence" in lazy.reason


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
    assert judge(scores[6:]).reason.startswith("1 of 4 greedy token(s) lost")


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


def test_json_round_trip_and_judge_rules() -> None:
    honest = ChallengeScore(greedy=False, tokens=7, log_ratios=(-1.0,) * len(EXPONENTS),
                            log_perplexity=1.5)
    assert ChallengeScore.from_json(honest.to_json()) == honest
    with pytest.raises(ScoringError, match="lacks margins"):
        ChallengeScore.from_json({k: v for k, v in honest.to_json().items() if k != "margins"})
    with pytest.raises(ScoringError, match="unknown field"):
        ChallengeScore.from_json({**honest.to_json(), "extra": 1})
    with pytest.raises(ScoringError, match="2 log ratios"):
        ChallengeScore.from_json({**honest.to_json(), "log_ratios": [1.0, 2.0]})
    # Evidence pools across outputs: each alone passes, together they fail.
    weak = replace(honest, log_ratios=(0.0,) * (len(EXPONENTS) - 1) + (9.0,))
    assert judge([weak]).passed and not judge([weak, weak]).passed
    # Greedy evidence cannot hide in sampled evidence, nor the other way round.
    near_tie = ChallengeScore(greedy=True, tokens=3, margins=(0.005,))
    clear = ChallengeScore(greedy=True, tokens=3, margins=(0.5,))
    assert judge([near_tie, honest]).passed
    assert not judge([clear] + [honest] * 50).passed
    assert judge([clear], greedy_margin=1.0).passed  # the margin is the operator's
    with pytest.raises(ScoringError, match="no outputs"):
        judge([])
    with pytest.raises(ScoringError, match="false_fault_rate"):
        judge([honest], false_fault_rate=0)
