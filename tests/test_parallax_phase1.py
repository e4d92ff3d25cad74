"""Parallax Phase 1: exact s*(k) against brute force, Z(k), water-filling, region-first."""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, Link, ModelSpec, Server, load_cluster
from market.scheduler.parallax_phase1 import (
    CoverSolver,
    Phase1Config,
    allocate,
    contiguous_ranges,
    cover_patterns,
    join_range,
    layer_capacity,
    paper_dp_min_stages,
    plan_pool,
    score,
    water_fill,
)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


def brute_min_stages(caps: list[int], L: int, k: int) -> int | None:
    """Every assignment of each GPU to one of k pipelines or to none; fewest GPUs used."""
    best = None
    for assign in itertools.product(range(k + 1), repeat=len(caps)):
        sums = [0] * k
        used = 0
        for c, a in zip(caps, assign, strict=True):
            if a < k:
                sums[a] += c
                used += 1
        if all(s >= L for s in sums) and (best is None or used < best):
            best = used
    return best


def small_instances(seed: int, count: int, max_n: int = 7):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(1, max_n)
        L = rng.randint(2, 14)
        types = [rng.randint(1, L + 2) for _ in range(rng.randint(1, 4))]
        caps = [rng.choice(types) for _ in range(n)]
        for k in range(1, n + 1):
            if (k + 1) ** n <= 20000:
                yield caps, L, k


def test_cover_solver_matches_brute_force():
    checked = 0
    for caps, L, k in small_instances(seed=1, count=250):
        solver = CoverSolver(caps, L)
        res = solver.solve(k)
        expected = brute_min_stages(caps, L, k)
        assert (None if res is None else res.stages) == expected, (caps, L, k)
        if res is not None:
            assert res.optimal
            pipes = solver.pipelines(res)
            assert len(pipes) == k
            assert sum(len(p) for p in pipes) == res.stages
            assert all(sum(solver.type_caps[t] for t in p) >= L for p in pipes)
            used = [solver.type_caps[t] for p in pipes for t in p]
            for c in set(used):  # never more GPUs of a capacity than the pool has
                assert used.count(c) <= caps.count(c)
        checked += 1
    assert checked > 300


def test_branch_and_bound_alone_matches_brute_force():
    """With the rounding repair off, the LP branch and bound has to find s*(k) itself."""
    for caps, L, k in small_instances(seed=2, count=150):
        res = CoverSolver(caps, L, repair=False).solve(k)
        assert (None if res is None else res.stages) == brute_min_stages(caps, L, k)


def test_paper_dp_matches_brute_force():
    for caps, L, k in small_instances(seed=3, count=120):
        assert paper_dp_min_stages(caps, L, k) == brute_min_stages(caps, L, k), (caps, L, k)


def test_cover_solver_matches_paper_dp_on_larger_pools():
    rng = random.Random(4)
    for _ in range(40):
        L = rng.randint(10, 40)
        types = [rng.randint(3, L) for _ in range(rng.randint(2, 4))]
        caps = [rng.choice(types) for _ in range(rng.randint(6, 11))]
        solver = CoverSolver(caps, L)
        for k in range(1, solver.k_max + 1):
            res = solver.solve(k)
            assert (None if res is None else res.stages) == paper_dp_min_stages(caps, L, k)


def test_cover_patterns_are_exactly_the_minimal_covers():
    caps, L = [9, 5, 3], 14
    pats = set(cover_patterns(caps, L))
    expected = set()
    for vec in itertools.product(range(6), repeat=3):
        total = sum(a * c for a, c in zip(vec, caps, strict=True))
        if total >= L and all(
            total - c < L for a, c in zip(vec, caps, strict=True) if a > 0
        ):
            expected.add(vec)
    assert pats == expected


def test_infeasible_k_returns_none():
    solver = CoverSolver([5, 5, 5], 10)
    assert solver.k_max == 1
    assert solver.solve(2) is None
    assert solver.solve(1).stages == 2


