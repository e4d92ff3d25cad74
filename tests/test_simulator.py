"""Simulator: hand-computed timings on two servers, memory contention, retries, determinism."""

from __future__ import annotations

import pytest

from market.errors import QuarryError
from market.scheduler import cgbp, petals, scenarios, simulator
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server

# Two servers in a chain: A holds blocks [0,2), B holds [2,4).
# One hidden state is 1000 * 2 = 2000 bytes; KV is 10 bytes per token per block.
L_IN, L_MAX = 5, 11  # s_c = 10 * (5 + 11) = 160 bytes per block per session
S_M = 1000
SER = 0.018  # routing.SERIALIZATION_S, spelled out so the numbers below are by hand


def _two_servers(a_memory: int) -> tuple[Cluster, Placement]:
    model = ModelSpec("toy", 4, S_M, 10, hidden_size=1000, dtype_bytes=2)
    servers = [
        Server("A", a_memory, prefill_s_per_block=0.3, decode_s_per_block=0.02),
        Server("B", 10**9, prefill_s_per_block=0.5, decode_s_per_block=0.03),
    ]
    clients = {"c": {"A": Link(0.05, 1e6), "B": Link(0.1, 1e6)}}
    return Cluster(servers, model, clients=clients), Placement({"A": (0, 2), "B": (2, 4)})


# Prefill: A 0.05 + 2 * 5 * 2000 / 1e6 + SER + 2 * 0.3; B 0.1 + 0.02 + SER + 2 * 0.5
FIRST = (0.05 + 0.02 + SER + 0.6) + (0.1 + 0.02 + SER + 1.0)
# Decode step: A 0.05 + 2 * 2000 / 1e6 + SER + 2 * 0.02; B 0.1 + 0.004 + SER + 2 * 0.03
STEP = (0.05 + 0.004 + SER + 0.04) + (0.1 + 0.004 + SER + 0.06)
TOTAL = FIRST + (L_MAX - 1) * STEP


def test_one_request_follows_eq1():
    c, p = _two_servers(10**9)
    trace = [simulator.Request(0, 2.0, "c")]
    res = simulator.simulate(c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX)
    (r,) = res.requests
    assert r.path == [("A", 0, 2), ("B", 2, 4)]
    assert r.start_s == 2.0 and r.wait_s == 0.0
    assert r.ttft_s == pytest.approx(1.826)
    assert r.ttft_s == pytest.approx(FIRST)
    assert r.end_s - r.arrival_s == pytest.approx(4.766)
    assert res.avg_per_token_s == pytest.approx(4.766 / L_MAX)
    assert res.avg_decode_s == pytest.approx(0.294)


def test_second_request_queues_until_memory_frees():
    # A's cache room: 2420 - 2 * 1000 = 420 bytes = 2 slots = one 2-block session
    c, p = _two_servers(2 * S_M + 2 * 160 + 100)
    trace = [simulator.Request(0, 0.0, "c"), simulator.Request(1, 1.0, "c")]
    res = simulator.simulate(c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX)
    r0, r1 = res.requests
    assert r0.end_s == pytest.approx(TOTAL)
    assert r1.start_s == pytest.approx(r0.end_s)  # starts the moment r0 releases A
    assert r1.wait_s == pytest.approx(TOTAL - 1.0)
    assert r1.ttft_s == pytest.approx(TOTAL - 1.0 + FIRST)
    assert r1.end_s == pytest.approx(2 * TOTAL)
    assert res.max_concurrent == 1
    assert res.avg_first_token_s == pytest.approx((FIRST + TOTAL - 1.0 + FIRST) / 2)


