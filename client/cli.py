"""The `client` command: submit OpenAI Batch JSONL jobs to Quarry, follow them, fetch verified
results, and get the money back for results withheld, wrong or over-billed (challenge,
dispute, prove-billing).

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
from market.protocol.precision import mask_labels


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("connection")
    g.add_argument("--config", type=Path, default=None,
                   help="TOML file with a [client] table (market_url, rpc_url, key_file)")
    g.add_argument("--market-url", default=None, help="market service URL")
    g.add_argument("--rpc-url", default=None,
                   help="chain RPC (default: the one the market's deployment names)")
    g.add_argument("--key-file", default=None, help="file holding the client's private key")


def _connect(args: argparse.Namespace) -> Any:
    from client.config import ClientConfig
    from client.sdk import Client

    cfg = ClientConfig.load(args.config, market_url=args.market_url, rpc_url=args.rpc_url,
                            key_file=args.key_file)
    return Client(cfg.rpc_url, cfg.private_key(), cfg.market_url)


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
                       prefer_miner=args.miner, allow_probation=args.allow_probation,
                       precisions=args.precision, require_commitments=args.require_commitments,
                       audit_rate_bps=args.audit_rate)
        t = job.task()
        cost = job.payment
        print(f"task {job.task_id}: {t.num_requests} requests in {t.num_shards} shard(s) of "
              f"{t.shard_size}, model 0x{t.model_id.hex()}, {t.price_per_token} wei/token, "
              f"deadline {t.deadline}")
        if args.miner:
            print(f"offered to miner {args.miner} only (the market shows it to no other miner "
                  "until the deadline)")
        if t.allow_probation:
            print("miners on probation (new, not yet vetted by the committee) may claim it"
                  + ("" if args.allow_probation else
                     ": no established miner serves the model yet (--no-probation refuses)"))
        if t.precisions:
            print(f"only miners serving it in {', '.join(mask_labels(t.precisions))} may "
                  "claim it")
        if t.require_commitments:
            print("every output must carry an activation commitment")
        print(f"cost: {cost} wei ({_eth(cost)}) escrowed (at most; unused tokens are refunded)")
        if job.audit_fee:
            print(f"audit rate {args.audit_rate} bps: {job.audit_fee} wei ({_eth(job.audit_fee)}) "
                  "paid to the committee for the extra audits")
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
        print(f"task {args.task_id}: {n} outputs verified (signatures, result-tree proofs, "
              f"token counts, output hashes) and written to {path}")
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
        if args.wait:
            _wait_verdict(job, dispute_id, args)
    return 0


def _wait_verdict(job: Any, dispute_id: int, args: argparse.Namespace) -> Any:
    """Wait for the dispute's verdict (or expire it at its deadline) and print it."""
    try:
        info = job.wait_dispute(dispute_id, timeout=args.timeout, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"dispute {dispute_id} stays open; `client dispute {job.task_id}` shows its "
              "outcome later", file=sys.stderr)
        raise
    print(f"dispute {dispute_id}: {info.outcome()}", flush=True)
    return info


def _challenge(args: argparse.Namespace) -> int:
    from market.chain.contracts import ChallengeStatus

    with _connect(args) as c:
        job = c.job(args.task_id)
        info = _open_challenge(job, args)
        if not args.wait:
            return 0
        info = job.wait_challenge(info.challenge_id, timeout=args.timeout,
                                  progress=not args.no_progress)
        print(f"challenge {info.challenge_id}: {info.outcome()}", flush=True)
        if info.status == ChallengeStatus.ANSWERED:
            _after_answer(job, info, args)
    return 0  # unanswered: the shard budget, the slash and the bond are the client's


