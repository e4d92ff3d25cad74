"""Stages as swarm members, and the per-microbatch route chooser over them.

A swarm's stages need not form one chain: a layer range may have several replicas, and
ranges may overlap. Every microbatch gets a route, a chain of (stage, start, end) hops
covering [0, L), chosen when it is admitted and pinned until it is freed (its KV caches live
on those stages). Two routers, both the scheduler package's own code:

* "parallax": Parallax Phase 2 (`market.scheduler.parallax_phase2.Router`), the layer DAG
  with node weight tau(g) per layer and edge weight rho = one-way hop latency. Choices made
  here: tau0(g) starts equal for every stage and becomes the measured per-layer decode time
  of that stage (an EMA of what the stages report), and load_weight is set so that
  tau = tau0 * (1 + microbatches pinned to g): on a compute-bound stage every microbatch in
  flight adds one more step of work to the wait, so pinned load spreads microbatches over
  replicas, as Parallax's republished tau does.
* "wsrr": Sun et al.'s WS-RR (`market.scheduler.routing.ws_rr`): shortest path with the
  wait for cache room added; each stage has `slots` microbatch slots per layer it serves
  (the per-chain in-flight count), and an in-flight microbatch holds its slots for its
  remaining tokens times its route's per-token time.

A stage that dies leaves the router (`remove`); the routes still possible are the ones
that avoid it, and when none covers [0, L) `NoRouteError` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from market.engine.pipeline.auth import check_key
from market.engine.pipeline.errors import PipelineError
from market.scheduler import routing
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server
from market.scheduler.parallax_phase2 import NoRouteError, Router

ROUTERS = ("parallax", "wsrr")
_HUGE_MEMORY = 1 << 60  # memory is the member's business (checked when the plan is made)
_EMA = 0.3


@dataclass(frozen=True)
class StageRef:
    """A stage started elsewhere: who runs it, where, which layers, and its CURVE key."""

    name: str  # the member's address
    endpoint: str  # tcp://host:port its stage listens on
    layers: tuple[int, int]  # [start, end)
    public_key: str | None = None  # CURVE z85; None: plain TCP (a trusted local test)

    def __post_init__(self) -> None:
        if not self.name:
            raise PipelineError("StageRef needs a name (the member's address)")
        if not (isinstance(self.endpoint, str) and self.endpoint.startswith("tcp://")):
            raise PipelineError(f"stage {self.name}: endpoint {self.endpoint!r} is not tcp://H:P")
        try:
            a, b = (int(x) for x in self.layers)
        except (TypeError, ValueError) as exc:
            raise PipelineError(f"stage {self.name}: layers {self.layers!r} are not A, B") from exc
        if a < 0 or b <= a:
            raise PipelineError(f"stage {self.name}: bad layer range {a}:{b}")
        object.__setattr__(self, "layers", (a, b))
        if self.public_key is not None:
            check_key(self.public_key, f"stage {self.name} public key")


@dataclass(frozen=True)
class Hop:
    stage: int  # index into the engine's stage list
    start: int
    end: int


def coverage_width(ranges: Sequence[tuple[int, int]], num_layers: int) -> int:
    """How many stages hold the least-replicated layer (0 when some layer is uncovered)."""
    counts = [0] * num_layers
    for a, b in ranges:
        for layer in range(max(0, a), min(b, num_layers)):
            counts[layer] += 1
    return min(counts) if counts else 0


class RouteChooser:
    """Routes microbatches over the live stages with Parallax Phase 2 or WS-RR."""

    def __init__(
        self,
        ranges: dict[int, tuple[int, int]],
        *,
        num_layers: int,
        hidden_size: int,
        bytes_per_layer: int,
        kv_bytes_per_token_per_layer: int,
        hop_latency_s: float = 0.0,
        router: str = "parallax",
    ) -> None:
        if router not in ROUTERS:
            raise PipelineError(f"router must be one of {ROUTERS}, got {router!r}")
        self.kind = router
        self.num_layers = num_layers
        self.model = ModelSpec(
            name="swarm",
            num_layers=num_layers,
            bytes_per_layer=max(1, bytes_per_layer),
            kv_bytes_per_token_per_layer=max(1, kv_bytes_per_token_per_layer),
            hidden_size=hidden_size,
            dtype_bytes=4,
        )
        self.hop_latency_s = hop_latency_s
        self.ranges = dict(ranges)
        self.tau0: dict[int, float] = {i: 1e-3 for i in ranges}  # equal until measured
        self.pinned: dict[int, tuple[Hop, ...]] = {}
        self.remaining_tokens: dict[int, int] = {}
        self.slots = 1
        self._router: Router | None = None
        self._build()

    # -- state ---------------------------------------------------------------------------
    def _cluster(self) -> Cluster:
        servers = [
            Server(str(i), _HUGE_MEMORY, self.tau0[i], self.tau0[i]) for i in sorted(self.ranges)
        ]
        return Cluster(
            servers=servers,
            model=self.model,
            default_link=Link(2 * self.hop_latency_s, math.inf),
        )

    def _placement(self) -> Placement:
        return Placement({str(i): r for i, r in self.ranges.items()}, algorithm="swarm")

    def _build(self) -> None:
        """(Re)build the Phase 2 router, re-pinning the microbatches in flight."""
        if self.kind != "parallax":
            return
        l_tokens = 2  # Router's s_kv uses l_in + l_max; only the ratio to B matters here
        router = Router(self._cluster(), self._placement(), l_in=1, l_max=1)
        s_kv = self.model.kv_bytes_per_token_per_layer * l_tokens
        router.load_weight = self.model.bytes_per_layer / s_kv  # tau = tau0 * (1 + load)
        for mb, hops in self.pinned.items():
            router.pin(mb, _to_route(hops))
        self._router = router

    @property
    def width(self) -> int:
        return coverage_width(list(self.ranges.values()), self.num_layers)

    def covers(self) -> bool:
        return self.width > 0

    def observe(self, hops: Sequence[Hop], times: Sequence[float]) -> None:
        """Fold the per-hop times a result carried into each stage's per-layer time."""
        changed = False
        for hop, t in zip(hops, times, strict=False):
            if hop.stage not in self.tau0 or hop.end <= hop.start:
                continue
            per_layer = max(1e-6, float(t) / (hop.end - hop.start))
            old = self.tau0[hop.stage]
            self.tau0[hop.stage] = per_layer if old == 1e-3 else (1 - _EMA) * old + _EMA * per_layer
            changed = True
        if changed and self._router is not None:
            router = self._router
            for name, i in router.index.items():
                router.tau0[i] = self.tau0[int(name)]

    # -- routing -------------------------------------------------------------------------
    def best(self) -> tuple[Hop, ...]:
        """The chain a new microbatch would get now (not pinned)."""
        return self._choose(tokens=1)

    def acquire(self, mb: int, tokens: int) -> tuple[Hop, ...]:
        """Choose and pin the route of microbatch `mb`, which will run `tokens` steps."""
        hops = self._choose(tokens)
        self.pinned[mb] = hops
        self.remaining_tokens[mb] = tokens
        if self._router is not None:
            self._router.pin(mb, _to_route(hops))
        return hops

    def step(self, mb: int) -> None:
        if mb in self.remaining_tokens:
            self.remaining_tokens[mb] = max(0, self.remaining_tokens[mb] - 1)

    def release(self, mb: int) -> None:
        if self.pinned.pop(mb, None) is not None and self._router is not None:
            self._router.release(mb)
        self.remaining_tokens.pop(mb, None)

    def remove(self, stage: int) -> list[int]:
        """Drop a dead stage; return the microbatches that were routed through it."""
        self.ranges.pop(stage, None)
        self.tau0.pop(stage, None)
        lost = [mb for mb, hops in self.pinned.items() if any(h.stage == stage for h in hops)]
        for mb in lost:
            self.pinned.pop(mb)
            self.remaining_tokens.pop(mb, None)
        if not self.covers():
            self._router = None
            return lost
        self._build()
        return lost

    def _choose(self, tokens: int) -> tuple[Hop, ...]:
        if not self.covers():
            missing = [
                layer
                for layer in range(self.num_layers)
                if not any(a <= layer < b for a, b in self.ranges.values())
            ]
            raise NoRouteError(f"no live stage holds layer {missing[0]}")
        if self.kind == "parallax":
            assert self._router is not None
            route = self._router.route()
            return tuple(Hop(int(n), a, b) for n, a, b in route.chain)
        return self._wsrr(tokens)

    def _wsrr(self, tokens: int) -> tuple[Hop, ...]:
        cluster = self._cluster()
        capacity = {str(i): self.slots * (b - a) for i, (a, b) in self.ranges.items()}
        active: dict[str, list[tuple[float, int]]] = {str(i): [] for i in self.ranges}
        for mb, hops in self.pinned.items():
            per_token = sum((h.end - h.start) * self.tau0.get(h.stage, 0.0) for h in hops)
            remaining = self.remaining_tokens.get(mb, 1) * per_token
            for h in hops:
                active[str(h.stage)].append((remaining, h.end - h.start))
        path, _, _ = routing.ws_rr(
            cluster, self._placement(), None, 1, max(1, tokens), capacity, active
        )
        return tuple(Hop(int(n), a, b) for n, a, b in path)


def _to_route(hops: Sequence[Hop]):  # -> parallax_phase2.Route
    from market.scheduler.parallax_phase2 import Route

    return Route(chain=tuple((str(h.stage), h.start, h.end) for h in hops), per_token_s=0.0)


__all__ = [
    "ROUTERS",
    "Hop",
    "NoRouteError",
    "RouteChooser",
    "StageRef",
    "coverage_width",
]
