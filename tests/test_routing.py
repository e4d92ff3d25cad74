"""Routing: feasibility rule (3), Dijkstra against brute force, WS-RR's waiting time (20)."""

from __future__ import annotations

import math
import random

import pytest

from market.errors import QuarryError
from market.scheduler import routing
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server


def _cluster(n_servers: int, L: int, rng: random.Random, n_clients: int = 2) -> Cluster:
    servers = [
        Server(
            f"s{i}",
            memory_bytes=10**12,
            prefill_s_per_block=rng.uniform(0.01, 0.2),
            decode_s_per_block=rng.uniform(0.001, 0.05),
        )
        for i in range(n_servers)
    ]
    clients = {
        f"c{k}": {s.name: Link(rng.uniform(0.001, 0.2), rng.uniform(1e6, 1e9)) for s in servers}
        for k in range(n_clients)
    }
    model = ModelSpec("toy", L, 1000, 8, hidden_size=64, dtype_bytes=2)
    return Cluster(servers, model, clients=clients)


def _random_placement(cluster: Cluster, rng: random.Random) -> Placement:
    L = cluster.model.num_layers
    ranges = {}
    for s in cluster.servers:
        a = rng.randrange(L)
        ranges[s.name] = (a, rng.randint(a + 1, L))
    return Placement(ranges)


def _brute_force(cluster, placement, client, l_in, l_max, decode_only):
    """Enumerate every chain that covers [0, L) by rule (3) and price it directly."""
    L = cluster.model.num_layers
    best = (math.inf, None)

    def price(path):
        dec = routing.decode_token_time(cluster, path, client)
        if decode_only:
            return dec
        return routing.request_time(cluster, path, client, l_in, l_max) / l_max

    def walk(end, path, used):
        nonlocal best
        if end == L:
            cost = price(path)
            if cost < best[0] - 1e-12:
                best = (cost, list(path))
            return
        for name, (s, e) in placement.ranges.items():
            if name not in used and routing.feasible_hop(0, end, s, e):
                walk(e, [*path, (name, end, e)], used | {name})

    walk(0, [], frozenset())
    return best


def test_feasible_hop_rule():
    # next block 5 must be on j and j must add something: start_j <= 5 < end_j
    assert routing.feasible_hop(0, 5, 5, 10)
    assert routing.feasible_hop(0, 5, 3, 10)  # overlap: j skips blocks 3..4
    assert routing.feasible_hop(0, 5, 0, 6)
    assert not routing.feasible_hop(0, 5, 6, 10)  # gap: block 5 missing
    assert not routing.feasible_hop(0, 5, 2, 5)  # j adds nothing after i
    assert not routing.feasible_hop(0, 5, 0, 5)


def test_feasible_edges_source_and_sink():
    rng = random.Random(0)
    c = _cluster(3, 6, rng)
    p = Placement({"s0": (0, 3), "s1": (2, 6), "s2": (3, 6)})
    edges = {(i, j, s, e) for i, j, s, e in routing.feasible_edges(c, p)}
    assert (routing.SOURCE, "s0", 0, 3) in edges
    assert ("s0", "s1", 3, 6) in edges and ("s0", "s2", 3, 6) in edges
    assert ("s1", routing.SINK, 6, 6) in edges and ("s2", routing.SINK, 6, 6) in edges
    assert not any(i == routing.SOURCE and j != "s0" for i, j, _, _ in edges)


@pytest.mark.parametrize("decode_only", [True, False])
def test_shortest_path_matches_brute_force(decode_only):
    rng = random.Random(1234 + decode_only)
    checked = 0
    for _ in range(300):
        c = _cluster(rng.randint(2, 6), rng.randint(3, 9), rng)
        p = _random_placement(c, rng)
        client = rng.choice([None, "c0", "c1"])
        l_in, l_max = rng.randint(1, 30), rng.randint(1, 200)
        want, want_path = _brute_force(c, p, client, l_in, l_max, decode_only)
        if want_path is None:
            with pytest.raises(QuarryError):
                routing.shortest_path(c, p, client, l_max, l_in=l_in, decode_only=decode_only)
            continue
        path, cost = routing.shortest_path(c, p, client, l_max, l_in=l_in, decode_only=decode_only)
        routing.validate_path(c, p, path)
        assert cost == pytest.approx(want, rel=1e-9)
        checked += 1
    assert checked > 100


