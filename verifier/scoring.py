"""PlanetServe's token-level check: how likely is a miner's exact output under the reference model?

For each request the verifier runs one teacher-forced pass over prompt + the miner's token
ids and reads every token's log-probability. Raw perplexity depends on the prompt (an open
question is less predictable than a fact), so it is normalised by the verifier's own
completion(s) of the same request:

- `reference_perplexity`: the reference engine completes the request with its temperature,
  top_p and max_tokens but with seeds DERIVED from the request (`reference_seed`), never the
  request's own seed: on real hardware an honest sample is not bit-identical to a replay, so
  the score must not depend on exact replay. Median over `reference_samples` completions
  (greedy requests: one, since every seed gives the same completion).
- `credibility = min(1, reference_perplexity / miner_perplexity)`, computed in log space so
  a wildly unlikely output (perplexity beyond float range) still scores a clean 0.
- Greedy requests also get `agreement`: the share of miner tokens equal to the reference
  model's argmax at that position (teacher forcing), and `score = min(credibility,
  agreement)`; sampled requests: `score = credibility`.

An output the model cannot have produced scores 0 without a forward pass (`miner_perplexity`
is then infinite): a token id outside the vocabulary, more tokens than max_tokens, a stop
token before the end, or an output that stops short of max_tokens without a stop token
(the engines stop only at a stop token or at max_tokens). An empty output is that last case,
unless max_tokens is 0 (the reference is empty too), which scores 1.

All the work is batched: one `generate` call for every reference completion and one `score`
call for every distinct (prompt, output) pair, so an honest greedy output identical to the
reference is scored once and its credibility is exactly 1. Same model, same inputs -> same
numbers on every verifier.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from market.engine.base import Engine, GenerationRequest, ScoreResult
from market.errors import QuarryError

BPS = 10_000
SEED_DOMAIN = b"quarry-reference-seed-v1\x00"
MAX_LOG_PERPLEXITY = 700.0  # exp(700) ~ 1e304: reported perplexities stay finite floats


class ScoringError(QuarryError):
    """Scoring could not run: bad input, an engine failure, or (remote) no scorer answered."""


@dataclass(frozen=True)
class ChallengeScore:
    """The verdict on one output; `score` is what reputation uses."""

    credibility: float  # min(1, reference_perplexity / miner_perplexity), in [0, 1]
    agreement: float | None  # greedy requests only: share of miner tokens == reference argmax
    score: float  # credibility (sampled); min(credibility, agreement) (greedy)
    miner_perplexity: float  # math.inf when the output is not one the model can produce
    reference_perplexity: float
    tokens: int  # the miner's output length

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (an infinite perplexity is written as null, since JSON has no inf)."""
        return {
            "credibility": self.credibility,
            "agreement": self.agreement,
            "score": self.score,
            "miner_perplexity": (
                self.miner_perplexity if math.isfinite(self.miner_perplexity) else None
            ),
            "reference_perplexity": self.reference_perplexity,
            "tokens": self.tokens,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChallengeScore:
        """The inverse of `to_json`; raises ScoringError naming a missing or bad field."""
        if not isinstance(d, Mapping):
            raise ScoringError(f"a challenge score must be a JSON object, got {type(d).__name__}")
        fields = ("credibility", "agreement", "score", "miner_perplexity",
                  "reference_perplexity", "tokens")
        missing = [f for f in fields if f not in d]
        if missing:
            raise ScoringError(f"challenge score lacks {', '.join(missing)}")
        unknown = sorted(str(k) for k in d if k not in fields)
        if unknown:
            raise ScoringError(f"challenge score has unknown field(s) {', '.join(unknown)}")

        def number(name: str, *, unit: bool = False, nullable: bool = False) -> float | None:
            value = d[name]
            if value is None and nullable:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ScoringError(f"challenge score field {name} must be a number, "
                                   f"got {value!r}")
            value = float(value)
            if math.isnan(value) or (unit and not 0.0 <= value <= 1.0):
                raise ScoringError(f"challenge score field {name} must be in [0, 1], "
                                   f"got {value!r}")
            return value

        tokens = d["tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ScoringError(f"challenge score field tokens must be an integer >= 0, "
                               f"got {tokens!r}")
        miner_ppl = number("miner_perplexity", nullable=True)
        return cls(
            credibility=number("credibility", unit=True),  # type: ignore[arg-type]
            agreement=number("agreement", unit=True, nullable=True),
            score=number("score", unit=True),  # type: ignore[arg-type]
            miner_perplexity=math.inf if miner_ppl is None else miner_ppl,
            reference_perplexity=number("reference_perplexity"),  # type: ignore[arg-type]
            tokens=tokens,
        )


def score_bps(score: float) -> int:
    """`score` in basis points: round(score * 10000) clipped to [0, 10000]."""
    if isinstance(score, bool) or not isinstance(score, int | float) or math.isnan(score):
        raise ScoringError(f"a score must be a number, got {score!r}")
    return min(BPS, max(0, round(float(score) * BPS)))


def mean_score(scores: Sequence[ChallengeScore]) -> float:
    """The epoch score S_t: the mean of the challenges' scores."""
    if not scores:
        raise ScoringError("no challenge scores to average (a miner needs at least one)")
    return math.fsum(s.score for s in scores) / len(scores)


def reference_seed(request: GenerationRequest, sample: int) -> int:
    """The seed of reference completion `sample` of `request`: a hash of the whole request,
    so every verifier derives the same seeds, and none equals the miner's own stream."""
    blob = json.dumps(
        [list(request.prompt_ids), request.max_tokens, repr(float(request.temperature)),
         repr(float(request.top_p)), int(request.seed), sample],
        separators=(",", ":"),
    ).encode()
    return int.from_bytes(hashlib.sha256(SEED_DOMAIN + blob).digest()[:8], "big")


def _log_perplexity(result: ScoreResult) -> float:
    if not result.logprobs:
        return 0.0
    return -math.fsum(result.logprobs) / len(result.logprobs)


def _perplexity(log_ppl: float) -> float:
    return math.exp(min(log_ppl, MAX_LOG_PERPLEXITY))


def _check_inputs(
    engine: Engine,
    requests: Sequence[GenerationRequest],
    output_ids: Sequence[Sequence[int]],
    reference_samples: int,
) -> list[tuple[int, ...]]:
    if not isinstance(engine, Engine):
        raise ScoringError(f"engine must be an Engine, got {type(engine).__name__}")
    if (isinstance(reference_samples, bool) or not isinstance(reference_samples, int)
            or reference_samples < 1):
        raise ScoringError(f"reference_samples must be an integer >= 1, "
                           f"got {reference_samples!r}")
    if isinstance(output_ids, str | bytes) or isinstance(requests, str | bytes):
        raise ScoringError("requests and output_ids must be sequences")
    if len(requests) != len(output_ids):
        raise ScoringError(f"{len(requests)} requests but {len(output_ids)} outputs; "
                           "each request needs exactly one output")
    outputs = []
    for i, (request, ids) in enumerate(zip(requests, output_ids, strict=True)):
        if not isinstance(request, GenerationRequest):
            raise ScoringError(f"request {i}: expected a GenerationRequest, "
                               f"got {type(request).__name__}")
        if isinstance(ids, str | bytes | Mapping) or not isinstance(ids, Sequence):
            raise ScoringError(f"output {i}: token ids must be a list of integers, "
                               f"got {type(ids).__name__}")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int):
                raise ScoringError(f"output {i}: token id {t!r} is not an integer")
        outputs.append(tuple(int(t) for t in ids))
    return outputs


