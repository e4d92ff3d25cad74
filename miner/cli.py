"""The `miner` command: register GPUs and models, run the work loop, check and withdraw
earnings, and exit with unbonding. Settings come from `--config FILE` ([miner] table), then
QUARRY_MINER_* variables, then flags."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.cliutil import add_log_format, add_metrics_options, run_cli
from market.logs import configure_logging, export_format, say

if TYPE_CHECKING:
    from miner.config import MinerConfig


def _load(args: argparse.Namespace, **flags: Any) -> MinerConfig:
    from miner.config import MinerConfig

    common = {"market_url": args.market_url, "rpc_url": args.rpc_url,
              "key_file": args.key_file, "deployment": args.deployment}
    return MinerConfig.load(args.config, **common, **flags)


def _logging(args: argparse.Namespace, verbose: bool = False) -> None:
    """Text (`miner: message`) or JSON lines (--log-format, else $QUARRY_LOG_FORMAT); the
    format goes in the environment too, so processes started from here log the same way."""
    configure_logging("miner", fmt=args.log_format, verbose=verbose)
    export_format()


def cmd_register(args: argparse.Namespace) -> int:
    from miner.register import register_miner

    _logging(args)
    cfg = _load(args, model_dirs=args.model_dir or None, price_per_token=args.price_per_token,
                stake=args.stake, endpoint=args.endpoint, precision=args.precision)
    print(register_miner(cfg).format())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from market.engine.heap import freeze_startup_heap
    from miner.worker import Worker

    _logging(args, args.verbose)
    cfg = _load(args, model_dirs=args.model_dir or None, engine=args.engine,
                precision=args.precision, max_batch=args.max_batch,
                max_shards_in_flight=args.max_shards_in_flight,
                poll_interval_s=args.poll_interval_s,
                auto_withdraw=True if args.auto_withdraw else None, test_mode=args.test_mode,
                state_dir=args.state_dir, metrics_port=args.metrics_port,
                metrics_host=args.metrics_host)
    if cfg.test_mode:
        say(f"miner: WARNING: TEST MODE {cfg.test_mode!r}: this miner CHEATS ON PURPOSE "
            "(for tests and detection benchmarks only); its results are wrong and it will "
            "be slashed", logger="miner", level=logging.WARNING)
    if cfg.metrics_port is not None:  # before the models load: a busy port fails at once
        from market.metrics import serve_metrics

        serve_metrics(cfg.metrics_port, cfg.metrics_host)
    if cfg.swarm:
        return _run_swarm(cfg, progress=not args.no_progress)
    worker = Worker.from_config(cfg, progress=not args.no_progress)
    freeze_startup_heap()  # the models are loaded: keep full GC passes off the generation
    try:
        say(f"miner {worker.address}: serving {len(worker.engines)} model(s) with the "
            f"{cfg.engine} engine; Ctrl-C finishes the current shard and exits; copies "
            f"of submitted results in {worker.archive.root}", logger="miner",
            miner=worker.address)
        summary = worker.run(stop_when_idle=args.once)
    finally:
        worker.close()
    say(f"submitted {len(summary.submitted)} shard(s) ({summary.tokens} tokens), "
        f"{summary.failed} failed, {summary.finalized} finalized for {summary.paid_wei} wei, "
        f"{summary.withdrawn_wei} wei withdrawn", logger="miner", file=sys.stdout)
    if summary.challenges_answered or summary.challenges_missed:
        say(f"availability challenges: {summary.challenges_answered} answered "
            f"({summary.challenge_bonds_wei} wei of bonds), {summary.challenges_missed} "
            "missed", logger="miner", file=sys.stdout)
    return 0


def _run_swarm(cfg: MinerConfig, progress: bool) -> int:
    """`miner run` with `[miner] swarm = true`: a swarm member (miner/swarm.py)."""
    from market.errors import ConfigError
    from miner.swarm import SwarmMember

    if cfg.test_mode:
        raise ConfigError("miner setting test_mode is for a single miner, not a swarm member")
    member = SwarmMember.from_config(cfg, progress=progress)
    try:
        say(f"miner {member.address}: swarm member for {member.model.manifest.name}, stage "
            f"{member.endpoint}, memory cap {member.memory_mib} MiB, {member.tflops:.3g} "
            "TFLOP/s declared; Ctrl-C leaves", logger="miner", miner=member.address)
        summary = member.run()
    finally:
        member.close()
    say(f"as the swarm's head: submitted {len(summary.submitted)} shard(s) "
        f"({summary.tokens} tokens), {summary.failed} failed, {summary.finalized} finalized "
        f"for {summary.paid_wei} wei to the members", logger="miner", file=sys.stdout)
    return 0


def _connect(cfg: MinerConfig) -> Any:
    from market.connect import connect

    q, market = connect(cfg)
    market.close()
    return q


def cmd_status(args: argparse.Namespace) -> int:
    from miner.status import miner_status

    cfg = _load(args)
    address = args.address or cfg.account().address
    status = miner_status(_connect(cfg), address)
    print(json.dumps(status.to_json(), indent=2) if args.json else status.format())
    return 0


def cmd_withdraw(args: argparse.Namespace) -> int:
    from miner.status import withdraw_earnings, withdraw_stake

    cfg = _load(args)
    account = cfg.account()
    q = _connect(cfg)
    if args.stake:
        amount, burned = withdraw_stake(q, account)
        print(f"withdrew the whole stake: {amount} wei to {account.address}; the miner is no "
              "longer registered" if not burned else
              f"withdrew the stake: {amount} wei to {account.address}, {burned} wei burned "
              "(it left untrusted without being challenged again); the miner is no longer "
              "registered")
    else:
        amount = withdraw_earnings(q, account)
        print(f"withdrew {amount} wei of earnings to {account.address}")
    return 0


def cmd_exit(args: argparse.Namespace) -> int:
    from miner.status import format_time, request_exit

    cfg = _load(args)
    account = cfg.account()
    q = _connect(cfg)
    at = request_exit(q, account)
    grace = q.gpu.verdict_grace_epochs()
    print(f"exit requested: {account.address} claims no new shards; shards already claimed "
          f"must still be submitted. The stake can be withdrawn with `miner withdraw --stake` "
          f"from {format_time(at)} (unbonding), once every shard is finalized (past its "
          "challenge window, disputes resolved) and the committee has reported the epoch "
          "after the last one settled, which carries any fault found on them (at most "
          f"{grace} epochs after that settlement if the committee is silent); `miner status` "
          "shows what it waits for")
    return 0


def cmd_rechallenge(args: argparse.Namespace) -> int:
    from miner.status import request_rechallenge

    cfg = _load(args)
    account = cfg.account()
    fee, burned = request_rechallenge(_connect(cfg), account)
    stake = (f" and {burned} wei of its stake (the burn its first untrusted report spared)"
             if burned else "")
    print(f"re-challenge requested: {account.address} paid {fee} wei (burned){stake} and is "
          "back on probation; the committee's next challenge set includes it, and the report "
          "after it decides whether it is trusted again")
    return 0


PRECISION_HELP = ("fp32, fp16, bf16, fp8 or int8: declared for every model and the engine's "
                  "dtype (default: fp32 on CPU, bf16 on GPU); register and run must agree")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miner", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--config", type=Path, metavar="FILE",
                       help="TOML file with a [miner] table")
        p.add_argument("--market-url", help="the market's URL (default http://127.0.0.1:8600)")
        p.add_argument("--rpc-url", help="chain RPC URL (default: the market's deployment)")
        p.add_argument("--key-file", type=Path, help="file holding the hex private key")
        p.add_argument("--deployment", type=Path,
                       help="deployment file used when the market is unreachable")
        p.set_defaults(func=func)
        return p

    p = command("register", "stake and register this miner's GPU and models on-chain "
                "(rerun to update; stake is topped up to the configured amount)", cmd_register)
    p.add_argument("--model-dir", action="append", type=Path, metavar="DIR",
                   help="a model directory with a quarry-manifest.json (repeatable)")
    p.add_argument("--price-per-token", help="asking price, wei (or e.g. 1gwei)")
    p.add_argument("--stake", help="total stake, wei (or e.g. 0.5ether)")
    p.add_argument("--endpoint", help="URL advertised on-chain")
    p.add_argument("--precision", help=PRECISION_HELP)
    add_log_format(p)

    p = command("run", "claim and serve open shards until Ctrl-C", cmd_run)
    p.add_argument("--model-dir", action="append", type=Path, metavar="DIR")
    p.add_argument("--engine", help="torch, pipeline or vllm")
    p.add_argument("--precision", help=PRECISION_HELP)
    p.add_argument("--max-batch", type=int, help="requests per engine batch")
    p.add_argument("--max-shards-in-flight", type=int,
                   help="shards of one task claimed together and generated as one stream")
    p.add_argument("--poll-interval-s", type=float, help="seconds between polls when idle")
    p.add_argument("--auto-withdraw", action="store_true",
                   help="withdraw earnings as soon as shards are finalized")
    p.add_argument("--once", action="store_true",
                   help="exit when a poll finds no shard to take")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="where copies of submitted results are kept to answer availability "
                   "challenges (default $QUARRY_HOME/miner)")
    p.add_argument("--test-mode", metavar="MODE",
                   help="CHEAT ON PURPOSE, for tests and benchmarks only: one of the modes "
                   "of miner/cheats.py (substitute, perturb, random, wrong-prompt, "
                   "greedy-sampled, cold, noise, truncate, selective)")
    add_metrics_options(p)
    p.add_argument("-v", "--verbose", action="store_true")
    add_log_format(p)

    p = command("status", "stake, collateral, reputation, shards and earnings", cmd_status)
    p.add_argument("--address", help="another miner's address (no key needed)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command("withdraw", "withdraw escrowed earnings (or, with --stake, the stake after "
                "`miner exit` and unbonding)", cmd_withdraw)
    p.add_argument("--stake", action="store_true", help="withdraw the stake instead")

    command("exit", "request exit: stop claiming and start unbonding the stake", cmd_exit)
    command("rechallenge", "untrusted: pay the fee (burned) to be challenged again, and be "
            "trusted again if the answers pass", cmd_rechallenge)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