def test_shortest_path_reports_missing_blocks():
    c = _cluster(2, 6, random.Random(0))
    with pytest.raises(QuarryError, match=r"blocks \[3\]"):
        routing.shortest_path(c, Placement({"s0": (0, 3), "s1": (4, 6)}), None, 10)


def test_token_and_prompt_rtt_follow_the_link():
    s = Server("a", 10**12, 0.1, 0.01)
    model = ModelSpec("m", 2, 10, 4, hidden_size=1000, dtype_bytes=2)
    c = Cluster([s], model, clients={"near": {"a": Link(0.01, 1e6)}, "far": {"a": Link(0.2, 1e6)}})
    # one hidden state = 2000 bytes, 2 ms each way at 1 MB/s
    ser = routing.SERIALIZATION_S
    assert routing.token_rtt(c, "near", "a") == pytest.approx(0.01 + 0.004 + ser)
    assert routing.token_rtt(c, None, "a") == pytest.approx(0.2 + 0.004 + ser)
    assert routing.prompt_rtt(c, "near", "a", 10) == pytest.approx(0.01 + 0.04 + ser)
    with pytest.raises(QuarryError, match="unknown client"):
        routing.token_rtt(c, "nobody", "a")


def test_validate_path_rejects_gaps_and_foreign_servers():
    c = _cluster(2, 4, random.Random(0))
    p = Placement({"s0": (0, 2), "s1": (1, 4)})
    routing.validate_path(c, p, [("s0", 0, 2), ("s1", 2, 4)])
    with pytest.raises(QuarryError):
        routing.validate_path(c, p, [("s0", 0, 1), ("s1", 2, 4)])
    with pytest.raises(QuarryError):
        routing.validate_path(c, p, [("s0", 0, 2)])
    with pytest.raises(QuarryError):
        routing.validate_path(c, p, [("s9", 0, 4)])


def test_waiting_time_eq20():
    # capacity 10 slots; sessions hold 4 (ends in 5 s), 3 (in 2 s), 2 (in 9 s): 9 used.
    active = [(5.0, 4), (2.0, 3), (9.0, 2)]
    assert routing.waiting_time(10, active, 1) == 0.0
    assert routing.waiting_time(10, active, 2) == 2.0  # after the 2 s session: 4 free
    assert routing.waiting_time(10, active, 4) == 2.0
    assert routing.waiting_time(10, active, 5) == 5.0  # after 2 s and 5 s: 8 free
    assert routing.waiting_time(10, active, 10) == 9.0
    assert routing.waiting_time(10, active, 11) == math.inf
    assert routing.waiting_time(3, [], 3) == 0.0


def _line() -> tuple[Cluster, Placement]:
    """Two ways through 4 blocks: fast A [0,4) alone, or slower B [0,2) + C [2,4)."""
    servers = [
        Server("A", 10**12, 0.01, 0.001),
        Server("B", 10**12, 0.02, 0.004),
        Server("C", 10**12, 0.02, 0.004),
    ]
    model = ModelSpec("m", 4, 10, 1, hidden_size=1, dtype_bytes=1)
    links = {n: Link(0.01, math.inf) for n in "ABC"}
    c = Cluster(servers, model, clients={"c": links})
    return c, Placement({"A": (0, 4), "B": (0, 2), "C": (2, 4)})


def test_ws_rr_waits_or_detours_by_cost():
    c, p = _line()
    cap = {"A": 4, "B": 2, "C": 2}
    path, wait, _ = routing.ws_rr(c, p, "c", 1, 10, cap, {})
    assert [h[0] for h in path] == ["A"] and wait == 0.0
    # A is full for 0.01 s more: waiting is cheaper than the slower two-hop chain
    path, wait, cost = routing.ws_rr(c, p, "c", 1, 10, cap, {"A": [(0.01, 4)]})
    assert [h[0] for h in path] == ["A"] and wait == pytest.approx(0.01)
    assert cost == pytest.approx(0.01 + routing.request_time(c, path, "c", 1, 10))
    # A is full for 100 s: the detour wins and needs no wait
    path, wait, _ = routing.ws_rr(c, p, "c", 1, 10, cap, {"A": [(100.0, 4)]})
    assert [h[0] for h in path] == ["B", "C"] and wait == 0.0