def _impossible(engine: Engine, request: GenerationRequest, output: tuple[int, ...]) -> bool:
    """Whether no honest run of the engine could return `output` for `request`."""
    if len(output) > request.max_tokens:
        return True
    vocab = getattr(engine, "vocab_size", None)
    if isinstance(vocab, int) and any(not 0 <= t < vocab for t in output):
        return True
    if any(t < 0 for t in output):
        return True
    stop_ids = getattr(engine, "stop_token_ids", None)
    if stop_ids is None:  # an engine that does not say how it stops: only emptiness is sure
        return not output and request.max_tokens > 0
    stops = frozenset(stop_ids)
    if any(t in stops for t in output[:-1]):
        return True  # the engine would have stopped at the first stop token
    ended = bool(output) and output[-1] in stops
    # Stopped short of max_tokens without a stop token (an empty output included).
    return len(output) < request.max_tokens and not ended


def score_outputs(
    engine: Engine,
    requests: Sequence[GenerationRequest],
    output_ids: Sequence[Sequence[int]],
    *,
    reference_samples: int = 3,
) -> list[ChallengeScore]:
    """Score each miner output against `engine` (the reference model); see the module doc.

    Raises ScoringError naming the problem for malformed input (counts that do not pair up,
    non-integer ids, a request the engine rejects); an output the model could not have
    produced is not an error, it scores 0.
    """
    outputs = _check_inputs(engine, requests, output_ids, reference_samples)
    requests = list(requests)

    # One generate call: greedy requests once, sampled ones `reference_samples` times.
    ref_requests: list[GenerationRequest] = []
    ref_slices: list[tuple[int, int]] = []
    for request in requests:
        count = 1 if request.greedy else reference_samples
        start = len(ref_requests)
        for k in range(count):
            ref_requests.append(GenerationRequest(
                prompt_ids=request.prompt_ids, max_tokens=request.max_tokens,
                temperature=request.temperature, top_p=request.top_p,
                seed=reference_seed(request, k)))
        ref_slices.append((start, start + count))
    try:
        ref_outputs = engine.generate(ref_requests) if ref_requests else []
    except QuarryError as exc:
        raise ScoringError(f"the reference engine refused a request: {exc}") from exc
    if len(ref_outputs) != len(ref_requests):
        raise ScoringError(f"the reference engine returned {len(ref_outputs)} completions "
                           f"for {len(ref_requests)} requests")

    # One score call over every distinct (prompt, output) pair.
    impossible = [_impossible(engine, r, o) for r, o in zip(requests, outputs, strict=True)]
    pairs: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}

    def slot(prompt: tuple[int, ...], output: tuple[int, ...]) -> int:
        return pairs.setdefault((tuple(prompt), output), len(pairs))

    ref_slots = [slot(r.prompt_ids, tuple(o.token_ids))
                 for r, o in zip(ref_requests, ref_outputs, strict=True)]
    miner_slots = [None if bad else slot(r.prompt_ids, o)
                   for r, o, bad in zip(requests, outputs, impossible, strict=True)]
    keys = list(pairs)
    try:
        results = engine.score([p for p, _ in keys], [o for _, o in keys]) if keys else []
    except QuarryError as exc:
        raise ScoringError(f"the reference engine could not score the outputs: {exc}") from exc
    if len(results) != len(keys):
        raise ScoringError(f"the reference engine returned {len(results)} scores "
                           f"for {len(keys)} sequences")

    scores = []
    for i, request in enumerate(requests):
        start, end = ref_slices[i]
        ref_log = statistics.median(_log_perplexity(results[s]) for s in ref_slots[start:end])
        ref_empty = all(not ref_outputs[k].token_ids for k in range(start, end))
        output = outputs[i]
        miner_slot = miner_slots[i]
        if miner_slot is None:
            scores.append(ChallengeScore(
                credibility=0.0, agreement=0.0 if request.greedy else None, score=0.0,
                miner_perplexity=math.inf, reference_perplexity=_perplexity(ref_log),
                tokens=len(output)))
            continue
        if not output:  # only reachable when max_tokens == 0
            ok = 1.0 if ref_empty else 0.0
            scores.append(ChallengeScore(
                credibility=ok, agreement=ok if request.greedy else None, score=ok,
                miner_perplexity=1.0, reference_perplexity=_perplexity(ref_log), tokens=0))
            continue
        result = results[miner_slot]
        miner_log = _log_perplexity(result)
        credibility = math.exp(min(0.0, ref_log - miner_log))
        agreement: float | None = None
        score = credibility
        if request.greedy:
            if len(result.argmax_ids) != len(output):
                raise ScoringError("the reference engine returned no argmax ids; greedy "
                                   "outputs need them for the agreement check")
            same = sum(a == t for a, t in zip(result.argmax_ids, output, strict=True))
            agreement = same / len(output)
            score = min(credibility, agreement)
        scores.append(ChallengeScore(
            credibility=credibility, agreement=agreement, score=score,
            miner_perplexity=_perplexity(miner_log), reference_perplexity=_perplexity(ref_log),
            tokens=len(output)))
    return scores
