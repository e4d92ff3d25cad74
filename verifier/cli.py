"""The `verifier` command: stake into the committee, run the epoch protocol and dispute votes,
run scoring workers, open disputes as an arbiter, and show the committee. Settings come from
`--config FILE` ([verifier] table), then QUARRY_VERIFIER_* variables, then flags."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.cliutil import run_cli

if TYPE_CHECKING:
    from verifier.config import VerifierConfig


def _load(args: argparse.Namespace, **flags: Any) -> VerifierConfig:
    from verifier.config import VerifierConfig

    common = {"market_url": args.market_url, "rpc_url": args.rpc_url,
              "key_file": args.key_file, "deployment": args.deployment}
    return VerifierConfig.load(args.config, **common, **flags)


def _logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="verifier: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "urllib3", "web3", "celery", "kombu"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def scoring_queue(address: str) -> str:
    """Each verifier's own Celery queue: verifiers never share scorers."""
    return f"quarry.score.{address.lower()}"


def cmd_register(args: argparse.Namespace) -> int:
    from market.connect import connect
    from market.errors import QuarryError

    cfg = _load(args, stake=args.stake)
    account = cfg.account()
    q, market = connect(cfg)
    market.close()
    committee = q.committee
    if committee.is_member(account.address):
        info = committee.verifier_info(account.address)
        print(f"verifier {account.address} is already a committee member (stake {info.stake} "
              f"wei; {len(committee.members())} members, quorum {committee.quorum()})")
        return 0
    stake = cfg.stake
    if stake is None:
        stake = int(q.chain.call(committee.contract.functions.minVerifierStake()))
    if q.chain.balance(account.address) <= stake:
        raise QuarryError(f"{account.address} holds {q.chain.balance(account.address)} wei, "
                          f"not enough to stake {stake} wei and pay gas")
    committee.register(account, stake)
    print(f"verifier {account.address} joined the committee with {stake} wei staked "
          f"({len(committee.members())} members, quorum {committee.quorum()})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from market.chain.errors import ChainError
    from market.config import quarry_home
    from market.connect import connect
    from market.errors import ConfigError, QuarryError
    from market.model.manifest import load_manifest
    from market.service.api import MarketError
    from verifier.committee import CommitteeMember
    from verifier.disputes import DisputeDesk
    from verifier.scoring_worker import ScoringClient, start_scoring_worker

    _logging(args.verbose)
    cfg = _load(args, model_dir=args.model_dir, redis_url=args.redis_url,
                scoring_workers=args.scoring_workers, poll_interval_s=args.poll_interval_s,
                test_mode=args.test_mode)
    cfg.require("key", "model_dir")
    assert cfg.model_dir is not None
    if cfg.test_mode:
        print(f"verifier: WARNING: TEST MODE {cfg.test_mode!r}: this verifier is BYZANTINE ON "
              "PURPOSE (for tests only)", file=sys.stderr)
    manifest = load_manifest(cfg.model_dir)
    manifest.verify(cfg.model_dir)
    account = cfg.account()
    q, market = connect(cfg)
    if not q.committee.is_member(account.address):
        raise ConfigError(f"{account.address} is not a committee member: run `verifier "
                          "register` first")
    home = cfg.state_dir or quarry_home() / "verifier"
    state = home / f"{account.address}-{q.chain.chain_id}-{q.committee.address}.json"
    queue = scoring_queue(account.address)
    workers = [start_scoring_worker(cfg.redis_url, queue,
                                    home / "logs" / f"scorer-{account.address}-{i}.log")
               for i in range(cfg.scoring_workers)]
    try:
        scorer = ScoringClient(cfg.redis_url, queue, cfg.model_dir)
        member = CommitteeMember(
            q, account, market, scorer, model_id=manifest.model_id, model_name=manifest.name,
            params=cfg.reputation_params(), state_path=state,
            requests=cfg.challenge_requests, max_tokens=cfg.challenge_max_tokens,
            tolerance_bps=cfg.tolerance_bps, fault_below_bps=cfg.fault_below_bps,
            test_mode=cfg.test_mode, on_event=lambda line: print(line, flush=True))
        desk = DisputeDesk(q, account, market, scorer, fault_below_bps=cfg.fault_below_bps,
                           model_id=manifest.model_id,
                           lie=cfg.test_mode == "lie")
        print(f"verifier {account.address}: committee of {len(q.committee.members())}, model "
              f"{manifest.name} ({manifest.model_id_hex}), {cfg.scoring_workers} scoring "
              f"worker(s) on {queue}; Ctrl-C stops", file=sys.stderr, flush=True)
        while True:
            for part in (member.step, desk.step):
                try:
                    part()
                except (ChainError, MarketError, QuarryError) as exc:
                    # One failed pass (chain or market briefly down) must not stop the loop.
                    print(f"verifier: {type(exc).__name__}: {exc}", file=sys.stderr,
                          flush=True)
            time.sleep(cfg.poll_interval_s)
    except KeyboardInterrupt:
        print("verifier: stopped", file=sys.stderr)
        return 0
    finally:
        for w in workers:
            w.stop()
        market.close()


def cmd_worker(args: argparse.Namespace) -> int:
    from verifier.scoring_worker import run_worker

    cfg = _load(args, redis_url=args.redis_url)
    queue = args.queue or scoring_queue(cfg.account().address)
    run_worker(cfg.redis_url, queue, concurrency=args.concurrency)
    return 0


def cmd_dispute(args: argparse.Namespace) -> int:
    from market.connect import connect
    from market.jobs import open_dispute, wait_dispute

    cfg = _load(args)
    account = cfg.account()
    q, market = connect(cfg)
    try:
        dispute_id = open_dispute(q, account, market, args.task_id, args.index,
                                  bond=args.bond)
        print(f"dispute {dispute_id} opened on task {args.task_id} request {args.index}",
              flush=True)
        if args.no_wait:
            return 0
        info = wait_dispute(q, dispute_id, timeout=args.timeout, expire_as=account)
        print(json.dumps(info.to_json()) if args.json
              else f"dispute {dispute_id}: {info.outcome()}")
    finally:
        market.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from market.connect import connect

    cfg = _load(args)
    q, market = connect(cfg)
    market.close()
    c = q.committee
    epoch = c.current_epoch()
    members = c.members()
    reports = c.events("ReputationSubmitted", q.deployment.deploy_block)
    miners = sorted({m["miner"] for m in q.gpu.events("MinerRegistered",
                                                      q.deployment.deploy_block)})
    status = {
        "epoch": epoch, "epochDurationS": c.epoch_duration(), "members": members,
        "quorum": c.quorum(),
        "leader": c.leader_of(epoch) if members else None,
        "challengeSetCommitted": {e: c.challenge_set_of(e) != bytes(32)
                                  for e in (epoch, epoch + 1)},
        "reportedEpochs": sorted(int(r["epoch"]) for r in reports),
        "minerReputationBps": {m: q.gpu.miner_info(m).reputation_bps for m in miners},
    }
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(f"epoch {epoch} ({status['epochDurationS']} s): {len(members)} members, quorum "
              f"{status['quorum']}, leader {status['leader']}")
        print(f"reported epochs: {status['reportedEpochs'] or 'none'}")
        for m, bps in status["minerReputationBps"].items():
            print(f"  miner {m}: reputation {bps / 100:.2f}%")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verifier", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--config", type=Path, metavar="FILE",
                       help="TOML file with a [verifier] table")
        p.add_argument("--market-url", help="the market's URL (default http://127.0.0.1:8600)")
        p.add_argument("--rpc-url", help="chain RPC URL (default: the market's deployment)")
        p.add_argument("--key-file", type=Path, help="file holding the hex private key")
        p.add_argument("--deployment", type=Path,
                       help="deployment file used when the market is unreachable")
        p.set_defaults(func=func)
        return p

    p = command("register", "stake into VerifierCommittee and join the committee", cmd_register)
    p.add_argument("--stake", help="stake, wei (or e.g. 0.1ether; default the minimum)")

    p = command("run", "take part in every epoch (challenge sets, challenges, re-scoring, "
                "co-signing reports) and vote on disputes, until Ctrl-C", cmd_run)
    p.add_argument("--model-dir", type=Path, help="the reference model directory")
    p.add_argument("--redis-url", help="Celery broker of the scoring workers")
    p.add_argument("--scoring-workers", type=int,
                   help="scoring workers to start (0: run `verifier worker` yourself)")
    p.add_argument("--poll-interval-s", type=float)
    p.add_argument("--test-mode", metavar="MODE",
                   help="BYZANTINE ON PURPOSE, for tests only: lie or withhold")
    p.add_argument("-v", "--verbose", action="store_true")

    p = command("worker", "a scoring worker (Celery) on this verifier's queue", cmd_worker)
    p.add_argument("--redis-url", help="Celery broker")
    p.add_argument("--queue", help="queue name (default: this verifier's own)")
    p.add_argument("--concurrency", type=int, default=1)

    p = command("dispute", "as a task's arbiter (or client), dispute one output and wait for "
                "the committee's verdict", cmd_dispute)
    p.add_argument("task_id", type=int)
    p.add_argument("index", type=int, help="request index in the task")
    p.add_argument("--bond", type=int, help="bond, wei (default: the minimum)")
    p.add_argument("--no-wait", action="store_true", help="print the dispute id and exit")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait")
    p.add_argument("--json", action="store_true")

    p = command("status", "the committee, the epoch, its leader and miners' reputations",
                cmd_status)
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
