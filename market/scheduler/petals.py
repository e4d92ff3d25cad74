"""A PETALS-like baseline: PETALS' own block placement, cache reservation and routing.

Modelled on PETALS' server and client code (petals.server.server, block_selection,
client.routing.sequence_manager), which Sun et al. compare against:

- Block count: floor((M - 2 GiB autograd reserve) / (s_m + attention cache per block)),
  where the cache per block is a fixed reservation for ATTN_CACHE_TOKENS = 4096 tokens
  (2 * d_model * 4096 * dtype bytes). It does not depend on how many sessions will run at
  once, which is the root cause Sun et al. identify: on an A100-80GB with BLOOM-176B in NF4
  it gives 53 blocks and a cache pool for only 4096 / (l_in + l_max) sessions.
- Servers join one at a time (random order unless given) and each takes the window of
  blocks whose sorted per-block throughput coverage is lexicographically least (the most
  under-served span), ties to the smallest start.
- Server throughput (PETALS' rule): min(forward_rps / ((m + 1) / 2), network_rps).
  forward_rps = FORWARD_TOKENS_PER_STEP / tau_j, calibrated so that it reproduces the
  forward_rps PETALS measured for A100 and MIG 1g slices (20829 and 2757 rps in the
  authors' throughput file, tau 2.22 and 16.25 ms: about 46 tokens per decode-step time);
  network_rps = bandwidth / (hidden_size * 2 bytes) over the server's fastest link.
- Routing (min-latency mode): Dijkstra over (server, block) nodes with edge weights
  rtt/2 + 18 ms serialization per hop, 1 / inference_rps (= tau_j) per block, and a 10 s
  penalty on entering a server whose free cache is below l_in + l_max tokens for its whole
  span. Server-to-server hops use the server-to-server RTT, as PETALS does, although the
  client actually relays every embedding: the heuristic weights are not the real time.
  It ignores how long a full server would make the request wait.
- When a chosen chain cannot allocate its caches the client retries with PETALS' binary
  exponential backoff, 1, 2, 4, ... seconds capped at 60 (see simulator.PetalsPolicy).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from market.errors import QuarryError
from market.scheduler import routing
from market.scheduler.cluster import Cluster, Placement, Server

ATTN_CACHE_TOKENS = 4096
AUTOGRAD_BYTES = 2 * 1024**3
FORWARD_TOKENS_PER_STEP = 46.0
ALLOC_DELAY_S = 10.0
OVERHEAD_DELAY_S = 0.018
MAX_DELAY_S = 5.0
MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


def _cache_bytes_per_token(cluster: Cluster) -> int:
    m = cluster.model
    return m.kv_bytes_per_token_per_layer or 2 * m.hidden_size * m.dtype_bytes


def block_count(cluster: Cluster, server: Server) -> int:
    """PETALS' `_choose_num_blocks`: memory left after the autograd reserve, per block + cache."""
    per_block = cluster.model.bytes_per_layer + _cache_bytes_per_token(cluster) * ATTN_CACHE_TOKENS
    if per_block <= 0:
        raise QuarryError(f"model {cluster.model.name!r} has no block size")
    n = (server.memory_bytes - AUTOGRAD_BYTES) // per_block
    return int(max(0, min(n, cluster.model.num_layers)))


def cache_budgets(cluster: Cluster, placement: Placement) -> dict[str, int]:
    """PETALS' fixed attention-cache pool per server: m_j blocks x 4096 tokens of K and V."""
    per_block = _cache_bytes_per_token(cluster) * ATTN_CACHE_TOKENS
    return {name: (e - s) * per_block for name, (s, e) in placement.ranges.items()}


def _best_bandwidth(cluster: Cluster, name: str) -> float:
    bws = [lk.bandwidth_bytes_per_s for (a, b), lk in cluster.links.items() if name in (a, b)]
    bws += [lk[name].bandwidth_bytes_per_s for lk in cluster.clients.values() if name in lk]
    return max(bws) if bws else cluster.default_link.bandwidth_bytes_per_s


def throughput(cluster: Cluster, server: Server, blocks: int) -> float:
    """PETALS' announced server throughput (requests/s) for `blocks` hosted blocks."""
    forward_rps = FORWARD_TOKENS_PER_STEP / server.decode_s_per_block
    network_rps = _best_bandwidth(cluster, server.name) / max(1, cluster.model.hidden_size * 2)
    return min(forward_rps / ((blocks + 1) / 2), network_rps)