def test_petals_client_retries_with_backoff():
    c, p = _two_servers(2 * S_M + 2 * 160 + 100)
    trace = [simulator.Request(0, 0.0, "c"), simulator.Request(1, 1.0, "c")]
    budget = {"A": 320, "B": 10**6}  # a fixed pool of 2 slots on A
    res = simulator.simulate(
        c, p, simulator.PetalsPolicy(), trace, L_IN, L_MAX, cache_budget=budget
    )
    r0, r1 = res.requests
    assert r0.end_s == pytest.approx(TOTAL)  # 4.766
    # r1 fails at t=1 and retries after 1, 2, 4 s: at t=2, 4 (A still busy), then t=8
    assert r1.attempts == 4
    assert r1.start_s == pytest.approx(8.0)
    assert r1.end_s == pytest.approx(8.0 + TOTAL)


def test_fixed_request_delay_pads_completion_and_holds_memory():
    """The authors' constant delay: +D on TTFT and completion, caches held through it."""
    D = 7.5
    c, p = _two_servers(10**9)
    trace = [simulator.Request(0, 2.0, "c")]
    res = simulator.simulate(
        c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX, fixed_request_delay_s=D
    )
    (r,) = res.requests
    assert res.fixed_request_delay_s == D
    assert r.start_s == 2.0  # memory is taken at once; the delay follows
    assert r.ttft_s == pytest.approx(FIRST + D)
    assert r.end_s - r.arrival_s == pytest.approx(TOTAL + D)
    assert res.avg_per_token_s == pytest.approx((TOTAL + D) / L_MAX)
    assert res.avg_decode_s == pytest.approx(STEP)  # decode speed is untouched

    # A holds one session: the second request waits for the first one's padded end.
    c, p = _two_servers(2 * S_M + 2 * 160 + 100)
    trace = [simulator.Request(0, 0.0, "c"), simulator.Request(1, 1.0, "c")]
    res = simulator.simulate(
        c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX, fixed_request_delay_s=D
    )
    r0, r1 = res.requests
    assert r0.end_s == pytest.approx(TOTAL + D)
    assert r1.start_s == pytest.approx(TOTAL + D)
    assert r1.wait_s == pytest.approx(TOTAL - 1.0 + D)  # D more than without the delay
    assert r1.ttft_s == pytest.approx(TOTAL - 1.0 + D + FIRST + D)
    assert r1.end_s == pytest.approx(2 * (TOTAL + D))
    assert res.max_concurrent == 1


def test_fixed_request_delay_with_petals_retries():
    c, p = _two_servers(2 * S_M + 2 * 160 + 100)
    trace = [simulator.Request(0, 0.0, "c"), simulator.Request(1, 1.0, "c")]
    budget = {"A": 320, "B": 10**6}
    res = simulator.simulate(
        c,
        p,
        simulator.PetalsPolicy(),
        trace,
        L_IN,
        L_MAX,
        cache_budget=budget,
        fixed_request_delay_s=5.0,
    )
    r0, r1 = res.requests
    assert r0.end_s == pytest.approx(TOTAL + 5.0)  # 9.766: A is busy at t = 1, 2, 4, 8
    assert r1.attempts == 5
    assert r1.start_s == pytest.approx(16.0)  # the next retry, 8 s after t = 8
    assert r1.end_s == pytest.approx(16.0 + TOTAL + 5.0)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_fixed_request_delay_rejects_bad_values(bad):
    c, p = _two_servers(10**9)
    trace = [simulator.Request(0, 0.0, "c")]
    with pytest.raises(QuarryError, match="fixed_request_delay_s"):
        simulator.simulate(
            c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX, fixed_request_delay_s=bad
        )


