"""The statistical check of a miner's outputs: could honest generation have produced them?

One teacher-forced pass of the reference model over prompt + the miner's exact token ids
(`Engine.evidence`) gives, at every position, the whole next-token distribution and the
hidden state the LM head read. Three kinds of evidence come out of it, each an e-value
(a nonnegative statistic whose expectation under honest generation is at most 1), so that
by Ville's inequality an honest miner's evidence reaches 1 / alpha with probability at
most alpha, for any length, any number of outputs, and at any stopping time.

**The honest miner.** It runs the registered model in the precision it declared for it
(`market.protocol.precision`, recorded on the shard at claim) on its own hardware: another
GPU, kernel, batch shape or engine than the verifier's. Its numbers differ from the
reference by rounding; it never changes the weights, the prompt or the sampling rule. The
reference is this verifier's engine in its own precision (fp32 by default, or bf16;
`verifier.error_models` holds a calibration for each pair, per model).

- **Sampled requests** (temperature T > 0, top_p p): token t is drawn from q_t, the softmax
  of logits / T cut to the top_p nucleus, exactly as `market.engine.sampling` draws it (the
  protocol's only sampler: no top_k, no min_p, no penalties). For any exponent e > 0 let
  q_t^(e) be proportional to q_t ** e (the same model at temperature T / e): e > 1 is
  *more* likely than honest sampling (greedy answers, a lower temperature), e < 1 *less*
  likely (another model, noise, random tokens). Under honest sampling every factor
  q_t^(e)(y_t) / q_t(y_t) has expectation exactly 1 given the prefix, so the product over
  positions (and outputs) is a test martingale, and so is the mean over the fixed grid
  `EXPONENTS`. Rounding moves q_t a little; this test has never needed a tolerance for it
  (0 of 20,408 honest outputs at fault in every precision pair, `benchmarks/numerics.py`). A
  token outside the nucleus is judged against the untruncated distribution, so
  nucleus-edge rounding on another accelerator cannot make an infinite ratio.
  Tempering misses miners that sample from the right distribution's head only or end
  outputs early, so the grid also holds `SUPPORT_TEST`'s mixtures q' = (1 - lam) q +
  lam r, with r inside q's support: r = q cut to the stop tokens at positions whose stop
  mass s is at least c (an end chosen wherever one was likely: each such end weighs
  (1 - lam) + lam / s, each continuation there 1 - lam), and r = q cut to its k most
  likely tokens (top-k or min-p sampling: each token of the head weighs (1 - lam) +
  lam / m_k, each of the tail 1 - lam). Both factors have expectation exactly 1 under q,
  so they join the same mean: E_q = (1 - lam) + lam * r(support) = 1 for any lam in (0, 1),
  which is why raising lam (0.95 for the stop alternatives from c = 0.03) leaves the 1e-6
  bound exact. One honest output ends once, so alone its stop evidence is at most
  log(0.2 + 0.8 / 0.01) = 4.4 nats (c = 0.01; 3.5 at c = 0.03), under a third of the
  threshold.
  What no choice of alternatives fixes (`benchmarks/evidence_limits.py`, trained test
  model, 3 epochs): the evidence a test can expect per epoch is at most the KL divergence
  of the cheat's token distribution from the honest one. Ending wherever the stop mass
  reaches 0.1 gives 5.2 nats per epoch's challenge (12.7 with a young miner's audited
  shards pooled; 9.1 when they counted twice), of which the c = 0.1 alternative collects
  97%; the mixture over 21 sampled alternatives and 3 kinds costs 4.1 nats, so a challenge
  alone needs 4 epochs on average.
  Logit noise of 0.25 (0.5) nats on sampled steps gives 0.37 (1.5) nats per challenge on
  the tokens inside the nucleus: 38 (10) epochs for an exact test. What does show it is
  its tokens outside the honest nucleus under top_p < 1 (13 and 24 in 3 epochs; honest
  fp32: 0), which the ratios above forgive as rounding at the nucleus' edge; the
  nucleus-edge test below counts them.
- **The nucleus' edge** (sampled requests with top_p < 1). Rounding moves the edge only a
  little: if a miner's logits differ from the reference's by at most delta around a common
  shift, every token its nucleus holds lies within 2 delta of the reference's edge, where
  a token's *edge distance* is T times the least slack g for which the tokens more than g
  above it (tempered) hold under top_p e^g of the mass (`market.engine.sampling.
  edge_distances`: 0 inside the nucleus, at most T log(1 / top_p)). A token is *beyond the
  edge* when its distance exceeds the pair's margin (`verifier.error_models.EDGE`: twice
  the farthest honest token of the calibration, at least 0.005 nats; bf16 against an fp32
  verifier: 0.0182 on the trained test model, whose farthest of 58,355 honest tokens lay
  0.0091 beyond, and 0.0556 on the tiny one). Taking an honest token's chance to land
  beyond it, given everything before it, as at most eps = `EDGE_FALSE_RATE` (3e-4;
  measured: none beyond the margin of the 36,000 to 62,000 honest tokens per pair of the
  calibration, nor of the 38,066 of `benchmarks/numerics.py`'s fp32, bf16 and fp16 miners
  on both models, each judged by an fp32 and a bf16 verifier, nor of the 18,606 of
  `benchmarks/detection.py`'s honest bf16 outputs: 0 of 94,738 judgements; and since, 1
  of 42,468 more: an honest fp16 token on the tiny model 0.0155 beyond a 0.005 margin, so
  1 of 137,206, whose 95% bound is 3.5e-5: the margin is not a hard bound, the rate is
  what the test relies on; that token was a first token, whose tails run heavier, so first
  tokens were measured apart: 2 of 1,100,000 one-token judgements beyond, at most 1 of
  65,000 for any pair, a 95% bound of 7.3e-5), the factor of each checked token, q / eps
  beyond the edge and (1 - q) / (1 - eps) inside, has expectation r q / eps + (1 - r)
  (1 - q) / (1 - eps) at an honest rate r <= eps, which is 1 at r = eps and grows with r
  (q > eps for every alternative rate q of `EDGE_ALTERNATIVES`), so it is at most 1. The
  product over the checked tokens is then a test supermartingale for each q, and these
  products join the sampled kind's mean beside the tempering and support alternatives: a
  mean of test supermartingales is one, so Ville's bound holds as before. (Joined rather
  than a kind of its own: a fourth kind would give the edge test 1.3 nats more, log 3 +
  log 4 against log 2 + log 21 in a set with greedy lines, but cost the greedy and the
  other sampled alternatives log(3 / 2) = 0.4 nats wherever top_p < 1; joined, the other
  sampled alternatives lose log(21 / 17) = 0.2.) A pair without a margin checks no token,
  and nothing changes for it.
- **Greedy requests** (temperature 0): the token at every position is the argmax of the
  miner's logits, which are the reference's plus the miner's rounding. The error model,
  for declared precision P against a verifier in precision V, is two parts:
  1. *Rounding of the logits themselves* is bounded: a logit l rounded to a float with m
     mantissa bits moves by at most half an ulp, 2^(floor(log2 |l|) - m - 1). So any token
     whose reference logit is within both halves of the argmax's (`half_ulp` of each, for
     P's and V's mantissa) ties with it and carries no evidence.
  2. *Error accumulated through the layers* is random-like and dominated by Gumbel noise
     of scale beta(P, V): beyond the tie, an honest miner returns token j no more often
     than a Gumbel-max draw over the logits at scale beta would, p_t(j) = softmax(-g'/beta)
     with g'_j the gap left after part 1.
  The alternatives are the same draw with more noise, q_t^(e) = softmax(-e g'/beta) for e in
  `GREEDY_EXPONENTS` (all below 1). Because q^(e)/p grows as p falls, every factor
  q_t^(e)(y_t)/p_t(y_t) has expectation at most 1 whenever the honest chance of each
  non-tied token is at most p_t(j), whatever the honest chance of the argmax and its ties;
  so the product is a test supermartingale. beta(P, V) is calibrated per model from
  measured honest runs (`benchmarks/calibrate_numerics.py`: fp32, fp16, bf16, fp8 and int8
  weights over bf16, batch 1, 32 and shuffled batches of 5, sdpa and eager attention), as
  twice the smallest scale under which, beyond every gap, the observed flips stay under
  half of what the bound allows (`verifier.error_models`; bf16 on the trained test model:
  0.0308 nats, where its honest flips reached 0.080 in a second sample of prompts; the
  first, 0.033, had given 0.015).
- **Activation commitments** (`market.protocol.commitments`, TOPLOC), where the miner's
  engine made them: each chunk of 32 positions is compared with the verifier's own hidden
  states; a chunk fails when it is further than the declared precision's tolerance
  (`verifier.error_models`: twice the worst honest chunk of the calibration runs, which a
  larger sample still exceeds now and then). Taking an honest chunk's chance to fail as at
  most `CHUNK_FALSE_RATE` (0.03; measured: at most 1.1% for any precision pair, 13 of
  1,150 chunks of fp8 weights against an fp32 verifier on the trained model, 21 of 3,018
  for bf16, none for fp32 or fp16, 1 of 20,408 on the tiny model; `benchmarks/numerics.py`),
  the product over
  chunks of (q / eps if failed else (1 - q) / (1 - eps)) is a test supermartingale for each
  alternative failure rate q in `COMMIT_ALTERNATIVES`, and so is their mean.
  A chunk inside the tolerance can still *drift*: a mean mantissa error above the pair's
  `drift` (`verifier.error_models.DRIFT`, calibrated where a cheaper computation hides
  inside the tolerance: bf16 declared against an fp32 verifier, where int8 weights' worst
  chunks overlap bf16's but their typical chunk does not, and fp16, whose tolerance int8
  weights' chunks fit inside). An honest chunk drifts with chance at most
  `DRIFT_FALSE_RATE` (0.1; measured: at most 2.6% of the honest bf16 chunks a verifier
  tests, in any setup on the trained model, against 39% of int8 weights' and 92% of 1%
  weight noise's; 2 of 1,803 honest fp16 chunks above fp16's line, which sits at three
  times the quantile for other hardware, and 100% and 98% of those cheats'; an H200's bf16
  chunks erred as this CPU's did: median 0.58 ulps on both, on the tiny model), so the same
  product over the drift-checked chunks, with alternative rates `DRIFT_ALTERNATIVES`, joins
  the mean; a pair without a calibrated drift checks none. Like the tolerance's, the bound
  takes chunks as independent given the past: the product is a test supermartingale when
  each chunk's chance to drift, given everything before it, stays under the bound.
  A full chunk's 128 points are the largest of 32 positions' activations. An output's last
  chunk may hold a single position, and then (at a small hidden size) its points include
  ordinary activations that round worse in ulps: honest bf16 one-position chunks on the
  trained model erred 2.6 ulps (median), a third of them beyond the tolerance and all
  above the drift line. So a chunk drawn from fewer than `MIN_TESTED_VALUES` activations
  (1,024: fewer than 8 positions at hidden size 128, never at 1,024 and above) is counted as
  passing and neither fails nor drifts; a factor that is (1 - q) / (1 - eps) <= 1 whatever
  happened keeps the product a test supermartingale. The drift line is calibrated on the
  chunks tested (with the short ones counted it sat at 0.95, where int8 drifted 23%); the
  tolerance on every chunk, which only widens it.

**The verdict** (`judge`). A set of outputs (one miner's epoch, or one shard) fails if any
output is impossible, or if its evidence, the mean of the e-values of the kinds the set
holds (greedy, sampled, commitments; which kinds is fixed by the requests and the engine,
not by the outcome), reaches 1 / `FALSE_FAULT_RATE` = 10^6. An average of e-values is an
e-value, so an honest set fails with probability at most 1e-6 under the model above.

**Across epochs** (`judge(prior=...)`, `Judgement.carry`), the committee runs a CUSUM
e-detector: each alternative's log evidence is carried from one challenge epoch of a miner
to its next, floored at 0 (`carry`), and added to the new epoch's. The floor means honest
epochs never bank credit against a later cheat, while a subtle cheat's evidence adds up
over as many epochs as it lasts. The average over alternatives of those products is at
most a sum, over every starting epoch, of e-processes, so by the e-detector bound (Shin,
Ramdas and Rinaldo, "E-detectors", 2023) an honest miner's average run before a false
alarm is at least 10^6 epochs.

**Pooling audited shards** (`judge(joined=...)`). A dispute judges one shard alone, and so
does an audit for its dispute; the audited shard also joins its miner's epoch evidence.
Every output's factors have expectation at most 1 given its prompt and everything before
it, whoever chose the prompt, so the product over any set of a miner's outputs fixed
without looking at their evidence is still a test supermartingale. The committee's epoch
set is the miner's challenge answer plus the client shards submitted in the epoch before
that the audit rule drew at the chain's base rate (`verifier.committee.CommitteeMember.
pooled_shards`), passed or failed, its own challenges left out: fixed by public chain data
(the draw's block hash taken as independent of the outputs' evidence, as the audit draw
already takes it), each output in one epoch only. So pooling keeps the 1e-6 honest bound
per epoch and the CUSUM's 10^6-epoch average run unchanged, and adds what the epoch's
audited shards hold (3 to 11 shards of 4 outputs beside a challenge of 16: likely-end 0.1
gives 5.2 nats per epoch from the challenge, 9.1 pooled at two shards a young miner's
shard and 12.7 at four, `verifier.audits.YOUNG_WEIGHT`; `benchmarks/evidence_limits.py`).

An output the model cannot have produced fails without a forward pass: a token id outside
the vocabulary, more tokens than max_tokens, a stop token before the end, an output that
stops short of max_tokens without a stop token (the engines stop only at a stop token or
at max_tokens), a `finish_reason` that does not match the tokens ("stop" needs a final
stop token, "length" needs max_tokens tokens and none), or a commitment whose length does
not fit the output. An empty output is the short case, unless max_tokens is 0, which
passes. In a set where any output carries a commitment, every nonempty one must.

Stop strings (`body.stop`) add one more way to end, decided on the decoded ids by the rule
the engines use (`market.engine.base.text_for`): generation ends at the first token after
which the decoded output contains a stop string; every id up to that token is kept and the
text is cut before the stop string. So with the reference tokenizer a verifier checks that
the ids without their last token decode to text holding no stop string (else the miner ran
past one), that an output ending short of max_tokens without a stop token does complete one
(else it stopped early claiming a stop string it did not produce), that "length" never
completes one, and, when the miner's texts are given, that the text is exactly the decoded
ids cut before the stop string (so it holds none, and the cut is where the ids say). The
token tests cover every returned id: whether to stop is a function of the tokens so far, so
stopping is a stopping time and the products are still test supermartingales there.

All the work is batched: one `evidence` call over every distinct (prompt, output,
sampling) row. Same model, same inputs -> the same numbers on every verifier of the same
precision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from market.engine.base import (
    Engine,
    GenerationRequest,
    GreedyTest,
    ScoreResult,
    SupportTest,
    text_for,
)
from market.errors import QuarryError
from market.protocol.commitments import (
    ChunkCheck,
    checked_chunks,
    chunk_sizes,
    expected_length,
)
from market.protocol.precision import Precision, PrecisionError, parse_precision
from market.protocol.requests import find_stop
from verifier.error_models import CALIBRATED, DEFAULT, DRIFT, EDGE

BPS = 10_000
EXPONENTS = (0.25, 0.5, 0.7, 0.85, 1.2, 1.5, 2.0, 4.0, 16.0)
"""Alternatives of the sampled test: the same model at temperature T / e. 16 is nearly
greedy; 0.25 is four times hotter. The grid is fixed in advance (it is part of the test)."""
SUPPORT_TEST = SupportTest(stops=((0.01, 0.8), (0.03, 0.95), (0.1, 0.95), (0.3, 0.95)),
                           top_ks=((2, 0.7), (5, 0.7), (20, 0.7), (50, 0.7)))
"""Further alternatives of the sampled test, on how outputs end (an end token chosen where
its chance was at least c) and where tokens come from (the k most likely only); fixed in
advance like EXPONENTS (`market.engine.base.SupportTest`). The stop alternatives from
c = 0.03 up weigh an end 0.05 + 0.95 / s: a miner that ends wherever an end was that
likely never continues there, so the continuation factor can be small (0.05) and each of
its ends weighs nearly the full likelihood ratio 1 / s (`likely-end-0.1` in
`benchmarks/detection.py` on the trained model: untrusted after 4 epochs where 0.8 took 6
on the same draws; the c = 0.1 alternative collects 97% of the exact ratio,
`benchmarks/evidence_limits.py`); c = 0.01 keeps 0.8 for a miner that ends early only now
and then."""
SAMPLED_WIDTH = len(EXPONENTS) + SUPPORT_TEST.width
"""The sampled alternatives the reference engine computes (`ChallengeScore.log_ratios`)."""
EDGE_ALTERNATIVES = (0.002, 0.005, 0.01, 0.03)
"""Alternatives of the nucleus-edge test: the share of nucleus-limited sampled tokens a
dishonest miner puts beyond the edge (logit noise of 0.25 and 0.5 nats on sampled steps:
about 0.5% and 1% on the trained test model)."""
EDGE_FALSE_RATE = 3e-4
"""The honest chance, taken as an upper bound, that one nucleus-limited sampled token lies
beyond the edge (module doc)."""
GREEDY_EXPONENTS = (0.05, 0.15, 0.35, 0.6)
"""Alternatives of the greedy test: Gumbel noise of scale beta / e, from 1.7 to 20 times the
honest bound (another model, weight noise, cheaper precision)."""
COMMIT_ALTERNATIVES = (0.1, 0.3, 0.9)
"""Alternatives of the commitment test: the share of chunks a dishonest miner fails."""
CHUNK_FALSE_RATE = 0.03
"""The honest chance, taken as an upper bound, that one chunk fails its tolerance."""
DRIFT_ALTERNATIVES = (0.3, 0.6)
"""Alternatives of the drift test: the share of chunks a cheaper computation drifts."""
DRIFT_FALSE_RATE = 0.1
"""The honest chance, taken as an upper bound, that one chunk drifts (module doc)."""
FALSE_FAULT_RATE = 1e-6
"""The most often an honest set of outputs may fail, by the stated model."""
FINISH_REASONS = ("stop", "length")
KINDS = ("greedy", "sampled", "commitments")
"""The kinds of evidence, in the order of `Judgement.own` (and of a `prior`)."""
GRIDS = {"greedy": len(GREEDY_EXPONENTS), "sampled": SAMPLED_WIDTH + len(EDGE_ALTERNATIVES),
         "commitments": len(COMMIT_ALTERNATIVES) + len(DRIFT_ALTERNATIVES)}
"""How many alternatives each kind's e-value averages over."""
EVIDENCE_WIDTH = sum(GRIDS.values())