def _open_challenge(job: Any, args: argparse.Namespace) -> Any:
    """This client's still-open challenge on the request (a wait resumed after --no-wait,
    --timeout or Ctrl-C), or a new one; prints which."""
    from market.chain.contracts import ChallengeStatus

    for info in job.challenges():
        if (info.index, info.status) == (args.index, ChallengeStatus.OPEN) and \
                info.challenger == job.client.address:
            print(f"challenge {info.challenge_id} on request {args.index} is still open "
                  f"(the miner must answer by chain time {info.deadline}): waiting on it",
                  flush=True)
            return info
    info = job.challenge_info(job.challenge(args.index, bond=args.bond))
    print(f"challenge {info.challenge_id}: request {args.index} (shard {info.shard}), bond "
          f"{info.bond} wei; the miner must show its receipt on-chain by chain time "
          f"{info.deadline} or be at fault", flush=True)
    return info


def _after_answer(job: Any, info: Any, args: argparse.Namespace) -> None:
    """The miner showed the receipt: done if the document now checks out, else dispute the
    shown receipt (the committee finds the output withheld) and wait for the verdict."""
    from client.sdk import ClientError
    from market.chain.contracts import DisputeStatus

    failed = _result_check(job, info.shard)
    if failed is None:
        print(f"shard {info.shard}'s result document checks out now: `client results "
              f"{job.task_id}` fetches it")
        return
    if failed.index not in (None, args.index):
        raise ClientError(f"request {args.index} was answered, but shard {info.shard} fails "
                          f"elsewhere: {failed}")
    if not args.dispute:
        raise ClientError(
            f"the miner showed request {args.index}'s receipt, but its result still fails the "
            f"{failed.check} check; `client dispute {job.task_id} {args.index}` disputes the "
            f"shown receipt until chain time {info.window_end}")
    dispute_id = job.dispute(args.index)
    print(f"opened dispute {dispute_id} on the shown receipt: its result still fails the "
          f"{failed.check} check", flush=True)
    verdict = _wait_verdict(job, dispute_id, args)
    if verdict.status != DisputeStatus.MINER_AT_FAULT:
        raise ClientError(f"dispute {dispute_id} did not find the miner at fault "
                          f"({verdict.status.name}): no refund, the shard is paid as submitted")


def _result_check(job: Any, shard: int) -> Any:
    """The failed check of the shard's result document (None when it checks out)."""
    from client.sdk import ResultCheckFailed

    try:
        job.shard_results(shard)
    except ResultCheckFailed as exc:
        return exc
    return None


