"""One model across four miners' GPUs, on one machine: `python examples/swarm.py`.

1. Private Redis, Anvil (contracts deployed), the market service and a Celery worker.
2. An 8-layer tiny model.
3. Four miners registering it (`miner register`) and running as swarm members
   (`miner run` with `[miner] swarm = true`), each with its own memory cap and declared
   speed: none can hold the model alone.
4. The market placing the layers on the live members (Parallax Phase 1); every member
   checking its range, starting its pipeline stage (CURVE-authenticated: only the plan's
   members may connect) and signing the swarm's EIP-712 consent; the head registering the
   swarm on-chain.
5. A client batch served through the pipeline across the four processes, every receipt
   checked by the client.
6. Settlement: each shard's payment split to the wei by the layers each member serves
   (`swarmSplit`: floor of each share, the remainder to the head).

Everything started here is stopped at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from client import Client
from market.chain.client import anvil_account
from market.errors import QuarryError
from market.local.processes import ManagedProcess, spawn
from market.local.stack import LocalStack
from market.marketapi import MarketAPI, MarketError
from market.model.create import create_model

BIN = Path(sys.executable).parent
CLIENT_ACCOUNT = 1
PRICE_WEI = 10**9
# account -> (memory cap MiB, declared TFLOP/s): different GPUs; with the KV room the market
# reserves per layer they hold 1, 2, 2 and 3 of the 8 layers, so the plan needs all four
MEMBERS = {12: (3, 2.0), 13: (5, 1.0), 14: (5, 1.5), 15: (7, 1.0)}
STEPS = 6


def step(n: int, text: str) -> None:
    print(f"[{n}/{STEPS}] {text}", flush=True)


def member_config(path: Path, *, account: int, market_url: str, model_dir: Path,
                  stage_port: int, memory_mib: int, tflops: float) -> Path:
    path.write_text(
        "[miner]\n"
        f'key = "0x{bytes(anvil_account(account).key).hex()}"\n'
        f'market_url = "{market_url}"\n'
        f'model_dirs = ["{model_dir}"]\n'
        f'price_per_token = "{PRICE_WEI}"\n'
        'stake = "0.5ether"\n'
        f'endpoint = "http://127.0.0.1:{9100 + account}"\n'
        "poll_interval_s = 0.5\nheartbeat_interval_s = 1.0\nmax_batch = 8\n"
        f'state_dir = "{path.parent / "state"}"\n'
        f"swarm = true\nmemory_mib = {memory_mib}\ntflops = {tflops}\n"
        f"stage_port = {stage_port}\n")
    path.chmod(0o600)  # it holds a raw key
    return path


def run(args: argparse.Namespace, home: Path) -> None:
    procs: list[ManagedProcess] = []
    with LocalStack(home) as stack:
        q = stack.quarry
        step(1, f"Redis, Anvil, market and Celery worker up; market {stack.market_url}")
        model_dir = home / "models" / "quarry-tiny-8"
        manifest = create_model(model_dir, layers=8, hidden=64)
        model_hex = manifest.model_id_hex
        step(2, f"8-layer model {manifest.name} {model_hex[:18]}...")
        try:
            for i, (account, (memory, tflops)) in enumerate(MEMBERS.items()):
                cfg = member_config(home / f"member{i}.toml", account=account,
                                    market_url=stack.market_url, model_dir=model_dir,
                                    stage_port=args.base_port + i, memory_mib=memory,
                                    tflops=tflops)
                reg = spawn([str(BIN / "miner"), "register", "--config", str(cfg)],
                            name="miner register", log_path=home / "logs" / "register.log")
                if reg.popen.wait(timeout=180) != 0:
                    raise QuarryError(f"miner register failed:\n{reg.log_tail()}")
                procs.append(spawn([str(BIN / "miner"), "run", "--config", str(cfg),
                                    "--no-progress"], name=f"member {i}",
                                   log_path=home / "logs" / f"member{i}.log"))
            step(3, "four swarm members registered and running: " + ", ".join(
                f"{anvil_account(a).address[:10]}... {m} MiB" for a, (m, _) in MEMBERS.items()))

            with MarketAPI(stack.market_url) as api:
                def registered() -> dict | None:
                    try:
                        plan = api.swarm_plan(model_hex)
                    except MarketError:
                        return None
                    return plan if plan.get("swarm_id") is not None else None

                plan = stack.wait_until(registered, "the swarm to be planned and registered",
                                        timeout=args.timeout)
            assert plan is not None
            step(4, f"plan {plan['version']} ({plan['algorithm']}), swarm {plan['swarm_id']} "
                    f"on-chain, head {plan['head'][:10]}...:")
            for m in plan["members"]:
                print(f"      {m['address']} layers {m['layers'][0]}:{m['layers'][1]} "
                      f"({m['memory_mib']} MiB) at {m['endpoint']}")

            with Client(stack.rpc_url, anvil_account(CLIENT_ACCOUNT).key,
                        stack.market_url) as client:
                t = time.monotonic()
                job = client.submit([f"Tell me about item {i}." for i in range(args.prompts)],
                                    model=manifest.name, max_tokens=args.max_tokens,
                                    price=PRICE_WEI, shard_size=args.shard_size, deadline=3600,
                                    allow_probation=True)
                job.wait(progress=True, timeout=args.timeout)
                outputs = job.results()
                step(5, f"{len(outputs)} results through the swarm in "
                        f"{time.monotonic() - t:.1f} s, every receipt verified, "
                        f"{sum(len(o.token_ids) for o in outputs)} tokens")

                q.chain.advance_time(int(q.deployment.params["challenge_window"]) + 1)
                job.wait(progress=False, timeout=args.timeout, finalized=True)
            paid: dict[str, int] = {}
            for ev in q.tasks.events("ShardFinalized", taskId=job.task_id):
                [credit] = q.tasks.events("SwarmPaid", taskId=job.task_id, shard=ev["shard"])
                split = q.gpu.swarm_split(int(credit["swarmId"]), int(ev["payment"]))
                credited = dict(zip(credit["members"], credit["amounts"], strict=True))
                if credited != split:  # what escrow credited vs the swarm's fixed shares
                    raise QuarryError(f"shard {ev['shard']}: credited {credited}, the split "
                                      f"says {split}")
                for member, part in credited.items():
                    paid[member] = paid.get(member, 0) + int(part)
            info = q.gpu.swarm_info(plan["swarm_id"])
            step(6, "settled; each member credited exactly its share of the pay (shares = "
                    "layers served; floor of each, the remainder to the head):")
            for member, share in zip(info.members, info.shares, strict=True):
                print(f"      {member}: {share} layer(s), {paid.get(member, 0)} wei")
        finally:
            for p in procs:
                p.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="batch size (8)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per output (16)")
    parser.add_argument("--shard-size", type=int, default=4, help="requests per shard (4)")
    parser.add_argument("--base-port", type=int, default=9500,
                        help="the members' stage ports start here (9500)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait (240)")
    parser.add_argument("--keep", action="store_true", help="keep the directory afterwards")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="quarry-swarm-"))
    try:
        run(args, home)
    except QuarryError as exc:
        print(f"swarm example failed: {exc} (logs in {home / 'logs'})", file=sys.stderr)
        args.keep = True
        return 1
    except KeyboardInterrupt:
        print("interrupted; everything started is stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