@dataclass(frozen=True)
class ChunkTolerance:
    """How far an honest commitment chunk may be from the verifier's activations."""

    mismatches: int  # points whose sign or exponent differ
    mant_err_mean: float  # bf16 ulps
    mant_err_median: float
    drift: float = math.inf  # a passing chunk's mean error above this drifts (module doc)

    def passes(self, c: ChunkCheck) -> bool:
        return (c.mismatches <= self.mismatches and c.mant_err_mean <= self.mant_err_mean
                and c.mant_err_median <= self.mant_err_median)

    @property
    def checks_drift(self) -> bool:
        return math.isfinite(self.drift)

    def drifts(self, c: ChunkCheck) -> bool:
        return c.mant_err_mean > self.drift


@dataclass(frozen=True)
class ErrorModel:
    """The honest error of a miner in one declared precision against a verifier in
    another (module doc): the greedy test's Gumbel scale and logit mantissa, and the
    commitment chunks' tolerance."""

    beta: float
    roundings: tuple[int, ...]  # the logits' mantissa widths: the miner's, the verifier's
    chunks: ChunkTolerance
    edge: float = math.inf  # a sampled token further than this beyond the nucleus' edge

    @property
    def checks_edge(self) -> bool:
        return math.isfinite(self.edge)

    def greedy_test(self) -> GreedyTest:
        return GreedyTest(self.beta, self.roundings, GREEDY_EXPONENTS)


