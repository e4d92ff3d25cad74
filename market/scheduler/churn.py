"""Parallax under churn (Tong et al., section 3.4): GPUs join and leave a live placement.

* A joining GPU takes the bottleneck range: it starts at the layer with the least load and
  holds as many contiguous layers as its capacity allows (shifted left when the slice would
  run past L, so it still covers the bottleneck).
* A leaving GPU drops out of the map; pipelines that contained it are no longer listed, the
  other GPUs keep their layers, and sessions pinned through it are evicted (returned to the
  caller to re-route).
* Phase 1 is re-run (global rebalancing) when some layer has no server, or when the
  coefficient of variation of the per-layer load exceeds `cv_threshold`. Load is
  0.5 * kv / total_mem + 0.5 * compute / total_flops (see `parallax_phase1.layer_loads` for
  what a layer's kv and compute are). The paper leaves the threshold configurable; the
  default 0.25 is the Parallax reference implementation's. Freshly planned synthetic
  clusters of 16-256 GPUs sit at CV 0.01-0.12, but tiny ones can start above 0.25 (4 GPUs:
  one pipeline plus two extra replicas, CV 0.28), where re-planning cannot help. So the
  trigger is CV > max(cv_threshold, CV of the last fresh plan): no re-plan storms.
* Sessions survive a re-plan when the new placement still holds every hop of their chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, Placement, Server
from market.scheduler.parallax_phase1 import (
    Phase1Config,
    Phase1Result,
    allocate,
    join_range,
    layer_capacity,
    layer_loads,
)
from market.scheduler.parallax_phase2 import (
    DEFAULT_L_IN,
    DEFAULT_L_MAX,
    Route,
    Router,
)

DEFAULT_CV_THRESHOLD = 0.25


@dataclass(frozen=True)
class ChurnConfig:
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    mem_weight: float = 0.5

    def __post_init__(self) -> None:
        if not self.cv_threshold > 0:
            raise QuarryError(f"cv_threshold must be > 0, got {self.cv_threshold}")
        if not 0 <= self.mem_weight <= 1:
            raise QuarryError(f"mem_weight must be in [0, 1], got {self.mem_weight}")


def coefficient_of_variation(loads: np.ndarray) -> float:
    """std / mean of the per-layer loads (population std); 0 when the mean is 0."""
    mean = float(np.mean(loads)) if len(loads) else 0.0
    return 0.0 if mean <= 0 else float(np.std(loads)) / mean


def uncovered_layers(ranges: dict[str, tuple[int, int]], num_layers: int) -> list[int]:
    """Layers no server holds: a chain covering [0, L) exists iff this is empty."""
    held = np.zeros(num_layers + 1, dtype=int)
    for a, b in ranges.values():
        if b > a:
            held[a] += 1
            held[b] -= 1
    return [int(x) for x in np.flatnonzero(np.cumsum(held)[:num_layers] == 0)]


@dataclass
class ChurnEvent:
    """What one join or leave did."""

    kind: str  # "join" | "leave"
    server: str
    range: tuple[int, int] | None = None  # the joiner's slice before any re-plan
    replanned: str | None = None  # why Phase 1 was re-run, if it was
    evicted: list[object] = field(default_factory=list)  # sessions that lost their chain


class ParallaxScheduler:
    """A live Parallax placement: Phase 1 plan, Phase 2 router, joins, leaves, re-plans."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        concurrency: int = 8,
        l_in: int = DEFAULT_L_IN,
        l_max: int = DEFAULT_L_MAX,
        phase1: Phase1Config | None = None,
        churn: ChurnConfig | None = None,
        load_weight: float = 1.0,
        placement: Placement | None = None,
        cv_floor: float | None = None,
    ) -> None:
        """Phase 1 on `cluster`; or, given `placement` (and the `cv_floor` of the fresh plan
        it came from), resume that live placement as it stands, so a stored plan goes on
        under the churn rules instead of being planned again (`market.scheduler.live`)."""
        # Own copy of the server list: joins and leaves must not edit the caller's cluster.
        self.cluster = replace(cluster, servers=list(cluster.servers))
        self.phase1 = phase1 or Phase1Config.for_workload(concurrency, l_in, l_max)
        self.churn = churn or ChurnConfig()
        self.l_in = l_in
        self.l_max = l_max
        self.load_weight = load_weight
        self.replans = 0
        self.cv_floor = 0.0
        self.router: Router | None = None
        self.result: Phase1Result
        self.placement: Placement
        if placement is None:
            self._plan()
            return
        self.placement = Placement(ranges=dict(placement.ranges),
                                   pipelines=[list(p) for p in placement.pipelines],
                                   algorithm=placement.algorithm or "parallax")
        self.result = Phase1Result(placement=self.placement, pools=[], capacities={},
                                   leftovers=[], unused=[])
        self.cv_floor = self.load_cv() if cv_floor is None else cv_floor
        self._rebuild_router()

    # -- planning ---------------------------------------------------------------------------

    def _plan(self) -> list[object]:
        self.result = allocate(self.cluster, self.phase1)
        self.placement = self.result.placement
        self.cv_floor = self.load_cv()
        return self._rebuild_router()

    def _rebuild_router(self) -> list[object]:
        """New router over the current placement; carry over sessions whose chain survives."""
        old = self.router.sessions if self.router is not None else {}
        self.router = Router(self.cluster, self.placement, l_in=self.l_in, l_max=self.l_max,
                             reserve_frac=self.phase1.reserve_frac,
                             load_weight=self.load_weight)
        evicted = []
        for sid, route in old.items():
            if self.router.covers(route):
                self.router.pin(sid, route)
            else:
                evicted.append(sid)
        return evicted

    def layer_loads(self) -> np.ndarray:
        return layer_loads(self.cluster, self.placement.ranges,
                           reserve_frac=self.phase1.reserve_frac,
                           mem_weight=self.churn.mem_weight)

    def load_cv(self) -> float:
        return coefficient_of_variation(self.layer_loads())

    def replan_reason(self) -> str | None:
        """Why Phase 1 should be re-run now, or None."""
        missing = uncovered_layers(self.placement.ranges, self.cluster.model.num_layers)
        if missing:
            return f"no server holds layers {missing[0]}..{missing[-1]} ({len(missing)} layers)"
        cv = self.load_cv()
        limit = max(self.churn.cv_threshold, self.cv_floor)
        if cv > limit + 1e-12:
            return f"layer-load CV {cv:.3f} > {limit:.3f}"
        return None

    def _settle(self, event: ChurnEvent) -> ChurnEvent:
        reason = self.replan_reason()
        if reason is None:
            event.evicted = self._rebuild_router()
            return event
        try:
            event.evicted = self._plan()
            self.replans += 1
            event.replanned = reason
        except QuarryError as exc:  # e.g. too few GPUs left: keep serving what remains
            event.replanned = f"{reason}; re-plan failed: {exc}"
            event.evicted = self._rebuild_router()
        return event

    # -- membership ---------------------------------------------------------------------------

    def join(self, server: Server) -> ChurnEvent:
        """Add `server`, give it the bottleneck slice, re-plan if the trigger fires."""
        if any(s.name == server.name for s in self.cluster.servers):
            raise QuarryError(f"server {server.name!r} is already in the cluster")
        self.cluster.servers.append(server)
        cap = layer_capacity(server, self.cluster.model, self.phase1.kv_tokens,
                             self.phase1.reserve_frac)
        event = ChurnEvent(kind="join", server=server.name)
        if cap > 0:
            event.range = join_range(cap, self.layer_loads())
            self.placement.ranges[server.name] = event.range
        return self._settle(event)

    def leave(self, name: str) -> ChurnEvent:
        """Remove server `name`: its layers, its pipelines, its sessions."""
        if not any(s.name == name for s in self.cluster.servers):
            raise QuarryError(f"server {name!r} is not in the cluster")
        self.cluster.servers = [s for s in self.cluster.servers if s.name != name]
        self.placement.ranges.pop(name, None)
        self.placement.pipelines = [p for p in self.placement.pipelines if name not in p]
        return self._settle(ChurnEvent(kind="leave", server=name))

    # -- routing -------------------------------------------------------------------------------

    def acquire(self, session: object | None = None) -> tuple[object, Route]:
        assert self.router is not None
        return self.router.acquire(session)

    def release(self, session: object) -> None:
        assert self.router is not None
        self.router.release(session)
