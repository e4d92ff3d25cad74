"""The token-level check with real forward passes on the tiny model: honest outputs score near
1 (greedy exactly), random tokens and a cheaper model's outputs score low, the numbers are
deterministic, impossible outputs score 0, and bad input is refused by name."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from market.engine.base import GenerationRequest
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.model.tokenizer import EOS_ID
from verifier.scoring import (
    ChallengeScore,
    ScoringError,
    mean_score,
    reference_seed,
    score_bps,
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
]
MAX_TOKENS = 16


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


def test_honest_greedy_scores_exactly_one(engine: TorchEngine) -> None:
    reqs = requests(engine, 0.0)
    honest = engine.generate(reqs)
    scores = score_outputs(engine, reqs, ids(honest))
    assert [s.agreement for s in scores] == [1.0] * len(reqs)
    assert [s.score for s in scores] == [1.0] * len(reqs)
    for s, out in zip(scores, honest, strict=True):
        assert s.tokens == len(out.token_ids)
        assert s.miner_perplexity == pytest.approx(s.reference_perplexity)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_honest_sampled_scores_near_one(engine: TorchEngine, temperature: float,
                                        top_p: float) -> None:
    reqs = requests(engine, temperature, top_p)
    honest = engine.generate(reqs)
    greedy = engine.generate(requests(engine, 0.0))
    assert ids(honest) != ids(greedy)  # really sampled
    scores = score_outputs(engine, reqs, ids(honest))
    assert all(s.agreement is None for s in scores)
    assert all(s.score == s.credibility for s in scores)
    assert min(s.score for s in scores) > 0.6
    assert mean_score(scores) > 0.85


def test_random_tokens_score_near_zero(engine: TorchEngine) -> None:
    rng = random.Random(5)
    for temperature in (0.0, 1.0):
        reqs = requests(engine, temperature)
        junk = [[rng.randrange(8, engine.vocab_size) for _ in range(MAX_TOKENS)] for _ in reqs]
        scores = score_outputs(engine, reqs, junk)
        assert max(s.score for s in scores) < 0.01
        assert all(math.isfinite(s.miner_perplexity) for s in scores)


@pytest.mark.parametrize(("cheap", "ceiling"), [("two-layers", 0.35), ("other-seed", 0.01)])
def test_cheaper_model_scores_low(engine: TorchEngine, models: dict[str, Path], cheap: str,
                                  ceiling: float) -> None:
    substitute = TorchEngine(models[cheap])
    for temperature in (0.0, 1.0):
        reqs = requests(engine, temperature)
        scores = score_outputs(engine, reqs, ids(substitute.generate(reqs)))
        assert mean_score(scores) < ceiling
        if temperature == 0.0:
            assert all(s.agreement is not None and s.agreement < 0.8 for s in scores)


def test_deterministic_across_calls_and_engines(engine: TorchEngine,
                                                models: dict[str, Path]) -> None:
    reqs = requests(engine, 1.0)[:3] + requests(engine, 0.0)[3:]
    outputs = ids(engine.generate(reqs))
    first = score_outputs(engine, reqs, outputs)
    assert score_outputs(engine, reqs, outputs) == first
    # Another verifier: its own engine instance, batching differently.
    other = TorchEngine(models["tiny"], max_batch_size=2)
    again = score_outputs(other, reqs, outputs)
    for a, b in zip(first, again, strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-4, abs=1e-6)
        assert a.reference_perplexity == pytest.approx(b.reference_perplexity, rel=1e-4)


def test_reference_seeds_are_derived_not_replayed(engine: TorchEngine) -> None:
    req = requests(engine, 1.0)[0]
    seeds = [reference_seed(req, k) for k in range(3)]
    assert len(set(seeds)) == 3 and req.seed not in seeds
    assert seeds == [reference_seed(req, k) for k in range(3)]
    bumped = GenerationRequest(req.prompt_ids, req.max_tokens, req.temperature, req.top_p,
                               req.seed + 1)
    assert reference_seed(bumped, 0) != seeds[0]
    # More reference samples change only the median, not the honest verdict.
    out = ids(engine.generate([req]))
    one, five = (score_outputs(engine, [req], out, reference_samples=n)[0] for n in (1, 5))
    assert one.miner_perplexity == five.miner_perplexity
    assert five.score > 0.6


def test_empty_and_impossible_outputs(engine: TorchEngine) -> None:
    greedy = requests(engine, 0.0)[0]
    honest = engine.generate([greedy])[0].token_ids
    zero = GenerationRequest(greedy.prompt_ids, 0)
    stopped = (*honest[:3], EOS_ID)  # a legitimate early stop is scored, not refused
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
    assert scores[0].score == 1.0 and scores[0].tokens == 0
    for s in scores[1:6]:
        assert (s.score, s.credibility, s.agreement) == (0.0, 0.0, 0.0)
        assert s.miner_perplexity == math.inf
        assert ChallengeScore.from_json(s.to_json()) == s
        assert s.to_json()["miner_perplexity"] is None
    assert math.isfinite(scores[6].miner_perplexity) and scores[6].tokens == 4
    assert scores[6].agreement == 0.75  # EOS was not the argmax at step 4


def test_bad_input_is_named(engine: TorchEngine) -> None:
    reqs = requests(engine, 0.0)[:2]
    with pytest.raises(ScoringError, match="2 requests but 1 outputs"):
        score_outputs(engine, reqs, [[5]])
    with pytest.raises(ScoringError, match="output 1: token id '7' is not an integer"):
        score_outputs(engine, reqs, [[5], ["7"]])
    with pytest.raises(ScoringError, match="reference_samples must be an integer >= 1"):
        score_outputs(engine, reqs, [[5], [6]], reference_samples=0)
    with pytest.raises(ScoringError, match="request 0: expected a GenerationRequest"):
        score_outputs(engine, [{"prompt": "x"}, reqs[1]], [[5], [6]])  # type: ignore[list-item]
    with pytest.raises(ScoringError, match="empty prompt"):
        score_outputs(engine, [GenerationRequest((), 4)], [[5]])
    with pytest.raises(ScoringError, match="engine must be an Engine"):
        score_outputs(object(), reqs, [[5], [6]])  # type: ignore[arg-type]


def test_json_round_trip_and_helpers() -> None:
    s = ChallengeScore(credibility=0.5, agreement=None, score=0.5, miner_perplexity=3.0,
                       reference_perplexity=1.5, tokens=7)
    assert ChallengeScore.from_json(s.to_json()) == s
    with pytest.raises(ScoringError, match="lacks score"):
        ChallengeScore.from_json({k: v for k, v in s.to_json().items() if k != "score"})
    with pytest.raises(ScoringError, match="credibility must be in"):
        ChallengeScore.from_json({**s.to_json(), "credibility": 1.5})
    with pytest.raises(ScoringError, match="unknown field"):
        ChallengeScore.from_json({**s.to_json(), "extra": 1})
    assert [score_bps(x) for x in (0.0, 0.12345, 0.99996, 1.2, -0.1)] == [0, 1234, 10000,
                                                                        10000, 0]
    with pytest.raises(ScoringError, match="must be a number"):
        score_bps(float("nan"))
    assert mean_score([s, ChallengeScore(1.0, 1.0, 1.0, 1.0, 1.0, 3)]) == 0.75
    with pytest.raises(ScoringError, match="no challenge scores"):
        mean_score([])
