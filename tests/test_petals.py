"""PETALS-like baseline: block count, block selection, heuristic routing and backoff."""

from __future__ import annotations

import math

import pytest

from market.errors import QuarryError
from market.scheduler import petals, routing, scenarios
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server


def test_bloom_block_counts_match_the_paper():
    """53 blocks on an A100-80GB and 4 on a MIG slice, as the paper reports for PETALS."""
    c = scenarios.clustered()
    assert petals.block_count(c, c.server("a100-0")) == 53
    assert petals.block_count(c, c.server("mig-0")) == 4
    # the pool holds 4096 tokens per block whatever the load: 27 sessions of 20 + 128
    budget = petals.cache_budgets(c, Placement({"a100-0": (0, 53)}))["a100-0"]
    s_c = routing.cache_bytes_per_block(c, 20, 128)
    assert budget // s_c // 53 == 27


def test_choose_best_blocks_takes_least_served_window():
    assert petals.choose_best_blocks([770.0] * 40 + [0.0] * 30, 4) == 40
    assert petals.choose_best_blocks([0.0] * 10, 3) == 0  # ties: smallest start
    # sorted-window comparison: [5, 1] beats [2, 2] because 1 < 2
    assert petals.choose_best_blocks([2.0, 2.0, 5.0, 1.0], 2) == 2
    with pytest.raises(QuarryError):
        petals.choose_best_blocks([1.0, 2.0], 3)


def test_placement_is_sequential_and_seeded():
    c = scenarios.clustered()
    first = petals.place(c, order=[s.name for s in c.servers])
    assert first.ranges["a100-0"] == (0, 53)
    assert first.ranges["a100-1"] == (17, 70)  # the window holding all 17 uncovered blocks
    assert petals.place(c, seed=3).ranges == petals.place(c, seed=3).ranges
    orders = {tuple(sorted(petals.place(c, seed=s).ranges.items())) for s in range(8)}
    assert len(orders) > 1  # join order matters
    with pytest.raises(QuarryError, match="join order"):
        petals.place(c, order=["a100-0"])


def test_same_signature_as_cgbp():
    c = scenarios.clustered()
    assert petals.place(c, 10, 20, 64).ranges == petals.place(c, 99, 20, 128).ranges


def _toy() -> Cluster:
    """A [0,2) -> B or C [2,3) -> D [3,4). C is far from the client but pings A and D fast."""
    servers = [Server(n, 10**12, 0.1, 0.01) for n in "ABCD"]
    model = ModelSpec("m", 4, 10, 1, hidden_size=1, dtype_bytes=1)
    near = Link(0.02, math.inf)
    clients = {"c": {"A": near, "B": Link(0.1, math.inf), "C": Link(2.0, math.inf), "D": near}}
    slow, fast = Link(0.4, math.inf), Link(0.002, math.inf)
    links = {("A", "B"): slow, ("B", "D"): slow, ("A", "C"): fast, ("C", "D"): fast}
    return Cluster(servers, model, links=links, clients=clients)


TOY = Placement({"A": (0, 2), "B": (2, 3), "C": (2, 3), "D": (3, 4)})


def test_route_uses_server_to_server_pings():
    c = _toy()
    path = petals.route(c, TOY, "c")
    assert path == [("A", 0, 2), ("C", 2, 3), ("D", 3, 4)]
    # ... although with the client relaying every token, B is the faster choice
    via_b = [("A", 0, 2), ("B", 2, 3), ("D", 3, 4)]
    assert routing.decode_token_time(c, via_b, "c") < routing.decode_token_time(c, path, "c")


def test_route_penalises_servers_without_cache():
    c = _toy()
    path = petals.route(c, TOY, "c", free_slots={"A": 10, "B": 10, "C": 0, "D": 10})
    assert [h[0] for h in path] == ["A", "B", "D"]
    # every alternative lacks cache too: the penalty cannot be avoided, the route stays
    path = petals.route(c, TOY, "c", free_slots={"A": 10, "B": 0, "C": 0, "D": 10})
    assert [h[0] for h in path] == ["A", "C", "D"]


def test_route_jumps_only_at_span_ends():
    c = _toy()
    p = Placement({"A": (0, 3), "B": (1, 4), "D": (2, 4)})
    path = petals.route(c, p, "c")
    routing.validate_path(c, p, path)
    assert path[0] == ("A", 0, 3)


def test_route_reports_missing_blocks():
    with pytest.raises(QuarryError, match="no chain"):
        petals.route(_toy(), Placement({"A": (0, 2), "B": (3, 4)}), "c")


def test_backoff_schedule():
    assert [petals.backoff_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
