"""CG-BP: conservative block counts, coverage, Lemma 3.3's layout and the bound (17)."""

from __future__ import annotations

import math
import random

import pytest

from market.errors import QuarryError
from market.scheduler import cgbp, routing, scenarios, simulator
from market.scheduler.cluster import Cluster, Link, ModelSpec, Server

S_M = 100  # bytes per block
L_IN, L_MAX = 2, 8  # with 1 KV byte per token per block: s_c = 10 bytes
S_C = L_IN + L_MAX


def _model(L: int) -> ModelSpec:
    return ModelSpec("toy", L, S_M, 1, hidden_size=1, dtype_bytes=1)


def _random_cluster(rng: random.Random, R: int) -> Cluster:
    L = rng.randint(3, 12)
    servers = []
    for i in range(rng.randint(2, 7)):
        blocks = rng.randint(0, 6)
        servers.append(
            Server(
                f"s{i}",
                memory_bytes=blocks * (S_M + S_C * R) + rng.randint(0, S_M),
                prefill_s_per_block=rng.uniform(0.01, 0.1),
                decode_s_per_block=rng.uniform(0.001, 0.02),
            )
        )
    clients = {
        f"c{k}": {s.name: Link(rng.uniform(0.001, 0.1), 1e9) for s in servers}
        for k in range(rng.randint(1, 3))
    }
    return Cluster(servers, _model(L), clients=clients)


def _feasible_instances(seed: int, count: int):
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        R = rng.randint(1, 5)
        c = _random_cluster(rng, R)
        if sum(cgbp.block_counts(c, R, L_IN, L_MAX).values()) >= c.model.num_layers:
            out.append((c, R))
    return out


def test_block_count_formula():
    s = Server("a", 1000, 0.1, 0.01)
    c = Cluster([s], _model(5))
    assert cgbp.block_counts(c, 3, L_IN, L_MAX) == {"a": 5}  # floor(1000/130) = 7, capped at L
    c = Cluster([s], _model(50))
    assert cgbp.block_counts(c, 3, L_IN, L_MAX) == {"a": 7}
    assert cgbp.block_counts(c, 90, L_IN, L_MAX) == {"a": 1}  # 1000 // 1000
    assert cgbp.block_counts(c, 91, L_IN, L_MAX) == {"a": 0}
    with pytest.raises(QuarryError, match="concurrency"):
        cgbp.block_counts(c, 0, L_IN, L_MAX)


def test_every_block_covered_with_capacity_for_R():
    for c, R in _feasible_instances(1, 150):
        L = c.model.num_layers
        p = cgbp.plan(c, R, L_IN, L_MAX)
        covered = [0] * L
        for name, (a, e) in p.placement.ranges.items():
            assert 0 <= a < e <= L and e - a == p.blocks[name]
            srv = c.server(name)
            # conservative: room for R sessions' caches on every hosted block
            assert srv.memory_bytes - S_M * p.blocks[name] >= S_C * R * p.blocks[name]
            assert p.sessions[name] >= R
            for b in range(a, e):
                covered[b] += p.sessions[name]
        assert all(x >= R for x in covered)
        assert covered == p.capacity
        assert routing.uncovered_blocks(c, p.placement) == []


def test_fastest_servers_tile_the_model_in_order():
    """Lemma 3.3: servers 1..K-1 take consecutive blocks, server K ends at L."""
    for c, R in _feasible_instances(2, 100):
        L = c.model.num_layers
        p = cgbp.plan(c, R, L_IN, L_MAX)
        total = 0
        for name in p.order:
            a, e = p.placement.ranges[name]
            if total + p.blocks[name] >= L:
                assert (a, e) == (L - p.blocks[name], L)
                break
            assert a == total
            total += p.blocks[name]


def test_amortised_order():
    for c, R in _feasible_instances(3, 30):
        p = cgbp.plan(c, R, L_IN, L_MAX)
        tts = [p.amortised[n] for n in p.order]
        assert tts == sorted(tts)
        for n in p.order:
            srv = c.server(n)
            worst = max(routing.token_rtt(c, k, n) for k in c.clients)
            assert p.amortised[n] == pytest.approx(srv.decode_s_per_block + worst / p.blocks[n])