MANTISSA_BITS = {Precision.FP32: 23, Precision.FP16: 10, Precision.BF16: 7,
                 Precision.FP8: 7, Precision.INT8: 7}
"""The mantissa of the logits each precision rounds to (int8 and fp8 compute in bf16)."""
VERIFIER_PRECISIONS = (Precision.FP32, Precision.BF16)
"""The precisions a verifier's reference may compute in (each has its error models)."""


class ScoringError(QuarryError):
    """Scoring could not run: bad input, an engine failure, or (remote) no scorer answered."""


def error_model(declared: object, verifier: object = Precision.FP32,
                model_id: bytes | None = None) -> ErrorModel:
    """The calibrated error model (`verifier.error_models`) of a miner serving `model_id`
    in `declared` precision, judged by a verifier computing in `verifier` precision: the
    model's own when it was calibrated, else the default; ScoringError for a verifier
    precision without calibrations."""
    try:
        miner, reference = parse_precision(declared), parse_precision(verifier)
    except PrecisionError as exc:
        raise ScoringError(str(exc)) from exc
    if reference not in VERIFIER_PRECISIONS:
        raise ScoringError(f"no calibrated error model for a {reference.label} verifier; "
                           f"verifiers score in "
                           f"{' or '.join(p.label for p in VERIFIER_PRECISIONS)}")
    key = "0x" + model_id.hex() if model_id else ""
    pair = f"{miner.label}/{reference.label}"
    beta, (mismatches, mean, median) = CALIBRATED.get(key, DEFAULT)[pair]
    drift = DRIFT.get(key, {}).get(pair, math.inf)
    return ErrorModel(beta, (MANTISSA_BITS[miner], MANTISSA_BITS[reference]),
                      ChunkTolerance(mismatches, mean, median, drift),
                      EDGE.get(key, {}).get(pair, math.inf))


