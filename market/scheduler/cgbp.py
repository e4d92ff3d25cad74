"""CG-BP: Sun et al.'s Conservative Greedy Block Placement (Alg. 1 lines 1-8, Alg. 2).

1. Conservative block count m_j = min(floor(M_j / (s_m + s_c |R|)), L): every server keeps
   room for the attention caches of all |R| concurrent sessions on every block it holds.
2. Amortised time tt_j = tau_j + t*_j / m_j (eq. 14), t*_j the worst client's per-token RTT.
3. Servers in increasing tt_j each take a window of m_j blocks: while some block has
   capacity C_b < |R|, the window (with at least one such block) of largest total T_b; after
   that, the window whose sorted capacities are lexicographically least. Ties go to the
   smallest start, as Lemma 3.3 assumes.

Choices where the paper is silent: servers with equal tt_j are taken in name order; the
dummy server's time tt_0 is 2 * max tt_j + 1 (any value above every tt_j gives the same
placement); servers whose m_j is 0 (they cannot hold one block plus |R| caches) get nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from market.errors import QuarryError
from market.scheduler import routing
from market.scheduler.cluster import Cluster, Placement


@dataclass
class CGBPPlan:
    """Everything CG-BP computed, for reports and tests."""

    placement: Placement
    concurrency: int
    blocks: dict[str, int]  # m_j
    amortised: dict[str, float]  # tt_j
    sessions: dict[str, int]  # f_j, eq. (15)
    order: list[str]  # servers by increasing tt_j (those with m_j > 0)
    capacity: list[int]  # C_b after placement


def block_counts(cluster: Cluster, concurrency: int, l_in: int, l_max: int) -> dict[str, int]:
    """Step 1: m_j = min(floor(M_j / (s_m + s_c |R|)), L)."""
    if concurrency < 1:
        raise QuarryError(f"concurrency |R| must be >= 1, got {concurrency}")
    L = cluster.model.num_layers
    s_m = cluster.model.bytes_per_layer
    if L < 1 or s_m <= 0:
        raise QuarryError(
            f"model {cluster.model.name!r} needs num_layers >= 1 and bytes_per_layer > 0"
        )
    s_c = routing.cache_bytes_per_block(cluster, l_in, l_max)
    return {
        s.name: min(max(0, s.memory_bytes) // (s_m + s_c * concurrency), L) for s in cluster.servers
    }


def amortised_times(
    cluster: Cluster, blocks: dict[str, int], client: str | None = None
) -> dict[str, float]:
    """Eq. (14): tt_j = tau_j + t*_j / m_j for every server with m_j > 0."""
    return {
        s.name: s.decode_s_per_block + routing.token_rtt(cluster, client, s.name) / blocks[s.name]
        for s in cluster.servers
        if blocks.get(s.name, 0) > 0
    }


def max_concurrency(cluster: Cluster, l_in: int, l_max: int) -> int:
    """Largest |R| for which CG-BP covers every block, condition (18) (0 if even 1 fails)."""
    L = cluster.model.num_layers

    def ok(r: int) -> bool:
        return sum(block_counts(cluster, r, l_in, l_max).values()) >= L

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 40:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def plan(
    cluster: Cluster, concurrency: int, l_in: int, l_max: int, client: str | None = None
) -> CGBPPlan:
    """Run CG-BP and keep its intermediate values."""
    L = cluster.model.num_layers
    R = concurrency
    m = block_counts(cluster, R, l_in, l_max)
    if sum(m.values()) < L:
        r_max = max_concurrency(cluster, l_in, l_max)
        raise QuarryError(
            f"CG-BP cannot place {L} blocks for |R|={R} concurrent sessions "
            f"(servers hold {sum(m.values())} blocks in total); the largest feasible |R| here "
            f"is {r_max}"
        )
    s_m = cluster.model.bytes_per_layer
    s_c = routing.cache_bytes_per_block(cluster, l_in, l_max)
    tt = amortised_times(cluster, m, client)
    order = sorted(tt, key=lambda n: (tt[n], n))
    f = {n: (cluster.server(n).memory_bytes - s_m * m[n]) // (s_c * m[n]) for n in order}
    tt0 = 2 * max(tt.values()) + 1.0
    C = [0] * L
    T = [tt0 * R] * L
    ranges: dict[str, tuple[int, int]] = {}
    for name in order:
        mj = m[name]
        starts = range(0, L - mj + 1)
        if any(c < R for c in C):
            best, best_sum = -1, -math.inf
            for a in starts:
                if not any(C[b] < R for b in range(a, a + mj)):
                    continue
                total = sum(T[a : a + mj])
                if total > best_sum:
                    best, best_sum = a, total
            a_j = best
        else:
            a_j = min(starts, key=lambda a: (sorted(C[a : a + mj]), a))
        for b in range(a_j, a_j + mj):
            T[b] -= (tt0 - tt[name]) * min(max(R - C[b], 0), f[name])
            C[b] += f[name]
        ranges[name] = (a_j, a_j + mj)
    placement = Placement(ranges=ranges, algorithm="cg-bp")
    return CGBPPlan(placement, R, m, tt, f, order, C)


def place(cluster: Cluster, concurrency: int, l_in: int, l_max: int) -> Placement:
    """CG-BP block placement for |R| = `concurrency` sessions of l_in + l_max tokens."""
    return plan(cluster, concurrency, l_in, l_max).placement


def upper_bound(
    cluster: Cluster,
    concurrency: int,
    l_in: int,
    l_max: int,
    client: str | None = None,
    *,
    averaged: bool = False,
) -> float:
    """Theorem 3.5, eq. (17): T <= sum_{j<=K} tt_j m_j - tau_K (sum_{j<=K} m_j - L).

    K is the number of fastest servers (by tt_j) whose blocks first reach L; they tile the
    model (Lemma 3.3), and the bound is that chain's cost for the worst client. It holds for
    the decode per-token time (eq. 4) under shortest-path routing while at most |R|
    sessions run. With `averaged=True` the per-server times are redefined as in eq. (8),
    the average over all l_max tokens including the prefill, which is what WS-RR optimises
    and what the simulator reports as the per-token time; the same argument gives the bound
    sum_{j<=K} (t'*_j + tau'_j m_j) - tau'_K (sum_{j<=K} m_j - L).
    """
    p = plan(cluster, concurrency, l_in, l_max, client)
    L = cluster.model.num_layers
    total_m, bound = 0, 0.0
    for name in p.order:
        srv = cluster.server(name)
        m = p.blocks[name]
        if averaged:
            links: list[str | None] = (
                [client] if client is not None else (list(cluster.clients) or [None]))
            t_star = max(
                (
                    routing.prompt_rtt(cluster, c, name, l_in)
                    + (l_max - 1) * routing.token_rtt(cluster, c, name)
                )
                / l_max
                for c in links
            )
            tau = (srv.prefill_s_per_block + (l_max - 1) * srv.decode_s_per_block) / l_max
        else:
            t_star = routing.token_rtt(cluster, client, name)
            tau = srv.decode_s_per_block
        total_m += m
        bound += t_star + tau * m
        if total_m >= L:
            return bound - tau * (total_m - L)
    raise QuarryError("CG-BP placement does not cover the model")  # plan() already checked


def target_concurrency(
    cluster: Cluster, rate_per_s: float, l_in: int, l_max: int, client: str | None = None
) -> int:
    """The paper's configuration of |R|: mean + 1 std of arrivals during one request.

    One request's duration is estimated without waiting, on CG-BP's placement for |R| = 1
    with shortest-path routing; arrivals are Poisson, so std = sqrt(mean). The result is
    capped at the largest feasible |R| (condition 18) and is at least 1.
    """
    if rate_per_s < 0:
        raise QuarryError(f"request rate must be >= 0, got {rate_per_s}")
    r_max = max_concurrency(cluster, l_in, l_max)
    if r_max < 1:
        raise QuarryError(
            f"the cluster cannot hold {cluster.model.num_layers} blocks plus one session's caches"
        )
    p1 = place(cluster, 1, l_in, l_max)
    path, _ = routing.shortest_path(cluster, p1, client, l_max, l_in=l_in)
    duration = routing.request_time(cluster, path, client, l_in, l_max)
    mean = rate_per_s * duration
    return max(1, min(round(mean + math.sqrt(mean)), r_max))
