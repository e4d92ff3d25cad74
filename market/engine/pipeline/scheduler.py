"""Microbatch scheduling (DeServe section 4.3): how many microbatches to keep in flight.

One decode step of a microbatch goes driver -> stage 0 -> ... -> stage S-1 -> driver: S
stage computations and `hops` network hops (S + 1 here: the driver sits on the ring). While
one microbatch crosses a link, the stages it left would idle unless other microbatches are
queued behind. Keeping N = cycle / T_S microbatches in flight, with

    cycle = S * T_S + hops * d + t_driver,

keeps the slowest stage busy: N = S * (1 + d / T_S) in DeServe's ring of S hops (Fig. 2c:
S = 4, d = T_S / 2 gives 6, two extra). T_S and d are measured, never hard-coded: T_S is a
moving average of what the stages report per decode step, d comes from timing a lone
probe microbatch (round trip minus compute, per hop), floored at the configured injected
latency. The "naive" pipeline (vLLM-style) keeps exactly S in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def microbatches_in_flight(
    stages: int,
    stage_time_s: float,
    link_latency_s: float,
    *,
    hops: int | None = None,
    stage_times_s: Sequence[float] | None = None,
    driver_time_s: float = 0.0,
    max_in_flight: int = 1024,
) -> int:
    """N = ceil(cycle / T_S): enough microbatches that the bottleneck stage never waits.

    `stage_time_s` is the bottleneck (largest) stage time; `stage_times_s`, if given, are all
    stages' times (their sum replaces S * T_S in the cycle); `hops` defaults to S (DeServe's
    ring). Never fewer than `stages`, never more than `max_in_flight`.
    """
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if not stage_time_s > 0:
        raise ValueError(f"stage time must be > 0, got {stage_time_s}")
    if link_latency_s < 0 or driver_time_s < 0:
        raise ValueError("latencies must be >= 0")
    hops = stages if hops is None else hops
    compute = sum(stage_times_s) if stage_times_s else stages * stage_time_s
    cycle = compute + hops * link_latency_s + driver_time_s
    # The small epsilon keeps an exact ratio (e.g. 6.0) from rounding up on float noise.
    n = math.ceil(cycle / stage_time_s - 1e-9)
    return max(stages, min(max_in_flight, n))


@dataclass
class PipelineTimings:
    """Running estimates the scheduler feeds on: per-stage step time and per-hop latency."""

    stages: int
    configured_latency_s: float = 0.0
    alpha: float = 0.2  # EMA weight of the newest sample
    stage_s: list[float] = field(default_factory=list)
    hop_s: float | None = None  # measured one-way time per hop, transport included
    driver_s: float = 0.0

    def observe_stages(self, times: Sequence[float]) -> None:
        if len(times) != self.stages:
            return
        if not self.stage_s:
            self.stage_s = [float(t) for t in times]
            return
        a = self.alpha
        self.stage_s = [
            (1 - a) * old + a * float(t) for old, t in zip(self.stage_s, times, strict=True)
        ]

    def observe_at(self, indices: Sequence[int], times: Sequence[float]) -> None:
        """Fold in the times of some stages only (a swarm route visits a few of them)."""
        if not self.stage_s:
            self.stage_s = [0.0] * self.stages
        a = self.alpha
        for i, t in zip(indices, times, strict=False):
            if 0 <= i < self.stages:
                old = self.stage_s[i]
                self.stage_s[i] = float(t) if old == 0.0 else (1 - a) * old + a * float(t)

    def observe_driver(self, seconds: float) -> None:
        self.driver_s = seconds if self.driver_s == 0 else 0.8 * self.driver_s + 0.2 * seconds

    def set_hop_latency(self, seconds: float) -> None:
        self.hop_s = max(0.0, seconds)

    @property
    def bottleneck_s(self) -> float | None:
        return max(self.stage_s) if self.stage_s else None

    @property
    def link_latency_s(self) -> float:
        measured = self.hop_s if self.hop_s is not None else 0.0
        return max(self.configured_latency_s, measured)

    def in_flight(
        self,
        mode: str,
        max_in_flight: int = 1024,
        *,
        chain: Sequence[int] | None = None,
        width: int = 1,
    ) -> int:
        """How many microbatches to keep in flight now ("naive": S; "microbatch": formula).

        A swarm passes `chain` (the stage indices of the route a microbatch would take now)
        and `width` (replicas of its least-replicated layer): the formula runs over that
        chain and is multiplied by the number of chains that can run side by side.
        """
        if mode not in ("naive", "microbatch"):
            raise ValueError(f"unknown scheduling mode {mode!r}")
        idx = list(range(self.stages)) if chain is None else list(chain)
        depth = len(idx)
        width = max(1, width)
        if mode == "naive":
            return min(max_in_flight, depth * width) if chain is not None else self.stages
        times = [self.stage_s[i] for i in idx] if self.stage_s else []
        known = [t for t in times if t > 0]
        if not known:
            return min(max_in_flight, depth * width)  # nothing measured yet
        times = [t if t > 0 else sum(known) / len(known) for t in times]
        n = microbatches_in_flight(
            depth,
            max(times),
            self.link_latency_s,
            hops=depth + 1,
            stage_times_s=times,
            driver_time_s=self.driver_s,
            max_in_flight=max_in_flight,
        )
        return min(max_in_flight, n * width)
