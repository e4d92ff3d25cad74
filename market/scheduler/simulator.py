"""Discrete-event simulator of pipelined inference on Sun et al.'s performance model.

Each request opens a session on a chain of servers. Once it starts, its timeline follows
eq. (1) hop by hop: the first token after sum_j (t^I_cj + k_j tau^I_j), then one token per
sum_j (t_cj + k_j tau_j). The paper validated that per-token times do not depend on how
many sessions share a server while their caches fit, so sessions interact only through
memory: a session holds k_j attention caches on every server j of its chain from its start
to its last token. Events are arrivals, retries and session ends.

When a chain lacks cache memory the request waits, in one of two ways:
- "queue": it keeps the chain its router chose and starts as soon as every hop has room
  (checked at each session end, in arrival order, later requests may start first if they
  fit). This is how WS-RR is meant to run: its router already predicted the wait.
- "retry": the client retries later with PETALS' exponential backoff and routes again.

By default no constant per-request delay is added. The authors' public simulator adds one
(NOTES.md): 250 s to every PETALS request and 60 s to every CG-BPRR request
(`allocation_delay_petals` / `allocation_delay_prop` in TingyangSunJeff/LLM_inference_simulator,
Petals_online.m and WS_RR.m). There it is summed into the request's time before the first
token (`time_r` and `ttft_r`), and the request's caches stay booked until its completion time,
which includes it; so the delay both pads every request and lengthens the time a session
holds memory, which is what makes PETALS' fixed pool run out. `simulate(...,
fixed_request_delay_s=D)` reproduces that for a sensitivity study: a session that gets memory
at `start` keeps its caches reserved through D idle seconds, then runs as above; D = 0 (the
default) is the faithful model. Given the same seed, the trace and therefore every result are
identical.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from market.errors import QuarryError
from market.scheduler import petals, routing
from market.scheduler.cluster import Cluster, Placement

MAX_ATTEMPTS = 10_000
# The authors' constant per-request delays, by policy name (seconds); a sensitivity knob only.
AUTHORS_FIXED_DELAY_S: dict[str, float] = {"petals": 250.0, "ws-rr": 60.0}


@dataclass(frozen=True)
class Request:
    id: int
    arrival_s: float
    client: str | None = None


@dataclass
class RequestResult:
    id: int
    client: str | None
    arrival_s: float
    start_s: float
    first_token_s: float  # absolute time of the first token
    end_s: float
    path: list[routing.Hop]
    attempts: int = 1

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclass
class SimResult:
    policy: str
    l_in: int
    l_max: int
    requests: list[RequestResult]
    max_concurrent: int
    fixed_request_delay_s: float = 0.0

    def _mean(self, xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def avg_per_token_s(self) -> float:
        """The paper's metric: completion minus arrival, over all l_max tokens of all requests."""
        return self._mean([(r.end_s - r.arrival_s) / self.l_max for r in self.requests])

    @property
    def avg_first_token_s(self) -> float:
        return self._mean([r.ttft_s for r in self.requests])

    @property
    def avg_decode_s(self) -> float:
        """Average time of each token after the first."""
        if self.l_max < 2:
            return 0.0
        return self._mean([(r.end_s - r.first_token_s) / (self.l_max - 1) for r in self.requests])

    @property
    def avg_wait_s(self) -> float:
        return self._mean([r.wait_s for r in self.requests])

    def summary(self) -> dict[str, float]:
        return {
            "avg_per_token_s": self.avg_per_token_s,
            "avg_first_token_s": self.avg_first_token_s,
            "avg_decode_s": self.avg_decode_s,
            "avg_wait_s": self.avg_wait_s,
            "max_concurrent": float(self.max_concurrent),
            "waited_fraction": self._mean([1.0 if r.wait_s > 0 else 0.0 for r in self.requests]),
        }


@dataclass
class _Session:
    req: Request
    path: list[routing.Hop]
    end_s: float


@dataclass
class SimState:
    """What routers may look at: the placement, the memory and the running sessions."""

    cluster: Cluster
    placement: Placement
    l_in: int
    l_max: int
    capacity: dict[str, int]  # cache slots (session x block) per server
    used: dict[str, int] = field(default_factory=dict)
    sessions: dict[int, _Session] = field(default_factory=dict)

    def free(self) -> dict[str, int]:
        return {n: self.capacity[n] - self.used.get(n, 0) for n in self.capacity}

    def active(self, now: float) -> dict[str, list[tuple[float, int]]]:
        """Per server: (remaining seconds, slots) of each running session (WS-RR's state)."""
        out: dict[str, list[tuple[float, int]]] = {n: [] for n in self.capacity}
        for sess in self.sessions.values():
            for name, s, e in sess.path:
                out[name].append((sess.end_s - now, e - s))
        return out

    def fits(self, path: Sequence[routing.Hop]) -> bool:
        return all(self.used.get(n, 0) + (e - s) <= self.capacity.get(n, 0) for n, s, e in path)

    def can_ever_fit(self, path: Sequence[routing.Hop]) -> bool:
        return all(e - s <= self.capacity.get(n, 0) for n, s, e in path)


class Policy(Protocol):
    name: str
    admission: str  # "queue" or "retry"

    def route(self, state: SimState, req: Request, now: float) -> list[routing.Hop]: ...


class WSRRPolicy:
    """CG-BPRR's online routing: waiting-penalised shortest path, then queue."""

    name = "ws-rr"
    admission = "queue"

    def route(self, state: SimState, req: Request, now: float) -> list[routing.Hop]:
        path, _, _ = routing.ws_rr(
            state.cluster,
            state.placement,
            req.client,
            state.l_in,
            state.l_max,
            state.capacity,
            state.active(now),
        )
        return path