def test_authors_delays_lengthen_petals_contention():
    """With 250 s per PETALS session, its fixed 27-session pool fills even at 0.1 req/s."""
    c = scenarios.clustered(20, 0)
    client = next(iter(c.clients))
    trace = simulator.poisson_trace(60, 0.1, client, seed=0)
    pp = petals.place(c, order=[s.name for s in c.servers])
    kw = {"cache_budget": petals.cache_budgets(c, pp)}
    plain = simulator.simulate(c, pp, simulator.PetalsPolicy(), trace, 20, 128, **kw)
    padded = simulator.simulate(
        c,
        pp,
        simulator.PetalsPolicy(),
        trace,
        20,
        128,
        fixed_request_delay_s=simulator.AUTHORS_FIXED_DELAY_S["petals"],
        **kw,
    )
    assert plain.avg_wait_s == 0.0 and plain.max_concurrent < 27
    assert padded.max_concurrent == 27  # 4096 cache tokens / 148 per session
    assert padded.avg_wait_s > 1.0
    assert padded.avg_per_token_s > plain.avg_per_token_s + 250.0 / 128


def test_cache_budget_override_and_impossible_chain():
    c, p = _two_servers(10**9)
    trace = [simulator.Request(0, 0.0, "c")]
    tiny = {"A": 100}  # less than one 160-byte cache
    with pytest.raises(QuarryError, match="more cache memory than a server has"):
        simulator.simulate(c, p, simulator.WSRRPolicy(), trace, L_IN, L_MAX, cache_budget=tiny)
    with pytest.raises(QuarryError, match="never fit"):
        simulator.simulate(
            c, p, simulator.ShortestPathPolicy(), trace, L_IN, L_MAX, cache_budget=tiny
        )


def test_poisson_trace_is_seeded():
    a = simulator.poisson_trace(50, 0.5, "c", seed=1)
    assert a == simulator.poisson_trace(50, 0.5, "c", seed=1)
    assert a != simulator.poisson_trace(50, 0.5, "c", seed=2)
    assert a[0].arrival_s == 0.0
    assert all(x.arrival_s < y.arrival_s for x, y in zip(a, a[1:], strict=False))
    mixed = simulator.poisson_trace(40, 1.0, ["c1", "c2"], seed=0)
    assert {r.client for r in mixed} == {"c1", "c2"}
    with pytest.raises(QuarryError):
        simulator.poisson_trace(5, 0.0)


def _run(seed: int) -> list[tuple]:
    c = scenarios.clustered(20, 0)
    client = next(iter(c.clients))
    trace = simulator.poisson_trace(40, 0.5, client, seed=seed)
    out = []
    p = cgbp.place(c, cgbp.target_concurrency(c, 0.5, 20, 128, client), 20, 128)
    res = simulator.simulate(c, p, simulator.WSRRPolicy(), trace, 20, 128)
    out += [(r.start_s, r.first_token_s, r.end_s, tuple(r.path)) for r in res.requests]
    pp = petals.place(c, seed=seed)
    res = simulator.simulate(
        c, pp, simulator.PetalsPolicy(), trace, 20, 128, cache_budget=petals.cache_budgets(c, pp)
    )
    out += [(r.start_s, r.first_token_s, r.end_s, tuple(r.path)) for r in res.requests]
    return out


def test_deterministic_under_a_seed():
    assert _run(3) == _run(3)
    assert _run(3) != _run(4)


def test_petals_waits_where_cgbp_does_not():
    """The paper's mechanism: PETALS' 4096-token pool fills at 0.5 req/s with l_max = 128."""
    c = scenarios.clustered(20, 0)
    client = next(iter(c.clients))
    trace = simulator.poisson_trace(60, 0.5, client, seed=0)
    R = cgbp.target_concurrency(c, 0.5, 20, 128, client)
    ws = simulator.simulate(c, cgbp.place(c, R, 20, 128), simulator.WSRRPolicy(), trace, 20, 128)
    pp = petals.place(c, order=[s.name for s in c.servers])
    pe = simulator.simulate(
        c, pp, simulator.PetalsPolicy(), trace, 20, 128, cache_budget=petals.cache_budgets(c, pp)
    )
    assert pe.avg_wait_s > 10 * max(ws.avg_wait_s, 0.1)
    assert ws.avg_per_token_s < pe.avg_per_token_s