def test_layer_capacity_rule():
    model = ModelSpec("m", num_layers=80, bytes_per_layer=1_000, kv_bytes_per_token_per_layer=2)
    s = Server("g", memory_bytes=100_000, prefill_s_per_block=1, decode_s_per_block=1)
    # (100000 * 0.9) // (1000 + 50 * 2) = 90000 // 1100 = 81 -> capped at L
    assert layer_capacity(s, model, kv_tokens=50, reserve_frac=0.1) == 80
    assert layer_capacity(s, model, kv_tokens=500, reserve_frac=0.1) == 90000 // 2000
    tiny = Server("t", memory_bytes=500, prefill_s_per_block=1, decode_s_per_block=1)
    assert layer_capacity(tiny, model) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.floats(0.1, 100.0)), min_size=1, max_size=8),
    st.integers(1, 60),
)
def test_water_fill_properties(gpus, L):
    caps = [c for c, _ in gpus]
    flops = [f for _, f in gpus]
    if sum(caps) < L:
        with pytest.raises(QuarryError):
            water_fill(caps, flops, L)
        return
    x = water_fill(caps, flops, L)
    assert sum(x) == L
    assert all(0 <= xi <= ci for xi, ci in zip(x, caps, strict=True))
    ranges = contiguous_ranges(x)
    assert ranges[0][0] == 0 and ranges[-1][1] == L
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    # Proportional to compute wherever capacity allows: an unsaturated GPU sits within one
    # layer of lam * F_i, and no saturated GPU is below what its compute share would give it.
    lo, hi = 0.0, max(c / f for c, f in zip(caps, flops, strict=True)) + 1
    for _ in range(200):
        lam = (lo + hi) / 2
        if sum(min(c, lam * f) for c, f in zip(caps, flops, strict=True)) >= L:
            hi = lam
        else:
            lo = lam
    for xi, c, f in zip(x, caps, flops, strict=True):
        target = min(c, hi * f)
        assert abs(xi - target) < 1 + 1e-6


def test_water_fill_splits_by_compute_when_caps_allow():
    assert water_fill([80, 80], [3.0, 1.0], 80) == [60, 20]
    assert water_fill([50, 80], [3.0, 1.0], 80) == [50, 30]  # cap binds on the fast GPU
    assert water_fill([40, 40, 40], [1.0, 1.0, 1.0], 80) == [27, 27, 26]


def test_score_and_k_choice_is_the_argmax():
    rng = random.Random(5)
    for _ in range(30):
        L = rng.randint(5, 20)
        caps = [rng.randint(2, L) for _ in range(rng.randint(2, 7))]
        t_comp, r = rng.uniform(0.01, 1), rng.uniform(0.01, 1)
        alpha = rng.choice([0.5, 1.0, 2.0])
        cfg = Phase1Config(alpha=alpha)
        idx = list(range(len(caps)))
        pp = plan_pool("p", idx, caps, [1.0] * len(caps), L, t_comp, r, cfg)
        zs = {}
        for k in range(1, len(caps) + 1):
            s = paper_dp_min_stages(caps, L, k)  # checked against brute force above
            if s is not None:
                zs[k] = score(k, s, t_comp, r, alpha)
        if not zs:
            assert pp is None
            continue
        assert pp is not None
        assert math.isclose(pp.score, max(zs.values()), rel_tol=1e-12)
        assert pp.stages == paper_dp_min_stages(caps, L, pp.k)
        assert len(pp.pipelines) == pp.k


def _cluster(specs: list[tuple[str, int, float, str]], L: int = 10,
             region_rtt: dict | None = None) -> Cluster:
    model = ModelSpec("m", num_layers=L, bytes_per_layer=1_000_000,
                      kv_bytes_per_token_per_layer=0)
    servers = [Server(n, memory_bytes=int(c * 1_000_000 / 0.9) + 1, prefill_s_per_block=0.01,
                      decode_s_per_block=d, region=r) for n, c, d, r in specs]
    links = {k: Link(v, 1e9) for k, v in (region_rtt or {}).items()}
    return Cluster(servers=servers, model=model, region_links=links)


