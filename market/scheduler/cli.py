"""`market plan`: place a model's layers on a cluster of miners and price a token.

    market plan CLUSTER.toml [--algorithm parallax|cgbp|petals] [--out plan.json]
                [--l-in N] [--l-max N] [--concurrency N] [--client NAME]
    market plan --registry (--model-spec MODEL.toml | --layers N --layer-bytes B
                --kv-bytes-per-token B [--hidden H] [--model-name NAME] [--dtype-bytes B])
                [--model-id 0x..] [--latencies FILE | --no-measure] [--deployment FILE]
                [--default-rtt-s S] [--default-bandwidth B] [--save-cluster FILE.json]
                [--algorithm ...] [--out plan.json] [--l-in N] [--l-max N] ...
    market plan --swarm MODEL_ID [--market URL] [--out plan.json]

`--swarm` prints the live plan the market serves for the model's swarm (GET
/swarms/MODEL_ID/plan: which member serves which layers, the head, the consent terms and
the on-chain swarm id once registered), from --market (default http://127.0.0.1:8600, where
`market serve` listens by default). The market plans it from the members that joined (their declared
memory and speed, their measured RTTs) with its `swarm_algorithm` setting, so the
placement flags do not apply.

The cluster comes from exactly one of: a cluster file, or `--registry`, which builds it
from the deployed GPURegistry ($QUARRY_HOME/deployment.json, or --deployment): one server
per active miner (exiting and withdrawn ones are skipped; with --model-id, only miners
listing that model), memory from its registered GPUs, per-block times estimated from the
GPU name (see market/scheduler/registry.py for the GPU table and its assumptions). Links
come from --latencies (a measured-latency file, `[[links]] a = "0x..", b = "0x..", rtt_s,
bandwidth_bytes_per_s`, optional `[regions]` and `default_link`), or else are measured now
by timing TCP connects to each miner's endpoint: that is this machine's RTT to each miner
(priced as client "this-machine"), not the miners' RTT to each other (a pair gets the sum
of its two RTTs, an upper bound). --no-measure uses the default link everywhere.
--save-cluster writes the cluster built this way as a cluster file for later runs.

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

from market.errors import QuarryError

ALGORITHMS = ("parallax", "cgbp", "petals")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="place a model's layers on a cluster and print the expected per-token time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("cluster", type=Path, nargs="?",
                   help="cluster description (.toml or .json); or use --registry")
    p.add_argument("--algorithm", choices=ALGORITHMS, default=None, help="(parallax)")
    p.add_argument("--out", type=Path, help="write the plan as JSON here")
    p.add_argument("--l-in", type=int, default=None, help="prompt tokens per session (512)")
    p.add_argument("--l-max", type=int, default=None,
                   help="generated tokens per session (256)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="sessions each hosted layer keeps KV room for (8)")
    p.add_argument("--client", default=None, help="price the route from this [[clients]] entry")
    r = p.add_argument_group("cluster from the on-chain registry")
    r.add_argument("--registry", action="store_true",
                   help="build the cluster from the deployed GPURegistry instead of a file")
    r.add_argument("--deployment", type=Path, default=None,
                   help="deployment file (default $QUARRY_HOME/deployment.json)")
    r.add_argument("--model-spec", type=Path, default=None,
                   help="model as TOML/JSON ([model] table, the cluster file's keys)")
    r.add_argument("--layers", type=int, default=None, help="number of layers L")
    r.add_argument("--layer-bytes", type=int, default=None, help="weights of one layer")
    r.add_argument("--kv-bytes-per-token", type=int, default=None,
                   help="KV cache bytes per token per layer")
    r.add_argument("--hidden", type=int, default=None, help="hidden size (activation width)")
    r.add_argument("--model-name", default=None, help="model name in the plan (model)")
    r.add_argument("--dtype-bytes", type=int, default=None, help="bytes per value (2)")
    r.add_argument("--model-id", default=None,
                   help="only miners listing this modelId (0x + 64 hex digits)")
    r.add_argument("--latencies", type=Path, default=None,
                   help="measured-latency file (.toml or .json) instead of live TCP timing")
    r.add_argument("--no-measure", action="store_true",
                   help="do not time TCP connects; use the default link for every pair")
    r.add_argument("--default-rtt-s", type=float, default=None,
                   help="RTT of pairs with no measured link (0.005)")
    r.add_argument("--default-bandwidth", type=float, default=None,
                   help="bytes/s of pairs with no measured link (125e6)")
    r.add_argument("--save-cluster", type=Path, default=None,
                   help="also write the registry-built cluster here (JSON cluster file)")
    w = p.add_argument_group("the live plan of a swarm")
    w.add_argument("--swarm", metavar="MODEL_ID", default=None,
                   help="print the live plan the market serves for this model's swarm")
    w.add_argument("--market", metavar="URL", default=None,
                   help="the market's URL (http://127.0.0.1:8600)")
    p.set_defaults(func=cmd_plan)


WORKLOAD_DEFAULTS = {"algorithm": "parallax", "l_in": 512, "l_max": 256, "concurrency": 8}


REGISTRY_ONLY = ("deployment", "model_spec", "layers", "layer_bytes", "kv_bytes_per_token",
                 "hidden", "model_name", "dtype_bytes", "model_id", "latencies", "no_measure",
                 "default_rtt_s", "default_bandwidth", "save_cluster")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_source(args: argparse.Namespace) -> None:
    """Exactly one of a cluster file, --registry and --swarm, and only flags that apply to
    it; fills in the workload defaults of an offline plan."""
    if getattr(args, "swarm", None) is not None:
        if args.cluster is not None or args.registry:
            raise QuarryError("give a cluster file, --registry or --swarm, not two of them")
        used = [_flag(n) for n in (*REGISTRY_ONLY, *WORKLOAD_DEFAULTS, "client")
                if getattr(args, n) not in (None, False)]
        if used:
            raise QuarryError(f"{', '.join(used)} do not apply with --swarm: the market "
                              "plans a swarm with its own settings")
        parse_model_id(args.swarm, "--swarm")
        return
    if getattr(args, "market", None) is not None:
        raise QuarryError("--market only applies with --swarm")
    for name, default in WORKLOAD_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    if args.registry and args.cluster is not None:
        raise QuarryError("give either a cluster file or --registry, not both")
    if not args.registry and args.cluster is None:
        raise QuarryError("give a cluster file or --registry")
    if not args.registry:
        used = [_flag(n) for n in REGISTRY_ONLY if getattr(args, n) not in (None, False)]
        if used:
            raise QuarryError(f"{', '.join(used)} only apply with --registry")
        return
    sizes = ("layers", "layer_bytes", "kv_bytes_per_token", "hidden", "model_name",
             "dtype_bytes")
    given = [n for n in sizes if getattr(args, n) is not None]
    if args.model_spec is not None and given:
        raise QuarryError(f"give --model-spec or {', '.join(map(_flag, given))}, not both")
    if args.model_spec is None:
        missing = [_flag(n) for n in ("layers", "layer_bytes", "kv_bytes_per_token")
                   if getattr(args, n) is None]
        if missing:
            raise QuarryError("--registry needs the model: --model-spec FILE, or "
                              f"--layers, --layer-bytes and --kv-bytes-per-token "
                              f"(missing {', '.join(missing)})")
    if args.latencies is not None and args.no_measure:
        raise QuarryError("give --latencies or --no-measure, not both")


def parse_model_id(text: str, flag: str = "--model-id") -> bytes:
    """A modelId from `0x` + 64 hex digits."""
    body = text[2:] if text.lower().startswith("0x") else text
    try:
        raw = bytes.fromhex(body)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise QuarryError(f"{flag} must be 0x followed by 64 hex digits, got {text!r}")
    return raw


def registry_cluster(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The cluster `--registry` builds, and the provenance the plan's JSON carries."""
    from market.chain.deploy import Quarry
    from market.scheduler.cluster import Cluster, Link, ModelSpec
    from market.scheduler.registry import (
        build_registry_cluster,
        cluster_to_dict,
        load_latencies,
        model_spec_from_file,
    )

    if args.model_spec is not None:
        model = model_spec_from_file(args.model_spec)
    else:
        model = ModelSpec(name=args.model_name or "model", num_layers=args.layers,
                          bytes_per_layer=args.layer_bytes,
                          kv_bytes_per_token_per_layer=args.kv_bytes_per_token,
                          hidden_size=args.hidden or 0,
                          dtype_bytes=2 if args.dtype_bytes is None else args.dtype_bytes)
    validate_model(model)
    model_id = parse_model_id(args.model_id) if args.model_id is not None else None
    lat = load_latencies(args.latencies) if args.latencies is not None else None
    default = Cluster(servers=[], model=model).default_link
    if lat is not None and lat.default_link is not None:
        default = lat.default_link
    default = Link(default.rtt_s if args.default_rtt_s is None else args.default_rtt_s,
                   default.bandwidth_bytes_per_s if args.default_bandwidth is None
                   else args.default_bandwidth)
    q = Quarry.connect(args.deployment)

    def warn(message: str) -> None:
        print(f"market: warning: {message}", file=sys.stderr)

    built = build_registry_cluster(
        q, model, model_id=model_id, latencies=None if lat is None else lat.links,
        default_link=default, regions=None if lat is None else lat.regions, l_in=args.l_in,
        measure=not args.no_measure, warn=warn,
    )
    validate_cluster(built.cluster)
    info = {"GPURegistry": q.gpu.address, "chain_id": q.chain_id,
            "model_id": None if model_id is None else "0x" + model_id.hex(),
            **built.describe()}
    skipped = "; ".join(f"{a}: {why}" for a, why in built.skipped.items())
    print(f"registry: {len(built.miners)} miners from GPURegistry {q.gpu.address} "
          f"(chain {q.chain_id})" + (f", skipped {skipped}" if skipped else ""))
    if args.save_cluster is not None:
        try:
            args.save_cluster.write_text(json.dumps(cluster_to_dict(built.cluster), indent=2)
                                         + "\n")
        except OSError as exc:
            raise QuarryError(f"cannot write {args.save_cluster}: {exc}") from exc
        print(f"  wrote the cluster to {args.save_cluster}")
    return built.cluster, info


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise QuarryError(f"{name} must be a number {bound}, got {value!r}")


