"""`market plan`: place a model's layers on a cluster of miners and price a token.

    market plan CLUSTER.toml [--algorithm parallax|cgbp|petals] [--out plan.json]
                [--l-in N] [--l-max N] [--concurrency N] [--client NAME]

It prints which server holds which layers (per pipeline for Parallax), the expected
per-token time, and writes the plan as JSON: `Placement.to_dict()` (algorithm, ranges as
[start, end) per server, pipelines) plus "model", "params" and "expected". A miner loads
its stage from `ranges[its name]`.

Per-token time: for parallax, the Phase 2 route cost at zero load (decode step; one-way
server-to-server hops, see `parallax_phase2`); for cgbp and petals, `routing.shortest_path`
(Sun et al.'s client-centric model, eq. 8: prefill amortised over l_max; the decode step
alone is in the JSON too).

Cluster file (TOML; a `.json` file with the same keys also loads). Sizes are bytes, times
seconds, bandwidths bytes per second; see examples/clusters/*.toml:

    default_link = { rtt_s = 0.01, bandwidth_bytes_per_s = 125e6 }  # optional, top level

    [model]
    name = "Qwen3-32B"
    num_layers = 64                       # L
    bytes_per_layer = 976_000_000         # weights of one layer
    kv_bytes_per_token_per_layer = 4096
    hidden_size = 5120                    # optional (activation size on the wire)
    dtype_bytes = 2                       # optional

    [[servers]]                           # one per miner GPU
    name = "us-5090-a"
    memory_bytes = 34_359_738_368
    prefill_s_per_block = 0.0048          # one layer, one prompt
    decode_s_per_block = 0.000545         # one layer, one token
    region = "us-west"                    # optional, default "default"
    flops = 2.09e14                       # optional; Parallax water-fills by it

    [[region_links]]                      # optional: (a, a) is inside region a
    a = "us-west"
    b = "eu-west"
    rtt_s = 0.016
    bandwidth_bytes_per_s = 125_000_000

    [[links]]                             # optional: one server pair, overrides the above
    a = "us-5090-a"
    b = "us-5090-b"
    rtt_s = 0.001
    bandwidth_bytes_per_s = 1_250_000_000

    [[clients]]                           # optional: for --client
    name = "client-sf"
    links = { "us-5090-a" = { rtt_s = 0.008 } }

This module stays cheap to import: numpy and the placers load inside the handler.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from market.cliutil import run_cli
from market.errors import QuarryError

ALGORITHMS = ("parallax", "cgbp", "petals")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="place a model's layers on a cluster and print the expected per-token time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("cluster", type=Path, help="cluster description (.toml or .json)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="parallax")
    p.add_argument("--out", type=Path, help="write the plan as JSON here")
    p.add_argument("--l-in", type=int, default=512, help="prompt tokens per session (512)")
    p.add_argument("--l-max", type=int, default=256, help="generated tokens per session (256)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="sessions each hosted layer keeps KV room for (8)")
    p.add_argument("--client", default=None, help="price the route from this [[clients]] entry")
    p.set_defaults(func=cmd_plan)


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise QuarryError(f"{name} must be a number {bound}, got {value!r}")


def validate_cluster(cluster: Any) -> None:
    """Reject a cluster whose numbers cannot be planned, naming the first bad field."""
    m = cluster.model
    if not isinstance(m.num_layers, int) or isinstance(m.num_layers, bool) or m.num_layers < 1:
        raise QuarryError(f"model.num_layers must be an integer >= 1, got {m.num_layers!r}")
    _positive("model.bytes_per_layer", m.bytes_per_layer)
    _positive("model.kv_bytes_per_token_per_layer", m.kv_bytes_per_token_per_layer,
              allow_zero=True)
    _positive("model.hidden_size", m.hidden_size, allow_zero=True)
    _positive("model.dtype_bytes", m.dtype_bytes, allow_zero=True)
    if not cluster.servers:
        raise QuarryError("cluster has no [[servers]]")
    for s in cluster.servers:
        if not isinstance(s.name, str) or not s.name:
            raise QuarryError(f"server name must be a non-empty string, got {s.name!r}")
        _positive(f"server {s.name!r} memory_bytes", s.memory_bytes)
        _positive(f"server {s.name!r} decode_s_per_block", s.decode_s_per_block)
        _positive(f"server {s.name!r} prefill_s_per_block", s.prefill_s_per_block,
                  allow_zero=True)
        _positive(f"server {s.name!r} flops", s.flops, allow_zero=True)
        if not isinstance(s.region, str):
            raise QuarryError(f"server {s.name!r} region must be a string, got {s.region!r}")
    names = {s.name for s in cluster.servers}
    links = [("link", k, v) for k, v in cluster.links.items()]
    links += [("region link", k, v) for k, v in cluster.region_links.items()]
    links += [("default link", ("", ""), cluster.default_link)]
    for kind, (a, b), lk in links:
        _positive(f"{kind} {a}-{b} rtt_s", lk.rtt_s, allow_zero=True)
        _positive(f"{kind} {a}-{b} bandwidth_bytes_per_s", lk.bandwidth_bytes_per_s)
    for a, b in cluster.links:
        for end in (a, b):
            if end not in names:
                raise QuarryError(f"link {a}-{b} names unknown server {end!r}")
    for client, per_server in cluster.clients.items():
        for server, lk in per_server.items():
            if server not in names:
                raise QuarryError(f"client {client!r} names unknown server {server!r}")
            _positive(f"client {client!r} rtt_s to {server!r}", lk.rtt_s, allow_zero=True)
            _positive(f"client {client!r} bandwidth to {server!r}", lk.bandwidth_bytes_per_s)


def _call_place(module: Any, cluster: Any, concurrency: int, l_in: int, l_max: int) -> Any:
    """Call `module.place` with whichever of concurrency/l_in/l_max it accepts."""
    params = inspect.signature(module.place).parameters
    kwargs = {k: v for k, v in (("concurrency", concurrency), ("l_in", l_in), ("l_max", l_max))
              if k in params}
    return module.place(cluster, **kwargs)


def build_plan(cluster: Any, algorithm: str, *, concurrency: int, l_in: int, l_max: int,
               client: str | None) -> dict[str, Any]:
    """The plan document `market plan` prints and writes."""
    params = {"algorithm": algorithm, "concurrency": concurrency, "l_in": l_in,
              "l_max": l_max, "client": client}
    if algorithm == "parallax":
        from market.scheduler import parallax

        p = parallax.plan(cluster, concurrency, l_in, l_max, client=client)
        doc = p.placement.to_dict()
        doc["expected"] = {
            "per_token_s": p.route.per_token_s,
            "route": p.route.to_dict()["chain"],
            "cost_model": "Parallax Phase 2 at zero load: decode step, one-way hops",
        }
        doc["pools"] = [
            {"pool": pp.name, "k": pp.k, "stages": pp.stages, "score": pp.score,
             "optimal": pp.optimal}
            for pp in p.phase1.pools
        ]
        doc["extra_replicas"] = p.phase1.leftovers
        doc["unused"] = p.phase1.unused
    else:
        try:
            module = importlib.import_module(f"market.scheduler.{algorithm}")
            routing = importlib.import_module("market.scheduler.routing")
        except ModuleNotFoundError as exc:
            raise QuarryError(f"algorithm {algorithm!r} is not available: {exc}") from exc
        try:
            placement = _call_place(module, cluster, concurrency, l_in, l_max)
            path, per_token = routing.shortest_path(cluster, placement, client, l_max, l_in=l_in)
            _, decode = routing.shortest_path(cluster, placement, client, l_max, l_in=l_in,
                                              decode_only=True)
        except (ValueError, ZeroDivisionError) as exc:
            raise QuarryError(f"{algorithm} cannot plan this cluster: {exc}") from exc
        doc = placement.to_dict()
        doc["expected"] = {
            "per_token_s": per_token,
            "decode_step_s": decode,
            "route": [{"server": n, "start": a, "end": b} for n, a, b in path],
            "cost_model": "Sun et al. eq. 8 (client-centric, prefill amortised over l_max)",
        }
    doc["model"] = asdict(cluster.model)
    doc["params"] = params
    return doc


def render(doc: dict[str, Any]) -> str:
    """Human-readable plan: stages per pipeline (or per server), route and per-token time."""
    ranges = {k: tuple(v) for k, v in doc["ranges"].items()}
    model = doc["model"]
    lines = [f"{doc['algorithm']} plan for {model['name']} ({model['num_layers']} layers) "
             f"on {len(ranges)} servers"]

    def stage(name: str) -> str:
        a, b = ranges[name]
        return f"{name} [{a}, {b})"

    listed: set[str] = set()
    for i, pipe in enumerate(doc.get("pipelines") or [], 1):
        lines.append(f"  pipeline {i}: " + " -> ".join(stage(n) for n in pipe))
        listed.update(pipe)
    rest = sorted((n for n in ranges if n not in listed and ranges[n][1] > ranges[n][0]),
                  key=lambda n: (ranges[n], n))
    if rest:
        title = "  extra replicas:" if listed else "  servers:"
        lines.append(title)
        lines.extend(f"    {stage(n)}" for n in rest)
    idle = sorted(n for n, (a, b) in ranges.items() if b <= a) + doc.get("unused", [])
    if idle:
        lines.append("  unused: " + ", ".join(idle))
    exp = doc["expected"]
    route = " -> ".join(f"{h['server']} [{h['start']}, {h['end']})" for h in exp["route"])
    lines.append(f"  expected per-token time: {exp['per_token_s'] * 1e3:.2f} ms "
                 f"({exp['cost_model']})")
    lines.append(f"  route: {route}")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from market.scheduler.cluster import load_cluster

    for name in ("concurrency", "l_max"):
        if getattr(args, name) < 1:
            raise QuarryError(f"--{name.replace('_', '-')} must be >= 1")
    if args.l_in < 0:
        raise QuarryError("--l-in must be >= 0")
    cluster = load_cluster(args.cluster)
    validate_cluster(cluster)
    doc = build_plan(cluster, args.algorithm, concurrency=args.concurrency, l_in=args.l_in,
                     l_max=args.l_max, client=args.client)
    print(render(doc))
    if args.out is not None:
        try:
            args.out.write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            raise QuarryError(f"cannot write {args.out}: {exc}") from exc
        print(f"  wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m market.scheduler.cli plan ...`: the same command without the other areas."""
    parser = argparse.ArgumentParser(prog="market")
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return run_cli(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
