"""The statistical check of a miner's outputs: could honest generation have produced them?

One teacher-forced pass of the reference model over prompt + the miner's exact token ids
(`Engine.evidence`) gives, at every position, the whole next-token distribution. The model
of an honest miner, stated once:

- **Greedy requests** (temperature 0): the token at every position is the reference's
  argmax given the prefix, up to floating-point noise. An honest miner on other hardware
  may pick another token only where the two best are within `greedy_margin` nats of each
  other. So a token that loses to the argmax by more than the margin (a *mismatch*) is
  evidence no honest run gives; honest outputs have none.
- **Sampled requests** (temperature T > 0, top_p p): token t is drawn from q_t, the softmax
  of logits / T cut to the top_p nucleus, exactly as `market.engine.sampling` draws it.
  For any exponent e > 0 let q_t^(e) be proportional to q_t ** e (the same model at
  temperature T / e): e > 1 is *more* likely than honest sampling (greedy answers, a lower
  temperature), e < 1 *less* likely (another model, noise, random tokens). Under honest
  sampling every factor q_t^(e)(y_t) / q_t(y_t) has expectation exactly 1 given the
  prefix, so the product over positions (and over outputs) is a test martingale, and the
  mean over the fixed grid `EXPONENTS` is one too. By Ville's inequality an honest
  miner's evidence E reaches 1 / alpha with probability at most alpha, for any length
  and any number of outputs, without a normal approximation. That is the two-sided test:
  `log_evidence = log mean_e prod_t q_t^(e)(y_t) / q_t(y_t)` against
  `log(1 / FALSE_FAULT_RATE)`. A token outside the nucleus (impossible for honest
  sampling) is judged against the untruncated distribution, so nucleus-edge rounding on
  another accelerator cannot make an infinite ratio.

Greedy and sampled evidence are judged separately (`judge`): an epoch's or a shard's
outputs fail if any is impossible, if any greedy token is a mismatch, or if the sampled
outputs' pooled evidence passes the threshold. Neither can hide in the other, and the
chance that an honest set fails is at most `FALSE_FAULT_RATE` = 1e-6 by the model above.
Because the product is a martingale across sets as well, evidence may be pooled over more
than one set (`judge(prior=...)`): the committee judges each epoch's challenge together
with the same miner's sampled evidence of the previous epoch, so a subtle cheat meets twice
the tokens, while each test is still exact at 1e-6 (an honest miner is falsely flagged in
at most one epoch in a million, in expectation). Only one epoch is carried, so honest
epochs cannot be banked to hide a later cheat.

An output the model cannot have produced fails without a forward pass: a token id outside
the vocabulary, more tokens than max_tokens, a stop token before the end, an output that
stops short of max_tokens without a stop token (the engines stop only at a stop token or
at max_tokens), or a `finish_reason` that does not match the tokens ("stop" needs a final
stop token, "length" needs max_tokens tokens and none). An empty output is the short case,
unless max_tokens is 0, which passes.

Stop strings (`body.stop`) add one more way to end, decided on the decoded ids by the rule
the engines use (`market.engine.base.text_for`): generation ends at the first token after
which the decoded output contains a stop string; every id up to that token is kept and the
text is cut before the stop string. So with the reference tokenizer a verifier checks that
the ids without their last token decode to text holding no stop string (else the miner ran
past one), that an output ending short of max_tokens without a stop token does complete one
(else it stopped early claiming a stop string it did not produce), that "length" never
completes one, and, when the miner's texts are given, that the text is exactly the decoded
ids cut before the stop string (so it holds none, and the cut is where the ids say). The
token test below is unchanged and covers every returned id: whether to stop is a function
of the tokens so far, so stopping is a stopping time and the product of likelihood ratios
is still a test martingale there (Ville's inequality holds at any stopping time).

All the work is batched: one `evidence` call over every distinct (prompt, output,
sampling) row. Same model, same inputs -> the same numbers on every verifier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from market.engine.base import Engine, GenerationRequest, ScoreResult, text_for
from market.errors import QuarryError
from market.protocol.precision import Precision
from market.protocol.requests import find_stop

BPS = 10_000
EXPONENTS = (0.25, 0.5, 0.7, 0.85, 1.2, 1.5, 2.0, 4.0, 16.0)
"""Alternatives of the sampled test: the same model at temperature T / e. 16 is nearly
greedy; 0.25 is four times hotter. The grid is fixed in advance (it is part of the test)."""
FALSE_FAULT_RATE = 1e-6
"""The most often an honest set of outputs may fail, by the stated model."""
GREEDY_MARGIN = 0.01
"""Nats by which a greedy token may lose to the argmax and still be honest rounding."""
FINISH_REASONS = ("stop", "length")


class ScoringError(QuarryError):
    """Scoring could not run: bad input, an engine failure, or (remote) no scorer answered."""


def _logmeanexp(values: Sequence[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(math.fsum(math.exp(v - top) for v in values) / len(values))


@dataclass(frozen=True)
class ChallengeScore:
    """The evidence from one output; `judge` turns a set of them into a verdict."""

    greedy: bool
    tokens: int  # the miner's output length
    problem: str = ""  # why no honest run could return this output ("" when it could)
    margins: tuple[float, ...] = ()  # greedy: nats lost to the argmax, where not the argmax
    log_ratios: tuple[float, ...] = ()  # sampled: sum of log q^(e)/q per exponent
    log_perplexity: float = 0.0  # untempered, for the record (inf when impossible)

    @property
    def possible(self) -> bool:
        return not self.problem

    def mismatches(self, greedy_margin: float = GREEDY_MARGIN) -> int:
        """Greedy tokens that lost to the argmax by more than the margin."""
        return sum(m > greedy_margin for m in self.margins)

    @property
    def log_evidence(self) -> float:
        """log of this output's own e-value (0 for greedy outputs: no sampled evidence)."""
        return _logmeanexp(self.log_ratios) if self.log_ratios else 0.0

    def suspicion(self, greedy_margin: float = GREEDY_MARGIN) -> tuple[int, int, float]:
        """A sort key, larger = more clearly wrong: impossible, then mismatches, then the
        sampled evidence. The committee disputes its most suspicious output."""
        return (int(not self.possible), self.mismatches(greedy_margin), self.log_evidence)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (an infinite perplexity is written as null, since JSON has no inf)."""
        return {
            "greedy": self.greedy, "tokens": self.tokens, "problem": self.problem,
            "margins": list(self.margins), "log_ratios": list(self.log_ratios),
            "log_perplexity": (self.log_perplexity if math.isfinite(self.log_perplexity)
                               else None),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChallengeScore:
        """The inverse of `to_json`; raises ScoringError naming a missing or bad field."""
        if not isinstance(d, Mapping):
            raise ScoringError(f"a challenge score must be a JSON object, got {type(d).__name__}")
        fields = ("greedy", "tokens", "problem", "margins", "log_ratios", "log_perplexity")
        missing = [f for f in fields if f not in d]
        if missing:
            raise ScoringError(f"challenge score lacks {', '.join(missing)}")
        unknown = sorted(str(k) for k in d if k not in fields)
        if unknown:
            raise ScoringError(f"challenge score has unknown field(s) {', '.join(unknown)}")

        def numbers(name: str) -> tuple[float, ...]:
            value = d[name]
            if not isinstance(value, list) or any(
                    isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v)
                    for v in value):
                raise ScoringError(f"challenge score field {name} must be a list of numbers, "
                                   f"got {value!r}")
            return tuple(float(v) for v in value)

        tokens, greedy, problem, log_ppl = d["tokens"], d["greedy"], d["problem"], \
            d["log_perplexity"]
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ScoringError(f"challenge score field tokens must be an integer >= 0, "
                               f"got {tokens!r}")
        if not isinstance(greedy, bool) or not isinstance(problem, str):
            raise ScoringError("challenge score fields greedy and problem must be a boolean "
                               "and a string")
        if log_ppl is not None and (isinstance(log_ppl, bool)
                                    or not isinstance(log_ppl, int | float)):
            raise ScoringError(f"challenge score field log_perplexity must be a number, "
                               f"got {log_ppl!r}")
        ratios = numbers("log_ratios")
        if ratios and len(ratios) != len(EXPONENTS):
            raise ScoringError(f"challenge score has {len(ratios)} log ratios, the test uses "
                               f"{len(EXPONENTS)} exponents")
        return cls(greedy=greedy, tokens=tokens, problem=problem, margins=numbers("margins"),
                   log_ratios=ratios,
                   log_perplexity=math.inf if log_ppl is None else float(log_ppl))


@dataclass(frozen=True)
class Judgement:
    """The verdict on a set of outputs (one miner's epoch, or one shard), each kind of
    evidence against its own threshold."""

    outputs: int
    impossible: int
    greedy_tokens: int
    mismatches: int
    sampled_tokens: int
    log_evidence: float  # pooled over every sampled output (and the prior)
    threshold: float  # log(1 / false_fault_rate)
    reason: str
    pooled: tuple[float, ...] = ()  # per exponent: the prior plus these outputs' log ratios
    own: tuple[float, ...] = ()  # per exponent: these outputs' log ratios alone (to carry)

    @property
    def passed(self) -> bool:
        return not self.reason

    @property
    def score_bps(self) -> int:
        """What reputation uses: 10000 for a set that passes, 0 for one that fails (a
        failure is evidence at the 1e-6 level, never noise, so it is not graded)."""
        return BPS if self.passed else 0


def judge(scores: Sequence[ChallengeScore], *, greedy_margin: float = GREEDY_MARGIN,
          false_fault_rate: float = FALSE_FAULT_RATE, prior: Sequence[float] = ()
          ) -> Judgement:
    """Judge a set of outputs: fail on any impossible output, any greedy mismatch, or
    pooled sampled evidence of at least 1 / false_fault_rate (the module doc's model).
    `prior`: sampled log ratios per exponent carried from an earlier set of the same miner
    (`Judgement.own` of its last judgement)."""
    if not scores:
        raise ScoringError("no outputs to judge (a miner needs at least one)")
    if not 0 < false_fault_rate < 1:
        raise ScoringError(f"false_fault_rate must be in (0, 1), got {false_fault_rate!r}")
    if not greedy_margin >= 0:
        raise ScoringError(f"greedy_margin must be >= 0, got {greedy_margin!r}")
    impossible = [s.problem for s in scores if s.problem]
    greedy = [s for s in scores if s.greedy and s.possible]
    sampled = [s for s in scores if not s.greedy and s.possible and s.log_ratios]
    mismatches = sum(s.mismatches(greedy_margin) for s in greedy)
    if prior and len(prior) != len(EXPONENTS):
        raise ScoringError(f"prior has {len(prior)} log ratios, the test uses "
                           f"{len(EXPONENTS)} exponents")
    base = [float(x) for x in prior] if prior else [0.0] * len(EXPONENTS)
    own = [math.fsum(s.log_ratios[k] for s in sampled) for k in range(len(EXPONENTS))]
    pooled = [math.fsum([base[k], own[k]]) for k in range(len(EXPONENTS))]
    log_evidence = _logmeanexp(pooled) if (sampled or prior) else 0.0
    threshold = math.log(1 / false_fault_rate)
    greedy_tokens = sum(s.tokens for s in greedy)
    if impossible:
        reason = f"{len(impossible)} impossible output(s), first: {impossible[0]}"
    elif mismatches:
        reason = (f"{mismatches} of {greedy_tokens} greedy token(s) lost to the reference "
                  f"argmax by more than {greedy_margin:g} nats")
    elif log_evidence >= threshold:
        reason = (f"sampled outputs' evidence e^{log_evidence:.1f} >= 1/{false_fault_rate:g} "
                  "(not what honest sampling at the requested temperature gives)")
    else:
        reason = ""
    return Judgement(outputs=len(scores), impossible=len(impossible),
                     greedy_tokens=greedy_tokens, mismatches=mismatches,
                     sampled_tokens=sum(s.tokens for s in sampled), log_evidence=log_evidence,
                     threshold=threshold, reason=reason, pooled=tuple(pooled),
                     own=tuple(own))


def _log_perplexity(result: ScoreResult) -> float:
    if not result.logprobs:
        return 0.0
    return -math.fsum(result.logprobs) / len(result.logprobs)


def _check_inputs(
    engine: Engine,
    requests: Sequence[GenerationRequest],
    output_ids: Sequence[Sequence[int]],
) -> list[tuple[int, ...]]:
    if not isinstance(engine, Engine):
        raise ScoringError(f"engine must be an Engine, got {type(engine).__name__}")
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


def _stop_string_problem(engine: Engine, request: GenerationRequest, output: tuple[int, ...],
                         text: str | None) -> tuple[str, bool]:
    """(problem, completed): whether `output` ends by completing one of the request's stop
    strings, and why no honest run could return it ("" if one can); see the module doc."""
    decode = getattr(engine, "decode", None)
    if not request.stop or decode is None:
        if request.stop and text is not None and find_stop(text, request.stop) is not None:
            return "the text contains a stop string (it must end before the first)", False
        return "", False
    if output and text_for(decode, output[:-1], request.stop)[1]:
        return ("ran past a stop string: the output's text held one before its last token "
                "(the engine stops at the token that completes the first)"), False
    expected, completed = text_for(decode, output, request.stop)
    if text is not None and text != expected:
        if find_stop(text, request.stop) is not None:
            return "the text contains a stop string (it must end before the first)", completed
        return ("the text is not the output's tokens decoded and cut before the first stop "
                "string"), completed
    return "", completed


def _problem(engine: Engine, request: GenerationRequest, output: tuple[int, ...],
             finish_reason: str | None, text: str | None = None) -> str:
    """Why no honest run of the engine could return `output` (and `text`, when given) for
    `request` ("" if one can)."""
    if len(output) > request.max_tokens:
        return f"{len(output)} tokens, over max_tokens {request.max_tokens}"
    vocab = getattr(engine, "vocab_size", None)
    if any(t < 0 for t in output) or (isinstance(vocab, int)
                                      and any(not 0 <= t < vocab for t in output)):
        return "a token id outside the vocabulary"
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        return f"finish_reason {finish_reason!r} is neither 'stop' nor 'length'"
    stop_ids = getattr(engine, "stop_token_ids", None)
    if stop_ids is None:  # an engine that does not say how it stops: only emptiness is sure
        return "an empty output" if not output and request.max_tokens > 0 else ""
    stops = frozenset(stop_ids)
    if any(t in stops for t in output[:-1]):
        return "a stop token before the end (the engine stops at the first)"
    problem, completed = _stop_string_problem(engine, request, output, text)
    if problem:
        return problem
    ended = bool(output) and output[-1] in stops
    if len(output) < request.max_tokens and not ended and not completed:
        return (f"stopped after {len(output)} of {request.max_tokens} tokens without a "
                "stop token" + (" or a stop string" if request.stop else ""))
    if finish_reason == "stop" and not ended and not completed and request.max_tokens > 0:
        if request.stop:
            return ("finish_reason 'stop' but the output ends with neither a stop token nor "
                    "a stop string")
        return "finish_reason 'stop' but the output does not end with a stop token"
    if finish_reason == "length" and ended:
        return "finish_reason 'length' but the output ends with a stop token"
    if finish_reason == "length" and completed:
        return "finish_reason 'length' but the output completes a stop string"
    return ""


def score_outputs(
    engine: Engine,
    requests: Sequence[GenerationRequest],
    output_ids: Sequence[Sequence[int]],
    finish_reasons: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    *,
    precision: object = Precision.FP32,
    commitments: Sequence[bytes] | None = None,
) -> list[ChallengeScore]:
    """The evidence from each miner output against `engine` (the reference model); see the
    module doc. `finish_reasons`, when given, are checked against the tokens, and so are
    `texts` (the miner's output texts) for requests with stop strings.

    Raises ScoringError naming the problem for malformed input (counts that do not pair up,
    non-integer ids, a request the engine rejects); an output the model could not have
    produced is not an error, it carries its `problem`.
    """
    outputs = _check_inputs(engine, requests, output_ids)
    requests = list(requests)
    if finish_reasons is not None:
        if isinstance(finish_reasons, str) or len(finish_reasons) != len(outputs):
            raise ScoringError(f"{len(outputs)} outputs but finish reasons "
                               f"{finish_reasons!r}; each output needs one")
        if any(not isinstance(f, str) for f in finish_reasons):
            raise ScoringError("every finish_reason must be a string")
    reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(outputs)
    if texts is not None:
        if isinstance(texts, str) or len(texts) != len(outputs):
            raise ScoringError(f"{len(outputs)} outputs but texts {texts!r}; each output "
                               "needs one")
        if any(not isinstance(t, str) for t in texts):
            raise ScoringError("every output text must be a string")
    text_list = list(texts) if texts is not None else [None] * len(outputs)
    problems = [_problem(engine, r, o, f, t)
                for r, o, f, t in zip(requests, outputs, reasons, text_list, strict=True)]

    # One evidence call over every distinct (prompt, output, sampling) row.
    rows: dict[tuple[tuple[int, ...], tuple[int, ...], float, float], int] = {}
    slots: list[int | None] = []
    for request, output, problem in zip(requests, outputs, problems, strict=True):
        if problem or not output:
            slots.append(None)
            continue
        setting = (0.0, 1.0) if request.greedy else (float(request.temperature),
                                                     float(request.top_p))
        slots.append(rows.setdefault((tuple(request.prompt_ids), output, *setting), len(rows)))
    keys = list(rows)
    try:
        results = engine.evidence([k[0] for k in keys], [k[1] for k in keys],
                                  [(k[2], k[3]) for k in keys], EXPONENTS) if keys else []
    except QuarryError as exc:
        raise ScoringError(f"the reference engine could not score the outputs: {exc}") from exc
    if len(results) != len(keys):
        raise ScoringError(f"the reference engine returned {len(results)} scores "
                           f"for {len(keys)} sequences")

    scores = []
    for request, output, problem, slot in zip(requests, outputs, problems, slots, strict=True):
        if slot is None:  # impossible, or empty with max_tokens 0
            scores.append(ChallengeScore(greedy=request.greedy, tokens=len(output),
                                         problem=problem,
                                         log_perplexity=math.inf if problem else 0.0))
            continue
        result = results[slot]
        if len(result.top_logprobs) != len(output) or (not request.greedy and len(
                result.log_ratios) != len(EXPONENTS)):
            raise ScoringError("the reference engine returned incomplete evidence")
        margins: tuple[float, ...] = ()
        if request.greedy:
            margins = tuple(max(0.0, top - lp) for top, lp, am, t in zip(
                result.top_logprobs, result.logprobs, result.argmax_ids, output, strict=True)
                if am != t)
        scores.append(ChallengeScore(
            greedy=request.greedy, tokens=len(output), margins=margins,
            log_ratios=() if request.greedy else tuple(result.log_ratios),
            log_perplexity=_log_perplexity(result)))
    return scores
