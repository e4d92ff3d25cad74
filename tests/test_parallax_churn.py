"""Parallax churn: joins take the bottleneck layers, leaves drop out, re-plan triggers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from market.errors import QuarryError
from market.scheduler.churn import (
    ChurnConfig,
    ParallaxScheduler,
    coefficient_of_variation,
    uncovered_layers,
)
from market.scheduler.cluster import Cluster, ModelSpec, Server

pytestmark = pytest.mark.timeout(60)


def server(name: str, cap: int, decode: float) -> Server:
    # kv_tokens = 0 below, so capacity = floor(0.9 * memory / 1e6) = cap exactly
    return Server(name, memory_bytes=int(cap * 1_000_000 / 0.9) + 1, prefill_s_per_block=0.01,
                  decode_s_per_block=decode)


def cluster(*servers: Server) -> Cluster:
    model = ModelSpec("m", num_layers=10, bytes_per_layer=1_000_000,
                      kv_bytes_per_token_per_layer=0)
    return Cluster(servers=list(servers), model=model)


def scheduler(*servers: Server, cv: float = 0.25) -> ParallaxScheduler:
    from market.scheduler.parallax_phase1 import Phase1Config

    return ParallaxScheduler(cluster(*servers), phase1=Phase1Config(kv_tokens=0),
                             churn=ChurnConfig(cv_threshold=cv))


def base() -> list[Server]:
    # Pipelines {a1} and {b1 -> b2}; b2 is slow, so layers 5..9 carry the least compute:
    # per-layer compute share 100/10 + 100/5 = 30 on 0..4, 100/10 + 50/5 = 20 on 5..9.
    return [server("a1", 10, 0.01), server("b1", 5, 0.01), server("b2", 5, 0.02)]


def test_plan_has_the_expected_shape():
    s = scheduler(*base())
    assert sorted(map(sorted, s.placement.pipelines)) == [["a1"], ["b1", "b2"]]
    assert s.placement.ranges["b2"] == (5, 10)
    assert s.load_cv() == pytest.approx(0.2)
    assert s.replan_reason() is None


def test_join_takes_the_bottleneck_range():
    s = scheduler(*base(), cv=10.0)
    loads = s.layer_loads()
    assert int(np.argmin(loads)) == 5
    event = s.join(server("j", 3, 0.01))
    assert event.range == (5, 8)
    assert event.replanned is None and s.replans == 0
    assert s.placement.ranges["j"] == (5, 8)
    # Phase 2 can use the newcomer straight away.
    assert "j" in s.router.names


def test_join_that_unbalances_the_load_triggers_a_replan():
    s = scheduler(*base())  # default threshold 0.25; the join lifts CV to ~0.36
    sid, _ = s.acquire("before")
    event = s.join(server("j", 3, 0.01))
    assert event.replanned is not None and event.replanned.startswith("layer-load CV")
    assert s.replans == 1
    assert "j" in s.placement.ranges
    assert ("before" in s.router.sessions) != ("before" in event.evicted)


def test_leave_drops_the_server_its_pipeline_and_its_sessions():
    s = scheduler(*base(), cv=10.0)
    sid, route = s.acquire()
    assert route.servers == ["a1"]  # 10 fast layers, no hop
    event = s.leave("a1")
    assert "a1" not in s.placement.ranges
    assert s.placement.pipelines == [["b1", "b2"]]
    assert event.evicted == [sid] and event.replanned is None
    assert s.acquire()[1].servers == ["b1", "b2"]
    with pytest.raises(QuarryError, match="not in the cluster"):
        s.leave("a1")


def test_leave_that_uncovers_layers_triggers_a_replan():
    s = scheduler(server("b1", 5, 0.01), server("b2", 5, 0.01), server("c", 5, 0.01))
    assert len(s.placement.pipelines) == 1
    spare = s.placement.ranges["c"]  # the leftover joined as an extra replica
    victim = next(n for n in s.placement.pipelines[0] if s.placement.ranges[n] != spare)
    event = s.leave(victim)
    assert event.replanned is not None and event.replanned.startswith("no server holds")
    assert s.replans == 1
    assert uncovered_layers(s.placement.ranges, 10) == []
    assert victim not in s.placement.ranges and len(s.placement.pipelines) == 1


def test_leave_that_leaves_too_little_keeps_serving_what_remains():
    s = scheduler(server("b1", 5, 0.01), server("b2", 5, 0.01))
    event = s.leave("b2")
    assert "re-plan failed" in event.replanned
    assert s.placement.ranges == {"b1": (0, 5)}


def test_join_rejects_duplicates():
    s = scheduler(*base())
    with pytest.raises(QuarryError, match="already"):
        s.join(server("a1", 3, 0.01))


def test_fresh_small_plans_do_not_trigger_themselves():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from parallax_timing import synthetic_cluster

    for n in (4, 8, 64):
        s = ParallaxScheduler(synthetic_cluster(n))
        assert s.replan_reason() is None
    assert ParallaxScheduler(synthetic_cluster(4)).load_cv() > 0.25  # why cv_floor exists


def test_cv_and_coverage_helpers():
    assert coefficient_of_variation(np.array([1.0, 1.0, 1.0])) == 0.0
    assert coefficient_of_variation(np.array([0.0, 0.0])) == 0.0
    assert coefficient_of_variation(np.array([1.0, 3.0])) == pytest.approx(0.5)
    assert uncovered_layers({"a": (0, 3), "b": (5, 8)}, 8) == [3, 4]
    assert uncovered_layers({"a": (0, 8)}, 8) == []
