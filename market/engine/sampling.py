"""Next-token selection: the one place every torch engine (single-process, pipelined) picks tokens.

Rules, shared by miners and verifiers:

- The logprob recorded for a token is ALWAYS from the untempered model distribution
  (log_softmax of the raw logits at that step), whatever temperature or top_p sampled it.
  So teacher-forced `score()` of an output equals the sum of its recorded logprobs.
- Greedy (`temperature <= 0`): argmax of the logits (first index on ties).
- Sampling: logits / temperature, softmax, then the top_p nucleus (smallest set of the most
  likely tokens whose mass reaches top_p, stable-sorted by probability), renormalised, and
  one uniform draw from the request's own CPU `torch.Generator` mapped through the
  cumulative distribution (computed on the CPU in float64). One draw per sampled step and a
  generator per request mean the same seed gives the same sample whatever else is in the
  batch, and the random stream does not depend on the accelerator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from market.engine.base import GenerationRequest
from market.errors import QuarryError

SEED_MODULUS = 1 << 64


class SamplingError(QuarryError):
    """A request's sampling parameters are invalid."""


def validate_sampling(request: GenerationRequest, index: int | None = None) -> None:
    """Raise SamplingError naming the bad field of `request`."""
    where = f"request {index}: " if index is not None else ""
    t, p = request.temperature, request.top_p
    if not isinstance(t, int | float) or math.isnan(t) or math.isinf(t):
        raise SamplingError(f"{where}temperature must be a finite number, got {t!r}")
    if not isinstance(p, int | float) or math.isnan(p) or not 0.0 < p <= 1.0:
        raise SamplingError(f"{where}top_p must be in (0, 1], got {p!r}")
    if not isinstance(request.seed, int) or isinstance(request.seed, bool):
        raise SamplingError(f"{where}seed must be an integer, got {request.seed!r}")


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for one request; seeds are taken modulo 2**64 (negatives allowed)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) % SEED_MODULUS)
    return gen


def make_generators(requests: Sequence[GenerationRequest]) -> list[torch.Generator | None]:
    """One fresh generator per sampled request (None for greedy ones), in request order."""
    return [None if r.greedy else make_generator(r.seed) for r in requests]


def _sample_row(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
) -> int:
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    sorted_p = sorted_p.to("cpu", torch.float64)
    if top_p < 1.0:
        before = torch.cumsum(sorted_p, 0) - sorted_p  # mass strictly above each token
        keep = before < top_p
        keep[0] = True
        sorted_p = sorted_p * keep
    cum = torch.cumsum(sorted_p, 0)
    u = torch.rand((), generator=gen, dtype=torch.float64)
    idx = int(torch.searchsorted(cum, u * cum[-1], right=True))
    idx = min(idx, cum.numel() - 1)
    while sorted_p[idx] == 0 and idx > 0:  # u * total landed on the very end
        idx -= 1
    return int(order[idx])


def select_next(
    logits: torch.Tensor,
    requests: Sequence[GenerationRequest],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (token ids [B], logprobs [B]).

    `requests[i]` and `generators[i]` belong to row i; a sampled request needs its generator
    (from `make_generator(request.seed)`, kept across steps). Logprobs are untempered.
    """
    if logits.dim() != 2:
        raise SamplingError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    batch = logits.shape[0]
    if len(requests) != batch or len(generators) != batch:
        raise SamplingError(
            f"{batch} logit rows but {len(requests)} requests and {len(generators)} generators"
        )
    raw = logits.float()
    logprobs = torch.log_softmax(raw, dim=-1)
    ids = torch.argmax(raw, dim=-1)
    for row, request in enumerate(requests):
        if request.greedy:
            continue
        gen = generators[row]
        if gen is None:
            raise SamplingError(f"row {row} samples (temperature > 0) but has no generator")
        ids[row] = _sample_row(raw[row], float(request.temperature), float(request.top_p), gen)
    chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
    return ids, chosen
