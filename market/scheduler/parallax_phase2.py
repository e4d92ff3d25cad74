"""Parallax Phase 2: per-request GPU chain selection (Tong et al., section 3.3).

The placement becomes a DAG with a node (l, g) for every layer l and every GPU g holding it.
Node weight tau(g, l) is g's time for one layer of one token under its current load; edge
weight rho(g, g') is the one-way hop latency (0 when g = g'). One left-to-right sweep

    dp(l+1, g') = min_g dp(l, g) + rho(g, g') + tau(g', l+1)

then an argmin at the last layer and a backtrack give the cheapest chain. Each layer step is
one numpy min-plus product over the GPUs holding l and l+1, so a request costs
O(L * R^2) with R the copies per layer (the paper's bound), in L vectorised steps.

Choices where the paper is silent (stated here, measured in benchmarks/parallax_timing.py):

* rho(g, g') = rtt(g, g') / 2 + activation_bytes / bandwidth(g, g'): the paper calls it the
  "one-way RTT"; activation_bytes = hidden_size * dtype_bytes per token (0 when the model
  spec does not give hidden_size). With a `client`, its one-way latency to the first GPU and
  from the last GPU are added, closing the per-token ring through the client.
* tau(g, l) = tau0(g) * (1 + load_weight * n_g * s_kv / B): a decode step on a layer reads the
  layer's weights (B bytes) plus every pinned session's KV for that layer (s_kv = KV bytes
  per token per layer * (l_in + l_max)), so a memory-bound step grows with the bytes read.
  This roofline matches DeServe's Table 3 (66.6 ms at batch 1, 89.1 ms at 128: +0.27% per
  session) in magnitude. load_weight = 1 by default; it scales the feedback for tests.
* A GPU at its KV capacity (n_g >= floor(free memory / (blocks * s_kv))) gets tau = inf, so
  no new session is routed through it; when no chain is left, `NoRouteError`.
* Load is counted per GPU: a session pinned to a chain adds 1 to every GPU on it, for all
  the layers that GPU serves, until released.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, Placement

DEFAULT_L_IN = 512
DEFAULT_L_MAX = 256
DEFAULT_RESERVE_FRAC = 0.10


class NoRouteError(QuarryError):
    """No chain covers every layer with spare capacity."""


def hop_latency_matrix(cluster: Cluster, names: list[str]) -> np.ndarray:
    """One-way per-token hop latency rho between every pair of `names` (seconds).

    Explicit pair links override region links, which override the default link, exactly as
    `Cluster.link` resolves them, but built with array operations so 256 GPUs take well
    under a millisecond.
    """
    n = len(names)
    index = {name: i for i, name in enumerate(names)}
    region_of = {s.name: s.region for s in cluster.servers}
    regions = sorted({region_of.get(name, "") for name in names})
    ridx = {r: i for i, r in enumerate(regions)}
    d = cluster.default_link
    rtt_r = np.full((len(regions), len(regions)), d.rtt_s, dtype=float)
    bw_r = np.full((len(regions), len(regions)), d.bandwidth_bytes_per_s, dtype=float)
    for (a, b), lk in cluster.region_links.items():
        if a in ridx and b in ridx:
            for x, y in ((a, b), (b, a)):
                rtt_r[ridx[x], ridx[y]] = lk.rtt_s
                bw_r[ridx[x], ridx[y]] = lk.bandwidth_bytes_per_s
    act = cluster.model.hidden_size * cluster.model.dtype_bytes
    rho_r = _one_way(rtt_r, bw_r, act)
    ri = np.array([ridx[region_of.get(name, "")] for name in names], dtype=int)
    rho = rho_r[np.ix_(ri, ri)]
    for (a, b), lk in cluster.links.items():
        if a in index and b in index:
            i, j = index[a], index[b]
            rho[i, j] = rho[j, i] = _one_way(lk.rtt_s, lk.bandwidth_bytes_per_s, act)
    if n:
        np.fill_diagonal(rho, 0.0)
    return rho


def _one_way(rtt: np.ndarray | float, bw: np.ndarray | float, act_bytes: int) -> np.ndarray:
    """rtt / 2 plus the time to push one token's activations (inf over a zero-bandwidth link)."""
    rtt = np.asarray(rtt, dtype=float)
    bw = np.asarray(bw, dtype=float)
    if act_bytes <= 0:
        return rtt / 2.0
    with np.errstate(divide="ignore"):
        return rtt / 2.0 + np.where(bw > 0, act_bytes / np.where(bw > 0, bw, 1.0), np.inf)


