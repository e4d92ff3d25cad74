"""Parallax scheduler time at 4 and 256 GPUs, next to the paper's figures (Tong et al., 4.3).

`measure(n_gpus, seed)` builds a synthetic heterogeneous cluster (a 70B-like model with 80
layers; five GPU models with four distinct layer capacities; up to four regions with 4 ms
RTT inside a region and 40-150 ms between regions), then times:

* Phase 1 (`allocate`: capacities, hop matrix, per-region and cross-region k selection,
  water-filling, leftover joins): median of several runs;
* Phase 2 per request (`Router.acquire`: the DP plus pinning the chain, so the load
  feedback is in the loop): median over 200 requests. Sessions stay pinned until the
  oldest is released (untimed) to hold a steady load of 4 sessions per pipeline.

Run as a script it prints one JSON object as its last line. `benchmarks/scheduling.py`
imports `measure` from here; keep its name and signature.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from market.scheduler.cluster import Cluster, Link, ModelSpec, Server  # noqa: E402
from market.scheduler.parallax_phase1 import Phase1Config, allocate  # noqa: E402
from market.scheduler.parallax_phase2 import (  # noqa: E402
    NoRouteError,
    Router,
    hop_latency_matrix,
)

PAPER = {
    "phase1_ms_4": 0.10,
    "phase1_ms_256": 8.55,
    "phase2_ms_per_req_4": 0.0136,
    "phase2_ms_per_req_256": 6.63,
}

# A 70B-like model: 856M parameters per layer in fp16, GQA with 8 KV heads of 128.
MODEL = ModelSpec(
    name="llama-70b-like",
    num_layers=80,
    bytes_per_layer=1_712_000_000,
    kv_bytes_per_token_per_layer=2 * 8 * 128 * 2,
    hidden_size=8192,
    dtype_bytes=2,
)

# name, memory bytes, decode s per layer (weights / HBM bandwidth), fp16 dense FLOP/s, weight
GPU_TYPES = [
    ("H100-80GB", 80e9, 1.712e9 / 3.35e12, 989e12, 0.15),
    ("A100-80GB", 80e9, 1.712e9 / 2.0e12, 312e12, 0.20),
    ("A100-40GB", 40e9, 1.712e9 / 1.55e12, 312e12, 0.20),
    ("L40S-48GB", 48e9, 1.712e9 / 0.864e12, 362e12, 0.20),
    ("RTX4090-24GB", 24e9, 1.712e9 / 1.0e12, 165e12, 0.25),
]
REGIONS = ["us-east", "us-west", "eu-central", "ap-south"]


def synthetic_cluster(n_gpus: int, seed: int = 0) -> Cluster:
    """n_gpus GPUs drawn from GPU_TYPES, spread over min(4, n/8) regions (at least one)."""
    if n_gpus < 1:
        raise ValueError("n_gpus must be >= 1")
    rng = random.Random(seed)
    n_regions = max(1, min(len(REGIONS), n_gpus // 8))
    weights = [t[4] for t in GPU_TYPES]
    servers = []
    for i in range(n_gpus):
        # The first two GPUs are 80 GB cards so even a 4-GPU cluster can hold the model.
        name, mem, dec, flops, _ = GPU_TYPES[i % 2] if i < 2 else rng.choices(GPU_TYPES,
                                                                             weights)[0]
        prefill = 2 * (MODEL.bytes_per_layer / 2) * 512 / (0.5 * flops)
        servers.append(Server(name=f"gpu{i:03d}-{name}", memory_bytes=int(mem),
                              prefill_s_per_block=prefill, decode_s_per_block=dec,
                              region=REGIONS[i % n_regions], flops=flops))
    region_links = {}
    for a in range(n_regions):
        region_links[(REGIONS[a], REGIONS[a])] = Link(0.004, 1.25e9)
        for b in range(a + 1, n_regions):
            region_links[(REGIONS[a], REGIONS[b])] = Link(rng.uniform(0.040, 0.150), 1.25e8)
    return Cluster(servers=servers, model=MODEL, region_links=region_links)


def measure(n_gpus: int, seed: int = 0) -> dict:
    """Phase 1 ms (median of 7) and Phase 2 ms per request (median of 200) on n_gpus.

    Keys include `phase1_ms_{n_gpus}` and `phase2_ms_per_req_{n_gpus}` (and unsuffixed copies).
    """
    cluster = synthetic_cluster(n_gpus, seed)
    config = Phase1Config()
    runs = []
    result = None
    for _ in range(7):
        t0 = time.perf_counter()
        result = allocate(cluster, config)
        runs.append(time.perf_counter() - t0)
    assert result is not None
    rho = hop_latency_matrix(cluster, [s.name for s in cluster.servers])
    router = Router(cluster, result.placement, rho=rho)
    steady = max(1, 4 * len(result.placement.pipelines))
    active: deque = deque()
    per_req = []
    chains = set()
    peak_load = 0.0
    for _ in range(200):
        while True:
            t0 = time.perf_counter()
            try:
                sid, route = router.acquire()
            except NoRouteError:
                router.release(active.popleft())
                continue
            per_req.append(time.perf_counter() - t0)
            break
        chains.add(route.chain)
        peak_load = max(peak_load, float(router.load.max()))
        active.append(sid)
        if len(active) > steady:
            router.release(active.popleft())
    hosts = [len(h) for h in router.hosts]
    phase1_ms = statistics.median(runs) * 1e3
    phase2_ms = statistics.median(per_req) * 1e3
    return {
        "n_gpus": n_gpus,
        "seed": seed,
        "phase1_ms": phase1_ms,
        "phase2_ms_per_req": phase2_ms,
        # Suffixed copies: benchmarks/scheduling.py reads phase1_ms_256 from measure(256).
        f"phase1_ms_{n_gpus}": phase1_ms,
        f"phase2_ms_per_req_{n_gpus}": phase2_ms,
        "pipelines": len(result.placement.pipelines),
        "stages": sum(len(p) for p in result.placement.pipelines),
        "leftover_replicas": len(result.leftovers),
        "pools": [{"pool": p.name, "k": p.k, "stages": p.stages, "solved_k": sorted(p.evaluated)}
                  for p in result.pools],
        "optimal": result.optimal,
        "copies_per_layer_mean": statistics.mean(hosts),
        "distinct_chains_in_200_requests": len(chains),  # load feedback spreads sessions
        "peak_sessions_on_one_gpu": int(peak_load),
        "zero_load_per_token_ms": Router(cluster, result.placement, rho=rho).route().per_token_s
        * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="16 GPUs instead of 256: checks that the script runs (make test)")
    args = parser.parse_args(argv)
    small = measure(4)
    large = measure(16 if args.smoke else 256)
    for m in (small, large):
        print(f"{m['n_gpus']:>4} GPUs: phase 1 {m['phase1_ms']:.3f} ms, phase 2 "
              f"{m['phase2_ms_per_req']:.4f} ms/request, {m['pipelines']} pipelines, "
              f"{m['stages']} stages, {m['copies_per_layer_mean']:.1f} copies/layer")
    out = {
        "phase1_ms_4": round(small["phase1_ms"], 4),
        f"phase1_ms_{large['n_gpus']}": round(large["phase1_ms"], 4),
        "phase2_ms_per_req_4": round(small["phase2_ms_per_req"], 4),
        f"phase2_ms_per_req_{large['n_gpus']}": round(large["phase2_ms_per_req"], 4),
        "paper": PAPER,
        "detail": {"4": small, str(large["n_gpus"]): large},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