def validate_model(m: Any) -> None:
    """Reject a model whose numbers cannot be planned, naming the first bad field."""
    if not isinstance(m.num_layers, int) or isinstance(m.num_layers, bool) or m.num_layers < 1:
        raise QuarryError(f"model.num_layers must be an integer >= 1, got {m.num_layers!r}")
    _positive("model.bytes_per_layer", m.bytes_per_layer)
    _positive("model.kv_bytes_per_token_per_layer", m.kv_bytes_per_token_per_layer,
              allow_zero=True)
    _positive("model.hidden_size", m.hidden_size, allow_zero=True)
    _positive("model.dtype_bytes", m.dtype_bytes, allow_zero=True)


def validate_cluster(cluster: Any) -> None:
    """Reject a cluster whose numbers cannot be planned, naming the first bad field."""
    validate_model(cluster.model)
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


def render_live(doc: dict[str, Any]) -> str:
    """Human-readable live plan of a swarm: members by layer range, head, terms, swarm id."""
    head = doc["head"]
    lines = [f"{doc['algorithm']} live plan v{doc['version']} for model {doc['model_id']} "
             f"({doc['num_layers']} layers) on {len(doc['members'])} members"]
    for m in sorted(doc["members"], key=lambda m: (m["layers"], m["address"])):
        a, b = m["layers"]
        lines.append(f"  {m['address']} [{a}, {b}) {m['memory_mib']} MiB {m['endpoint']}"
                     + ("  (head)" if m["address"] == head else ""))
    if doc["standby"]:
        lines.append("  standby: " + ", ".join(doc["standby"]))
    lines.append(f"  expected per-token time: {doc['predicted_s_per_token'] * 1e3:.2f} ms "
                 "(Parallax Phase 2 at zero load: decode step, one-way hops)")
    terms = doc.get("terms")
    if terms is None:
        lines.append("  terms: none (a swarm needs 2 to 16 members serving layers)")
    else:
        lines.append(f"  terms: shares {terms['shares']}, price {terms['price_per_token']} "
                     f"wei/token, consent deadline {terms['deadline']}")
    swarm_id = doc.get("swarm_id")
    lines.append(f"  on-chain swarm: {swarm_id if swarm_id is not None else 'not registered'}")
    return "\n".join(lines)


