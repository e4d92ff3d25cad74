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
from collections.abc import Collection, Sequence

import torch

from market.engine.base import GenerationRequest, GreedyTest, SamplingError, SupportTest
from market.protocol.errors import RequestError
from market.protocol.requests import stop_strings

SEED_MODULUS = 1 << 64


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
    if not isinstance(request.stop, tuple):
        raise SamplingError(f"{where}stop must be a tuple of strings, got {request.stop!r}")
    try:
        stop_strings(list(request.stop) or None)  # the protocol's limits on body.stop
    except RequestError as exc:
        raise SamplingError(f"{where}{exc}") from exc


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for one request; seeds are taken modulo 2**64 (negatives allowed)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) % SEED_MODULUS)
    return gen


def make_generators(requests: Sequence[GenerationRequest]) -> list[torch.Generator | None]:
    """One fresh generator per sampled request (None for greedy ones), in request order."""
    return [None if r.greedy else make_generator(r.seed) for r in requests]


def _nucleus(sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which of the probabilities (sorted descending, float64, along the last dim) are in
    the top_p nucleus: the most likely token always, then every token whose mass strictly
    above it is still under top_p."""
    before = torch.cumsum(sorted_p, -1) - sorted_p  # mass strictly above each token
    keep = before < top_p
    keep[..., 0] = True
    return keep


def _sorted_probs(logits: torch.Tensor, temperature: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities sorted descending in float64, their token ids), both on the CPU, for
    rows of `logits` [..., V]: the float32 softmax of logits / temperature, stable-sorted as
    `_sample_row` sorts it (so the nucleus comes out the same)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    return sorted_p.to("cpu", torch.float64), order.to("cpu")


def edge_distances(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                   top_p: float) -> torch.Tensor:
    """How far beyond the top_p nucleus' edge each target y of `targets` [N] lies under
    logits [N, V], in raw logit nats (float64 [N]; 0 for a token inside the nucleus).

    With s the tempered log-probabilities and g >= 0 a slack (tempered nats), call y
    *g-inside* when the tokens whose s exceeds s(y) by more than g hold less than
    top_p * e^g of the mass. 0-inside is `_nucleus`'s rule (mass sorted before y under
    top_p, up to ties). The distance is T times the least g for which y is g-inside:
    min over the positions j up to y's in the stable sort of max(s_j - s(y),
    log(C_j / top_p)), C_j the mass sorted before j. A miner whose logits differ from these
    by at most delta around a common shift keeps every token it may draw within 2 delta:
    the tokens more than 2 delta / T above y were above y for it too, so they held under
    top_p of its mass, and at most e^(2 delta / T) times that of this one."""
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise SamplingError(f"logits must be [N, V] and targets [N], got "
                            f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise SamplingError(f"edge distances need a sampled request (temperature > 0, "
                            f"top_p in (0, 1]), got {temperature!r}, {top_p!r}")
    sorted_p, order = _sorted_probs(logits, temperature)
    logq = torch.log_softmax(logits.to("cpu", torch.float64) / temperature, dim=-1)
    s_sorted = logq.gather(1, order)
    rank = (order == targets.to("cpu")[:, None]).to(torch.int64).argmax(dim=-1, keepdim=True)
    gap = s_sorted - s_sorted.gather(1, rank)
    before = (torch.cumsum(sorted_p, -1) - sorted_p).clamp(min=0.0)
    need = torch.maximum(gap, torch.log(before / top_p))
    positions = torch.arange(need.shape[1]).expand_as(need)
    need = torch.where(positions <= rank, need, torch.full_like(need, math.inf))
    return need.min(dim=-1).values.clamp(min=0.0) * temperature


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a sampled step draws from for one row of `logits` [V], by token id:
    softmax of logits / temperature cut to the top_p nucleus (chosen as `_sample_row` and
    `likelihood_ratios` choose it) and renormalised, in float64 as `likelihood_ratios`
    weighs it."""
    exact = torch.softmax(logits.to("cpu", torch.float64) / temperature, dim=-1)
    if top_p >= 1.0:  # no nucleus (as in likelihood_ratios)
        return exact
    sorted_p, order = _sorted_probs(logits, temperature)
    keep = _nucleus(sorted_p, top_p)
    out = torch.zeros_like(exact)
    kept = order[keep]
    out[kept] = exact[kept]
    return out / out.sum()


def _sample_row(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
) -> int:
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    sorted_p = sorted_p.to("cpu", torch.float64)
    if top_p < 1.0:
        sorted_p = sorted_p * _nucleus(sorted_p, top_p)
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
    ids = choose_next(logits, requests, generators)
    return ids, chosen_logprobs(logits, ids)