def _check_pipelines(cluster: Cluster, result) -> None:
    L = cluster.model.num_layers
    caps = result.capacities
    for pipe in result.placement.pipelines:
        cursor = 0
        for name in pipe:
            a, b = result.placement.ranges[name]
            assert a == cursor and b > a
            assert b - a <= caps[name]
            cursor = b
        assert cursor == L


def test_allocate_builds_gap_free_pipelines_and_respects_regions():
    cluster = _cluster([("a1", 6, 0.01, "x"), ("a2", 6, 0.01, "x"), ("b1", 5, 0.01, "y"),
                        ("b2", 5, 0.02, "y"), ("c1", 4, 0.01, "y")],
                       region_rtt={("x", "x"): 0.001, ("y", "y"): 0.001, ("x", "y"): 0.2})
    cfg = Phase1Config(kv_tokens=0)
    result = allocate(cluster, cfg)
    assert result.placement.algorithm == "parallax"
    _check_pipelines(cluster, result)
    region = {s.name: s.region for s in cluster.servers}
    pipes = result.placement.pipelines
    assert len(pipes) == 2
    assert all(len({region[n] for n in p}) == 1 for p in pipes)  # region-first
    assert result.optimal
    assert result.leftovers == ["c1"]  # joined the least-loaded layers as an extra replica
    no_left = allocate(cluster, Phase1Config(kv_tokens=0, assign_leftovers=False))
    assert "c1" not in no_left.placement.ranges and no_left.unused == ["c1"]


def test_cross_region_pipeline_from_leftovers():
    cluster = _cluster([("a1", 6, 0.01, "x"), ("b1", 6, 0.01, "y")],
                       region_rtt={("x", "y"): 0.05})
    result = allocate(cluster, Phase1Config(kv_tokens=0))
    assert [p.name for p in result.pools] == ["cross-region"]
    assert sorted(result.placement.pipelines[0]) == ["a1", "b1"]
    _check_pipelines(cluster, result)


def test_water_filling_inside_pipelines_follows_compute():
    cluster = _cluster([("fast", 10, 0.001, "x"), ("slow", 10, 0.003, "x")], L=12)
    result = allocate(cluster, Phase1Config(kv_tokens=0))
    # compute = 1 / decode time: 3:1, so 9 and 3 layers
    assert result.placement.ranges == {"fast": (0, 9), "slow": (9, 12)}


def test_allocate_rejects_a_cluster_that_cannot_hold_the_model():
    cluster = _cluster([("a", 3, 0.01, "x"), ("b", 3, 0.01, "x")], L=10)
    with pytest.raises(QuarryError, match="cannot hold"):
        allocate(cluster, Phase1Config(kv_tokens=0))


def test_too_many_patterns_falls_back_to_valid_flagged_pipelines():
    cluster = _cluster([(f"g{i}", 3 + i % 4, 0.01, "x") for i in range(12)], L=20)
    result = allocate(cluster, Phase1Config(kv_tokens=0, max_patterns=2))
    assert not result.optimal
    assert result.placement.pipelines
    _check_pipelines(cluster, result)


def test_join_range_takes_the_bottleneck_and_shifts_left_at_the_end():
    import numpy as np

    loads = np.array([3.0, 3.0, 1.0, 2.0, 2.0, 2.0])
    assert join_range(3, loads) == (2, 5)
    loads = np.array([3.0, 3.0, 3.0, 3.0, 0.5, 2.0])
    assert join_range(3, loads) == (3, 6)
    with pytest.raises(QuarryError):
        join_range(0, loads)


def test_example_and_synthetic_clusters_plan_optimally():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from parallax_timing import synthetic_cluster

    for cluster in (load_cluster(ROOT / "examples/clusters/small.toml"),
                    load_cluster(ROOT / "examples/clusters/geo-70b.toml"),
                    synthetic_cluster(256, seed=1)):
        result = allocate(cluster, Phase1Config())
        assert result.optimal
        _check_pipelines(cluster, result)
        holders = {s.name for s in cluster.servers} - set(result.unused)
        assert set(result.placement.ranges) == holders
