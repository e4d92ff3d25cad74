"""Scenario builders: Table 2's clustered topology and the generated scattered one."""

from __future__ import annotations

import math

import pytest

from market.scheduler import routing, scenarios


def test_clustered_matches_table2():
    c = scenarios.clustered(20, client_cluster=0)
    assert [s.name for s in c.servers][:2] == ["a100-0", "a100-1"]
    assert sum(s.name.startswith("mig") for s in c.servers) == 7
    assert c.rtt("a100-0", "a100-1") == 0.005 and c.rtt("mig-0", "mig-6") == 0.005
    assert c.rtt("a100-0", "mig-3") == 0.100
    assert c.link("a100-0", "mig-3").bandwidth_bytes_per_s == pytest.approx(100e6 / 8)
    (client,) = c.clients
    assert {lk.rtt_s for lk in c.clients[client].values()} == {0.100}
    c2 = scenarios.clustered(20, client_cluster=2)
    (client2,) = c2.clients
    assert c2.clients[client2]["mig-0"].rtt_s == 0.005
    assert c2.clients[client2]["a100-0"].rtt_s == 0.100
    with pytest.raises(ValueError):
        scenarios.clustered(20, client_cluster=3)


def test_bloom_sizes():
    m = scenarios.bloom_176b()
    assert m.num_layers == 70 and m.hidden_size == 14336
    assert 1.3e9 < m.bytes_per_layer < 1.35e9  # NF4 block
    c = scenarios.clustered()
    assert routing.cache_bytes_per_block(c, 20, 128) == 2 * 14336 * 148 * 2


def test_scattered_is_seeded_and_connected():
    a, b = scenarios.scattered(seed=7), scenarios.scattered(seed=7)
    assert a.links == b.links and a.clients == b.clients
    assert scenarios.scattered(seed=8).clients != a.clients
    assert sum(s.name.startswith("a100") for s in a.servers) == 2
    assert len(a.servers) == 9
    (client,) = a.clients
    node = client.split("@")[1]
    assert all(s.region != node for s in a.servers)  # the client hosts no server
    rtts = [lk.rtt_s for lk in a.links.values()] + [lk.rtt_s for lk in a.clients[client].values()]
    assert all(0 < r < math.inf for r in rtts)
    _, delays = scenarios.geo_graph()
    assert 0 < min(delays.values()) and max(delays.values()) < 0.02
