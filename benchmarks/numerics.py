"""Does verification hold where real miners run: other precisions, kernels, batch shapes?

Three measurements, one JSON object (last line; also benchmarks/out/numerics.json):

1. **Honest false faults.** On the embedded tiny model and the trained test model
   (`testmodels/quarry-pydoc`), every honest miner setup of `_numerics.HONEST_SETUPS` (fp32,
   fp16, bf16, int8 and fp8 weights; batch 32, 1, shuffled batches of 5; sdpa and eager
   attention) answers its own requests, a quarter greedy and a quarter each sampled at
   temperatures 0.5, 0.8 and 1.0 (top_p drawn as challenges draw it,
   `verifier.challenges.TOP_PS`: 1.0, 0.95 or 0.9), drawn like challenges and like client
   questions (`_numerics.draw_lines`). Each verifier precision (fp32, bf16) scores every output
   (`verifier.scoring.score_outputs` at the miner's declared precision, with its activation
   commitment), judging each output alone (a one-output shard: the strictest use) and each
   run of `--shard-size` outputs as a shard. `honest_outputs_at_fault` and
   `honest_shards_at_fault` count the failures (target 0 each; the stated model bounds
   the rate by 1e-6). `edge_tokens` and `beyond_edge` count the sampled tokens under
   top_p < 1 checked against the nucleus' edge and those found beyond it.
2. **Cheats.** `detection.py` on the trained model with every miner declaring bf16 (the
   common GPU case; honest miners compute in it; `--cheat-precision`): 2 honest miners and
   every mode of
   `miner.cheats`, the int8 substitute and logit noise (sigma 0.1) included, over
   `--epochs` epochs with audits of client traffic; epochs to untrusted per mode (target
   <= 3), with commitments and with statistics alone (what commitments add).
3. **Cost.** On the trained model, a bf16 miner's generation of a batch (`--cost-batch`
   outputs of `--cost-max-tokens`) with and without building commitments, and the fp32
   verifier's whole check of the same outputs (greedy and sampled evidence and the
   commitments): `check_to_generate_ratio` (target <= 0.25); commitment bytes per 32
   tokens.

`--miner-device cuda` runs the honest miners (and part 3's) on a GPU while the verifiers
stay on `--device`; `--dump-outputs` keeps part 1's requests and outputs so that
`--load-outputs` scores them again elsewhere (another verifier device, another error model)
without regenerating.

`--smoke` runs tiny sizes (seconds) on the tiny model only. On a GPU machine with vLLM,
`--device cuda --miner-engine vllm --skip cheats,cost` measures part 1 with vLLM in bf16
and fp16 as the honest miners and torch as the verifiers (no commitments: vLLM makes
none).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import detection  # noqa: E402
from _numerics import (  # noqa: E402
    HONEST_SETUPS,
    TRAINED_MODEL,
    VERIFIER_PRECISIONS,
    VLLM_SETUPS,
    Engines,
    draw_lines,
    generate,
    outputs_for,
    say,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "numerics.json"
TEMPERATURES = (0.0, 0.5, 0.8, 1.0)
TARGET_EPOCHS_TO_UNTRUSTED = 3
TARGET_CHECK_RATIO = 0.25


def dump_outputs(outputs: list[Any]) -> list[list[Any]]:
    """Outputs as JSON: another machine's verifiers can score them (`--load-outputs`)."""
    return [[list(o.token_ids), o.text, o.finish_reason, o.commitment.hex()] for o in outputs]


def load_outputs(rows: list[list[Any]]) -> list[Any]:
    from market.engine.base import GenerationOutput

    return [GenerationOutput(token_ids=tuple(ids), text=text, logprobs=(),
                             finish_reason=finish, commitment=bytes.fromhex(commitment))
            for ids, text, finish, commitment in rows]


