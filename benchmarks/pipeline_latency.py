"""Pipelined throughput under injected link latency: microbatch scheduling vs the naive pipe.

DeServe (Table 4) is the anchor: with enough microbatches in flight, throughput stays flat as
the one-way latency between stages grows (456.8 tok/s at 64 ms vs 445.2 centralized), while a
pipeline that keeps only one microbatch per stage (vLLM pp) falls to 36.1 tok/s (12.6x).

Here: a 4-stage pipeline of the project's deterministic tiny Llama (default 8 layers, hidden
512: two layers per stage, a few ms per decode step of a 4-row microbatch on one CPU thread),
each stage its own process with one torch thread, on this machine. The same stage processes
serve every setting: latency is switched in-band between runs and re-measured. Workload:
`--prompts` prompts of `--prompt-len` tokens, exactly `--tokens` greedy output tokens each (no
stop token), cut into microbatches of `--microbatch-size` rows in both modes (the per-microbatch
memory budget is the same; only how many are kept in flight differs). Every setting must
produce the same tokens (checked).

Prints progress lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from market.engine.base import GenerationRequest
from market.engine.pipeline.engine import PipelineEngine
from market.model.create import create_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model dir (default: create one)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=192)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--link-latency-ms", default="0,16,64",
                    help="injected one-way latency per hop, ms; comma-separated settings")
    ap.add_argument("--threads-per-stage", type=int, default=1)
    ap.add_argument("--smoke", action="store_true",
                    help="a 2-layer model in 2 stages, 8 prompts, no injected latency: checks "
                    "that the script runs (make test), not its figures")
    args = ap.parse_args(argv)
    if args.smoke:
        args.layers, args.hidden, args.stages, args.prompts = 2, 64, 2, 8
        args.prompt_len, args.tokens, args.microbatch_size = 4, 4, 2
        args.link_latency_ms = "0"
    latencies = [float(x) for x in args.link_latency_ms.split(",")]

    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(tmp) / "model"
            create_model(model_dir, layers=args.layers, hidden=args.hidden, seed=7)
        requests = [
            GenerationRequest(
                tuple(10 + (31 * i + 7 * j) % 400 for j in range(args.prompt_len)), args.tokens
            )
            for i in range(args.prompts)
        ]
        workload_tokens = args.prompts * args.tokens
        t0 = time.perf_counter()
        engine = PipelineEngine(
            model_dir,
            stages=args.stages,
            microbatch_size=args.microbatch_size,
            threads_per_stage=args.threads_per_stage,
            stop_token_ids=[],
            link_latency_ms=latencies[0],
            startup_timeout_s=600.0,  # a loaded machine starts stages slowly, not never
        )
        with engine:
            print(f"started {args.stages} stages in {time.perf_counter() - t0:.1f}s", flush=True)
            engine.generate(requests[: 2 * args.microbatch_size])  # warm up every code path
            reference = None
            results: dict[str, dict[str, float]] = {"microbatch": {}, "naive": {}}
            chosen: dict[str, dict[str, int]] = {"microbatch": {}, "naive": {}}
            targets: dict[str, int] = {}
            stage_ms: dict[str, dict[str, float]] = {"calibration": {}, "run": {}}
            hop_ms: dict[str, float] = {}
            for lat in latencies:
                key = f"{lat:g}"
                cal = engine.set_link_latency(lat)
                stage_ms["calibration"][key] = cal["bottleneck_stage_ms"]
                hop_ms[key] = cal["hop_latency_ms"]
                for mode in ("microbatch", "naive"):
                    engine.mode = mode
                    t = time.perf_counter()
                    outputs = engine.generate(requests)
                    wall = time.perf_counter() - t
                    tokens = [o.token_ids for o in outputs]
                    if sum(len(x) for x in tokens) != workload_tokens:
                        raise SystemExit("benchmark: a request did not produce --tokens tokens")
                    if reference is None:
                        reference = tokens
                    elif tokens != reference:
                        raise SystemExit(f"benchmark: outputs differ at {key} ms, {mode}")
                    results[mode][key] = round(workload_tokens / wall, 1)
                    chosen[mode][key] = engine.last_run["max_in_flight"]
                    if mode == "microbatch":
                        stage_ms["run"][key] = engine.stats()["bottleneck_stage_ms"]
                        targets[key] = engine.last_run["target_max"]
                    print(
                        f"latency {key:>3} ms {mode:<10} {results[mode][key]:7.1f} tok/s "
                        f"({wall:5.1f}s, {chosen[mode][key]} microbatches in flight "
                        f"of {engine.last_run['target_max']} asked, "
                        f"stages {engine.stats()['stage_ms']} ms)",
                        flush=True,
                    )
            # CPU ceiling: the lowest latency again, but with every microbatch in flight. On a
            # shared CPU the stages time-share cores, so more in flight than the bubble formula
            # asks for can still help; this shows how much of the 0 ms number is that effect.
            engine.set_link_latency(latencies[0])
            engine.mode = "microbatch"
            engine.min_in_flight = -(-args.prompts // args.microbatch_size)
            t = time.perf_counter()
            outputs = engine.generate(requests)
            wall = time.perf_counter() - t
            if [o.token_ids for o in outputs] != reference:
                raise SystemExit("benchmark: outputs differ in the ceiling run")
            ceiling = round(workload_tokens / wall, 1)
            print(
                f"latency {latencies[0]:>3g} ms all-in-flight {ceiling:7.1f} tok/s "
                f"({wall:5.1f}s, {engine.last_run['max_in_flight']} microbatches in flight)",
                flush=True,
            )
    lo, hi = f"{latencies[0]:g}", f"{latencies[-1]:g}"
    summary = {
        "setup": {
            "stages": args.stages,
            "model": {"layers": args.layers, "hidden": args.hidden},
            "threads_per_stage": args.threads_per_stage,
            "prompts": args.prompts,
            "prompt_len": args.prompt_len,
            "output_tokens_each": args.tokens,
            "microbatch_size": args.microbatch_size,
            "hops_per_step": args.stages + 1,
        },
        "tokens_per_s": results,
        f"throughput_ratio_{hi}ms_vs_{lo}ms": round(
            results["microbatch"][hi] / results["microbatch"][lo], 3
        ),
        f"speedup_vs_naive_{hi}ms": round(results["microbatch"][hi] / results["naive"][hi], 2),
        f"all_in_flight_{lo}ms_tokens_per_s": ceiling,
        f"throughput_ratio_{hi}ms_vs_all_in_flight_{lo}ms": round(
            results["microbatch"][hi] / ceiling, 3
        ),
        "microbatches_in_flight": chosen,
        "scheduler_target_in_flight": targets,
        "bottleneck_stage_ms": stage_ms,
        "measured_hop_latency_ms": hop_ms,
        "outputs_identical_across_settings": True,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
