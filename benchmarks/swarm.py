"""A heterogeneous swarm: planned placement vs an even split vs PETALS, and paid by layers.

Members are emulated on this machine: each runs its stage as its own process
(`python -m market.engine.pipeline.stage`, one torch thread, CURVE keys derived from its
Ethereum key) with `--slowdown` (a slower GPU: it sleeps (X - 1) times each forward's
compute) and `--link-latency-ms` (its outgoing links); the driver's own links get
`--driver-latency-ms`. Each member has a memory cap in MiB.

The same batch (greedy, fp32, exactly `--tokens` tokens per prompt) runs through:
  (a) planned: Parallax Phase 1 (`market.scheduler.parallax.place`) on a `Cluster` that
      describes the members: memory caps, per-block decode time = the per-layer time of a
      lone microbatch measured on this machine times the member's slowdown, links
      rtt(i, j) = d_i + d_j (one-way is d of the sender; the symmetric model takes the mean);
  (b) even: the layers split as evenly as possible over all members, one chain;
  (c) petals: `market.scheduler.petals.place` (PETALS' block counts and windows). Its
      2 GiB autograd reserve is sized for real GPUs and would leave MiB-sized emulated
      members no room, so it is 0 here; its 4096-token cache reservation is kept.
The engine routes every microbatch with Parallax Phase 2 over whatever stages there are.

`predicted_vs_measured_per_token_error`: the per-token time of a lone microbatch on the
planned swarm, measured (decode steps only), against the Phase 2 cost of the same chain on
that Cluster (`parallax_phase2.Router.chain_cost`, from the driver and back). The Cluster's
per-block time tau and per-stage fixed cost o come from lone microbatches here: one local
stage of all L layers (o + L tau) and the even split's stages, slowdown removed (o + k tau).
When the plan's chain is a single full-model stage its prediction is little more than that
calibration plus two links, so the even split's 4-stage chain is predicted and measured too
(`even_predicted_vs_measured_per_token_error`).

`payments_exact`: the planned swarm is registered on a fresh Anvil (every member's
EIP-712 consent, shares = layers served, head = the member holding layer 0 of the first
pipeline), its head claims a shard of this batch for the swarm, submits the receipts of
the planned run's outputs, and after finalization every member's escrow credit must equal
`swarmSplit` and the floor rule (floor(pay * share / total), remainder to the head) to the
wei.

Prints progress lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from market.chain.client import Chain, anvil_account
from market.chain.contracts import GpuSpec
from market.chain.deploy import Quarry, deploy
from market.chain.devnet import start_anvil
from market.engine.base import GenerationRequest
from market.engine.pipeline.auth import stage_keypair, write_allow_file
from market.engine.pipeline.engine import PipelineEngine, StageRef
from market.engine.pipeline.parts import split_layers
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.protocol import Receipt, input_tree, output_hash, receipts_tree, request_hash
from market.protocol.commitments import commitment_hash
from market.protocol.eip712 import SwarmConsent
from market.scheduler import parallax, petals
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server
from market.scheduler.parallax_phase2 import Router

PRICE = 10**9
ETHER = 10**18
DEPLOYER, CLIENT, ANYONE = (anvil_account(i) for i in (0, 1, 3))
ACCOUNTS = (11, 12, 13, 14, 15, 16, 17, 18)  # anvil accounts the members use


@dataclass(frozen=True)
class Member:
    name: str
    slowdown: float
    link_ms: float
    memory_mib: int


def parse_members(spec: str) -> list[Member]:
    """'slowdown:link_ms:memory_mib,...' -> members m0, m1, ..."""
    out = []
    for i, item in enumerate(spec.split(",")):
        try:
            slow, link, mem = item.split(":")
            out.append(Member(f"m{i}", float(slow), float(link), int(mem)))
        except ValueError as exc:
            raise SystemExit(f"benchmark: bad member {item!r}: want SLOWDOWN:LINK_MS:MIB") from exc
    if not 1 <= len(out) <= len(ACCOUNTS):
        raise SystemExit(f"benchmark: 1 to {len(ACCOUNTS)} members, got {len(out)}")
    return out


def model_spec(model_dir: Path, name: str) -> ModelSpec:
    """The model as the planners see it: real fp32 bytes per layer and KV bytes per token."""
    from market.engine.pipeline.engine import _kv_bytes, _layer_bytes
    from market.engine.pipeline.parts import load_config

    cfg = load_config(model_dir)
    return ModelSpec(name, int(cfg.num_hidden_layers), _layer_bytes(cfg), _kv_bytes(cfg),
                     hidden_size=int(cfg.hidden_size), dtype_bytes=4)


def cluster_of(members: list[Member], spec: ModelSpec, tau_s: float, stage_s: float,
               driver_ms: float) -> Cluster:
    """The members as the planners see them. Per-block time: tau_s * slowdown. A stage's
    fixed cost per step (stage_s * slowdown: embedding or lm_head, messaging) has no term of
    its own in the Cluster, so half of it rides on each link into and out of the stage."""
    servers = [
        Server(m.name, m.memory_mib * 2**20, tau_s * m.slowdown, tau_s * m.slowdown)
        for m in members
    ]

    def cost(m: Member) -> float:
        return m.link_ms / 1000.0 + stage_s * m.slowdown

    links = {
        (a.name, b.name): Link(cost(a) + cost(b), math.inf)
        for i, a in enumerate(members)
        for b in members[i + 1:]
    }
    clients = {"driver": {m.name: Link(driver_ms / 1000.0 + cost(m), math.inf)
                          for m in members}}
    return Cluster(servers=servers, model=spec, links=links, clients=clients,
                   default_link=Link(0.0, math.inf))


@contextmanager
def stage_processes(model_dir: Path, members: dict[str, Member], ranges: dict[str, tuple[int, int]],
                    keys: dict[str, tuple[str, str]], driver_public: str, workdir: Path):
    """Start one CURVE stage per member with layers; yield their StageRefs; stop them."""
    allow = [keys[n][0] for n in ranges] + [driver_public]
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    refs: list[StageRef] = []
    try:
        for name, (a, b) in ranges.items():
            m = members[name]
            secret = workdir / f"{name}.key"
            secret.write_text(keys[name][1] + "\n")
            allow_file = write_allow_file(workdir / f"{name}.allow", allow)
            log = workdir / f"{name}-{a}-{b}.log"
            logs.append(log)
            with open(log, "w") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "market.engine.pipeline.stage", "--model",
                     str(model_dir), "--layers", f"{a}:{b}", "--listen", "tcp://127.0.0.1:*",
                     "--curve-secret-file", str(secret), "--allow-file", str(allow_file),
                     "--slowdown", str(m.slowdown), "--link-latency-ms", str(m.link_ms)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 180
        for (name, (a, b)), proc, log in zip(ranges.items(), procs, logs, strict=True):
            while "listening on" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"benchmark: stage {name} did not start: {log.read_text()}")
                time.sleep(0.1)
            endpoint = log.read_text().split("listening on ")[1].split()[0]
            refs.append(StageRef(name, endpoint, (a, b), keys[name][0]))
        yield refs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def lone_per_token_s(engine: PipelineEngine, rows: list[GenerationRequest], short: int,
                     long: int) -> tuple[float, list[tuple[str, int, int]]]:
    """Decode time per token of one lone microbatch: (t(long) - t(short)) / (long - short)."""
    def run(n: int) -> float:
        reqs = [GenerationRequest(r.prompt_ids, n) for r in rows]
        t0 = time.perf_counter()
        engine.generate(reqs)
        return time.perf_counter() - t0

    run(short)  # warm the route's choice with what it has learned
    walls: dict[int, list[float]] = {n: [] for n in (short, long)}
    for _ in range(3):
        for n in (short, long):
            walls[n].append(run(n))
    (hops,) = engine.last_run["hops"].values()
    names = [s.name for s in engine.stages]
    chain = [(names[k], a, b) for k, a, b in hops]
    return (min(walls[long]) - min(walls[short])) / (long - short), chain


def pay_swarm(placement: Placement, members: list[Member], model_id: bytes,
              requests: list[dict], outputs: list[Any], tokens: int) -> dict[str, Any]:
    """Register the planned swarm on a fresh Anvil, run one shard through it, check the split."""
    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        deployment, _ = deploy(chain, DEPLOYER)
        q = Quarry(deployment, chain)
        accounts = {m.name: anvil_account(i) for m, i in zip(members, ACCOUNTS, strict=False)}
        served = {n: b - a for n, (a, b) in placement.ranges.items() if b > a}
        head_name = placement.pipelines[0][0] if placement.pipelines else min(
            served, key=lambda n: placement.ranges[n][0])
        probation = q.gpu.probation_params()
        q.gpu.set_probation(DEPLOYER, 0, probation[1])
        by_name = {m.name: m for m in members}
        for i, n in enumerate(served):
            q.gpu.register(accounts[n], [model_id], GpuSpec("emulated", by_name[n].memory_mib, 1),
                           f"http://127.0.0.1:{9400 + i}", PRICE, ETHER)
        q.gpu.set_probation(DEPLOYER, *probation)
        head = accounts[head_name]
        consent = SwarmConsent.for_plan(model_id, head.address,
                                        {accounts[n].address: s for n, s in served.items()},
                                        PRICE, chain.timestamp() + 3600)
        sigs = [q.gpu.sign_swarm_consent(consent, accounts[n])
                for n in sorted(served, key=lambda n: int(accounts[n].address, 16))]
        swarm_id, _ = q.gpu.register_swarm(ANYONE, consent, sigs)

        hashes = [request_hash(r) for r in requests]
        root = input_tree(hashes).root
        task_id, _ = q.tasks.create_task(
            CLIENT, model_id=model_id, input_root=root, input_uri=f"store://inputs/{root.hex()}",
            num_requests=len(requests), shard_size=len(requests), max_tokens_per_request=tokens,
            price_per_token=PRICE, deadline=chain.timestamp() + 3600)
        q.tasks.claim_shard_for_swarm(head, task_id, 0, swarm_id)
        receipts = [Receipt(task_id, 0, i, h, output_hash(o.text, list(o.token_ids)),
                            len(o.token_ids), model_id, commitment_hash(o.commitment))
                    for i, (h, o) in enumerate(zip(hashes, outputs, strict=True))]
        tree = receipts_tree(receipts)
        q.tasks.submit_result(head, task_id, 0, tree.root, f"store://results/{tree.root.hex()}",
                              tree.total)
        chain.advance_time(q.tasks.params()["challenge_window"])
        before = {n: q.escrow.withdrawable(accounts[n].address) for n in served}
        q.tasks.finalize_shard(ANYONE, task_id, 0)
        credit = {n: q.escrow.withdrawable(accounts[n].address) - before[n] for n in served}
        pay = tree.total * PRICE
        on_chain = q.gpu.swarm_split(swarm_id, pay)
        order = list(consent.members)
        shares = list(consent.shares)
        rule = [pay * s // sum(shares) for s in shares]
        rule[order.index(head.address)] += pay - sum(rule)
        expected = dict(zip(order, rule, strict=True))
        exact = all(credit[n] == on_chain[accounts[n].address] == expected[accounts[n].address]
                    for n in served) and sum(credit.values()) == pay
        return {"payments_exact": exact, "pay_wei": pay, "shares": served, "head": head_name,
                "credit_wei": credit}
    finally:
        anvil.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--members", default="1:1:130,1.5:2:110,2.5:3:90,4:5:70",
                    help="SLOWDOWN:LINK_MS:MEMORY_MIB per member, comma-separated")
    ap.add_argument("--driver-latency-ms", type=float, default=1.0)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="batch runs per placement (best)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="sessions Parallax reserves KV room for per layer")
    ap.add_argument("--smoke", action="store_true",
                    help="two members, a 2-layer model (hidden 64), 8 prompts x 4 tokens, one "
                    "run per placement: checks that the script runs (make test), not its "
                    "figures")
    args = ap.parse_args(argv)
    if args.smoke:
        args.members, args.layers, args.hidden = "1:1:130,2:2:110", 2, 64
        args.prompts, args.prompt_len, args.tokens, args.repeats = 8, 4, 4, 1
    members = parse_members(args.members)
    by_name = {m.name: m for m in members}

    with tempfile.TemporaryDirectory(prefix="quarry-swarm-bench-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        manifest = create_model(model_dir, name="quarry-swarm-bench", layers=args.layers,
                                hidden=args.hidden, seed=7)
        spec = model_spec(model_dir, "quarry-swarm-bench")
        prompts = [tuple(10 + (31 * i + 7 * j) % 400 for j in range(args.prompt_len))
                   for i in range(args.prompts)]
        batch = [GenerationRequest(p, args.tokens) for p in prompts]
        no_stop: frozenset[int] = frozenset()
        reference = TorchEngine(model_dir, stop_token_ids=no_stop).generate(batch)
        expected = [o.token_ids for o in reference]
        keys = {m.name: stage_keypair(bytes([i + 1]) * 32) for i, m in enumerate(members)}
        driver_public, driver_secret = stage_keypair(b"\x99" * 32)
        lone = batch[: args.microbatch_size]

        def engine(refs: list[StageRef]) -> PipelineEngine:
            return PipelineEngine(model_dir, stages=refs, curve_secret=driver_secret,
                                  link_latency_ms=args.driver_latency_ms,
                                  microbatch_size=args.microbatch_size, stop_token_ids=no_stop,
                                  driver_host="127.0.0.1", stage_timeout_s=10.0)

        # Stage times of a lone microbatch on this machine, T(k) = o + k * tau for a stage of
        # k layers: one local stage holding all L layers, then (below) the even split's
        # stages, slowdown removed. tau and o go into the Cluster used for planning and
        # prediction.
        def lone_runs(e: PipelineEngine) -> list[float]:
            """Each stage's decode step time over 4 lone runs: the lower quartile of every
            step's time (a shared machine only ever adds time; `lone_per_token_s` likewise
            takes the least wall time)."""
            steps: dict[int, list[float]] = {}
            for _ in range(4):
                e.generate([GenerationRequest(r.prompt_ids, args.tokens) for r in lone])
                for k, ts in e.last_run["step_s"].items():
                    steps.setdefault(k, []).extend(ts)
            return [sorted(steps[k])[len(steps[k]) // 4] for k in range(len(e.stages))]

        with PipelineEngine(model_dir, stages=1, microbatch_size=args.microbatch_size,
                            stop_token_ids=no_stop) as whole:
            (t_all,) = lone_runs(whole)
        even_ranges = dict(zip([m.name for m in members],
                               split_layers(args.layers, len(members)), strict=True))
        l_in, l_max = args.prompt_len, args.tokens
        tau_s = overhead_s = 0.0
        cluster: Cluster | None = None

        def placement_of(label: str) -> Placement:
            if label == "even":
                return Placement(even_ranges, algorithm="even")
            assert cluster is not None
            if label == "planned":
                return parallax.place(cluster, args.concurrency, l_in, l_max)
            saved = petals.AUTOGRAD_BYTES
            petals.AUTOGRAD_BYTES = 0
            try:
                return petals.place(cluster, order=[m.name for m in members])
            finally:
                petals.AUTOGRAD_BYTES = saved

        results: dict[str, dict[str, Any]] = {}
        placements: dict[str, Placement] = {}
        outputs_identical = True
        planned_outputs: list[Any] = []
        per_token: dict[str, dict[str, Any]] = {}
        for label in ("even", "planned", "petals"):
            placement = placements[label] = placement_of(label)
            ranges = {n: r for n, r in placement.ranges.items() if r[1] > r[0]}
            with stage_processes(model_dir, by_name, ranges, keys, driver_public, work) as refs:
                with engine(refs) as e:
                    e.generate(lone)  # warm-up: the router learns each stage's time
                    if label == "even":
                        stage_s = lone_runs(e)
                        per_layer = [
                            (t_all - stage_s[i] / by_name[s.name].slowdown)
                            / (args.layers - (b - a))
                            for i, (s, (a, b)) in enumerate(
                                zip(e.stages, ranges.values(), strict=True))
                        ]
                        tau_s = max(1e-6, sorted(per_layer)[len(per_layer) // 2])
                        overhead_s = max(0.0, t_all - args.layers * tau_s)
                        cluster = cluster_of(members, spec, tau_s, overhead_s,
                                             args.driver_latency_ms)
                        print(f"lone {args.microbatch_size}-row microbatch here: "
                              f"{tau_s * 1000:.2f} ms per layer + {overhead_s * 1000:.2f} ms "
                              "per stage", flush=True)
                    walls, same = [], True
                    for _ in range(args.repeats):  # best of: the machine may be shared
                        t0 = time.perf_counter()
                        out = e.generate(batch)
                        walls.append(time.perf_counter() - t0)
                        same = same and [o.token_ids for o in out] == expected
                    wall = min(walls)
                    outputs_identical = outputs_identical and same
                    tokens = sum(len(o.token_ids) for o in out)
                    results[label] = {
                        "tokens_per_s": round(tokens / wall, 1),
                        "ranges": {n: list(r) for n, r in ranges.items()},
                        "routes": e.last_run["routes"],
                        "max_in_flight": e.last_run["max_in_flight"],
                        "outputs_identical": same,
                    }
                    print(f"{label:>8}: {tokens / wall:7.1f} tok/s ({wall:5.1f}s) ranges "
                          f"{results[label]['ranges']} identical={same}", flush=True)
                    if label == "planned":
                        planned_outputs = out
                    if label in ("planned", "even"):
                        measured, chain = lone_per_token_s(e, lone, 2, 2 + args.tokens)
                        assert cluster is not None
                        router = Router(cluster, placement, l_in=l_in, l_max=l_max,
                                        client="driver")
                        predicted = router.chain_cost(chain)
                        per_token[label] = {"measured_s": round(measured, 5),
                                            "predicted_s": round(predicted, 5),
                                            "chain": [c[0] for c in chain]}
                        print(f"{label} lone microbatch per token: measured "
                              f"{measured * 1000:.1f} ms, predicted {predicted * 1000:.1f} ms "
                              f"over {per_token[label]['chain']}", flush=True)

        lines = [{"custom_id": f"swarm-{i}", "prompt_ids": list(p), "max_tokens": args.tokens,
                  "temperature": 0} for i, p in enumerate(prompts)]
        pay = pay_swarm(placements["planned"], members, manifest.model_id, lines,
                        planned_outputs, args.tokens)
        print(f"payments: {pay}", flush=True)

    def error(label: str) -> float:
        p = per_token[label]
        return round(abs(p["predicted_s"] - p["measured_s"]) / p["measured_s"], 3)
    summary = {
        "setup": {
            "model": {"layers": args.layers, "hidden": args.hidden},
            "members": [vars(m) for m in members],
            "driver_latency_ms": args.driver_latency_ms,
            "prompts": args.prompts,
            "prompt_len": args.prompt_len,
            "output_tokens_each": args.tokens,
            "microbatch_size": args.microbatch_size,
            "repeats": args.repeats,
            "measured_per_layer_ms": round(tau_s * 1000, 3),
            "measured_per_stage_ms": round(overhead_s * 1000, 3),
        },
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in results.items()},
        "placements": {k: v["ranges"] for k, v in results.items()},
        "routes": {k: v["routes"] for k, v in results.items()},
        "planned_vs_even_throughput_ratio": round(
            results["planned"]["tokens_per_s"] / results["even"]["tokens_per_s"], 3),
        "planned_vs_petals_throughput_ratio": round(
            results["planned"]["tokens_per_s"] / results["petals"]["tokens_per_s"], 3),
        "outputs_identical": outputs_identical,
        "per_token_s": per_token,
        "predicted_vs_measured_per_token_error": error("planned"),
        "even_predicted_vs_measured_per_token_error": error("even"),
        "payments_exact": pay["payments_exact"],
        "payment": {"pay_wei": pay["pay_wei"], "shares": pay["shares"], "head": pay["head"]},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