def false_faults(args: argparse.Namespace, work: Path, engines: Engines) -> dict[str, Any]:
    from market.model.create import create_model
    from verifier.challenges import TOP_PS
    from verifier.scoring import judge, score_outputs

    models = {"tiny": work / "tiny", "trained": TRAINED_MODEL}
    create_model(models["tiny"])
    setups = HONEST_SETUPS if not args.smoke else HONEST_SETUPS[:1] + HONEST_SETUPS[4:5]
    if args.miner_engine == "vllm":
        setups = VLLM_SETUPS
    if args.setups:
        setups = tuple(s for s in setups if s.label in args.setups)
    total = {"outputs": 0, "at_fault": 0, "shards": 0, "shards_at_fault": 0,
             "edge_tokens": 0, "beyond_edge": 0}
    worst: dict[str, float] = {"greedy": -math.inf, "sampled": -math.inf,
                               "commitments": -math.inf, "shard": -math.inf}
    rows: dict[str, Any] = {}
    loaded = (json.loads(gzip.decompress(args.load_outputs.read_bytes()))
              if args.load_outputs else None)
    dumped: dict[str, Any] = {}
    for name in args.models:
        model_dir = models[name]
        rng = random.Random(f"{args.seed}-{name}")
        probe = engines.get(model_dir, "fp32")
        for setup in setups:
            key = f"{name}/{setup.label}"
            t0 = time.monotonic()
            if loaded is not None:  # another machine's miners (--load-outputs)
                if key not in loaded:
                    continue
                lines, outputs = loaded[key]["lines"], load_outputs(loaded[key]["outputs"])
                requests = [probe.request_from_line(line) for line in lines]
            else:
                n = outputs_for(setup, args.outputs_per_setup)
                lines = draw_lines(n, rng, model_name=probe.manifest.name,
                                   temperatures=TEMPERATURES, max_tokens=args.max_tokens,
                                   top_ps=TOP_PS)
                engine = engines.get(model_dir, setup.precision, setup.attention,
                                     args.miner_engine, miner=True)
                requests = [engine.request_from_line(line) for line in lines]
                outputs = generate(engine, requests, setup.batching, rng)
                dumped[key] = {"lines": lines, "outputs": dump_outputs(outputs)}
                if args.dump_outputs:  # after each setup: a run cut short keeps what it made
                    args.dump_outputs.write_bytes(gzip.compress(json.dumps(dumped).encode()))
            n = len(outputs)
            gen_s = time.monotonic() - t0
            for v in VERIFIER_PRECISIONS:
                reference = engines.get(model_dir, v)
                scores = score_outputs(reference, requests, [o.token_ids for o in outputs],
                                       [o.finish_reason for o in outputs],
                                       [o.text for o in outputs], precision=setup.precision,
                                       commitments=[o.commitment for o in outputs])
                alone = [judge([s]) for s in scores]
                shards = [judge(scores[i: i + args.shard_size])
                          for i in range(0, len(scores), args.shard_size)]
                faults = [j.reason for j in alone if not j.passed]
                shard_faults = [j.reason for j in shards if not j.passed]
                for j in alone:
                    for k, kind in enumerate(("greedy", "sampled", "commitments")):
                        worst[kind] = max(worst[kind], j.kind_log_evidence[k])
                worst["shard"] = max([worst["shard"], *(j.log_evidence for j in shards)])
                rows[f"{name}/{setup.label}/{v}"] = {
                    "outputs": len(scores), "at_fault": len(faults),
                    "shards": len(shards), "shards_at_fault": len(shard_faults),
                    "first_fault": (faults or shard_faults or [""])[0],
                    "max_log_evidence": round(max(j.log_evidence for j in alone), 2),
                    "off_argmax_tokens": sum(j.mismatches for j in alone),
                    "failed_chunks": sum(j.failed_chunks for j in alone),
                    "drifted_chunks": sum(x.drifted_chunks for x in scores),
                    "drift_chunks": sum(x.drift_chunks for x in scores),
                    "edge_tokens": sum(x.edge_tokens for x in scores),
                    "beyond_edge": sum(x.beyond_edge for x in scores)}
                total["outputs"] += len(scores)
                total["at_fault"] += len(faults)
                total["shards"] += len(shards)
                total["shards_at_fault"] += len(shard_faults)
                total["edge_tokens"] += rows[f"{name}/{setup.label}/{v}"]["edge_tokens"]
                total["beyond_edge"] += rows[f"{name}/{setup.label}/{v}"]["beyond_edge"]
            say(f"{name} {setup.label}: {n} outputs in {gen_s:.0f}s; "
                + ", ".join(f"{v}: {rows[f'{name}/{setup.label}/{v}']['at_fault']} at fault"
                            for v in VERIFIER_PRECISIONS))
    return {"generated_outputs": total["outputs"] // len(VERIFIER_PRECISIONS),
            "judged_outputs": total["outputs"], "at_fault": total["at_fault"],
            "judged_shards": total["shards"], "shards_at_fault": total["shards_at_fault"],
            "edge_tokens": total["edge_tokens"], "beyond_edge": total["beyond_edge"],
            "max_honest_log_evidence": {k: round(v, 2) for k, v in worst.items()},
            "by_setup": rows}