class ShortestPathPolicy:
    """Offline CG-BPRR routing: each client's fixed shortest chain, ignoring load."""

    name = "shortest-path"
    admission = "queue"

    def __init__(self) -> None:
        self._cache: dict[str | None, list[routing.Hop]] = {}

    def route(self, state: SimState, req: Request, now: float) -> list[routing.Hop]:
        if req.client not in self._cache:
            self._cache[req.client], _ = routing.shortest_path(
                state.cluster, state.placement, req.client, state.l_max, l_in=state.l_in
            )
        return self._cache[req.client]


class PetalsPolicy:
    """PETALS' client: heuristic min-latency chain, retried with backoff when memory is full."""

    name = "petals"
    admission = "retry"

    def route(self, state: SimState, req: Request, now: float) -> list[routing.Hop]:
        return petals.route(state.cluster, state.placement, req.client, state.free())


def poisson_trace(
    n: int, rate_per_s: float, clients: Sequence[str | None] | str | None = None, seed: int = 0
) -> list[Request]:
    """n Poisson arrivals (the first at t = 0), each from a client drawn uniformly."""
    if n < 0 or rate_per_s <= 0:
        raise QuarryError(f"need n >= 0 and a positive rate, got n={n}, rate={rate_per_s}")
    pool: list[str | None] = (
        [clients] if clients is None or isinstance(clients, str) else list(clients)
    )
    if not pool:
        raise QuarryError("poisson_trace needs at least one client")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate_per_s)
        out.append(Request(i, t, pool[rng.randrange(len(pool))] if len(pool) > 1 else pool[0]))
    return out


def simulate(
    cluster: Cluster,
    placement: Placement,
    policy: Policy,
    trace: Sequence[Request],
    l_in: int,
    l_max: int,
    *,
    cache_budget: Mapping[str, int] | None = None,
    fixed_request_delay_s: float = 0.0,
) -> SimResult:
    """Run `trace` through `placement` with `policy`; see the module docstring.

    `cache_budget[j]` (bytes) overrides server j's cache memory, M_j - s_m m_j by default;
    PETALS reserves a fixed pool instead (petals.cache_budgets). `fixed_request_delay_s`
    (default 0) inserts the authors' constant delay between a session's start and its first
    token, with its caches held throughout (AUTHORS_FIXED_DELAY_S has their values).
    """
    if policy.admission not in ("queue", "retry"):
        raise QuarryError(f"unknown admission mode {policy.admission!r}")
    delay = float(fixed_request_delay_s)
    if not (math.isfinite(delay) and delay >= 0):
        raise QuarryError(
            f"fixed_request_delay_s must be a finite number >= 0, got {fixed_request_delay_s!r}"
        )
    s_c = routing.cache_bytes_per_block(cluster, l_in, l_max)
    capacity = {}
    for name, (s, e) in placement.ranges.items():
        if e > s:
            budget = None if cache_budget is None else cache_budget.get(name)
            capacity[name] = routing.cache_slots(
                cluster, cluster.server(name), e - s, s_c, budget=budget
            )
    state = SimState(cluster, placement, l_in, l_max, capacity)

    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, kind: str, rid: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, rid))
        seq += 1

    reqs = {r.id: r for r in trace}
    if len(reqs) != len(trace):
        raise QuarryError("request ids in the trace must be unique")
    for r in trace:
        if r.arrival_s < 0 or math.isnan(r.arrival_s):
            raise QuarryError(f"request {r.id} has an invalid arrival time {r.arrival_s}")
        push(r.arrival_s, "arrive", r.id)

    attempts: dict[int, int] = {}
    waiting: list[tuple[Request, list[routing.Hop]]] = []
    results: dict[int, RequestResult] = {}
    max_conc = 0

    def start(req: Request, path: list[routing.Hop], now: float) -> None:
        nonlocal max_conc
        for n, s, e in path:
            state.used[n] = state.used.get(n, 0) + (e - s)
        first = now + delay + routing.first_token_time(cluster, path, req.client, l_in)
        end = first + (l_max - 1) * routing.decode_token_time(cluster, path, req.client)
        state.sessions[req.id] = _Session(req, path, end)
        max_conc = max(max_conc, len(state.sessions))
        results[req.id] = RequestResult(
            req.id, req.client, req.arrival_s, now, first, end, path, attempts[req.id]
        )
        push(end, "end", req.id)

    def attempt(req: Request, now: float) -> None:
        attempts[req.id] = attempts.get(req.id, 0) + 1
        path = policy.route(state, req, now)
        routing.validate_path(cluster, placement, path)
        if state.fits(path):
            start(req, path, now)
        elif policy.admission == "queue":
            if not state.can_ever_fit(path):
                raise QuarryError(f"request {req.id} was routed to a chain it can never fit")
            waiting.append((req, path))
        else:
            n = attempts[req.id]
            if n >= MAX_ATTEMPTS:
                raise QuarryError(f"request {req.id} found no memory after {n} attempts")
            push(now + petals.backoff_s(n), "retry", req.id)

    while events:
        now, _, kind, rid = heapq.heappop(events)
        if kind in ("arrive", "retry"):
            attempt(reqs[rid], now)
        else:
            sess = state.sessions.pop(rid)
            for n, s, e in sess.path:
                state.used[n] -= e - s
            still: list[tuple[Request, list[routing.Hop]]] = []
            for req, path in waiting:
                if state.fits(path):
                    start(req, path, now)
                else:
                    still.append((req, path))
            waiting = still
    if waiting:
        raise QuarryError(f"{len(waiting)} requests never got memory")  # defensive
    return SimResult(policy.name, l_in, l_max, [results[r.id] for r in trace], max_conc, delay)
