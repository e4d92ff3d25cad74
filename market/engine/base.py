"""The engine interface: what miners call to generate and verifiers call to score.

Every engine (single-process torch, pipelined torch, vLLM) implements `Engine`, so the
miner's worker loop and the verifier's scorer never care which one runs underneath.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from market.errors import QuarryError
from market.protocol.commitments import ChunkCheck
from market.protocol.requests import find_stop


class SamplingError(QuarryError):
    """A request's sampling parameters, or a sampling test's, are invalid."""


@dataclass(frozen=True)
class GreedyTest:
    """The parameters of the greedy token test (`verifier.scoring` states its model):
    `beta`, the Gumbel scale in nats that dominates the honest miner's accumulated numeric
    error beyond rounding; `roundings`, the mantissa widths the logits were rounded to on
    each side (the miner's declared precision and the verifier's: 7 for bf16, 10 for fp16,
    23 for fp32), each of whose rounding is forgiven in full; `exponents`, the fixed grid
    of alternatives (noise scales beta / e, e < 1)."""

    beta: float
    roundings: tuple[int, ...]
    exponents: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise SamplingError(f"greedy beta must be a positive number, got {self.beta!r}")
        if not self.exponents or any(not 0 < e < 1 for e in self.exponents):
            raise SamplingError(f"greedy exponents must be in (0, 1), got {self.exponents!r}")


@dataclass(frozen=True)
class SupportTest:
    """The sampled test's alternatives aimed at how outputs end and where tokens come from
    (`verifier.scoring` states the model), each a mixture q' = (1 - lam) q + lam r of the
    honest next-token distribution q with a distribution r it puts inside q's support, so
    that q'(y) / q(y) has expectation exactly 1 under honest sampling:

    - `stops`, pairs (c, lam): at a position whose stop mass s (q of the stop tokens) is at
      least c, r is q cut to the stop tokens (a miner that ends where an end was likely
      rather than where one was drawn); elsewhere the factor is 1.
    - `top_ks`, pairs (k, lam): r is q cut to its k most likely tokens (top-k sampling, or
      any sampler that drops the tail)."""

    stops: tuple[tuple[float, float], ...] = ()
    top_ks: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for c, lam in self.stops:
            if not (0 < c <= 1 and 0 < lam < 1):
                raise SamplingError(f"a stop alternative needs 0 < c <= 1 and 0 < lam < 1, "
                                    f"got {(c, lam)!r}")
        for k, lam in self.top_ks:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not 0 < lam < 1:
                raise SamplingError(f"a top-k alternative needs an integer k >= 1 and "
                                    f"0 < lam < 1, got {(k, lam)!r}")

    @property
    def width(self) -> int:
        return len(self.stops) + len(self.top_ks)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete. `temperature == 0` means greedy; `seed` makes sampling repeatable;
    `stop` holds the request's stop strings (`market.protocol.requests.find_stop`)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class GenerationOutput:
    """The completion: exact token ids (what receipts hash), text, and each token's logprob.

    A stop string ends generation at the first token after which the decoded ids contain
    one; that token may reach past the stop string (or end inside it). The output then keeps
    every generated id up to and including that token (so `completion_tokens`, the receipt's
    token count, is what was computed and the verifier's token test sees every sampled
    token), while `text` is the decoded ids cut before the stop string (OpenAI's text).
    `text_for` below is that rule, shared with the verifier.
    """

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens)
    # The output's activation commitment (`market.protocol.commitments`), from engines that
    # can see their hidden states; b"" from the others.
    commitment: bytes = b""


def text_for(
    decode: Callable[[Sequence[int]], str], token_ids: Sequence[int], stop: Sequence[str]
) -> tuple[str, bool]:
    """(text, stopped): the decoded ids, cut before the earliest stop string when they
    contain one (`stopped`). Engines call it after each token of a request with stop
    strings and stop when `stopped`; verifiers call it to check an output the same way.
    The whole output is decoded each time (not just the new token) because a token's text
    can depend on its neighbours (a character split across byte tokens)."""
    text = decode(token_ids)
    if not stop:
        return text, False
    pos = find_stop(text, stop)
    return (text, False) if pos is None else (text[:pos], True)


@dataclass(frozen=True)
class ScoreResult:
    """Teacher-forced log-probabilities of `output_ids` given the prompt."""

    logprobs: tuple[float, ...]
    argmax_ids: tuple[int, ...] = field(default=())
    # From `Engine.evidence` only: each position's largest logprob (so logprob(argmax) -
    # logprob(token) is the margin by which a greedy token lost), and for a sampled row the
    # log likelihood ratios summed over its positions, one per exponent and then one per
    # `SupportTest` alternative (`sampling.likelihood_ratios`).
    top_logprobs: tuple[float, ...] = field(default=())
    log_ratios: tuple[float, ...] = field(default=())
    # For a sampled row with top_p < 1: how far beyond this engine's nucleus' edge each
    # position's token lies, in logit nats (`sampling.edge_distances`; 0 inside).
    edge_distances: tuple[float, ...] = field(default=())
    # From `Engine.evidence` given a greedy test, for a greedy row: its log likelihood
    # ratios summed over its positions, one per alternative (`sampling.greedy_ratios`).
    greedy_log_ratios: tuple[float, ...] = field(default=())
    # From `Engine.evidence` given the output's activation commitment: how far each of its
    # chunks is from this engine's own hidden states (`commitments.check`).
    commitment_checks: tuple[ChunkCheck, ...] = field(default=())

    @property
    def total_logprob(self) -> float:
        return float(sum(self.logprobs))

    @property
    def perplexity(self) -> float:
        if not self.logprobs:
            return 1.0
        return math.exp(-self.total_logprob / len(self.logprobs))


class Engine(ABC):
    """Batched generation and scoring over one loaded model."""

    commit: bool = False
    """Whether `generate` fills each output's `commitment` (TorchEngine does unless built with
    `commit=False`); a miner skips tasks that require commitments when its engine makes none."""

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Complete every request; outputs are in request order."""

    @abstractmethod
    def score(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[ScoreResult]:
        """One teacher-forced forward pass per batch: logprob of each output token."""

    def evidence(
        self,
        prompt_ids: Sequence[Sequence[int]],
        output_ids: Sequence[Sequence[int]],
        sampling: Sequence[tuple[float, float]],
        exponents: Sequence[float],
        commitments: Sequence[bytes] | None = None,
        greedy: GreedyTest | None = None,
        support: SupportTest | None = None,
    ) -> list[ScoreResult]:
        """`score` plus what a verifier's statistical tests need from the full next-token
        distribution: `top_logprobs` at every position; for each row whose
        (temperature, top_p) in `sampling` samples, its `log_ratios` for `exponents` (and
        then `support`'s alternatives, over this engine's stop tokens); for
        each greedy row, with `greedy`, its `greedy_log_ratios`; and for each row whose
        entry of `commitments` is not empty, its `commitment_checks`."""
        raise QuarryError(f"{type(self).__name__} cannot compute verification evidence (it "
                          "needs every token's probability); verifiers score with TorchEngine")

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Release processes and memory; engines holding none need not override."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
