"""Parallax Phase 2: the layer-DAG DP against brute-force path enumeration, load feedback."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server
from market.scheduler.parallax_phase2 import NoRouteError, Router, hop_latency_matrix

pytestmark = pytest.mark.timeout(120)


def make(taus: list[float], ranges: list[tuple[int, int]], L: int, *,
         kv_ratio: float = 0.0, memory: int = 10**12) -> tuple[Cluster, Placement]:
    """GPUs g0..gn with per-layer time taus[i] holding ranges[i]; kv_ratio = s_kv / B."""
    B = 1_000_000
    tokens = 512 + 256
    model = ModelSpec("m", num_layers=L, bytes_per_layer=B,
                      kv_bytes_per_token_per_layer=int(kv_ratio * B / tokens))
    servers = [Server(f"g{i}", memory_bytes=memory, prefill_s_per_block=0.01,
                      decode_s_per_block=t) for i, t in enumerate(taus)]
    placement = Placement(ranges={f"g{i}": r for i, r in enumerate(ranges)})
    return Cluster(servers=servers, model=model), placement


def brute_route(taus, ranges, rho, L, entry=None, exit_=None) -> float:
    """Cheapest sequence g_0..g_{L-1}, g_l holding l, by enumerating all of them."""
    holders = [[i for i, (a, b) in enumerate(ranges) if a <= layer < b] for layer in range(L)]
    best = np.inf
    for seq in itertools.product(*holders):
        cost = sum(taus[g] for g in seq)
        cost += sum(rho[a, b] for a, b in zip(seq, seq[1:], strict=False) if a != b)
        if entry is not None:
            cost += entry[seq[0]] + exit_[seq[-1]]
        best = min(best, cost)
    return best


def random_case(rng: random.Random):
    L = rng.randint(1, 6)
    n = rng.randint(1, 4)
    ranges = []
    for _ in range(n):
        a = rng.randint(0, L - 1)
        ranges.append((a, rng.randint(a + 1, L)))
    taus = [rng.uniform(0.001, 0.01) for _ in range(n)]
    rho = np.array([[rng.uniform(0.0, 0.02) for _ in range(n)] for _ in range(n)])
    rho = (rho + rho.T) / 2  # arbitrary, may break the triangle inequality
    np.fill_diagonal(rho, 0.0)
    return L, ranges, taus, rho


def test_route_matches_brute_force_enumeration():
    rng = random.Random(11)
    routed = 0
    for _ in range(400):
        L, ranges, taus, rho = random_case(rng)
        cluster, placement = make(taus, ranges, L)
        router = Router(cluster, placement, rho=rho)
        expected = brute_route(taus, ranges, rho, L)
        if not np.isfinite(expected):
            with pytest.raises(NoRouteError):
                router.route()
            continue
        route = router.route()
        assert route.per_token_s == pytest.approx(expected, rel=1e-12, abs=1e-15)
        # The chain is legal: contiguous, gap-free, each hop inside its server's range.
        cursor = 0
        for name, a, b in route.chain:
            lo, hi = placement.ranges[name]
            assert a == cursor and lo <= a < b <= hi
            cursor = b
        assert cursor == L
        assert router.chain_cost(route.chain) == pytest.approx(route.per_token_s)
        routed += 1
    assert routed > 150


def test_client_entry_and_exit_are_charged():
    rng = random.Random(12)
    for _ in range(100):
        L, ranges, taus, rho = random_case(rng)
        cluster, placement = make(taus, ranges, L)
        rtts = {f"g{i}": rng.uniform(0.0, 0.05) for i in range(len(taus))}
        cluster.clients["c"] = {n: Link(r, float("inf")) for n, r in rtts.items()}
        router = Router(cluster, placement, rho=rho, client="c")
        one_way = np.array([rtts[f"g{i}"] / 2 for i in range(len(taus))])
        expected = brute_route(taus, ranges, rho, L, one_way, one_way)
        if np.isfinite(expected):
            assert router.route().per_token_s == pytest.approx(expected)


def test_hop_matrix_agrees_with_cluster_link_resolution():
    model = ModelSpec("m", 4, 1000, 0, hidden_size=1000, dtype_bytes=2)
    servers = [Server(f"s{i}", 10**9, 0.1, 0.1, region=r) for i, r in enumerate("xxyz")]
    cluster = Cluster(
        servers=servers, model=model,
        links={("s0", "s2"): Link(0.5, 1e6)},
        region_links={("x", "x"): Link(0.01, 1e9), ("x", "y"): Link(0.2, 1e8)},
        default_link=Link(0.3, 5e7),
    )
    names = [s.name for s in servers]
    rho = hop_latency_matrix(cluster, names)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            lk = cluster.link(a, b)
            want = 0.0 if a == b else lk.rtt_s / 2 + 2000 / lk.bandwidth_bytes_per_s
            assert rho[i, j] == pytest.approx(want)


def two_pipelines(kv_ratio: float = 0.5, memory: int = 10**12):
    """Pipeline A (a0, a1) is a bit faster than pipeline B (b0, b1); L = 4."""
    cluster, placement = make([0.010, 0.010, 0.011, 0.011], [(0, 2), (2, 4), (0, 2), (2, 4)], 4,
                              kv_ratio=kv_ratio, memory=memory)
    rho = np.full((4, 4), 1.0)  # crossing between pipelines is very expensive
    rho[0, 1] = rho[1, 0] = rho[2, 3] = rho[3, 2] = 0.001
    np.fill_diagonal(rho, 0.0)
    return cluster, placement, rho


def test_load_feedback_spreads_sessions_and_release_restores():
    cluster, placement, rho = two_pipelines()
    router = Router(cluster, placement, rho=rho)
    s1, r1 = router.acquire("s1")
    assert r1.servers == ["g0", "g1"]
    # s1 raised tau on g0 and g1 by 50%: the slower, idle pipeline is now the cheaper one.
    s2, r2 = router.acquire("s2")
    assert r2.servers == ["g2", "g3"]
    assert router.load.tolist() == [1, 1, 1, 1]
    router.release(s1)
    assert router.route().servers == ["g0", "g1"]
    router.release(s2)
    assert router.load.tolist() == [0, 0, 0, 0]


def test_without_feedback_every_session_takes_the_same_chain():
    cluster, placement, rho = two_pipelines(kv_ratio=0.0)
    router = Router(cluster, placement, rho=rho)
    assert {tuple(router.acquire()[1].servers) for _ in range(5)} == {("g0", "g1")}


def test_kv_capacity_is_a_hard_limit():
    # free = 0.9 * memory - 2 layers * 1e6 bytes; s_kv = 0.5e6 -> capacity 1 session each
    cluster, placement, rho = two_pipelines(kv_ratio=0.5, memory=int(3.2e6 / 0.9))
    router = Router(cluster, placement, rho=rho, load_weight=0.0)
    assert router.capacity.tolist() == [1, 1, 1, 1]
    assert router.acquire("a")[1].servers == ["g0", "g1"]
    assert router.acquire("b")[1].servers == ["g2", "g3"]
    with pytest.raises(NoRouteError):
        router.acquire("c")
    router.release("a")
    assert router.acquire("c")[1].servers == ["g0", "g1"]


def test_a_layer_without_a_server_has_no_route():
    cluster, placement = make([0.01, 0.01], [(0, 2), (3, 4)], 4)
    with pytest.raises(NoRouteError, match="layer 2"):
        Router(cluster, placement).route()


def test_router_rejects_bad_placements():
    from market.errors import QuarryError

    cluster, placement = make([0.01], [(0, 4)], 4)
    placement.ranges["ghost"] = (0, 4)
    with pytest.raises(QuarryError, match="ghost"):
        Router(cluster, placement)
    cluster, placement = make([0.01], [(0, 5)], 4)
    with pytest.raises(QuarryError, match="outside"):
        Router(cluster, placement)
