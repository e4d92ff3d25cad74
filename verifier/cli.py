"""The `verifier` command: stake into the committee (and leave it, and withdraw the stake), run
the epoch protocol and dispute votes, run scoring workers, open disputes as an arbiter, and
show the committee. Settings come from
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

from market.cliutil import add_log_format, add_metrics_options, run_cli
from market.logs import configure_logging, export_format, json_logs, say

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.contracts import VerifierInfo
    from market.chain.deploy import Quarry
    from verifier.config import VerifierConfig


def _load(args: argparse.Namespace, **flags: Any) -> VerifierConfig:
    from verifier.config import VerifierConfig

    common = {"market_url": args.market_url, "rpc_url": args.rpc_url,
              "key_file": args.key_file, "deployment": args.deployment}
    return VerifierConfig.load(args.config, **common, **flags)


def _logging(args: argparse.Namespace, verbose: bool = False) -> None:
    """Text (`verifier: message`) or JSON lines (--log-format, else $QUARRY_LOG_FORMAT); the
    format goes in the environment too, so the scoring workers started from here (which
    inherit it) log the same way."""
    configure_logging("verifier", fmt=args.log_format, verbose=verbose)
    export_format()


def _print_event(line: str) -> None:
    print(line, flush=True)


def scoring_queue(address: str) -> str:
    """Each verifier's own Celery queue: verifiers never share scorers."""
    return f"quarry.score.{address.lower()}"


def _when(q: Quarry, epoch: int) -> str:
    """`epoch N (chain time T, in S s)`: when a membership change takes effect."""
    start, now = q.committee.epoch_start(epoch), q.chain.timestamp()
    return f"epoch {epoch} (chain time {start}, {_in(start - now)})"


def _in(seconds: int) -> str:
    return f"in {seconds} s" if seconds > 0 else "now"


def _on_chain(cfg: VerifierConfig) -> tuple[LocalAccount, Quarry, VerifierInfo]:
    """The account, the contracts and its committee record, for the stake commands (which
    need the market only to learn the deployment)."""
    from market.connect import connect

    account = cfg.account()
    q, market = connect(cfg)
    market.close()
    return account, q, q.committee.verifier_info(account.address)


def cmd_register(args: argparse.Namespace) -> int:
    from market.errors import QuarryError

    _logging(args)
    cfg = _load(args, stake=args.stake)
    account, q, info = _on_chain(cfg)
    committee = q.committee
    if info.seated:
        where = ("is a committee member" if info.active_from <= committee.current_epoch()
                 else f"is registered; its seat takes effect at {_when(q, info.active_from)}")
        print(f"verifier {account.address} {where} (stake {info.stake} wei)")
        return 0
    if info.registered:
        raise QuarryError(f"{account.address} is leaving the committee (its seat ends at epoch "
                          f"{info.active_until}): withdraw its stake from chain time "
                          f"{info.withdrawable_at} (`verifier withdraw`), then register again")
    stake = cfg.stake
    if stake is None:
        stake = int(q.chain.call(committee.contract.functions.minVerifierStake()))
    if q.chain.balance(account.address) <= stake:
        raise QuarryError(f"{account.address} holds {q.chain.balance(account.address)} wei, "
                          f"not enough to stake {stake} wei and pay gas")
    tx = committee.register(account, stake)
    at = int(tx.event("VerifierRegistered")["activeFrom"])
    print(f"verifier {account.address} registered with {stake} wei staked; its seat takes "
          f"effect at {_when(q, at)}: `verifier run` waits for it")
    for ev in tx.all("VerifierDisplaced"):
        print(f"  it displaces {ev['verifier']} (less stake) from epoch {ev['activeUntil']}")
    return 0