def _prove_billing(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        fault = c.job(args.task_id).prove_billing_fault(args.index)
        print(fault.outcome())
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
        offers = c.offers(allow_probation=True)  # shown apart: see ModelOffer.describe
        if not offers:
            print("no registered miner serves any model")
        for o in offers:
            print(o.describe())
            for m in o.miners:
                print(f"  {m.describe()}")
    return 0


def _gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from client.config import ClientConfig
    from client.gateway.app import UPLOAD_BURST_S, create_app
    from client.gateway.store import GatewayStore
    from client.sdk import Client
    from market.admission import Limit
    from market.errors import ConfigError

    cfg = ClientConfig.load(args.config, market_url=args.market_url, rpc_url=args.rpc_url,
                            key_file=args.key_file)
    cfg.require("key")
    if not cfg.gateway_token:  # no flag: a token on the command line shows in `ps`
        raise ConfigError("missing client setting gateway_token (the bearer token callers "
                          "send): set it under [client] in the config file (--config) or in "
                          "QUARRY_CLIENT_GATEWAY_TOKEN")
    account = cfg.account()

    def connect() -> Client:
        return Client(cfg.rpc_url, account, cfg.market_url)

    connect().close()  # a wrong market, chain or key ends the command here, in one line
    app = create_app(GatewayStore(), connect, cfg.gateway_token,
                     uploads=Limit.over(cfg.gateway_uploads_per_s, UPLOAD_BURST_S,
                                        cfg.gateway_uploads_at_once))
    print(f"OpenAI Batch gateway for {account.address} on http://{args.host}:{args.port}/v1",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
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
    probation = p.add_mutually_exclusive_group()
    probation.add_argument("--allow-probation", action="store_true", default=None,
                           help="let miners on probation (new, not yet vetted by the "
                           "committee) claim it too (default: only while no established "
                           "miner serves the model)")
    probation.add_argument("--no-probation", dest="allow_probation", action="store_false",
                           help="never let miners on probation claim it")
    p.add_argument("--precision", default=None, metavar="LIST",
                   help="precisions miners may serve it in, e.g. bf16,fp32 (fp32, fp16, bf16, "
                   "fp8, int8; default any)")
    p.add_argument("--require-commitments", action="store_true",
                   help="every output must carry an activation commitment (miners whose "
                   "engine makes none cannot claim it)")
    p.add_argument("--audit-rate", type=_non_negative, default=None, metavar="BPS",
                   help="share of shards the committee re-scores, above the base 1000 (one in "
                        "ten); paid per sitting member, a quarter of the open budget per 100%%")
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
                       "signature, result-tree proof, token count and output hash against the "
                       "chain, and only then write OpenAI Batch output lines to --out. On a "
                       "failed check nothing is written, and the error names the check, the "
                       "request and the remedy (`client challenge`, `client prove-billing` or "
                       "`client dispute`) with the chain time its window closes.")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.jsonl")
    p.add_argument("--wait", action="store_true", help="wait for every shard's result first")
    p.add_argument("--timeout", type=_seconds, default=None, help="with --wait: give up after")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=_results)

    p = sub.add_parser("dispute", help="dispute one output, or list the task's disputes",
                       description="With INDEX, open a dispute on that request's receipt "
                       "(from the result document, or as the miner showed it answering an "
                       "availability challenge), freezing its shard; print its id and wait "
                       "for the "
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

    p = sub.add_parser("challenge", help="make the miner show a request's receipt on-chain",
                       description="For a result document that is missing or does not prove "
                       "a request's receipt: challenge the shard's miner to show that receipt "
                       "on-chain within Arbitration's response window, and wait. Unanswered, "
                       "the challenge is settled as the miner's fault (shard budget and slash "
                       "to you, bond back). Answered while the result still fails its checks, "
                       "a dispute on the shown receipt is opened and its verdict awaited. "
                       "Exits 0 once you have your data or your money back. Run it again to "
                       "wait on a challenge left open (--no-wait, --timeout, Ctrl-C).")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("index", type=_non_negative, metavar="INDEX",
                   help="the request (0-based, file order) whose receipt the miner must show")
    p.add_argument("--bond", type=_non_negative, default=None, metavar="WEI",
                   help="challenge bond, paid to a miner that answers (default: the minimum)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once the challenge is open (run again to wait on it)")
    p.add_argument("--no-dispute", dest="dispute", action="store_false",
                   help="when the miner answers but the result still fails, do not dispute")
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="give up waiting after this many seconds (the challenge stays open; "
                   "run again to wait on it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p)
    p.set_defaults(func=_challenge)

    p = sub.add_parser("prove-billing", help="prove an over-billing receipt on-chain",
                       description="Prove that request INDEX's receipt bills more tokens than "
                       "its output holds (or than a request may have), or that its shard's "
                       "result tree records a false sum (from the lying request's path): the "
                       "shard is refunded and the miner slashed at once, without the committee.")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    p.add_argument("index", type=_non_negative, metavar="INDEX")
    _common(p)
    p.set_defaults(func=_prove_billing)

    p = sub.add_parser("cancel", help="cancel a task: open shards are refunded")
    p.add_argument("task_id", type=_task_id, metavar="TASK_ID")
    _common(p)
    p.set_defaults(func=_cancel)

    p = sub.add_parser("withdraw", help="collect refunds and compensation from escrow")
    _common(p)
    p.set_defaults(func=_withdraw)

    p = sub.add_parser("models", help="models that registered miners serve, with asks "
                       "(miners on probation apart)")
    _common(p)
    p.set_defaults(func=_models)

    p = sub.add_parser("gateway", help="serve the OpenAI Batch API (files, batches, models) "
                       "over Quarry, paying with this key",
                       description="An OpenAI-compatible Files/Batches/Models API on HOST:PORT: "
                       "point the openai SDK's base_url at http://HOST:PORT/v1 and its api_key "
                       "at gateway_token. Files and batches live in $QUARRY_HOME/gateway.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8700, help="port to bind (8700)")
    _common(p)
    p.set_defaults(func=_gateway)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
