"""The `client` command: submit OpenAI Batch JSONL jobs to Quarry, follow them, fetch verified
results, dispute an output.

Settings come from `--config FILE` ([client] table: market_url, rpc_url, key or key_file),
then QUARRY_CLIENT_* variables, then flags. Cheap to import: the SDK loads in the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.config import format_eth as _eth
from market.cliutil import run_cli


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("connection")
    g.add_argument("--config", type=Path, default=None,
                   help="TOML file with a [client] table (market_url, rpc_url, key_file)")
    g.add_argument("--market-url", default=None, help="market service URL")
    g.add_argument("--rpc-url", default=None,
                   help="chain RPC (default: the one the market's deployment names)")
    g.add_argument("--key-file", default=None, help="file holding the client's private key")


def _connect(args: argparse.Namespace) -> Any:
    from client.config import load_config

    return load_config(args.config, market_url=args.market_url, rpc_url=args.rpc_url,
                       key_file=args.key_file).connect()


def _task_id(value: str) -> int:
    try:
        task_id = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"task id must be an integer, got {value!r}") from None
    if task_id < 1:
        raise argparse.ArgumentTypeError(f"task ids start at 1, got {task_id}")
    return task_id


def _non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {n}")
    return n


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None


# ---------------------------------------------------------------------------- handlers


def _submit(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        job = c.submit(args.file, model=args.model, max_tokens=args.max_tokens,
                       price=args.price, deadline=args.deadline, shard_size=args.shard_size,
                       arbiter=args.arbiter, min_reputation_bps=args.min_reputation,
                       prefer_miner=args.miner)
        t = job.task()
        cost = job.payment
        print(f"task {job.task_id}: {t.num_requests} requests in {t.num_shards} shard(s) of "
              f"{t.shard_size}, model 0x{t.model_id.hex()}, {t.price_per_token} wei/token, "
              f"deadline {t.deadline}")
        if args.miner:
            print(f"offered to miner {args.miner} only (the market shows it to no other miner "
                  "until the deadline)")
        print(f"cost: {cost} wei ({_eth(cost)}) escrowed (at most; unused tokens are refunded)")
        if args.wait:
            status = job.wait(progress=not args.no_progress, timeout=args.timeout)
            print(status.summary())
    return 0


def _status(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        status = c.job(args.task_id).status()
        print(json.dumps(status.to_json(), indent=2) if args.json else status.summary())
    return 0


def _results(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        job = c.job(args.task_id)
        if args.wait:
            job.wait(progress=not args.no_progress, timeout=args.timeout)
        path = job.write_results(args.out)  # verifies every shard first; writes nothing else
        n = job.task().num_requests
        print(f"task {args.task_id}: {n} outputs verified (signatures, Merkle proofs, output "
              f"hashes) and written to {path}")
    return 0


def _print_disputes(job: Any) -> None:
    disputes = job.disputes()
    if not disputes:
        print(f"task {job.task_id}: no disputes")
    for d in disputes:
        outcome = f": {d.outcome()}" if d.settled else ""
        print(f"dispute {d.dispute_id}: request {d.index} (shard {d.shard}), "
              f"{d.status.name}, bond {d.bond} wei, deadline {d.deadline}, miner {d.miner}"
              f"{outcome}")


def _dispute(args: argparse.Namespace) -> int:
    index = args.index if args.index is not None else args.index_flag
    with _connect(args) as c:
        job = c.job(args.task_id)
        if index is None:
            _print_disputes(job)
            return 0
        dispute_id = job.dispute(index, bond=args.bond, evidence_uri=args.evidence_uri)
        [info] = [d for d in job.disputes() if d.dispute_id == dispute_id]
        print(f"opened dispute {dispute_id} on request {index} (shard {info.shard}), bond "
              f"{info.bond} wei; the shard is frozen until the committee resolves it (by chain "
              f"time {info.deadline})", flush=True)
        if not args.wait:
            return 0
        try:
            info = job.wait_dispute(dispute_id, timeout=args.timeout,
                                    progress=not args.no_progress)
        except KeyboardInterrupt:
            print(f"dispute {dispute_id} stays open; `client dispute {args.task_id}` shows its "
                  "outcome later", file=sys.stderr)
            raise
        print(f"dispute {dispute_id}: {info.outcome()}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        refund = c.job(args.task_id).cancel()
        print(f"task {args.task_id} cancelled: {refund} wei ({_eth(refund)}) refunded to "
              "escrow (claimed shards run to their end); `client withdraw` collects it")
    return 0


def _withdraw(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        amount = c.withdraw()
        print(f"withdrew {amount} wei ({_eth(amount)}) to {c.address}" if amount
              else f"nothing to withdraw for {c.address}")
    return 0


def _models(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        offers = c.offers()
        if not offers:
            print("no registered miner serves any model")
        for o in offers:
            print(f"{o.label()}: {len(o.miners)} miner(s) ({o.alive} alive), "
                  f"from {o.min_price} wei/token")
    return 0


# ---------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("submit", help="post a JSONL batch and pay for it",
                       description="Validate FILE (OpenAI Batch input lines), upload it, and "
                       "create the task with payment = requests * max_tokens * price. Every "
                       "check runs before any money moves.")
    p.add_argument("file", type=Path, metavar="FILE.jsonl")
    p.add_argument("--model", default=None,
                   help="model name or 0x modelId (default: the lines' body.model)")
    p.add_argument("--price", type=int, default=None,
                   help="wei per output token (default: the lowest miner ask)")
    p.add_argument("--deadline", type=_seconds, default=None, metavar="SECONDS",
                   help="seconds from now (default 3600)")
    p.add_argument("--shard-size", type=int, default=None,
                   help="requests per shard (default: spread over twice the alive miners)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="refuse lines whose body.max_tokens is larger than this")
    p.add_argument("--min-reputation", type=_non_negative, default=0, metavar="BPS",
                   help="least miner reputation to claim, in basis points")
    p.add_argument("--arbiter", default=None, help="address that may dispute for you")
    p.add_argument("--miner", default=None, metavar="ADDRESS",
                   help="a directed job: offer it to this miner only (its ask is the default "
                   "price)")
    p.add_argument("--wait", action="store_true", help="wait until every shard has results")
    p.add_argument("--timeout", type=_seconds, default=None, help="with --wait: give up after")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=_submit)

    p = sub.add_parser("status", help="a task's shards and money, from the chain")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("--json", action="store_true", help="print JSON")
    _common(p)
    p.set_defaults(func=_status)

    p = sub.add_parser("results", help="verify a task's outputs and write them as JSONL",
                       description="Fetch every shard's result document, check each receipt's "
                       "signature, Merkle proof and output hash against the chain, and only "
                       "then write OpenAI Batch output lines to --out.")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.jsonl")
    p.add_argument("--wait", action="store_true", help="wait for every shard's result first")
    p.add_argument("--timeout", type=_seconds, default=None, help="with --wait: give up after")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=_results)

    p = sub.add_parser("dispute", help="dispute one output, or list the task's disputes",
                       description="With INDEX, open a dispute on that request's signed "
                       "receipt (freezing its shard), print its id, and wait for the "
                       "committee's verdict: at the latest until the dispute's deadline, when "
                       "it is expired (bond returned). Without INDEX, list the task's disputes "
                       "and their outcomes.")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("index", type=_non_negative, nargs="?", default=None, metavar="INDEX",
                   help="the request (0-based, file order) to dispute")
    p.add_argument("--index", dest="index_flag", type=_non_negative, default=None,
                   help=argparse.SUPPRESS)  # the older spelling of INDEX
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once the dispute is open, without waiting for its outcome")
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="give up waiting after this many seconds (the dispute stays open)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--bond", type=_non_negative, default=None, metavar="WEI",
                   help="dispute bond (default: the minimum)")
    p.add_argument("--evidence-uri", default=None,
                   help="evidence address (default: the shard's result document)")
    _common(p)
    p.set_defaults(func=_dispute)

    p = sub.add_parser("cancel", help="cancel a task: open shards are refunded")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    _common(p)
    p.set_defaults(func=_cancel)

    p = sub.add_parser("withdraw", help="collect refunds and compensation from escrow")
    _common(p)
    p.set_defaults(func=_withdraw)

    p = sub.add_parser("models", help="models that registered miners serve, with asks")
    _common(p)
    p.set_defaults(func=_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