def live_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The live plan of `args.swarm`'s swarm from the market."""
    from market.marketapi import MarketAPI

    with MarketAPI(args.market or "http://127.0.0.1:8600") as api:
        return api.swarm_plan("0x" + parse_model_id(args.swarm, "--swarm").hex())


def cmd_plan(args: argparse.Namespace) -> int:
    from market.scheduler.cluster import load_cluster

    check_source(args)
    if args.swarm is not None:
        live = live_plan(args)
        _show(render_live(live), live, args.out)
        return 0
    for name in ("concurrency", "l_max"):
        if getattr(args, name) < 1:
            raise QuarryError(f"--{name.replace('_', '-')} must be >= 1")
    if args.l_in < 0:
        raise QuarryError("--l-in must be >= 0")
    registry_info = None
    if args.registry:
        cluster, registry_info = registry_cluster(args)
    else:
        cluster = load_cluster(args.cluster)
        validate_cluster(cluster)
    doc = build_plan(cluster, args.algorithm, concurrency=args.concurrency, l_in=args.l_in,
                     l_max=args.l_max, client=args.client)
    if registry_info is not None:
        doc["registry"] = registry_info
    _show(render(doc), doc, args.out)
    return 0


def _show(text: str, doc: dict[str, Any], out: Path | None) -> None:
    """Print a plan, and write its JSON to `out` when given."""
    print(text)
    if out is not None:
        try:
            out.write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            raise QuarryError(f"cannot write {out}: {exc}") from exc
        print(f"  wrote {out}")