def choose_best_blocks(coverage: Sequence[float], blocks: int) -> int:
    """PETALS' `choose_best_blocks`: start of the window with least sorted coverage."""
    L = len(coverage)
    if not 1 <= blocks <= L:
        raise QuarryError(f"cannot choose {blocks} blocks out of {L}")
    return min(range(L - blocks + 1), key=lambda a: (sorted(coverage[a : a + blocks]), a))


def place(
    cluster: Cluster,
    concurrency: int = 0,
    l_in: int = 20,
    l_max: int = 128,
    *,
    order: Sequence[str] | None = None,
    seed: int | None = None,
) -> Placement:
    """PETALS placement: servers join in `order` (or a `seed`ed shuffle, or cluster order).

    `concurrency`, `l_in` and `l_max` are accepted for call compatibility with `cgbp.place`
    and ignored: PETALS sizes its cache for 4096 tokens whatever the load.
    """
    del concurrency, l_in, l_max
    names = [s.name for s in cluster.servers]
    if order is not None:
        if sorted(order) != sorted(names):
            raise QuarryError("PETALS join order must list every server exactly once")
        names = list(order)
    elif seed is not None:
        random.Random(seed).shuffle(names)
    L = cluster.model.num_layers
    coverage = [0.0] * L
    ranges: dict[str, tuple[int, int]] = {}
    for name in names:
        srv = cluster.server(name)
        m = block_count(cluster, srv)
        if m == 0:
            continue
        a = choose_best_blocks(coverage, m)
        thr = throughput(cluster, srv, m)
        for b in range(a, a + m):
            coverage[b] += thr
        ranges[name] = (a, a + m)
    return Placement(ranges=ranges, algorithm="petals")


def _client_rtt(cluster: Cluster, client: str | None, server: str) -> float:
    return max(lk.rtt_s for lk in routing.client_links(cluster, client, server))


def _delay(rtt: float) -> float:
    return min(rtt / 2, MAX_DELAY_S)


def route(
    cluster: Cluster,
    placement: Placement,
    client: str | None,
    free_slots: Mapping[str, int] | None = None,
) -> list[routing.Hop]:
    """PETALS' min-latency chain (`_make_sequence_with_min_latency`), as hops.

    `free_slots[j]` is how many (session, block) caches server j can still allocate; a
    server with fewer than its span length gets the 10 s allocation penalty.
    """
    L = cluster.model.num_layers
    spans = {n: r for n, r in placement.ranges.items() if r[1] > r[0]}
    for n in spans:
        cluster.server(n)

    def penalty(name: str) -> float:
        if free_slots is None:
            return 0.0
        s, e = spans[name]
        return 0.0 if free_slots.get(name, 0) >= e - s else ALLOC_DELAY_S

    start, end = ("", -1), ("", L + 1)
    adj: dict[tuple[str, int], list[tuple[tuple[str, int], float]]] = {}

    def edge(u: tuple[str, int], v: tuple[str, int], w: float) -> None:
        adj.setdefault(u, []).append((v, w))

    for name, (s, e) in sorted(spans.items()):
        if s == 0:
            edge(
                start,
                (name, 0),
                _delay(_client_rtt(cluster, client, name)) + OVERHEAD_DELAY_S + penalty(name),
            )
        if e == L:
            edge((name, L), end, _delay(_client_rtt(cluster, client, name)))
        tau = cluster.server(name).decode_s_per_block
        for b in range(s, e):
            edge((name, b), (name, b + 1), tau)
    for cur, (_, ce) in sorted(spans.items()):
        if ce >= L:
            continue
        for nxt, (ns, ne) in sorted(spans.items()):
            if nxt != cur and ns <= ce < ne:
                w = _delay(cluster.rtt(cur, nxt)) + OVERHEAD_DELAY_S + penalty(nxt)
                edge((cur, ce), (nxt, ce), w)

    found = routing.least_cost_path(start, end, lambda u: adj.get(u, []))
    if found is None:
        missing = routing.uncovered_blocks(cluster, placement)
        raise QuarryError(f"PETALS routing found no chain: blocks {missing[:10]} are on no server")
    nodes = found[0][1:-1]
    hops: list[routing.Hop] = []
    for name, b in nodes:
        if hops and hops[-1][0] == name:
            hops[-1] = (name, hops[-1][1], b)
        else:
            hops.append((name, b, b))
    return [h for h in hops if h[2] > h[1]]


def backoff_s(attempt: int) -> float:
    """Delay before retry number `attempt` (1-based): 1, 2, 4, ... capped at 60 s."""
    return min(MIN_BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S)
