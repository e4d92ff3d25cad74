"""The whole marketplace on one machine, from nothing: `make demo` runs this.

1. Private Redis and Anvil (the five contracts deployed), the market service and a Celery
   worker, all on free ports under a fresh directory.
2. The embedded tiny model, and two miners registering it (`miner register`) and serving
   it (`miner run`) as separate processes.
3. A client submitting a batch of prompts through the SDK, waiting, and checking every
   receipt's signature, result-tree proof and output hash before it reads one output. The
   miners are new identities, hence on probation (the committee has not vetted them yet),
   so the client opts in to them (`allow_probation=True`), as any client of a fresh market
   must.
4. The market's settlement sweep finalizing each shard once its challenge window closes:
   each miner is paid for its own tokens, the unused budget goes back to the client.

Everything started here is stopped at the end, also on Ctrl-C or an error. Nothing in this
file is special to the demo: it is what a client script and two miner operators would do.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from client import Client
from market.chain.client import anvil_account
from market.errors import QuarryError
from market.model.create import create_model
from market.service.processes import ManagedProcess, spawn
from market.service.stack import LocalStack

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLIENT_ACCOUNT = 1
MINER_ACCOUNTS = (3, 4)
PRICE_WEI = 10**9  # 1 gwei per output token

TOPICS = ["the ocean", "a small village", "prime numbers", "the market", "music", "tea",
          "the library", "history", "computers", "the weather", "a long journey", "sleep"]
FORMS = ["Tell me about {}.", "Write a short story about {}.", "What is special about {}?",
         "Describe {} in one sentence.", "Why do people care about {}?"]


def prompts(n: int) -> list[str]:
    """`n` distinct prompts, the same on every run."""
    return [FORMS[i % len(FORMS)].format(TOPICS[(i // len(FORMS)) % len(TOPICS)])
            + ("" if i < len(FORMS) * len(TOPICS) else f" ({i})") for i in range(n)]


def eth(wei: int) -> str:
    return f"{wei} wei ({wei / 10**18:.9f} ETH)"


def step(n: int, text: str) -> None:
    print(f"[{n}/6] {text}", flush=True)


def miner_config(path: Path, *, account: int, market_url: str, model_dir: Path) -> Path:
    key = "0x" + bytes(anvil_account(account).key).hex()
    path.write_text(
        "[miner]\n"
        f'key = "{key}"\n'
        f'market_url = "{market_url}"\n'
        f'model_dirs = ["{model_dir}"]\n'
        f'price_per_token = "{PRICE_WEI}"\n'
        'stake = "0.5ether"\n'
        f'endpoint = "http://127.0.0.1:{9100 + account}"\n'
        "poll_interval_s = 0.5\n"
        "heartbeat_interval_s = 2.0\n"
        "max_batch = 16\n"
        "auto_withdraw = true\n"
    )
    return path


def run(args: argparse.Namespace, home: Path) -> None:
    began = time.monotonic()
    miners: list[ManagedProcess] = []
    with LocalStack(home) as stack:
        step(1, f"private Redis, Anvil, market and Celery worker up in "
                f"{stack.timings['total']:.1f} s")
        print(f"      market {stack.market_url} (OpenAPI at {stack.market_url}/docs), "
              f"chain {stack.deployment.chain_id} at {stack.rpc_url}")

        t = time.monotonic()
        model_dir = home / "models" / "quarry-tiny"
        manifest = create_model(model_dir)
        step(2, f"tiny model {manifest.name} {manifest.model_id_hex[:18]}... written in "
                f"{time.monotonic() - t:.1f} s")

        try:
            configs = [miner_config(home / f"miner{i}.toml", account=a,
                                    market_url=stack.market_url, model_dir=model_dir)
                       for i, a in enumerate(MINER_ACCOUNTS)]
            for cfg in configs:
                register = spawn([str(BIN / "miner"), "register", "--config", str(cfg)],
                                 name=f"miner register {cfg.stem}",
                                 log_path=home / "logs" / f"{cfg.stem}-register.log")
                if register.popen.wait(timeout=120) != 0:
                    raise QuarryError(f"miner register failed:\n{register.log_tail()}")
            for cfg in configs:
                miners.append(spawn([str(BIN / "miner"), "run", "--config", str(cfg)],
                                    name=f"miner run {cfg.stem}",
                                    log_path=home / "logs" / f"{cfg.stem}.log"))
            addresses = [anvil_account(a).address for a in MINER_ACCOUNTS]
            step(3, "two miners registered (0.5 ETH stake, 1 gwei/token) and running: "
                    + ", ".join(addresses))
            on_probation = [a for a in addresses if stack.quarry.gpu.on_probation(a)]
            if on_probation:
                print(f"      {len(on_probation)} of them on probation (new identities the "
                      "committee has not vetted yet): the client opts in with "
                      "allow_probation=True, or no miner could claim its task")

            with Client(stack.rpc_url, anvil_account(CLIENT_ACCOUNT).key,
                        stack.market_url) as client:
                job = client.submit(prompts(args.prompts), model=manifest.name,
                                    max_tokens=args.max_tokens, price=PRICE_WEI,
                                    shard_size=args.shard_size, deadline=3600,
                                    allow_probation=bool(on_probation))
                status = job.status()
                step(4, f"client {client.address} submitted task {job.task_id}: "
                        f"{status.num_requests} prompts in {len(status.shards)} shards, "
                        f"paid {eth(status.payment)} into escrow")
                job.wait(progress=True, timeout=args.timeout)
                outputs = job.results()
                out = Path.cwd() / ".quarry" / "demo-results.jsonl"
                out.parent.mkdir(parents=True, exist_ok=True)
                job.write_results(out)
                step(5, f"{len(outputs)} results verified (receipt signature, result-tree "
                        f"proof and output hash each), written to {out}")
                o = outputs[0]
                print(f"      e.g. {o.custom_id}: {len(o.token_ids)} tokens, "
                      f"finish_reason {o.finish_reason!r}, signed by {o.miner} "
                      "(the tiny model's weights are random, so its text is noise)")

                final = job.wait(progress=True, timeout=args.timeout, finalized=True)
                paid: dict[str, int] = defaultdict(int)
                tokens: dict[str, int] = defaultdict(int)
                shards: dict[str, list[int]] = defaultdict(list)
                for s in final.shards:
                    shards[s.miner or "-"].append(s.index)
                    tokens[s.miner or "-"] += s.tokens_used
                for e in stack.quarry.tasks.events("ShardFinalized", taskId=job.task_id):
                    paid[e["miner"]] += int(e["payment"])
                step(6, f"settled once the {stack.deployment.params['challenge_window']} s "
                        "challenge window closed (market sweep / miners' finalizeShard):")
                for miner in sorted(shards):
                    print(f"      miner {miner}: shards {shards[miner]}, {tokens[miner]} "
                          f"tokens, paid {eth(paid[miner])}")
                    if paid[miner] != tokens[miner] * PRICE_WEI:
                        raise QuarryError(f"miner {miner} was paid {paid[miner]} wei for "
                                          f"{tokens[miner]} tokens at {PRICE_WEI} wei")
                print(f"      client refunded {eth(final.refunded)} of unused budget; "
                      f"{final.tokens} tokens in all")
        finally:
            for m in miners:
                m.stop()
    print(f"demo done in {time.monotonic() - began:.1f} s; every process it started is "
          "stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=60, help="batch size (60)")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per output (24)")
    parser.add_argument("--shard-size", type=int, default=15, help="requests per shard (15)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait (240)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the demo directory (logs, store, board) afterwards")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="quarry-demo-"))
    try:
        run(args, home)
    except QuarryError as exc:
        print(f"demo failed: {exc} (logs in {home / 'logs'})", file=sys.stderr)
        args.keep = True
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"demo directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