def cmd_exit(args: argparse.Namespace) -> int:
    from market.errors import QuarryError

    account, q, info = _on_chain(_load(args))
    if not info.seated:
        raise QuarryError(
            f"{account.address} is not registered in the committee" if not info.registered
            else f"{account.address} is already leaving: its seat ends at epoch "
                 f"{info.active_until}, its stake can be withdrawn from chain time "
                 f"{info.withdrawable_at} (`verifier withdraw`)")
    tx = q.committee.request_exit(account)
    ev = tx.event("VerifierExitRequested")
    until, at = int(ev["activeUntil"]), int(ev["withdrawableAt"])
    now = q.chain.timestamp()
    if until == info.active_from:
        print(f"verifier {account.address}: its join had not taken effect and never will; "
              f"its stake of {info.stake} wei stays bonded for the unbonding period and can be "
              f"withdrawn from chain time {at} ({_in(at - now)}) with `verifier withdraw`")
        return 0
    print(f"verifier {account.address} leaves the committee: its last epoch is {until - 1}, "
          f"the seat ends at {_when(q, until)}; keep `verifier run` going: it must still vote "
          f"on the disputes opened until then. Its stake of {info.stake} wei can be withdrawn "
          f"from chain time {at} ({_in(at - now)}) with `verifier withdraw`")
    return 0


def cmd_withdraw(args: argparse.Namespace) -> int:
    from market.chain.errors import revert_class
    from market.errors import QuarryError

    account, q, info = _on_chain(_load(args))
    if info.withdrawable_at == 0:
        raise QuarryError(f"{account.address} has no stake to withdraw: "
                          + ("request an exit first (`verifier exit`)" if info.registered
                             else "it is not registered in the committee"))
    try:
        tx = q.committee.withdraw_stake(account)
    except revert_class("UnbondingNotOver") as exc:
        at = int(exc.args_dict.get("withdrawableAt", info.withdrawable_at))
        raise QuarryError(f"{account.address}'s stake is bonded until chain time {at} "
                          f"({_in(at - q.chain.timestamp())}): disputes its seat judged may "
                          "still expire and report it absent") from None
    amount = int(tx.event("VerifierStakeWithdrawn")["amount"])
    print(f"verifier {account.address} withdrew its stake: {amount} wei")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from market.chain.errors import ChainError
    from market.config import quarry_home
    from market.connect import connect
    from market.errors import ConfigError, QuarryError
    from market.marketapi import MarketError
    from market.model.manifest import load_manifest
    from verifier.audits import AuditDesk
    from verifier.committee import CommitteeMember
    from verifier.disputes import DisputeDesk
    from verifier.scoring_worker import ScoringClient, start_scoring_worker

    _logging(args, args.verbose)
    cfg = _load(args, model_dir=args.model_dir, redis_url=args.redis_url,
                scoring_workers=args.scoring_workers, poll_interval_s=args.poll_interval_s,
                test_mode=args.test_mode, metrics_port=args.metrics_port,
                metrics_host=args.metrics_host)
    cfg.require("key", "model_dir")
    assert cfg.model_dir is not None
    if cfg.test_mode:
        say(f"verifier: WARNING: TEST MODE {cfg.test_mode!r}: this verifier is BYZANTINE ON "
            "PURPOSE (for tests only)", logger="verifier", level=logging.WARNING)
    if cfg.metrics_port is not None:  # before anything slow: a busy port fails at once
        from market.metrics import serve_metrics

        serve_metrics(cfg.metrics_port, cfg.metrics_host)
    manifest = load_manifest(cfg.model_dir)
    manifest.verify(cfg.model_dir)
    account = cfg.account()
    q, market = connect(cfg)
    if not q.committee.verifier_info(account.address).registered:
        market.close()
        raise ConfigError(f"{account.address} is not registered in the committee: run "
                          "`verifier register` first")
    home = cfg.state_dir or quarry_home() / "verifier"
    state = home / f"{account.address}-{q.chain.chain_id}-{q.committee.address}.json"
    queue = scoring_queue(account.address)
    if cfg.metrics_port is not None:
        from verifier import metrics

        metrics.INFO.info({"address": account.address, "model": manifest.name})
        metrics.watch_scoring_queue(cfg.redis_url, queue)
    workers = [start_scoring_worker(cfg.redis_url, queue,
                                    home / "logs" / f"scorer-{account.address}-{i}.log",
                                    precision=cfg.scoring_precision)
               for i in range(cfg.scoring_workers)]
    # Text: the members' events on stdout as ever; JSON: logged, with their task and shard.
    on_event = None if json_logs() else _print_event
    try:
        scorer = ScoringClient(cfg.redis_url, queue, cfg.model_dir)
        audits = AuditDesk(q, account, market, scorer, rate_bps=cfg.audit_rate_bps,
                           model_id=manifest.model_id,
                           on_event=on_event)
        # The member pools the desk's audited shards into its miners' epoch evidence, from
        # the desk's own verdicts (each shard scored once).
        member = CommitteeMember(
            q, account, market, scorer, model_id=manifest.model_id, model_name=manifest.name,
            params=cfg.reputation_params(), state_path=state,
            requests=cfg.challenge_requests, max_tokens=cfg.challenge_max_tokens,
            tolerance_bps=cfg.tolerance_bps,
            test_mode=cfg.test_mode, on_event=on_event, audits=audits)
        desk = DisputeDesk(q, account, market, scorer, model_id=manifest.model_id,
                           lie=cfg.test_mode == "lie")
        say(f"verifier {account.address}: committee of {len(q.committee.members())}, model "
            f"{manifest.name} ({manifest.model_id_hex}), {cfg.scoring_workers} scoring "
            f"worker(s) on {queue}; Ctrl-C stops", logger="verifier")
        # A verifier whose seat has not taken effect yet (or that has left) runs too: the
        # member says once why it waits, and the desk still votes on disputes its old seat
        # judges.
        while True:
            parts = (member.step, desk.step) if cfg.test_mode else (
                member.step, desk.step, audits.step)  # Byzantine test members audit nothing
            for part in parts:
                try:
                    part()
                except (ChainError, MarketError, QuarryError) as exc:
                    # One failed pass (chain or market briefly down) must not stop the loop.
                    say(f"verifier: {type(exc).__name__}: {exc}", logger="verifier",
                        level=logging.WARNING)
            time.sleep(cfg.poll_interval_s)
    except KeyboardInterrupt:
        say("verifier: stopped", logger="verifier")
        return 0
    finally:
        for w in workers:
            w.stop()
        market.close()


