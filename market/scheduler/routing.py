"""Sun et al.'s performance model and request routing (shortest path, WS-RR).

Performance model (paper eq. 1): a request from client c over a chain where server j runs
k_j blocks takes

    T = sum_j [t^I_cj + k_j tau^I_j] + (l_max - 1) * sum_j (t_cj + k_j tau_j)

Communication is client-centric: the client relays every embedding, so each hop costs one
client <-> server round trip. Choices where the paper is silent:

- t_cj (per-token RTT) = link RTT + one embedding each way over the link bandwidth
  (hidden_size * dtype_bytes bytes) + SERIALIZATION_S. t^I_cj is the same with l_in
  embeddings each way. SERIALIZATION_S = 18 ms is PETALS' own empirically measured
  serialization overhead (`overhead_delay` in its router); the paper's t_cj explicitly
  includes serialization.
- With `client=None` the worst case over the cluster's clients is used (t*_j, the quantity
  CG-BP's robust placement plans for); a cluster without clients uses `default_link`.
- Blocks are 0-based and ranges end-exclusive: the paper's rule (3),
  a_j <= a_i + m_i <= a_j + m_j - 1, reads start_j <= end_i < end_j here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TypeVar

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, Link, Placement, Server

N = TypeVar("N", str, tuple[str, int])  # graph nodes: server names, or (server, block)

SERIALIZATION_S = 0.018


@contextmanager
def serialization_overhead(seconds: float) -> Iterator[None]:
    """Temporarily use another per-message overhead (for sensitivity runs), then restore it."""
    global SERIALIZATION_S
    if seconds < 0:
        raise QuarryError(f"serialization overhead must be >= 0, got {seconds}")
    old, SERIALIZATION_S = SERIALIZATION_S, seconds
    try:
        yield
    finally:
        SERIALIZATION_S = old


Hop = tuple[str, int, int]  # (server name, first block, end block exclusive)
SOURCE = "<source>"
SINK = "<sink>"


# --------------------------------------------------------------------------- model helpers


def embedding_bytes(cluster: Cluster) -> int:
    """Bytes of one token's hidden state on the wire (falls back to the KV size / 2)."""
    m = cluster.model
    if m.hidden_size > 0:
        return m.hidden_size * m.dtype_bytes
    return max(1, m.kv_bytes_per_token_per_layer // 2)


def cache_bytes_per_block(cluster: Cluster, l_in: int, l_max: int) -> int:
    """s_c = 2 * d_model * (l_in + l_max) * dtype_bytes: one session's KV cache for one block."""
    if l_in < 0 or l_max < 1:
        raise QuarryError(f"invalid lengths l_in={l_in}, l_max={l_max}: need l_in >= 0, l_max >= 1")
    m = cluster.model
    per_token = m.kv_bytes_per_token_per_layer or 2 * m.hidden_size * m.dtype_bytes
    if per_token <= 0:
        raise QuarryError(
            f"model {m.name!r} has neither kv_bytes_per_token_per_layer nor hidden_size"
        )
    return per_token * (l_in + l_max)


def _transfer_s(link: Link, nbytes: float) -> float:
    if link.bandwidth_bytes_per_s <= 0:
        raise QuarryError(f"link bandwidth must be positive, got {link.bandwidth_bytes_per_s}")
    return 0.0 if math.isinf(link.bandwidth_bytes_per_s) else nbytes / link.bandwidth_bytes_per_s


def client_links(cluster: Cluster, client: str | None, server: str) -> list[Link]:
    """The client-to-server link(s) to evaluate: one client's, or every client's (worst case)."""
    if client is not None:
        if client not in cluster.clients:
            raise QuarryError(f"unknown client {client!r}; known: {sorted(cluster.clients)}")
        return [cluster.clients[client].get(server, cluster.default_link)]
    if not cluster.clients:
        return [cluster.default_link]
    return [links.get(server, cluster.default_link) for links in cluster.clients.values()]


def token_rtt(cluster: Cluster, client: str | None, server: str) -> float:
    """t_cj: one decode step's round trip between the client and server j (worst client if None)."""
    emb = embedding_bytes(cluster)
    return max(
        lk.rtt_s + 2 * _transfer_s(lk, emb) + SERIALIZATION_S
        for lk in client_links(cluster, client, server)
    )


def prompt_rtt(cluster: Cluster, client: str | None, server: str, l_in: int) -> float:
    """t^I_cj: the prefill round trip, carrying l_in hidden states each way."""
    emb = embedding_bytes(cluster) * max(l_in, 1)
    return max(
        lk.rtt_s + 2 * _transfer_s(lk, emb) + SERIALIZATION_S
        for lk in client_links(cluster, client, server)
    )


def feasible_hop(start_i: int, end_i: int, start_j: int, end_j: int) -> bool:
    """Rule (3): after server i (blocks [start_i, end_i)) the next block end_i is on server j.

    Server j then runs blocks [end_i, end_j): the first server on the chain that holds a block
    processes it, so j skips the blocks it shares with i.
    """
    del start_i
    return start_j <= end_i < end_j


def hop_blocks(path: Sequence[Hop]) -> int:
    return sum(end - start for _, start, end in path)


def validate_path(cluster: Cluster, placement: Placement, path: Sequence[Hop]) -> None:
    """Raise unless `path` runs blocks 0..L-1 in order on servers that hold them."""
    expect = 0
    for name, start, end in path:
        if name not in placement.ranges:
            raise QuarryError(f"path uses server {name!r} that holds no blocks")
        s, e = placement.ranges[name]
        if start != expect or not (s <= start < end <= e):
            raise QuarryError(f"hop {name}[{start},{end}) is not feasible after block {expect}")
        expect = end
    if expect != cluster.model.num_layers:
        raise QuarryError(f"path ends at block {expect}, model has {cluster.model.num_layers}")


def first_token_time(cluster: Cluster, path: Sequence[Hop], client: str | None, l_in: int) -> float:
    """sum_j t^I_cj + k_j tau^I_j: time to the first generated token (no waiting)."""
    total = 0.0
    for name, start, end in path:
        srv = cluster.server(name)
        total += prompt_rtt(cluster, client, name, l_in) + (end - start) * srv.prefill_s_per_block
    return total


def decode_token_time(cluster: Cluster, path: Sequence[Hop], client: str | None) -> float:
    """sum_j t_cj + k_j tau_j: time of each later token (paper eq. 4 summed over the chain)."""
    total = 0.0
    for name, start, end in path:
        srv = cluster.server(name)
        total += token_rtt(cluster, client, name) + (end - start) * srv.decode_s_per_block
    return total


def request_time(
    cluster: Cluster, path: Sequence[Hop], client: str | None, l_in: int, l_max: int
) -> float:
    """Paper eq. (1): the whole request, first token plus l_max - 1 decode steps."""
    return first_token_time(cluster, path, client, l_in) + (l_max - 1) * decode_token_time(
        cluster, path, client
    )


# --------------------------------------------------------------------------- graph + Dijkstra


def _spans(cluster: Cluster, placement: Placement) -> dict[str, tuple[int, int]]:
    L = cluster.model.num_layers
    spans: dict[str, tuple[int, int]] = {}
    for name, (s, e) in placement.ranges.items():
        if e <= s:
            continue
        if s < 0 or e > L:
            raise QuarryError(f"server {name!r} range [{s},{e}) is outside the model's {L} blocks")
        cluster.server(name)  # unknown names fail loudly
        spans[name] = (s, e)
    return spans


def feasible_edges(cluster: Cluster, placement: Placement) -> list[tuple[str, str, int, int]]:
    """Every feasible hop as (from, to, first block on `to`, end block): the routing DAG.

    `from` is SOURCE for the first hop; edges into SINK close chains that reach block L.
    """
    L = cluster.model.num_layers
    spans = sorted(_spans(cluster, placement).items())
    edges: list[tuple[str, str, int, int]] = []
    for j, (sj, ej) in spans:
        if feasible_hop(0, 0, sj, ej):
            edges.append((SOURCE, j, 0, ej))
    for i, (si, ei) in spans:
        if ei == L:
            edges.append((i, SINK, L, L))
            continue
        for j, (sj, ej) in spans:
            if j != i and feasible_hop(si, ei, sj, ej):
                edges.append((i, j, ei, ej))
    return edges


def least_cost_path(
    start: N, end: N, neighbours: Callable[[N], Iterable[tuple[N, float]]]
) -> tuple[list[N], float] | None:
    """Dijkstra from `start` to `end`: the node path (both ends included) and its cost, or None.

    The one shortest-path core for every router here (CG-BP/WS-RR and the PETALS baseline).
    Ties go to the smaller node in heap order, so results are deterministic.
    """
    dist: dict[N, float] = {start: 0.0}
    prev: dict[N, N] = {}
    heap: list[tuple[float, N]] = [(0.0, start)]
    done: set[N] = set()
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        if u == end:
            break
        for v, w in neighbours(u):
            if w < 0:
                raise QuarryError(f"negative link cost {w} on {u}->{v}")
            nd = d + w
            if nd < dist.get(v, math.inf) and not math.isinf(nd):
                dist[v] = nd
                prev[v] = u
                heapq.heappush(heap, (nd, v))
    if end not in dist:
        return None
    path = [end]
    while path[-1] != start:
        path.append(prev[path[-1]])
    path.reverse()
    return path, dist[end]


def dijkstra(
    cluster: Cluster,
    placement: Placement,
    cost: Callable[[str, str, int, int], float],
) -> tuple[list[Hop], float]:
    """Least-cost SOURCE -> SINK chain; `cost(i, j, start, end)` prices running [start,end) on j.

    Ties are broken by server name so results are deterministic. Raises when no chain covers
    the model (some block is on no server, or the cost is infinite everywhere).
    """
    adj: dict[str, list[tuple[str, int, int]]] = {}
    span: dict[tuple[str, str], tuple[int, int]] = {}
    for i, j, s, e in feasible_edges(cluster, placement):
        adj.setdefault(i, []).append((j, s, e))
        span[(i, j)] = (s, e)

    def neighbours(u: str) -> Iterable[tuple[str, float]]:
        for v, s, e in adj.get(u, []):
            yield v, (0.0 if v == SINK else cost(u, v, s, e))

    found = least_cost_path(SOURCE, SINK, neighbours)
    if found is None:
        missing = uncovered_blocks(cluster, placement)
        why = (
            f"blocks {missing[:10]} are on no server"
            if missing
            else "every chain has an infinite cost (it needs more cache memory than a server has)"
        )
        L = cluster.model.num_layers
        raise QuarryError(f"no feasible chain covers the model's {L} blocks: {why}")
    nodes, total = found
    return [(v, *span[(u, v)]) for u, v in zip(nodes[:-2], nodes[1:-1], strict=True)], total


def uncovered_blocks(cluster: Cluster, placement: Placement) -> list[int]:
    covered = [False] * cluster.model.num_layers
    for s, e in _spans(cluster, placement).values():
        for b in range(s, e):
            covered[b] = True
    return [b for b, c in enumerate(covered) if not c]


class _HopTimes:
    """Memoised (prefill, decode-step) time of running k blocks on server j for one client."""

    def __init__(self, cluster: Cluster, client: str | None, l_in: int) -> None:
        self.cluster, self.client, self.l_in = cluster, client, l_in
        self._servers = {s.name: s for s in cluster.servers}
        self._rtts: dict[str, tuple[float, float]] = {}

    def __call__(self, name: str, blocks: int) -> tuple[float, float]:
        if name not in self._rtts:
            self._rtts[name] = (
                prompt_rtt(self.cluster, self.client, name, self.l_in),
                token_rtt(self.cluster, self.client, name),
            )
        t_in, t_tok = self._rtts[name]
        srv = self._servers[name]
        return t_in + blocks * srv.prefill_s_per_block, t_tok + blocks * srv.decode_s_per_block


def shortest_path(
    cluster: Cluster,
    placement: Placement,
    client: str | None,
    l_max: int,
    *,
    l_in: int = 0,
    decode_only: bool = False,
) -> tuple[list[Hop], float]:
    """CG-BPRR step 3: the client's best chain by Dijkstra over the feasible-hop DAG.

    The link cost is the paper's eq. (8), the average per-token time over l_max tokens
    (prefill amortised over the sequence); `decode_only=True` uses eq. (4), the decode-step
    time alone, as in Alg. 1. Returns the hops and that per-token time in seconds.
    """
    if l_max < 1:
        raise QuarryError(f"l_max must be >= 1, got {l_max}")
    hop = _HopTimes(cluster, client, l_in)

    def cost(_i: str, j: str, s: int, e: int) -> float:
        pre, dec = hop(j, e - s)
        return dec if decode_only else (pre + (l_max - 1) * dec) / l_max

    return dijkstra(cluster, placement, cost)


# --------------------------------------------------------------------------- WS-RR


def cache_slots(
    cluster: Cluster, server: Server, blocks: int, cache_bytes: int, *, budget: int | None = None
) -> int:
    """How many (session, block) attention caches fit: floor((M_j - s_m m_j) / s_c).

    `budget` overrides M_j - s_m m_j for systems that reserve a fixed cache pool (PETALS).
    """
    if cache_bytes <= 0:
        raise QuarryError("cache size per block must be positive")
    if budget is None:
        budget = server.memory_bytes - blocks * cluster.model.bytes_per_layer
    return max(0, budget // cache_bytes)


def waiting_time(capacity: int, active: Iterable[tuple[float, int]], need: int) -> float:
    """Paper eq. (20): wait until `need` cache slots are free on a server.

    `active` holds (remaining seconds, slots held) of the sessions now on the server. The
    sessions finish in order of remaining time; the wait is the remaining time of the first
    one after whose end enough slots are free (0 if they are free now, inf if never).
    """
    if need > capacity:
        return math.inf
    act = sorted(active)
    used = sum(slots for _, slots in act)
    if capacity - used >= need:
        return 0.0
    for remaining, slots in act:
        used -= slots
        if capacity - used >= need:
            return max(0.0, remaining)
    return math.inf  # unreachable when need <= capacity


def ws_rr(
    cluster: Cluster,
    placement: Placement,
    client: str | None,
    l_in: int,
    l_max: int,
    capacity: Mapping[str, int],
    active: Mapping[str, Sequence[tuple[float, int]]],
) -> tuple[list[Hop], float, float]:
    """Waiting-penalised shortest-path routing (WS-RR) for one arriving request.

    Link cost t^W_ij + l_max * t^c_ij, with t^c_ij refined to the exact average of eq. (8)
    (so l_max * t^c_ij is the hop's whole prefill + decode time, as the paper allows).
    `capacity[j]` is server j's cache slots, `active[j]` its sessions' (remaining s, slots).
    Returns (path, predicted wait before the session can start, path cost in seconds), where
    the wait is the max of t^W over the chosen hops (Corollary 3.7's start time).
    """
    waits: dict[tuple[str, int, int], float] = {}
    hop = _HopTimes(cluster, client, l_in)

    def cost(_i: str, j: str, s: int, e: int) -> float:
        w = waiting_time(capacity.get(j, 0), active.get(j, ()), e - s)
        waits[(j, s, e)] = w
        pre, dec = hop(j, e - s)
        return w + pre + (l_max - 1) * dec

    path, total = dijkstra(cluster, placement, cost)
    wait = max(waits[h] for h in path)
    return path, wait, total