@dataclass(frozen=True)
class Route:
    """A chain: (server, start, end) hops covering [0, L) in order, and its per-token cost."""

    chain: tuple[tuple[str, int, int], ...]
    per_token_s: float

    @property
    def servers(self) -> list[str]:
        return [name for name, _, _ in self.chain]

    def to_dict(self) -> dict:
        return {
            "chain": [{"server": n, "start": a, "end": b} for n, a, b in self.chain],
            "per_token_s": self.per_token_s,
        }


class Router:
    """Phase 2 over a fixed placement, with load feedback from pinned sessions."""

    def __init__(
        self,
        cluster: Cluster,
        placement: Placement,
        *,
        l_in: int = DEFAULT_L_IN,
        l_max: int = DEFAULT_L_MAX,
        reserve_frac: float = DEFAULT_RESERVE_FRAC,
        load_weight: float = 1.0,
        client: str | None = None,
        rho: np.ndarray | None = None,
    ) -> None:
        """`rho`, when given, is `hop_latency_matrix` over `cluster.servers` in their order."""
        if l_in < 0 or l_max < 0:
            raise QuarryError(f"l_in and l_max must be >= 0, got {l_in}, {l_max}")
        if load_weight < 0:
            raise QuarryError(f"load_weight must be >= 0, got {load_weight}")
        model = cluster.model
        self.L = L = model.num_layers
        by_name = {s.name: s for s in cluster.servers}
        names = []
        ranges = []
        for name, (a, b) in placement.ranges.items():
            if name not in by_name:
                raise QuarryError(f"placement names server {name!r}, which the cluster lacks")
            if not 0 <= a <= b <= L:
                raise QuarryError(f"server {name!r}: range [{a}, {b}) is outside [0, {L})")
            if b > a:
                names.append(name)
                ranges.append((a, b))
        self.names = names
        self.ranges = ranges
        self.index = {n: i for i, n in enumerate(names)}
        servers = [by_name[n] for n in names]
        self.tau0 = np.array([s.decode_s_per_block for s in servers], dtype=float)
        blocks = np.array([b - a for a, b in ranges], dtype=float)
        B = float(model.bytes_per_layer)
        s_kv = float(model.kv_bytes_per_token_per_layer) * (l_in + l_max)
        self.kv_per_weight = s_kv / B if B > 0 else 0.0
        self.load_weight = load_weight
        free = np.array([s.memory_bytes for s in servers], dtype=float) * (1 - reserve_frac)
        free -= blocks * B
        if s_kv > 0:
            self.capacity = np.floor(np.maximum(free, 0.0) / (blocks * s_kv))
        else:
            self.capacity = np.where(free >= 0, np.inf, 0.0)
        self.load = np.zeros(len(names))
        if rho is None:
            sub = hop_latency_matrix(cluster, names)
        else:
            pos = {s.name: i for i, s in enumerate(cluster.servers)}
            idx = np.array([pos[n] for n in names], dtype=int)
            sub = rho[np.ix_(idx, idx)]
        self.rho = sub
        self.entry = np.zeros(len(names))
        self.exit = np.zeros(len(names))
        if client is not None:
            if client not in cluster.clients:
                raise QuarryError(f"unknown client {client!r} in cluster")
            act = model.hidden_size * model.dtype_bytes
            for i, n in enumerate(names):
                lk = cluster.clients[client].get(n, cluster.default_link)
                one_way = float(_one_way(lk.rtt_s, lk.bandwidth_bytes_per_s, act))
                self.entry[i] = self.exit[i] = one_way
        hosts: list[list[int]] = [[] for _ in range(L)]
        for i, (a, b) in enumerate(ranges):
            for layer in range(a, b):
                hosts[layer].append(i)
        self.hosts = [np.array(h, dtype=int) for h in hosts]
        self._flat = np.array([i for h in hosts for i in h], dtype=int)
        self._offsets = [0, *itertools.accumulate(len(h) for h in hosts)]
        self._aranges = [np.arange(len(h)) for h in hosts]
        self._zero = np.zeros(1, dtype=int)
        # _solo_end[l] > l when layers l-1..l are held by one and the same server only: the
        # DP just adds its tau up to _solo_end[l] (exact: there is nothing to choose).
        self._solo_end = [0] * (L + 1)
        for layer in range(L - 1, 0, -1):
            if len(hosts[layer]) == 1 and hosts[layer] == hosts[layer - 1]:
                nxt = self._solo_end[layer + 1] if layer + 1 < L else 0
                self._solo_end[layer] = nxt if nxt > layer + 1 else layer + 1
        self.missing = [layer for layer, h in enumerate(hosts) if not h]
        cache: dict[tuple[tuple[int, ...], tuple[int, ...]], np.ndarray] = {}
        self.step_rho: list[np.ndarray] = []
        for layer in range(L - 1):
            key = (tuple(hosts[layer]), tuple(hosts[layer + 1]))
            if key not in cache:
                cache[key] = sub[np.ix_(self.hosts[layer], self.hosts[layer + 1])]
            self.step_rho.append(cache[key])
        self.sessions: dict[object, Route] = {}
        self._ids = itertools.count()

    # -- load ---------------------------------------------------------------------------------

    def tau(self) -> np.ndarray:
        """Per-layer latency of every GPU under its current load (inf at KV capacity)."""
        t = self.tau0 * (1.0 + self.load_weight * self.load * self.kv_per_weight)
        return np.where(self.load >= self.capacity, np.inf, t)

    # -- the DP ---------------------------------------------------------------------------------

    def route(self) -> Route:
        """The cheapest chain under the current load; does not pin it."""
        if self.missing:
            raise NoRouteError(f"layer {self.missing[0]} is held by no server")
        tau = self.tau()
        hosts = self.hosts
        tau_at = tau[self._flat]  # tau of every (layer, host) node, sliced per layer below
        off = self._offsets
        h0 = hosts[0]
        dp = tau_at[off[0]:off[1]] + self.entry[h0]
        back: list[np.ndarray] = []
        layer = 1
        while layer < self.L:
            end = self._solo_end[layer]
            if end > layer:  # the same single server holds layers layer-1..end-1: no choice
                dp = dp + tau_at[off[layer]] * (end - layer)
                back.extend([self._zero] * (end - layer))
                layer = end
                continue
            m = dp[:, None] + self.step_rho[layer - 1]
            arg = m.argmin(axis=0)
            dp = m[arg, self._aranges[layer]] + tau_at[off[layer]:off[layer + 1]]
            back.append(arg)
            layer += 1
        final = dp + self.exit[hosts[-1]]
        j = int(np.argmin(final))
        cost = float(final[j])
        if not math.isfinite(cost):
            raise NoRouteError("every chain passes a server at its KV capacity")
        path = [0] * self.L
        path[-1] = int(hosts[-1][j])
        for layer in range(self.L - 1, 0, -1):
            j = int(back[layer - 1][j])
            path[layer - 1] = int(hosts[layer - 1][j])
        chain: list[tuple[str, int, int]] = []
        start = 0
        for layer in range(1, self.L + 1):
            if layer == self.L or path[layer] != path[start]:
                chain.append((self.names[path[start]], start, layer))
                start = layer
        return Route(chain=tuple(chain), per_token_s=cost)

    def chain_cost(self, chain: list[tuple[str, int, int]] | tuple) -> float:
        """Per-token cost of a given chain under the current load (for checks and reports)."""
        tau = self.tau()
        cost = 0.0
        prev: int | None = None
        for name, a, b in chain:
            i = self.index[name]
            cost += (b - a) * tau[i]
            cost += self.entry[i] if prev is None else self.rho[prev, i]
            prev = i
        if prev is not None:
            cost += self.exit[prev]
        return float(cost)

    # -- sessions -------------------------------------------------------------------------------

    def acquire(self, session: object | None = None) -> tuple[object, Route]:
        """Route a new session and pin it: its GPUs' tau rise until `release`."""
        sid = next(self._ids) if session is None else session
        if sid in self.sessions:
            raise QuarryError(f"session {sid!r} is already routed")
        r = self.route()
        self.pin(sid, r)
        return sid, r

    def pin(self, session: object, route: Route) -> None:
        """Pin `session` to `route` (also used to carry sessions over a re-plan)."""
        for i in {self.index[n] for n in route.servers}:
            self.load[i] += 1
        self.sessions[session] = route

    def release(self, session: object) -> None:
        route = self.sessions.pop(session, None)
        if route is None:
            raise QuarryError(f"unknown session {session!r}")
        for i in {self.index[n] for n in route.servers}:
            self.load[i] -= 1

    def covers(self, route: Route) -> bool:
        """Whether every hop of `route` is still held by its server in this placement."""
        for name, a, b in route.chain:
            i = self.index.get(name)
            if i is None:
                return False
            lo, hi = self.ranges[i]
            if not (lo <= a and b <= hi):
                return False
        return True