def cmd_worker(args: argparse.Namespace) -> int:
    from verifier.scoring_worker import run_worker

    _logging(args)  # and exported: run_worker sets up the worker's logs from the environment
    cfg = _load(args, redis_url=args.redis_url)
    queue = args.queue or scoring_queue(cfg.account().address)
    run_worker(cfg.redis_url, queue, concurrency=args.concurrency,
               precision=cfg.scoring_precision)
    return 0


def cmd_dispute(args: argparse.Namespace) -> int:
    from market.connect import connect
    from market.jobs import open_dispute, wait_dispute

    _logging(args)
    cfg = _load(args)
    account = cfg.account()
    q, market = connect(cfg)
    try:
        dispute_id = open_dispute(q, account, market, args.task_id, args.index,
                                  bond=args.bond)
        say(f"dispute {dispute_id} opened on task {args.task_id} request {args.index}",
            logger="verifier", file=sys.stdout, task=args.task_id, dispute=dispute_id,
            index=args.index)
        if args.no_wait:
            return 0
        info = wait_dispute(q, dispute_id, timeout=args.timeout, expire_as=account)
        print(json.dumps(info.to_json()) if args.json
              else f"dispute {dispute_id}: {info.outcome()}")
    finally:
        market.close()
    return 0


def committee_status(q: Quarry) -> dict[str, Any]:
    """The committee as `verifier status` shows it (JSON-ready; weights and amounts in wei)."""
    from market.chain.contracts import SEATED

    c = q.committee
    epoch = c.current_epoch()
    weights = c.weights_at(epoch)
    infos = {v: c.verifier_info(v) for v in c.seats()}
    reports = c.events("ReputationSubmitted", q.deployment.deploy_block)
    miners = sorted({m["miner"] for m in q.gpu.events("MinerRegistered",
                                                      q.deployment.deploy_block)})
    return {
        "epoch": epoch, "epochDurationS": c.epoch_duration(), "chainTime": q.chain.timestamp(),
        "nextEpochAt": c.epoch_start(epoch + 1),
        "members": list(weights), "weights": weights, "totalWeight": c.total_weight_at(epoch),
        "quorumWeight": c.quorum_weight(epoch),
        "pending": {v: {"activeFrom": i.active_from, "stake": i.stake}
                    for v, i in sorted(infos.items()) if i.seated and i.active_from > epoch},
        "leaving": {v: {"activeUntil": i.active_until, "withdrawableAt": i.withdrawable_at,
                        "stake": i.stake}
                    for v, i in sorted(infos.items()) if i.active_until != SEATED},
        "leader": c.leader_of(epoch) if weights else None,
        "nextReportEpoch": c.next_report_epoch(),
        "challengeSetCommitted": {e: c.challenge_set_of(e) != bytes(32)
                                  for e in (epoch, epoch + 1)},
        "reportedEpochs": sorted(int(r["epoch"]) for r in reports),
        "miners": {m: {"reputationBps": (info := q.gpu.miner_info(m)).reputation_bps,
                       "onProbation": info.on_probation} for m in miners},
    }


