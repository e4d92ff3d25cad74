"""The evaluation scenarios of Sun et al.: BLOOM-176B on A100-80GB and A100 MIG slices.

Model (paper section 4; numbers it leaves out are from PETALS and the authors' public
simulator, which fitted them to their measurements):
- BLOOM-176B: 70 blocks, d_model 14336, bf16 attention caches, so one session's cache per
  block is 2 * 14336 * (l_in + l_max) * 2 bytes.
- Block size s_m: PETALS serves BLOOM-176B in NF4, 4.25 bits per parameter plus 1%, for
  2,466,437,120 parameters per block: 1.32 GB. The paper gives no s_m; this is the only
  value consistent with its "PETALS puts 53 blocks on an A100" (bf16, 4.9 GB per block,
  would allow 16; 4.1 GB would allow 19).
- A100-80GB: M = 79.14 GiB (the device's reported total), decode tau = 3.22 ms per block,
  prefill tau^I = (0.0743 l_in + 32.99) ms per block.
- MIG 1g.10gb slice: M = 9.1 GiB effective, tau = 16.25 ms, tau^I = (0.1041 l_in + 206.35)
  ms. With these PETALS' rule gives 53 blocks on an A100 and 4 on a MIG, as the paper says.

Clustered scenario (Table 2): Cluster0 holds only clients, Cluster1 the two A100s,
Cluster2 the seven MIGs; 5 ms RTT and 1 Gbit/s inside a cluster, 100 ms and 100 Mbit/s
across. Requests come from one client in the chosen cluster (Cluster0 by default).

Scattered scenario (Topology-Zoo-like, Table 3 AboveNet scale), generated because the
Topology Zoo files are not vendored: 23 nodes placed uniformly at random in a 4000 km x
2500 km box (seeded); each node links to its 2 nearest neighbours, plus the edges of a
minimum spanning tree so the graph is connected; each link has 1 Gbit/s and a one-way
delay of distance / 200,000 km/s (light in fibre). With the default seed this gives 30
links of 0.9-6.5 ms (AboveNet: 31 links of 0.1-13.8 ms) and client-server RTTs of 4-37 ms.
RTTs are twice the delay of the delay-shortest path; path bandwidth is 1 Gbit/s. 9
distinct nodes get servers (2 A100s, eta = 0.2, the rest MIGs); the client is a node
without a server.
"""

from __future__ import annotations

import heapq
import math
import random

from market.scheduler.cluster import Cluster, Link, ModelSpec, Server

GIB = 1024**3
BLOOM_PARAMS_PER_BLOCK = 2_466_437_120
NF4_BYTES_PER_PARAM = 4.25 / 8
BLOOM_D_MODEL = 14336

A100_MEMORY = int(79.138427734375 * GIB)
MIG_MEMORY = int(9.1 * GIB)

INTRA = Link(0.005, 1e9 / 8)
INTER = Link(0.100, 100e6 / 8)
FIBRE_KM_PER_S = 200_000.0
GEO_LINK_BW = 1e9 / 8


def bloom_176b() -> ModelSpec:
    return ModelSpec(
        name="BLOOM-176B",
        num_layers=70,
        bytes_per_layer=int(BLOOM_PARAMS_PER_BLOCK * NF4_BYTES_PER_PARAM * 1.01),
        kv_bytes_per_token_per_layer=2 * BLOOM_D_MODEL * 2,
        hidden_size=BLOOM_D_MODEL,
        dtype_bytes=2,
    )


def a100(name: str, l_in: int, region: str = "default") -> Server:
    return Server(
        name=name,
        memory_bytes=A100_MEMORY,
        prefill_s_per_block=(0.0743 * l_in + 32.99) / 1000,
        decode_s_per_block=3.2197 / 1000,
        region=region,
    )


def mig(name: str, l_in: int, region: str = "default") -> Server:
    return Server(
        name=name,
        memory_bytes=MIG_MEMORY,
        prefill_s_per_block=(0.1041 * l_in + 206.3547) / 1000,
        decode_s_per_block=16.2488 / 1000,
        region=region,
    )


