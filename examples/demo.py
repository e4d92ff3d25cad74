"""The whole marketplace on one machine, from nothing: `make demo` runs this.

1. Private Redis and Anvil (the five contracts deployed, 20 s epochs), the market service
   and a Celery worker, all on free ports under a fresh directory. The market's dashboard
   (`/ui`) shows everything below as it happens.
2. The embedded tiny model.
3. A verifier committee: two verifiers staking (`verifier register`; their seats take
   effect at the next epoch boundary) and running (`verifier run`, each with its own Celery
   scoring worker on the same Redis).
4. Two miners registering the model (`miner register`) and serving it (`miner run`).
5. A client submitting a batch of prompts through the SDK, naming an arbiter, waiting, and
   checking every receipt's signature, result-tree proof, output hash and finish reason
   before it reads one output. The miners are new identities, hence on probation (the
   committee has not vetted them yet), so the client opts in to them
   (`allow_probation=True`), as any client of a fresh market must.
6. The arbiter disputing one output (`verifier dispute`): the committee scores the whole
   shard, votes through the market's relay and records a stake quorum on-chain.
7. A challenge epoch: the committee's challenges, disguised as ordinary client jobs, reach
   the miners; the members score the answers and submit the epoch's reputation report. A
   miner too busy to answer within the answer window (a loaded machine) is reported
   unavailable, which costs it nothing but that epoch's credit.
8. The market's settlement sweep finalizing each shard once its challenge window closes:
   each miner is paid for its own tokens, the unused budget goes back to the client.

Everything started here is stopped at the end, also on Ctrl-C or an error; with `--keep`
(`make demo ARGS=--keep`) it stays up, dashboard and all, until Ctrl-C. Nothing in this
file is special to the demo: it is what a client script, an arbiter, two verifier operators
and two miner operators would do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from client import Client
from market.chain.client import anvil_account
from market.chain.deploy import DeployParams
from market.chain.devnet import free_port
from market.errors import QuarryError
from market.local.processes import ManagedProcess, spawn
from market.local.stack import LocalStack
from market.model.create import create_model

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLIENT_ACCOUNT = 1
ARBITER_ACCOUNT = 2
MINER_ACCOUNTS = (3, 4)
VERIFIER_ACCOUNTS = (6, 7)
VERIFIER_STAKES = ("0.2ether", "0.1ether")  # a quorum (> 2/3 of the stake) needs both
PRICE_WEI = 10**9  # 1 gwei per output token
EPOCH_S = 20
ANSWER_WINDOW_S = 15  # a challenged miner's time to answer, from the challenge's posting
CHALLENGE_WINDOW_S = 90  # a client's (and the arbiter's) time to check and dispute a shard
STEPS = 8

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
    print(f"[{n}/{STEPS}] {text}", flush=True)


def verifier_config(path: Path, *, account: int, stake: str, market_url: str,
                    redis_url: str, model_dir: Path, state_dir: Path,
                    metrics_port: int) -> Path:
    key = "0x" + bytes(anvil_account(account).key).hex()
    path.write_text(
        "[verifier]\n"
        f'key = "{key}"\n'
        f'market_url = "{market_url}"\n'
        f'model_dir = "{model_dir}"\n'
        f'redis_url = "{redis_url}"\n'
        f'state_dir = "{state_dir}"\n'
        f'stake = "{stake}"\n'
        "scoring_workers = 1\n"
        f"metrics_port = {metrics_port}\n"
        "poll_interval_s = 0.5\n"
        "challenge_requests = 6\n"
        "challenge_max_tokens = 16\n"
    )
    path.chmod(0o600)  # it holds a raw key
    return path


def run_command(home: Path, *argv: str) -> str:
    """Run one CLI command to completion and return the last line it printed; QuarryError
    with its log when it fails."""
    log = home / "logs" / f"{argv[0]}-{argv[1]}-{time.monotonic_ns()}.log"
    proc = spawn([str(BIN / argv[0]), *argv[1:]], name=" ".join(argv[:2]), log_path=log)
    if proc.popen.wait(timeout=180) != 0:
        raise QuarryError(f"{' '.join(argv[:2])} failed:\n{proc.log_tail()}")
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def miner_config(path: Path, *, account: int, market_url: str, model_dir: Path,
                 metrics_port: int) -> Path:
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
        f"metrics_port = {metrics_port}\n"
    )
    path.chmod(0o600)  # it holds a raw key
    return path


@dataclass
class Demo:
    """What a finished demo leaves running: the stack, the role processes and the job."""

    stack: LocalStack
    procs: list[ManagedProcess]
    task_id: int
    dispute_id: int
    epoch: int
    miners: list[str]
    missed: set[str]  # miners reported MISSED (too busy to answer) in epoch `epoch`'s report
    metrics_ports: list[int]  # the miners' Prometheus ports, then the verifiers'

    @property
    def dashboard_url(self) -> str:
        return f"{self.stack.market_url}/ui"


@contextmanager
def demo(args: argparse.Namespace, home: Path) -> Iterator[Demo]:
    """Run the demo's eight steps and yield while everything is still up; stop it all on
    exit (tests use this to look at a market with a finished job, a dispute and a reported
    epoch)."""
    procs: list[ManagedProcess] = []
    params = DeployParams(epoch_duration=EPOCH_S, challenge_window=CHALLENGE_WINDOW_S,
                          challenge_answer_window=ANSWER_WINDOW_S)
    with LocalStack(home, deploy_params=params) as stack:
        q = stack.quarry
        step(1, f"private Redis, Anvil, market and Celery worker up in "
                f"{stack.timings['total']:.1f} s")
        print(f"      market {stack.market_url} (OpenAPI at {stack.market_url}/docs), "
              f"chain {stack.deployment.chain_id} at {stack.rpc_url}, {EPOCH_S} s epochs")
        print(f"      dashboard {stack.market_url}/ui, metrics {stack.market_url}/metrics",
              flush=True)

        t = time.monotonic()
        model_dir = home / "models" / "quarry-tiny"
        manifest = create_model(model_dir)
        step(2, f"tiny model {manifest.name} {manifest.model_id_hex[:18]}... written in "
                f"{time.monotonic() - t:.1f} s")

        miner_ports = [free_port() for _ in MINER_ACCOUNTS]
        verifier_ports = [free_port() for _ in VERIFIER_ACCOUNTS]
        try:
            vcfgs = [verifier_config(home / f"verifier{i}.toml", account=a, stake=stake,
                                     market_url=stack.market_url, redis_url=stack.redis_url,
                                     model_dir=model_dir, state_dir=home / "verifier-state",
                                     metrics_port=port)
                     for i, (a, stake, port) in enumerate(zip(
                         VERIFIER_ACCOUNTS, VERIFIER_STAKES, verifier_ports, strict=True))]
            for cfg in vcfgs:
                run_command(home, "verifier", "register", "--config", str(cfg))
            for cfg in vcfgs:
                procs.append(spawn([str(BIN / "verifier"), "run", "--config", str(cfg)],
                                   name=f"verifier run {cfg.stem}",
                                   log_path=home / "logs" / f"{cfg.stem}.log"))
            seated = max(q.committee.verifier_info(anvil_account(a).address).active_from
                         for a in VERIFIER_ACCOUNTS)
            step(3, f"committee: 2 verifiers staked {' and '.join(VERIFIER_STAKES)}, seats "
                    f"from epoch {seated} (now {q.committee.current_epoch()}); each scores "
                    "on its own Celery worker; metrics on ports "
                    + ", ".join(map(str, verifier_ports)))

            configs = [miner_config(home / f"miner{i}.toml", account=a,
                                    market_url=stack.market_url, model_dir=model_dir,
                                    metrics_port=port)
                       for i, (a, port) in enumerate(zip(MINER_ACCOUNTS, miner_ports,
                                                         strict=True))]
            for cfg in configs:
                run_command(home, "miner", "register", "--config", str(cfg))
            for cfg in configs:
                procs.append(spawn([str(BIN / "miner"), "run", "--config", str(cfg),
                                    "--no-progress"],
                                   name=f"miner run {cfg.stem}",
                                   log_path=home / "logs" / f"{cfg.stem}.log"))
            addresses = [anvil_account(a).address for a in MINER_ACCOUNTS]
            step(4, "two miners registered (0.5 ETH stake, 1 gwei/token) and running, on "
                    "probation until the committee has vetted them: " + ", ".join(addresses)
                    + "; metrics on ports " + ", ".join(map(str, miner_ports)))

            arbiter = anvil_account(ARBITER_ACCOUNT)
            with Client(stack.rpc_url, anvil_account(CLIENT_ACCOUNT).key,
                        stack.market_url) as client:
                job = client.submit(prompts(args.prompts), model=manifest.name,
                                    max_tokens=args.max_tokens, price=PRICE_WEI,
                                    shard_size=args.shard_size, deadline=3600,
                                    allow_probation=True, arbiter=arbiter.address)
                status = job.status()
                job.wait(progress=True, timeout=args.timeout)
                outputs = job.results()
                out = home / "demo-results.jsonl"  # in the demo's directory (kept by --keep)
                job.write_results(out)
                step(5, f"client {client.address} paid {eth(status.payment)} for task "
                        f"{job.task_id} ({status.num_requests} prompts, {len(status.shards)} "
                        f"shards, arbiter {arbiter.address}); {len(outputs)} results verified "
                        f"and written to {out}")

                stack.wait_until(lambda: q.committee.current_epoch() >= seated,
                                 "the committee's seats to take effect", timeout=3 * EPOCH_S)
                index = outputs[-1].index
                acfg = home / "arbiter.toml"
                acfg.write_text("[verifier]\n"
                                f'key = "0x{bytes(arbiter.key).hex()}"\n'
                                f'market_url = "{stack.market_url}"\n')
                acfg.chmod(0o600)
                verdict = run_command(home, "verifier", "dispute", str(job.task_id),
                                      str(index), "--config", str(acfg), "--timeout",
                                      str(args.timeout))
                step(6, f"the arbiter disputed request {index}; the committee scored its "
                        f"whole shard and voted: {verdict}")

                def reported() -> list[dict]:
                    """Reports that rated every miner: a miner registered after the next
                    epoch's challenge set was drawn is first challenged an epoch later."""
                    return [r for r in q.committee.events("ReputationSubmitted",
                                                          q.deployment.deploy_block)
                            if r["count"] >= len(addresses)]

                first = stack.wait_until(reported, "the committee's first report rating "
                                         "every miner", timeout=args.timeout)[0]
                reps = {m: q.gpu.miner_info(m).reputation_bps for m in addresses}
                missed = {e["miner"] for e in q.gpu.events("ReportMissed",
                                                           int(first["blockNumber"]))
                          if e["blockNumber"] == first["blockNumber"]}
                step(7, f"challenge epoch {first['epoch']}: each miner got a challenge "
                        "posted like a client job from a fresh address; the members "
                        "re-scored the answers and submitted the report: reputations "
                        + ", ".join(f"{m[:10]}... {r / 100:.0f}%"
                                    + (" (missed its challenge: unavailable, not failed; "
                                       "reputation kept)" if m in missed else "")
                                    for m, r in reps.items()))

                final = job.wait(progress=True, timeout=args.timeout, finalized=True)
                paid: dict[str, int] = defaultdict(int)
                tokens: dict[str, int] = defaultdict(int)
                shards: dict[str, list[int]] = defaultdict(list)
                for s in final.shards:
                    shards[s.miner or "-"].append(s.index)
                    tokens[s.miner or "-"] += s.tokens_used
                for e in q.tasks.events("ShardFinalized", taskId=job.task_id):
                    paid[e["miner"]] += int(e["payment"])
                step(8, f"settled once the {stack.deployment.params['challenge_window']} s "
                        "challenge window closed (market sweep / miners' finalizeShard):")
                for miner in sorted(shards):
                    print(f"      miner {miner}: shards {shards[miner]}, {tokens[miner]} "
                          f"tokens, paid {eth(paid[miner])}")
                    if paid[miner] != tokens[miner] * PRICE_WEI:
                        raise QuarryError(f"miner {miner} was paid {paid[miner]} wei for "
                                          f"{tokens[miner]} tokens at {PRICE_WEI} wei")
                print(f"      client refunded {eth(final.refunded)} of unused budget; "
                      f"{final.tokens} tokens in all")
                dispute_id = max(d.dispute_id for d in job.disputes())
            yield Demo(stack=stack, procs=procs, task_id=job.task_id, dispute_id=dispute_id,
                       epoch=int(first["epoch"]), miners=addresses, missed=missed,
                       metrics_ports=miner_ports + verifier_ports)
        finally:
            for p in procs:
                p.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=60, help="batch size (60)")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per output (24)")
    parser.add_argument("--shard-size", type=int, default=15, help="requests per shard (15)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for each step (600: a busy machine is slow, "
                        "not broken)")
    parser.add_argument("--keep", action="store_true",
                        help="leave everything running (look at the dashboard) until Ctrl-C, "
                        "then keep the demo directory (logs, store, board)")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="the processes' log lines (in the demo directory's logs/): text, "
                        "or one JSON object per line (default: $QUARRY_LOG_FORMAT, else text)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops a kept demo as Ctrl-C does
    if args.log_format:
        os.environ["QUARRY_LOG_FORMAT"] = args.log_format  # every process inherits it
    home = Path(tempfile.mkdtemp(prefix="quarry-demo-"))
    began = time.monotonic()
    try:
        with demo(args, home) as d:
            print(f"demo done in {time.monotonic() - began:.1f} s; dashboard: "
                  f"{d.dashboard_url}", flush=True)
            if args.keep:
                print(f"everything stays up for you to look (logs in {home / 'logs'}); "
                      "Ctrl-C stops it", flush=True)
                while True:
                    time.sleep(3600)
        print("every process the demo started is stopped", flush=True)
    except QuarryError as exc:
        print(f"demo failed: {exc} (logs in {home / 'logs'})", file=sys.stderr)
        args.keep = True
        return 1
    except KeyboardInterrupt:
        if not args.keep:
            print("demo interrupted; everything it started is stopped", file=sys.stderr)
            return 130
        print("everything the demo started is stopped", flush=True)
    finally:
        if args.keep:
            print(f"demo directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