def choose_next(
    logits: torch.Tensor,
    requests: Sequence[GenerationRequest],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """`select_next`'s token ids alone: a decode loop that keeps its steps' logits takes
    their logprobs later, many steps in one `chosen_logprobs` call."""
    if logits.dim() != 2:
        raise SamplingError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    batch = logits.shape[0]
    if len(requests) != batch or len(generators) != batch:
        raise SamplingError(
            f"{batch} logit rows but {len(requests)} requests and {len(generators)} generators"
        )
    raw = logits.float()
    ids = torch.argmax(raw, dim=-1)
    for row, request in enumerate(requests):
        if request.greedy:
            continue
        gen = generators[row]
        if gen is None:
            raise SamplingError(f"row {row} samples (temperature > 0) but has no generator")
        ids[row] = _sample_row(raw[row], float(request.temperature), float(request.top_p), gen)
    return ids


def chosen_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The untempered logprob [B] of token `ids[i]` under row i of `logits` [B, V]. Each
    row's value does not depend on the other rows, so rows of many steps stacked give
    each step's own values."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)


def likelihood_ratios(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    top_p: float,
    exponents: Sequence[float],
    support: SupportTest | None = None,
    stop_ids: Collection[int] = (),
) -> torch.Tensor:
    """Per-position log likelihood ratios of `targets` [N] under logits [N, V]: column k is
    log q_k(y) - log q(y), where q is the distribution `select_next` samples from (softmax
    of logits / temperature, cut to the top_p nucleus exactly as `_sample_row` cuts it) and
    q_k is proportional to q ** exponents[k] on the same nucleus (the same model sampled at
    temperature / exponents[k]). So that entry is (e - 1) log q(y) - log sum_v q(v) ** e.

    Under honest sampling every column has expectation exp(.) = 1 at every position, which
    is what makes products of them e-values (verifier.evidence). A target outside the
    nucleus (probability 0 under honest sampling, so its factor cannot change that
    expectation) is judged against the untruncated tempered distribution instead, so a
    float32 rounding difference at the nucleus edge on another accelerator cannot make an
    infinite ratio. With `support`, its alternatives (over the stop tokens `stop_ids`)
    follow as further columns, log q'(y) - log q(y) on the same q (`_support_ratios`).
    Computed in float64 on the CPU; returns [N, len(exponents) + support.width].
    """
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise SamplingError(f"logits must be [N, V] and targets [N], got "
                            f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if not temperature > 0:
        raise SamplingError(f"likelihood ratios need a sampled request (temperature > 0), "
                            f"got {temperature!r}")
    exps = torch.tensor([float(e) for e in exponents], dtype=torch.float64)
    if exps.numel() == 0 or bool((exps <= 0).any()):
        raise SamplingError(f"exponents must be positive numbers, got {list(exponents)!r}")
    targets = targets.to("cpu")
    logq_full = torch.log_softmax(logits.to("cpu", torch.float64) / temperature, dim=-1)
    stops = torch.zeros(logq_full.shape[1], dtype=torch.bool)
    if support is not None and support.stops and stop_ids:
        stops[torch.tensor(sorted(stop_ids), dtype=torch.long)] = True
    width = exps.numel() + (support.width if support is not None else 0)

    def ratios(lq: torch.Tensor, ys: torch.Tensor, stop_mask: torch.Tensor) -> torch.Tensor:
        cols = _tempered_ratios(lq, ys, exps)
        if support is None or not support.width:
            return cols
        return torch.cat([cols, _support_ratios(lq, ys, stop_mask, support)], dim=1)

    if top_p >= 1.0:  # no nucleus: every token inside, and no order to sort into
        return ratios(logq_full, targets, stops.expand_as(logq_full))
    sorted_p, order = _sorted_probs(logits, temperature)  # what _sample_row sorts
    logq_sorted = logq_full.gather(1, order)
    keep = _nucleus(sorted_p, top_p)
    positions = torch.arange(order.shape[1]).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)  # token id -> sorted position
    target_rank = rank.gather(1, targets[:, None]).squeeze(1)
    inside = keep.gather(1, target_rank[:, None]).squeeze(1)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    logq_nucleus = torch.where(keep, logq_sorted, neg_inf)
    logq_nucleus = logq_nucleus - torch.logsumexp(logq_nucleus, dim=-1, keepdim=True)
    stops_sorted = stops[order]
    out = torch.empty((targets.shape[0], width), dtype=torch.float64)
    for table, rows in ((logq_nucleus, inside), (logq_sorted, ~inside)):
        if bool(rows.any()):
            out[rows] = ratios(table[rows], target_rank[rows], stops_sorted[rows])
    return out


def _support_ratios(lq: torch.Tensor, targets: torch.Tensor, stop_mask: torch.Tensor,
                    test: SupportTest) -> torch.Tensor:
    """log q'(y) - log q(y) for each of `test`'s alternatives (`SupportTest`), for each row
    of log q `lq` [n, V] (-inf outside the support), target column `targets` [n] and stop
    columns `stop_mask` [n, V]. Each is log((1 - lam) + lam / m) when y lies in the set r
    is cut to (m: its mass under q), else log(1 - lam); a stop alternative is 0 where the
    stop mass is under its c."""
    q = lq.exp()
    cols = []
    if test.stops:
        mass = (q * stop_mask).sum(-1)
        is_stop = stop_mask.gather(1, targets[:, None]).squeeze(1)
        for c, lam in test.stops:
            hit = torch.log((1 - lam) + lam / mass.clamp(min=1e-300))
            factor = torch.where(is_stop, hit, torch.full_like(hit, math.log(1 - lam)))
            cols.append(torch.where(mass >= c, factor, torch.zeros_like(factor)))
    for k, lam in test.top_ks:
        # The k most likely tokens, ties at the k-th included: {v : q(v) >= k-th largest}.
        kth = torch.topk(lq, min(k, lq.shape[1]), dim=-1).values[:, -1:]
        top = lq >= kth
        mass = (q * top).sum(-1)
        inside = top.gather(1, targets[:, None]).squeeze(1)
        hit = torch.log((1 - lam) + lam / mass)
        cols.append(torch.where(inside, hit, torch.full_like(hit, math.log(1 - lam))))
    return torch.stack(cols, dim=1)


def _tempered_ratios(lq: torch.Tensor, targets: torch.Tensor, exps: torch.Tensor
                     ) -> torch.Tensor:
    """(e - 1) log q(y) - log sum_v q(v) ** e for each row of log q `lq` [n, V] (-inf
    outside the support), target column `targets` [n] and exponent e of `exps`."""
    ly = lq.gather(1, targets[:, None])  # [n, 1]
    log_z = torch.stack([torch.logsumexp(lq * e, dim=-1) for e in exps.tolist()], -1)
    return (exps[None, :] - 1.0) * ly - log_z


def rounding_slack(logits: torch.Tensor, test: GreedyTest) -> torch.Tensor:
    """How far rounding may move each logit, summed over the test's roundings."""
    total = torch.zeros_like(logits)
    for bits in test.roundings:
        total += half_ulp(logits, bits)
    return total


def half_ulp(logits: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """Half the spacing of floats with `mantissa_bits` at each logit: the most rounding to
    that format can move it."""
    exponent = torch.floor(torch.log2(logits.abs().clamp(min=2.0 ** -14)))
    return torch.exp2(exponent - mantissa_bits - 1)


def forgiven_gaps(logits: torch.Tensor, test: GreedyTest) -> torch.Tensor:
    """Each token's gap below the argmax after forgiving both logits' rounding,
    max(0, l_a - l_j - slack(l_a) - slack(l_j)), in float64 [N, V]; 0 at the argmax and
    at every token tied with it within rounding."""
    raw = logits.to("cpu", torch.float64)
    top, arg = raw.max(dim=-1, keepdim=True)
    gap = (top - raw - rounding_slack(raw, test) - rounding_slack(top, test)).clamp(min=0.0)
    return gap.scatter_(1, arg, 0.0)


def greedy_ratios(logits: torch.Tensor, targets: torch.Tensor, test: GreedyTest
                  ) -> torch.Tensor:
    """Per-position log likelihood ratios of greedy `targets` [N] under the reference
    `logits` [N, V]: column k is log q_k(y) - log p(y), where p is the honest bound
    (softmax of -g'/beta over the `forgiven_gaps` g') and q_k the same at noise scale
    beta / exponents[k]; tokens within rounding of the argmax tie with it. Computed in
    float64 on the CPU; returns [N, len(exponents)]."""
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise SamplingError(f"logits must be [N, V] and targets [N], got "
                            f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    base = -forgiven_gaps(logits, test) / test.beta
    y = targets.to("cpu")[:, None]
    out = torch.empty((base.shape[0], len(test.exponents)), dtype=torch.float64)
    log_p = base.gather(1, y).squeeze(1) - torch.logsumexp(base, dim=-1)
    for k, e in enumerate(test.exponents):
        scaled = base * e
        out[:, k] = scaled.gather(1, y).squeeze(1) - torch.logsumexp(scaled, dim=-1) - log_p
    return out
