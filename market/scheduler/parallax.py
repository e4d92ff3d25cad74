"""Parallax two-phase scheduler (Tong et al.): the public entry points.

* Phase 1, model allocation: `parallax_phase1` (`allocate`, `Phase1Config`, `water_fill`,
  `layer_capacity`, `CoverSolver`).
* Phase 2, per-request chain selection with load feedback: `parallax_phase2` (`Router`).
* Churn, joins/leaves/re-plans: `churn` (`ParallaxScheduler`).

`place(cluster, concurrency, l_in, l_max)` mirrors `cgbp.place` so `market plan` and the
simulator can swap placers; `plan(...)` also returns the Phase 2 route at zero load.
"""

from __future__ import annotations

from dataclasses import dataclass

from market.scheduler.churn import ChurnConfig, ChurnEvent, ParallaxScheduler
from market.scheduler.cluster import Cluster, Placement
from market.scheduler.parallax_phase1 import (
    CoverSolver,
    Phase1Config,
    Phase1Result,
    allocate,
    layer_capacity,
    min_stages,
    water_fill,
)
from market.scheduler.parallax_phase2 import NoRouteError, Route, Router, hop_latency_matrix

__all__ = [
    "ChurnConfig",
    "ChurnEvent",
    "CoverSolver",
    "NoRouteError",
    "ParallaxPlan",
    "ParallaxScheduler",
    "Phase1Config",
    "Phase1Result",
    "Route",
    "Router",
    "allocate",
    "hop_latency_matrix",
    "layer_capacity",
    "min_stages",
    "place",
    "plan",
    "water_fill",
]


@dataclass
class ParallaxPlan:
    """Phase 1's placement plus the chain Phase 2 picks for the first request."""

    phase1: Phase1Result
    route: Route
    config: Phase1Config

    @property
    def placement(self) -> Placement:
        return self.phase1.placement


def plan(cluster: Cluster, concurrency: int = 8, l_in: int = 512, l_max: int = 256, *,
         client: str | None = None, config: Phase1Config | None = None) -> ParallaxPlan:
    """Phase 1 on `cluster`, then the zero-load Phase 2 route (from `client`, if named)."""
    cfg = config or Phase1Config.for_workload(concurrency, l_in, l_max)
    rho = hop_latency_matrix(cluster, [s.name for s in cluster.servers])
    result = allocate(cluster, cfg, rho=rho)
    router = Router(cluster, result.placement, l_in=l_in, l_max=l_max,
                    reserve_frac=cfg.reserve_frac, client=client, rho=rho)
    return ParallaxPlan(phase1=result, route=router.route(), config=cfg)


def place(cluster: Cluster, concurrency: int = 8, l_in: int = 512, l_max: int = 256, *,
          config: Phase1Config | None = None) -> Placement:
    """Parallax Phase 1 placement (`algorithm="parallax"`, with explicit pipelines)."""
    cfg = config or Phase1Config.for_workload(concurrency, l_in, l_max)
    return allocate(cluster, cfg).placement