def test_upper_bound_holds_for_shortest_paths():
    for c, R in _feasible_instances(4, 150):
        bound = cgbp.upper_bound(c, R, L_IN, L_MAX)
        p = cgbp.place(c, R, L_IN, L_MAX)
        for client in [None, *c.clients]:
            _, t = routing.shortest_path(c, p, client, L_MAX, decode_only=True)
            assert t <= bound + 1e-12


def test_upper_bound_holds_in_simulation_within_R():
    """Up to |R| sessions at once never wait, and each stays within the bound (17).

    WS-RR minimises the whole request time, so the bound checked is (17) with eq. (8)'s
    per-token averages, against the simulator's per-token time (completion / l_max).
    """
    for seed, (c, R) in enumerate(_feasible_instances(5, 40)):
        bound = cgbp.upper_bound(c, R, L_IN, L_MAX, averaged=True)
        p = cgbp.place(c, R, L_IN, L_MAX)
        rng = random.Random(seed)
        clients = list(c.clients)
        trace = [simulator.Request(i, 0.0, rng.choice(clients)) for i in range(R)]
        res = simulator.simulate(c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX)
        for r in res.requests:
            assert r.wait_s == 0.0
            assert (r.end_s - r.arrival_s) / L_MAX <= bound + 1e-9


def test_paper_suboptimality_example():
    """Fig. 5: L^2 servers with M = (L+1) s_m and |R| = L^2 get one block each."""
    L = 3
    s_c = S_C
    s_m = L * s_c
    model = ModelSpec("toy", L, s_m, 1, hidden_size=1, dtype_bytes=1)
    servers = [Server(f"s{i}", (L + 1) * s_m, 0.0, 0.01) for i in range(L * L)]
    c = Cluster(servers, model, clients={"c": {s.name: Link(0.1, math.inf) for s in servers}})
    p = cgbp.place(c, L * L, L_IN, L_MAX)
    assert all(e - a == 1 for a, e in p.ranges.values())
    path, t = routing.shortest_path(c, p, "c", L_MAX, decode_only=True)
    assert len(path) == L
    assert t == pytest.approx(L * (0.1 + routing.SERIALIZATION_S + 0.01))


def test_infeasible_concurrency_names_the_limit():
    c = Cluster([Server("a", 1000, 0.1, 0.01)], _model(8))
    r_max = cgbp.max_concurrency(c, L_IN, L_MAX)
    assert cgbp.block_counts(c, r_max, L_IN, L_MAX)["a"] >= 8
    assert cgbp.block_counts(c, r_max + 1, L_IN, L_MAX)["a"] < 8
    with pytest.raises(QuarryError, match=f"largest feasible .R. here is {r_max}"):
        cgbp.place(c, r_max + 1, L_IN, L_MAX)


def test_target_concurrency_is_mean_plus_one_std():
    c = scenarios.clustered(20, 0)
    client = next(iter(c.clients))
    p1 = cgbp.place(c, 1, 20, 128)
    path, _ = routing.shortest_path(c, p1, client, 128, l_in=20)
    mean = 0.5 * routing.request_time(c, path, client, 20, 128)
    assert cgbp.target_concurrency(c, 0.5, 20, 128, client) == round(mean + math.sqrt(mean))
    assert cgbp.target_concurrency(c, 1e-9, 20, 128, client) == 1
    assert cgbp.target_concurrency(c, 1e6, 20, 128, client) == cgbp.max_concurrency(c, 20, 128)


def test_bloom_on_clustered_scenario():
    c = scenarios.clustered(20, 0)
    p = cgbp.plan(c, 37, 20, 128)
    assert p.blocks["a100-0"] == 51 and p.blocks["mig-0"] == 5
    assert p.placement.ranges["a100-0"] == (0, 51)  # the fastest server starts the model
    assert p.placement.ranges["a100-1"] == (19, 70)