def _logmeanexp(values: Sequence[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(math.fsum(math.exp(v - top) for v in values) / len(values))


def _binomial_log_ratios(n: int, hits: int, honest: float,
                         alternatives: Sequence[float]) -> tuple[float, ...]:
    """log of prod (q / honest if hit else (1 - q) / (1 - honest)) over n trials, per
    alternative rate q: a test supermartingale while each trial hits with chance at most
    `honest` (module doc)."""
    return tuple(hits * math.log(q / honest) + (n - hits) * math.log((1 - q) / (1 - honest))
                 for q in alternatives)


def _commit_log_ratios(chunks: int, failed: int, drift_checked: int = 0,
                       drifted: int = 0) -> tuple[float, ...]:
    """log of the commitment e-value's factors: failures beyond the tolerance per
    COMMIT_ALTERNATIVES, then drift per DRIFT_ALTERNATIVES (module doc)."""
    return (_binomial_log_ratios(chunks, failed, CHUNK_FALSE_RATE, COMMIT_ALTERNATIVES)
            + _binomial_log_ratios(drift_checked, drifted, DRIFT_FALSE_RATE,
                                   DRIFT_ALTERNATIVES))


def _edge_log_ratios(checked: int, beyond: int) -> tuple[float, ...]:
    """log of the nucleus-edge e-value's factors per EDGE_ALTERNATIVES (module doc)."""
    return _binomial_log_ratios(checked, beyond, EDGE_FALSE_RATE, EDGE_ALTERNATIVES)


@dataclass(frozen=True)
class ChallengeScore:
    """The evidence from one output; `judge` turns a set of them into a verdict."""

    greedy: bool
    tokens: int  # the miner's output length
    problem: str = ""  # why no honest run could return this output ("" when it could)
    margins: tuple[float, ...] = ()  # greedy: nats lost to the argmax, where not the argmax
    log_ratios: tuple[float, ...] = ()  # sampled: sum of log q'/q per EXPONENTS, SUPPORT_TEST
    greedy_log_ratios: tuple[float, ...] = ()  # greedy: per GREEDY_EXPONENTS
    chunks: int = 0  # commitment chunks checked (0: the output carries no commitment)
    failed_chunks: int = 0  # of those, beyond the declared precision's tolerance
    drift_chunks: int = 0  # of those, checked for drift (0 where the pair has no drift)
    drifted_chunks: int = 0  # of those, drifted
    edge_tokens: int = 0  # sampled tokens under top_p < 1 checked against the nucleus' edge
    beyond_edge: int = 0  # of those, beyond it (0 where the pair has no edge margin)
    log_perplexity: float = 0.0  # untempered, for the record (inf when impossible)
    precision: int = int(Precision.FP32)  # the miner's declared precision it was judged at

    @property
    def possible(self) -> bool:
        return not self.problem

    def mismatches(self) -> int:
        """Greedy tokens that were not the reference's argmax (rounding included; for the
        record: the test weighs each by how far it lost)."""
        return len(self.margins)

    def sampled_log_ratios(self) -> tuple[float, ...]:
        """The sampled kind's evidence per alternative: the reference's `log_ratios`, then
        the nucleus-edge test's (() for a greedy output)."""
        if not self.log_ratios:
            return ()
        return self.log_ratios + _edge_log_ratios(self.edge_tokens, self.beyond_edge)

    def own_log_ratios(self) -> tuple[float, ...]:
        """This output's evidence per alternative, laid out as `Judgement.own`."""
        greedy = self.greedy_log_ratios or (0.0,) * len(GREEDY_EXPONENTS)
        sampled = self.sampled_log_ratios() or (0.0,) * GRIDS["sampled"]
        commit = _commit_log_ratios(self.chunks, self.failed_chunks, self.drift_chunks,
                                    self.drifted_chunks)
        return (*greedy, *sampled, *commit)

    @property
    def log_evidence(self) -> float:
        """log of this output's own e-value, over the kinds of evidence it carries (0 when
        it carries none)."""
        kinds = [v for v in (self.greedy_log_ratios, self.sampled_log_ratios()) if v]
        if self.chunks:
            kinds.append(_commit_log_ratios(self.chunks, self.failed_chunks,
                                            self.drift_chunks, self.drifted_chunks))
        return _logmeanexp([_logmeanexp(v) for v in kinds]) if kinds else 0.0

    def suspicion(self) -> tuple[int, float]:
        """A sort key, larger = more clearly wrong: impossible, then the evidence. The
        committee disputes its most suspicious output."""
        return (int(not self.possible), self.log_evidence)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (an infinite perplexity is written as null, since JSON has no inf)."""
        return {
            "greedy": self.greedy, "tokens": self.tokens, "problem": self.problem,
            "margins": list(self.margins), "log_ratios": list(self.log_ratios),
            "greedy_log_ratios": list(self.greedy_log_ratios), "chunks": self.chunks,
            "failed_chunks": self.failed_chunks, "drift_chunks": self.drift_chunks,
            "drifted_chunks": self.drifted_chunks, "edge_tokens": self.edge_tokens,
            "beyond_edge": self.beyond_edge, "precision": self.precision,
            "log_perplexity": (self.log_perplexity if math.isfinite(self.log_perplexity)
                               else None),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChallengeScore:
        """The inverse of `to_json`; raises ScoringError naming a missing or bad field."""
        if not isinstance(d, Mapping):
            raise ScoringError(f"a challenge score must be a JSON object, got {type(d).__name__}")
        fields = ("greedy", "tokens", "problem", "margins", "log_ratios", "greedy_log_ratios",
                  "chunks", "failed_chunks", "precision", "log_perplexity")
        missing = [f for f in fields if f not in d]
        if missing:
            raise ScoringError(f"challenge score lacks {', '.join(missing)}")
        # absent from scores before the drift and the nucleus-edge tests
        optional = ("drift_chunks", "drifted_chunks", "edge_tokens", "beyond_edge")
        d = {**dict.fromkeys(optional, 0), **d}
        unknown = sorted(str(k) for k in d if k not in fields + optional)
        if unknown:
            raise ScoringError(f"challenge score has unknown field(s) {', '.join(unknown)}")

        def numbers(name: str, width: int | None = None) -> tuple[float, ...]:
            value = d[name]
            if not isinstance(value, list) or any(
                    isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v)
                    for v in value):
                raise ScoringError(f"challenge score field {name} must be a list of numbers, "
                                   f"got {value!r}")
            if width is not None and value and len(value) != width:
                raise ScoringError(f"challenge score has {len(value)} {name}, the test uses "
                                   f"{width} alternatives")
            return tuple(float(v) for v in value)

        def count(name: str) -> int:
            value = d[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ScoringError(f"challenge score field {name} must be an integer >= 0, "
                                   f"got {value!r}")
            return value

        greedy, problem, log_ppl = d["greedy"], d["problem"], d["log_perplexity"]
        if not isinstance(greedy, bool) or not isinstance(problem, str):
            raise ScoringError("challenge score fields greedy and problem must be a boolean "
                               "and a string")
        if log_ppl is not None and (isinstance(log_ppl, bool)
                                    or not isinstance(log_ppl, int | float)):
            raise ScoringError(f"challenge score field log_perplexity must be a number, "
                               f"got {log_ppl!r}")
        chunks, failed = count("chunks"), count("failed_chunks")
        if failed > chunks:
            raise ScoringError(f"challenge score has {failed} failed of {chunks} chunks")
        drift_checked, drifted = count("drift_chunks"), count("drifted_chunks")
        if drifted > drift_checked or drift_checked > chunks:
            raise ScoringError(f"challenge score has {drifted} drifted of {drift_checked} "
                               f"drift-checked of {chunks} chunks")
        edge_checked, beyond = count("edge_tokens"), count("beyond_edge")
        if beyond > edge_checked or edge_checked > count("tokens"):
            raise ScoringError(f"challenge score has {beyond} beyond the edge of "
                               f"{edge_checked} edge-checked of {count('tokens')} tokens")
        try:
            precision = int(parse_precision(d["precision"]))
        except PrecisionError as exc:
            raise ScoringError(f"challenge score field precision: {exc}") from exc
        return cls(greedy=greedy, tokens=count("tokens"), problem=problem,
                   margins=numbers("margins"), log_ratios=numbers("log_ratios", SAMPLED_WIDTH),
                   greedy_log_ratios=numbers("greedy_log_ratios", len(GREEDY_EXPONENTS)),
                   chunks=chunks, failed_chunks=failed, drift_chunks=drift_checked,
                   drifted_chunks=drifted, edge_tokens=edge_checked, beyond_edge=beyond,
                   precision=precision,
                   log_perplexity=math.inf if log_ppl is None else float(log_ppl))


@dataclass(frozen=True)
class Judgement:
    """The verdict on a set of outputs (one miner's epoch, or one shard)."""

    outputs: int
    impossible: int
    greedy_tokens: int
    mismatches: int  # greedy tokens that were not the reference argmax (the record)
    sampled_tokens: int
    chunks: int  # commitment chunks checked
    failed_chunks: int
    log_evidence: float  # the set's e-value (with the prior), over the kinds it holds
    kind_log_evidence: tuple[float, float, float]  # greedy, sampled, commitments (KINDS)
    threshold: float  # log(1 / false_fault_rate)
    reason: str
    pooled: tuple[float, ...] = ()  # per alternative: the prior plus these outputs' ratios
    own: tuple[float, ...] = ()  # per alternative: these outputs' ratios alone
    edge_tokens: int = 0  # sampled tokens checked against the nucleus' edge
    beyond_edge: int = 0  # of those, beyond it

    @property
    def passed(self) -> bool:
        return not self.reason

    @property
    def score_bps(self) -> int:
        """What reputation uses: 10000 for a set that passes, 0 for one that fails (a
        failure is evidence at the 1e-6 level, never noise, so it is not graded)."""
        return BPS if self.passed else 0

    @property
    def carry(self) -> tuple[float, ...]:
        """The prior of the miner's next set: the pooled log evidence per alternative,
        floored at 0 (a CUSUM e-detector; the module doc)."""
        return tuple(max(0.0, x) for x in self.pooled)

    def summary(self) -> str:
        """One line on what was checked, for a passing verdict's record."""
        return (f"no impossible output; greedy evidence e^{self.kind_log_evidence[0]:.1f} over "
                f"{self.greedy_tokens} tokens ({self.mismatches} off the reference argmax), "
                f"sampled e^{self.kind_log_evidence[1]:.1f} over {self.sampled_tokens} "
                f"({self.beyond_edge} of {self.edge_tokens} beyond the nucleus' edge), "
                f"commitments {self.failed_chunks} of {self.chunks} chunks beyond tolerance; "
                f"the set's e^{self.log_evidence:.1f} < e^{self.threshold:.1f}")


_WHAT = {
    "greedy": "greedy tokens left the reference's argmax further or more often than the "
              "declared precision's rounding allows",
    "sampled": "sampled tokens are not what honest sampling at the requested temperature "
               "and top_p gives",
    "commitments": "activation commitments are further from the reference than the declared "
                   "precision allows",
}


def judge(scores: Sequence[ChallengeScore], *, false_fault_rate: float = FALSE_FAULT_RATE,
          prior: Sequence[float] = (),
          joined: Sequence[Sequence[ChallengeScore]] = ()) -> Judgement:
    """Judge a set of outputs: fail on any impossible output, on partial commitments, or on
    an e-value of at least 1 / false_fault_rate (the module doc's model). `prior`: log
    ratios per alternative carried from an earlier set of the same miner (`Judgement.own`
    of its last judgement). `joined`: further sets of the same miner whose outputs join
    this one's evidence (its epoch's audited shards); each is one engine's work, so each
    is held to commit all or none on its own, and `scores` may then be empty."""
    groups = [list(scores), *(list(g) for g in joined)]
    scores = [s for g in groups for s in g]
    if not scores:
        raise ScoringError("no outputs to judge (a miner needs at least one)")
    if not 0 < false_fault_rate < 1:
        raise ScoringError(f"false_fault_rate must be in (0, 1), got {false_fault_rate!r}")
    if prior and len(prior) != EVIDENCE_WIDTH:
        raise ScoringError(f"prior has {len(prior)} log ratios, the test uses "
                           f"{EVIDENCE_WIDTH} alternatives")
    impossible = [s.problem for s in scores if s.problem]
    possible = [s for s in scores if s.possible]
    greedy = [s for s in possible if s.greedy]
    sampled = [s for s in possible if not s.greedy and s.log_ratios]
    committed = [s for s in possible if s.chunks]
    partial = next(((g, i) for g, group in enumerate(groups) if any(s.chunks for s in group)
                    for i, s in enumerate(group) if s.possible and s.tokens and not s.chunks),
                   None)
    base = [float(x) for x in prior] if prior else [0.0] * EVIDENCE_WIDTH
    own = [math.fsum(col) for col in zip(*(s.own_log_ratios() for s in possible),
                                         strict=True)] if possible else [0.0] * EVIDENCE_WIDTH
    pooled = [math.fsum([b, o]) for b, o in zip(base, own, strict=True)]
    present = {"greedy": bool(greedy and any(s.greedy_log_ratios for s in greedy)),
               "sampled": bool(sampled), "commitments": bool(committed)}
    kind_evidence: list[float] = []
    start = 0
    for kind in KINDS:
        width = GRIDS[kind]
        part = pooled[start: start + width]
        if prior and any(base[start: start + width]):
            present[kind] = True
        kind_evidence.append(_logmeanexp(part) if present[kind] else 0.0)
        start += width
    held = [e for kind, e in zip(KINDS, kind_evidence, strict=True) if present[kind]]
    log_evidence = _logmeanexp(held) if held else 0.0
    threshold = math.log(1 / false_fault_rate)
    if impossible:
        reason = f"{len(impossible)} impossible output(s), first: {impossible[0]}"
    elif partial is not None:
        where = f"output {partial[1]}" + (f" of joined set {partial[0]}" if partial[0] else "")
        others = sum(bool(s.chunks) for s in groups[partial[0]])
        reason = (f"{where} carries no activation commitment while {others} other(s) do (an "
                  "engine commits to all or none)")
    elif log_evidence >= threshold:
        top = max((k for k in KINDS if present[k]),
                  key=lambda k: kind_evidence[KINDS.index(k)])
        reason = (f"evidence e^{log_evidence:.1f} >= 1/{false_fault_rate:g}: {_WHAT[top]} "
                  f"(e^{kind_evidence[KINDS.index(top)]:.1f})")
    else:
        reason = ""
    ke = (kind_evidence[0], kind_evidence[1], kind_evidence[2])
    return Judgement(outputs=len(scores), impossible=len(impossible),
                     greedy_tokens=sum(s.tokens for s in greedy),
                     mismatches=sum(s.mismatches() for s in greedy),
                     sampled_tokens=sum(s.tokens for s in sampled),
                     chunks=sum(s.chunks for s in committed),
                     failed_chunks=sum(s.failed_chunks for s in committed),
                     log_evidence=log_evidence, kind_log_evidence=ke, threshold=threshold,
                     reason=reason, pooled=tuple(pooled), own=tuple(own),
                     edge_tokens=sum(s.edge_tokens for s in sampled),
                     beyond_edge=sum(s.beyond_edge for s in sampled))


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
    """The evidence from each miner output against `engine` (the reference model, whose own
    `precision` is the verifier's), judged at the miner's declared `precision`; see the
    module doc. `finish_reasons`, when given, are checked against the tokens, and so are
    `texts` (the miner's output texts) for requests with stop strings; `commitments` are
    the outputs' activation commitments (b"" where there is none).

    Raises ScoringError naming the problem for malformed input (counts that do not pair up,
    non-integer ids, a request the engine rejects, a precision pair without a calibration);
    an output the model could not have produced is not an error, it carries its `problem`.
    """
    outputs = _check_inputs(engine, requests, output_ids)
    requests = list(requests)
    model = error_model(precision, getattr(engine, "precision", Precision.FP32),
                        getattr(engine, "model_id", None))
    declared = int(parse_precision(precision))
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
    commits = _check_commitments(engine, outputs, commitments)
    problems = [_problem(engine, r, o, f, t) or _commitment_problem(engine, o, c)
                for r, o, f, t, c in zip(requests, outputs, reasons, text_list, commits,
                                         strict=True)]

    # One evidence call over every distinct (prompt, output, sampling, commitment) row.
    rows: dict[tuple[tuple[int, ...], tuple[int, ...], float, float, bytes], int] = {}
    slots: list[int | None] = []
    for request, output, problem, commit in zip(requests, outputs, problems, commits,
                                                strict=True):
        if problem or not output:
            slots.append(None)
            continue
        setting = (0.0, 1.0) if request.greedy else (float(request.temperature),
                                                     float(request.top_p))
        slots.append(rows.setdefault((tuple(request.prompt_ids), output, *setting, commit),
                                     len(rows)))
    keys = list(rows)
    hidden = int(getattr(engine, "hidden_size", 0) or 0)
    try:
        results = engine.evidence([k[0] for k in keys], [k[1] for k in keys],
                                  [(k[2], k[3]) for k in keys], EXPONENTS,
                                  commitments=[k[4] for k in keys],
                                  greedy=model.greedy_test(),
                                  support=SUPPORT_TEST) if keys else []
    except QuarryError as exc:
        raise ScoringError(f"the reference engine could not score the outputs: {exc}") from exc
    if len(results) != len(keys):
        raise ScoringError(f"the reference engine returned {len(results)} scores "
                           f"for {len(keys)} sequences")

    scores = []
    for request, output, problem, slot, commit in zip(requests, outputs, problems, slots,
                                                      commits, strict=True):
        if slot is None:  # impossible, or empty with max_tokens 0
            scores.append(ChallengeScore(greedy=request.greedy, tokens=len(output),
                                         problem=problem, precision=declared,
                                         log_perplexity=math.inf if problem else 0.0))
            continue
        result = results[slot]
        edge = not request.greedy and request.top_p < 1.0 and model.checks_edge
        if len(result.top_logprobs) != len(output) or (not request.greedy and len(
                result.log_ratios) != SAMPLED_WIDTH) or (edge and len(
                result.edge_distances) != len(output)) or (request.greedy and len(
                result.greedy_log_ratios) != len(GREEDY_EXPONENTS)) or (commit and len(
                result.commitment_checks) != len(chunk_sizes(len(output), 1))):
            raise ScoringError("the reference engine returned incomplete evidence")
        margins: tuple[float, ...] = ()
        if request.greedy:
            margins = tuple(max(0.0, top - lp) for top, lp, am, t in zip(
                result.top_logprobs, result.logprobs, result.argmax_ids, output, strict=True)
                if am != t)
        checks = result.commitment_checks
        tested = [c for c, t in zip(checks, checked_chunks(len(output), hidden), strict=True)
                  if t] if checks else []
        drift = [c for c in tested if model.chunks.checks_drift and model.chunks.passes(c)]
        distances = result.edge_distances if edge else ()
        scores.append(ChallengeScore(
            greedy=request.greedy, tokens=len(output), margins=margins,
            log_ratios=() if request.greedy else tuple(result.log_ratios),
            greedy_log_ratios=tuple(result.greedy_log_ratios) if request.greedy else (),
            chunks=len(checks), failed_chunks=sum(not model.chunks.passes(c) for c in tested),
            drift_chunks=len(drift), drifted_chunks=sum(model.chunks.drifts(c) for c in drift),
            edge_tokens=len(distances), beyond_edge=sum(d > model.edge for d in distances),
            precision=declared, log_perplexity=_log_perplexity(result)))
    return scores


def _check_commitments(engine: Engine, outputs: Sequence[tuple[int, ...]],
                       commitments: Sequence[bytes] | None) -> list[bytes]:
    """The commitments as a list of bytes beside the outputs (b"" each when none given)."""
    if commitments is None:
        return [b""] * len(outputs)
    if isinstance(commitments, bytes | str) or len(commitments) != len(outputs):
        raise ScoringError(f"{len(outputs)} outputs but {len(commitments)} commitments; "
                           "each output needs one (b\"\" for none)")
    if any(not isinstance(c, bytes) for c in commitments):
        raise ScoringError("every commitment must be bytes")
    if any(commitments) and not isinstance(getattr(engine, "hidden_size", None), int):
        raise ScoringError(f"{type(engine).__name__} cannot check activation commitments "
                           "(it does not expose its hidden states)")
    return list(commitments)


def _commitment_problem(engine: Engine, output: tuple[int, ...], commitment: bytes) -> str:
    """Why `commitment` cannot be the commitment of `output` ("" when it can, or is none)."""
    if not commitment:
        return ""
    if not output:
        return "a commitment for an empty output"
    want = expected_length(len(output), int(getattr(engine, "hidden_size", 0)))
    if len(commitment) != want:
        return (f"a commitment of {len(commitment)} bytes for {len(output)} tokens "
                f"({want} expected)")
    return ""