def cmd_status(args: argparse.Namespace) -> int:
    from market.connect import connect

    cfg = _load(args)
    q, market = connect(cfg)
    market.close()
    status = committee_status(q)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"epoch {status['epoch']} ({status['epochDurationS']} s, the next at chain time "
          f"{status['nextEpochAt']}): {len(status['members'])} members, total weight "
          f"{status['totalWeight']} wei, quorum weight {status['quorumWeight']} wei, leader "
          f"{status['leader']}")
    for m, w in status["weights"].items():
        print(f"  member {m}: weight {w} wei")
    for m, p in status["pending"].items():
        print(f"  pending {m}: seated from epoch {p['activeFrom']} ({p['stake']} wei)")
    for m, p in status["leaving"].items():
        print(f"  leaving {m}: seat ends at epoch {p['activeUntil']}, stake of {p['stake']} "
              f"wei withdrawable from chain time {p['withdrawableAt']}")
    print(f"next report epoch: {status['nextReportEpoch']}; reported epochs: "
          f"{status['reportedEpochs'] or 'none'}")
    for m, r in status["miners"].items():
        print(f"  miner {m}: reputation {r['reputationBps'] / 100:.2f}%"
              + (" (on probation)" if r["onProbation"] else ""))
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

    p = command("register", "stake into VerifierCommittee; the seat takes effect at the next "
                "epoch boundary the committee allows (printed)", cmd_register)
    p.add_argument("--stake", help="stake, wei (or e.g. 0.1ether; default the minimum)")
    add_log_format(p)

    command("exit", "leave the committee at the next possible boundary (a join that has not "
            "taken effect is cancelled and refunded at once)", cmd_exit)
    command("withdraw", "withdraw the stake once an exit has unbonded", cmd_withdraw)

    p = command("run", "take part in every epoch (challenge sets, challenges, re-scoring, "
                "co-signing reports) and vote on disputes, until Ctrl-C", cmd_run)
    p.add_argument("--model-dir", type=Path, help="the reference model directory")
    p.add_argument("--redis-url", help="Celery broker of the scoring workers")
    p.add_argument("--scoring-workers", type=int,
                   help="scoring workers to start (0: run `verifier worker` yourself)")
    p.add_argument("--poll-interval-s", type=float)
    p.add_argument("--test-mode", metavar="MODE",
                   help="BYZANTINE ON PURPOSE, for tests only: lie or withhold")
    add_metrics_options(p)
    p.add_argument("-v", "--verbose", action="store_true")
    add_log_format(p)

    p = command("worker", "a scoring worker (Celery) on this verifier's queue", cmd_worker)
    p.add_argument("--redis-url", help="Celery broker")
    p.add_argument("--queue", help="queue name (default: this verifier's own)")
    p.add_argument("--concurrency", type=int, default=1)
    add_log_format(p)

    p = command("dispute", "as a task's arbiter (or client), dispute one output and wait for "
                "the committee's verdict", cmd_dispute)
    p.add_argument("task_id", type=int)
    p.add_argument("index", type=int, help="request index in the task")
    p.add_argument("--bond", type=int, help="bond, wei (default: the minimum)")
    p.add_argument("--no-wait", action="store_true", help="print the dispute id and exit")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait")
    p.add_argument("--json", action="store_true")
    add_log_format(p)

    p = command("status", "the epoch, its committee's weights and quorum, pending and leaving "
                "members, reports and miners' reputations", cmd_status)
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