def clustered(l_in: int = 20, client_cluster: int = 0) -> Cluster:
    """Table 2's three clusters; one client located in `client_cluster` (0, 1 or 2)."""
    if client_cluster not in (0, 1, 2):
        raise ValueError(f"client_cluster must be 0, 1 or 2, got {client_cluster}")
    servers = [a100(f"a100-{i}", l_in, "cluster1") for i in range(2)]
    servers += [mig(f"mig-{i}", l_in, "cluster2") for i in range(7)]
    links = {}
    for i, a in enumerate(servers):
        for b in servers[i + 1 :]:
            links[(a.name, b.name)] = INTRA if a.region == b.region else INTER
    here = f"cluster{client_cluster}"
    client = {s.name: (INTRA if s.region == here else INTER) for s in servers}
    return Cluster(
        servers=servers,
        model=bloom_176b(),
        links=links,
        default_link=INTER,
        clients={f"client@{here}": client},
    )


def geo_graph(
    n_nodes: int = 23, seed: int = 7, width_km: float = 4000.0, height_km: float = 2500.0
) -> tuple[list[tuple[float, float]], dict[tuple[int, int], float]]:
    """Random geographic graph: node positions (km) and undirected link delays (s)."""
    rng = random.Random(seed)
    pos = [(rng.uniform(0, width_km), rng.uniform(0, height_km)) for _ in range(n_nodes)]

    def dist(i: int, j: int) -> float:
        return math.dist(pos[i], pos[j])

    edges: set[tuple[int, int]] = set()
    for i in range(n_nodes):
        near = sorted((j for j in range(n_nodes) if j != i), key=lambda j: (dist(i, j), j))
        for j in near[:2]:
            edges.add((min(i, j), max(i, j)))
    # Prim's MST guarantees connectivity.
    in_tree, frontier = {0}, [(dist(0, j), 0, j) for j in range(1, n_nodes)]
    heapq.heapify(frontier)
    while len(in_tree) < n_nodes:
        _, i, j = heapq.heappop(frontier)
        if j in in_tree:
            continue
        in_tree.add(j)
        edges.add((min(i, j), max(i, j)))
        for k in range(n_nodes):
            if k not in in_tree:
                heapq.heappush(frontier, (dist(j, k), j, k))
    return pos, {e: dist(*e) / FIBRE_KM_PER_S for e in sorted(edges)}


def _all_pairs_delay(n: int, delays: dict[tuple[int, int], float]) -> list[list[float]]:
    adj: dict[int, list[tuple[int, float]]] = {i: [] for i in range(n)}
    for (a, b), d in delays.items():
        adj[a].append((b, d))
        adj[b].append((a, d))
    out = []
    for src in range(n):
        dist = [math.inf] * n
        dist[src] = 0.0
        heap = [(0.0, src)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            for v, w in adj[u]:
                if d + w < dist[v]:
                    dist[v] = d + w
                    heapq.heappush(heap, (d + w, v))
        out.append(dist)
    return out


def scattered(
    l_in: int = 20,
    seed: int = 7,
    n_nodes: int = 23,
    n_servers: int = 9,
    a100_fraction: float = 0.2,
) -> Cluster:
    """Servers and one client spread over `geo_graph`; RTT = 2 x shortest-path delay."""
    if not 1 <= n_servers < n_nodes:
        raise ValueError(f"need 1 <= n_servers < n_nodes, got {n_servers} and {n_nodes}")
    _, delays = geo_graph(n_nodes, seed)
    one_way = _all_pairs_delay(n_nodes, delays)
    rng = random.Random(seed + 1)
    nodes = rng.sample(range(n_nodes), n_servers + 1)
    server_nodes, client_node = nodes[:n_servers], nodes[n_servers]
    n_a100 = max(1, round(a100_fraction * n_servers))
    servers: list[Server] = []
    where: dict[str, int] = {}
    for k, node in enumerate(server_nodes):
        make = a100 if k < n_a100 else mig
        kind = "a100" if k < n_a100 else "mig"
        srv = make(f"{kind}-{k}@n{node}", l_in, f"n{node}")
        servers.append(srv)
        where[srv.name] = node
    links = {}
    for i, a in enumerate(servers):
        for b in servers[i + 1 :]:
            links[(a.name, b.name)] = Link(2 * one_way[where[a.name]][where[b.name]], GEO_LINK_BW)
    client = {s.name: Link(2 * one_way[client_node][where[s.name]], GEO_LINK_BW) for s in servers}
    return Cluster(
        servers=servers,
        model=bloom_176b(),
        links=links,
        default_link=Link(0.05, GEO_LINK_BW),
        clients={f"client@n{client_node}": client},
    )