def cheats(args: argparse.Namespace, commitments: bool) -> dict[str, Any]:
    argv = ["--model", "trained" if not args.smoke else "tiny",
            "--precision", args.cheat_precision,
            "--epochs", str(args.epochs), "--honest", "2",
            "--honest-outputs", str(args.cheat_honest_outputs), "--threads", str(args.threads)]
    if args.smoke:
        argv += ["--requests", "2", "--max-tokens", "4", "--client-shards", "2",
                 "--modes", "noise,int8,logit-noise"]
    if not commitments:
        argv.append("--no-commitments")
    d_args = detection.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-numerics-cheats-") as tmp:
        result = detection.run(d_args, Path(tmp))
    level = result["levels"][result["default_level"]]
    return {"epochs": args.epochs, "epochs_to_untrusted": level["epochs_to_untrusted"],
            "max_epochs_to_untrusted": level["max_epochs_to_untrusted"],
            "honest_false_positive_epochs": level["honest_false_positive_epochs"],
            "honest_outputs_at_fault": result["honest_outputs_at_fault"],
            "cheat_min_log_evidence": result["cheat_min_log_evidence"],
            "epoch_failed_chunks": {m: v for m, v in result["epoch_failed_chunks"].items()
                                    if not m.startswith("honest")}}


def cost(args: argparse.Namespace, engines: Engines, work: Path) -> dict[str, Any]:
    from market.protocol.commitments import CHUNK_TOKENS
    from verifier.scoring import score_outputs

    model_dir = TRAINED_MODEL if not args.smoke else work / "tiny"
    miner = engines.get(model_dir, "bf16", miner=True)
    reference = engines.get(model_dir, "fp32")
    rng = random.Random(f"{args.seed}-cost")
    lines = draw_lines(args.cost_batch, rng, model_name=miner.manifest.name,
                       temperatures=TEMPERATURES, max_tokens=args.cost_max_tokens)
    requests = [miner.request_from_line(line) for line in lines]
    times: dict[str, list[float]] = {"generate": [], "generate_no_commit": [], "check": []}
    outputs: list[Any] = []
    for _ in range(args.repeats):
        for commit in (False, True):
            miner.commit = commit
            t0 = time.perf_counter()
            outputs = miner.generate(requests)
            times["generate" if commit else "generate_no_commit"].append(
                time.perf_counter() - t0)
        t0 = time.perf_counter()
        score_outputs(reference, requests, [o.token_ids for o in outputs],
                      [o.finish_reason for o in outputs], precision="bf16",
                      commitments=[o.commitment for o in outputs])
        times["check"].append(time.perf_counter() - t0)
    miner.commit = True
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    tokens = sum(len(o.token_ids) for o in outputs)
    commit_bytes = sum(len(o.commitment) for o in outputs)
    chunks = sum(math.ceil(len(o.token_ids) / CHUNK_TOKENS) for o in outputs if o.token_ids)
    return {"outputs": len(outputs), "max_tokens": args.cost_max_tokens, "tokens": tokens,
            "repeats": args.repeats,
            "generate_s": round(med["generate"], 3),
            "generate_without_commitments_s": round(med["generate_no_commit"], 3),
            "commitment_overhead_ratio": round(med["generate"] / med["generate_no_commit"] - 1,
                                               4),
            "check_s": round(med["check"], 3),
            "check_to_generate_ratio": round(med["check"] / med["generate"], 4),
            "commitment_bytes": commit_bytes, "commitment_chunks": chunks,
            "commitment_bytes_per_chunk": round(commit_bytes / max(1, chunks), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,trained", help="tiny and/or trained")
    parser.add_argument("--outputs-per-setup", type=int, default=1150,
                        help="outputs per batch-32 setup and model; batch 1 gets an eighth, "
                        "shuffled batches half (880: 20,240 generated in all)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens (32)")
    parser.add_argument("--shard-size", type=int, default=16, help="outputs per shard (16)")
    parser.add_argument("--epochs", type=int, default=12, help="cheat epochs (12)")
    parser.add_argument("--cheat-honest-outputs", type=int, default=400,
                        help="detection.py's own false-fault sample (400; part 1 is the "
                        "large one)")
    parser.add_argument("--cheat-precision", default="bf16",
                        help="the precision every miner of the cheat epochs declares (bf16)")
    parser.add_argument("--cost-batch", type=int, default=32, help="outputs timed (32)")
    parser.add_argument("--cost-max-tokens", type=int, default=128,
                        help="their max_tokens (128, as verification_cost.py)")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (3)")
    parser.add_argument("--seed", default="numerics", help="request seed")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    parser.add_argument("--device", default="cpu",
                        help="the torch engines' device (cpu; cuda on a GPU machine)")
    parser.add_argument("--miner-device", default=None,
                        help="the honest miners' device in part 1 (default --device)")
    parser.add_argument("--setups", default="",
                        help="only these honest setups, comma-separated labels (bf16/b32/sdpa)")
    parser.add_argument("--dump-outputs", type=Path, default=None,
                        help="write part 1's requests and outputs here (gzipped JSON)")
    parser.add_argument("--load-outputs", type=Path, default=None,
                        help="score these dumped outputs in part 1 instead of generating")
    parser.add_argument("--miner-engine", choices=("torch", "vllm"), default="torch",
                        help="the honest miners' engine in part 1 (vllm: bf16 and fp16 "
                        "miners, needs a GPU and vLLM; the verifiers stay torch)")
    parser.add_argument("--skip", default="", help="parts to skip: faults, cheats, cost")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny sizes, tiny model")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.setups = {m.strip() for m in args.setups.split(",") if m.strip()}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.smoke:
        args.models, args.outputs_per_setup, args.max_tokens = ["tiny"], 4, 6
        args.epochs, args.cheat_honest_outputs, args.cost_batch, args.repeats = 2, 4, 2, 1
        args.cost_max_tokens = 6
    from market.engine.threads import set_threads  # engines loaded later keep it

    set_threads(args.threads)
    started = time.monotonic()
    engines = Engines(args.device, args.miner_device)
    result: dict[str, Any] = {"benchmark": "numerics", "models": args.models,
                              "max_tokens": args.max_tokens, "temperatures": TEMPERATURES,
                              "miner_engine": args.miner_engine, "device": args.device,
                              "miner_device": args.miner_device or args.device,
                              "setups": [s.label for s in (VLLM_SETUPS if args.miner_engine
                                                           == "vllm" else HONEST_SETUPS)],
                              "verifiers": VERIFIER_PRECISIONS}
    with tempfile.TemporaryDirectory(prefix="quarry-numerics-") as tmp:
        work = Path(tmp)
        if "faults" not in skip:
            faults = false_faults(args, work, engines)
            result |= {"honest_outputs": faults["generated_outputs"],
                       "honest_outputs_at_fault": faults["at_fault"],
                       "honest_shards_at_fault": faults["shards_at_fault"],
                       "honest_edge_tokens": faults["edge_tokens"],
                       "honest_beyond_edge": faults["beyond_edge"],
                       "false_faults": faults}
        if "cheats" not in skip:
            with_commit = cheats(args, commitments=True)
            without = cheats(args, commitments=False)
            result |= {"epochs_to_untrusted": with_commit["epochs_to_untrusted"],
                       "max_epochs_to_untrusted": with_commit["max_epochs_to_untrusted"],
                       "epochs_to_untrusted_statistics_only": without["epochs_to_untrusted"],
                       "cheats": with_commit, "cheats_statistics_only": without}
        if "cost" not in skip:
            if "faults" in skip:
                from market.model.create import create_model

                create_model(work / "tiny")
            result["cost"] = cost(args, engines, work)
            result["check_to_generate_ratio"] = result["cost"]["check_to_generate_ratio"]
    result["targets"] = {"honest_outputs_at_fault": 0, "honest_shards_at_fault": 0,
                         "max_epochs_to_untrusted": TARGET_EPOCHS_TO_UNTRUSTED,
                         "check_to_generate_ratio": TARGET_CHECK_RATIO}
    result["seconds"] = round(time.monotonic() - started, 1)
    if not args.smoke:  # a smoke run's figures are meaningless: never over real ones
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from market.errors import QuarryError

    try:
        sys.exit(main())
    except QuarryError as exc:  # vLLM absent, a model that does not load: one line
        say(f"numerics: {exc}")
        sys.exit(2)
