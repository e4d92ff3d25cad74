"""Does the market path cost the same per request at 20,000 requests as at 1,000?

For each size in `--requests` (default 1000,20000), one job of that many distinct prompts
(`--max-tokens` greedy tokens each, small so generation does not hide the overhead) goes
through a private `LocalStack` to one registered miner running the real `Worker` loop in
its own process (the miner child of `market_overhead.py`, its listener timing each step), in
shards of `--shard-size`. Timed from `client.submit` to the miner's last `submitResult`
of the job; the headline is the time per request at the largest size over the time per
request at the smallest (`per_request_ratio`; target at most 1.25).

Part of the miner's time per shard that grew with the whole task (the input's Merkle tree
rebuilt for every shard) shows in `pre_claim_s` (before each claim: chain reads, input
fetch and check, tokenizing). Client-side waiting and verification are outside the timing.

Prints progress on stderr and one JSON object as the last line of stdout (also written to
benchmarks/out/market_scaling.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from market_overhead import (
    CLIENT_ACCOUNT,
    PRICE_WEI,
    MinerProcess,
    prompts,
    say,
    wait_offer,
    write_miner_config,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "out" / "market_scaling.json"
TARGET_RATIO = 1.25


def one_job(client: Any, miner: MinerProcess, lines: list[dict[str, Any]], model: str, *,
            shard_size: int, timeout: float) -> dict[str, Any]:
    """Submit one job and wait for the miner to submit all its shards; its timings."""
    t0 = time.time()
    job = client.submit(lines, model=model, price=PRICE_WEI, shard_size=shard_size,
                        deadline=3600, allow_probation=True)
    t1 = time.time()
    task = job.task_id
    shards = -(-len(lines) // shard_size)

    def mine(e: dict[str, Any], name: str) -> bool:
        return e["event"] == name and e.get("task_id") == task

    miner.wait_until(lambda ev: sum(mine(e, "submitted") for e in ev) >= shards,
                     f"all {shards} shards of task {task} submitted", timeout)
    ev = miner.events
    done = max(e["t"] for e in ev if mine(e, "submitted"))
    claims = sorted(e["start"] for e in ev if mine(e, "claim_tx"))
    submits = sorted(e["end"] for e in ev if mine(e, "submit_tx"))
    found = min(e["t"] for e in ev if e["event"] == "found" and task in e["tasks"])

    def total(name: str) -> float:
        return sum(e["end"] - e["start"] for e in ev if mine(e, name))

    n = len(lines)
    return {
        "requests": n,
        "shards": shards,
        "time_s": round(done - t0, 3),
        "per_request_ms": round((done - t0) / n * 1000, 4),
        "submit_s": round(t1 - t0, 3),
        "discover_s": round(found - t1, 3),
        # Only the time before a claim that no overlap with a submission hides.
        "pre_claim_s": round(sum(max(0.0, c - b) for c, b in zip(claims, [found, *submits],
                                                                   strict=False)), 3),
        "generate_s": round(total("generate"), 3),
        "sign_s": round(total("sign"), 3),
        "claim_tx_s": round(total("claim_tx"), 3),
        "upload_s": round(total("upload"), 3),
        "submit_tx_s": round(total("submit_tx"), 3),
    }


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from client import Client
    from client.batch import prompt_lines
    from market.chain.client import anvil_account
    from market.chain.deploy import DeployParams
    from market.local.stack import LocalStack
    from market.model.create import create_model
    from miner.config import MinerConfig
    from miner.register import register_miner

    began = time.monotonic()
    model_dir = home / "models" / "quarry-tiny"
    manifest = create_model(model_dir)
    params = DeployParams(challenge_window=3600)  # nothing settles during the run
    results = []
    miner: MinerProcess | None = None
    with LocalStack(home, deploy_params=params) as stack:
        say(f"stack up in {stack.timings['total']:.1f} s: market {stack.market_url}")
        try:
            cfg_path = write_miner_config(home / "miner.toml", market_url=stack.market_url,
                                          model_dir=model_dir, max_batch=args.max_batch,
                                          poll_s=args.miner_poll_s)
            register_miner(MinerConfig.load(cfg_path))
            miner = MinerProcess(home, cfg_path, args.threads)
            with Client(stack.rpc_url, anvil_account(CLIENT_ACCOUNT).key,
                        stack.market_url) as client:
                wait_offer(client, manifest.model_id)
                miner.wait_for(lambda e: e["event"] == "ready", "ready", 120)
                warm = prompt_lines([f"Warm-up prompt {i}." for i in range(args.shard_size)],
                                    model=manifest.name, max_tokens=args.max_tokens)
                one_job(client, miner, warm, manifest.name, shard_size=args.shard_size,
                        timeout=args.timeout)
                offset = 0
                for n in args.requests:
                    texts = [f"{p} #{offset}" for p in prompts(n)]  # distinct across jobs
                    offset += 1
                    lines = prompt_lines(texts, model=manifest.name,
                                         max_tokens=args.max_tokens, temperature=0.0)
                    r = one_job(client, miner, lines, manifest.name,
                                shard_size=args.shard_size, timeout=args.timeout)
                    say(f"{n} requests, {r['shards']} shards: {r['time_s']} s, "
                        f"{r['per_request_ms']} ms/request (pre_claim {r['pre_claim_s']} s, "
                        f"generate {r['generate_s']} s)")
                    results.append(r)
        finally:
            if miner is not None:
                miner.stop()
    small = min(results, key=lambda r: r["requests"])
    large = max(results, key=lambda r: r["requests"])
    ratio = large["per_request_ms"] / small["per_request_ms"]
    return {
        "benchmark": "market_scaling",
        "max_tokens": args.max_tokens,
        "shard_size": args.shard_size,
        "max_batch": args.max_batch,
        "threads": args.threads,
        "miner_poll_interval_s": args.miner_poll_s,
        "jobs": results,
        "per_request_ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "wall_s": round(time.monotonic() - began, 1),
    }


def sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--requests wants sizes like 1000,20000, got {text!r}") from exc
    if len(out) < 2 or min(out) < 1:
        raise argparse.ArgumentTypeError("--requests wants at least two sizes, each >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=sizes, default=[1000, 20000],
                        help="job sizes, comma-separated (1000,20000)")
    parser.add_argument("--max-tokens", type=int, default=1, help="greedy tokens each (1)")
    parser.add_argument("--shard-size", type=int, default=256, help="requests per shard (256)")
    parser.add_argument("--max-batch", type=int, default=32, help="engine batch size (32)")
    parser.add_argument("--threads", type=int, default=1, help="the miner's torch threads (1)")
    parser.add_argument("--miner-poll-s", type=float, default=0.5,
                        help="miner poll_interval_s (0.5)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per job (1200)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument("--smoke", action="store_true",
                        help="jobs of 8 and 16 requests in shards of 4, results not written: "
                        "checks that the script runs (make test), not its figures")
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.shard_size, args.max_batch = [8, 16], 4, 4
    for name in ("max_tokens", "shard_size", "max_batch", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.miner_poll_s <= 0 or args.timeout <= 0:
        parser.error("--miner-poll-s and --timeout must be positive")

    from market.errors import QuarryError

    home = Path(tempfile.mkdtemp(prefix="quarry-scaling-"))
    try:
        result = run(args, home)
    except QuarryError as exc:
        say(f"market_scaling failed: {exc} (logs in {home / 'logs'})")
        args.keep = True
        return 1
    finally:
        if args.keep:
            say(f"run directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    say(f"time per request at {result['jobs'][-1]['requests']} over at "
        f"{result['jobs'][0]['requests']}: {result['per_request_ratio']} "
        f"(target <= {TARGET_RATIO})")
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
