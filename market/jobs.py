"""Post a batch, fetch a shard's verified results, challenge, dispute and prove faults.

The one implementation of what a task's client does on the market, shared by the client SDK
(`client.sdk`) and the verifiers (whose leader posts challenge prompts from fresh addresses
through this same path, and who open disputes as arbiters). Role packages may not import
each other, so it lives here.

Everything that can fail before money moves is checked before the first transaction, and
everything read back (result documents) is checked against the chain before it is returned.

When a shard's result document is missing or does not verify, the client has three on-chain
remedies, all inside the shard's challenge window:
- `challenge_availability`: the miner must show the named request's receipt on-chain within
  Arbitration's response window, or it is at fault (`wait_challenge` settles that);
- `open_dispute`: with the receipt from the document, or from an answered challenge when the
  document is still missing (the committee then finds the data withheld);
- `prove_billing_fault`: a receipt that bills more tokens than its output has (or than a
  request may have), or a result tree that records a false sum for a subtree (`sum_fault`),
  is proven wrong on-chain at once, without the committee.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from eth_account.signers.local import LocalAccount
from eth_utils import encode_hex, to_checksum_address

from market.chain.client import TxResult
from market.chain.contracts import (
    ZERO_ADDRESS,
    AvailabilityChallenge,
    Ballot,
    ChallengeStatus,
    DisputeStatus,
    Shard,
    ShardState,
    Task,
)
from market.chain.deploy import Quarry
from market.chain.errors import ChainError, ContractRevert, is_insufficient_funds
from market.chain.errors import InsufficientFunds as ChainInsufficientFunds
from market.errors import QuarryError
from market.marketapi import MarketAPI
from market.protocol.canonical import keccak
from market.protocol.eip712 import Receipt
from market.protocol.merkle import SumNode, SumStep, input_tree, receipt_leaf, sum_lie_path
from market.protocol.precision import ANY as ANY_PRECISION
from market.protocol.precision import PrecisionError, check_mask, mask_labels
from market.protocol.precision import accepts as accepts_precision
from market.protocol.requests import BatchError, check_line_sizes, request_line_sizes
from market.protocol.results import (
    ResultCheckFailed,
    ResultFormatError,
    ResultItem,
    ShardResult,
    receipt_proven,
    verify_shard_result,
)
from market.standing import why_not_eligible
from market.store import ContentNotFound, ContentTooLarge, StoreError, content_uri

__all__ = [
    "HAS_RESULTS",
    "MAX_REQUESTS",
    "JobError",
    "DeadlineExpired",
    "InsufficientFunds",
    "PaymentTooLow",
    "MinerNotEligible",
    "MinerOnProbation",
    "OfferFailed",
    "ResultsNotReady",
    "DisputeNotPossible",
    "JobTimeout",
    "DisputeInfo",
    "ChallengeInfo",
    "post_batch",
    "miner_ask",
    "shard_changes",
    "check_funds",
    "fetch_result_document",
    "task_shard_range",
    "verified_shard",
    "fetch_shard_result",
    "open_dispute",
    "dispute_info",
    "task_disputes",
    "wait_dispute",
    "report_absent",
    "judging_committee",
    "challenge_availability",
    "challenge_info",
    "answered_receipt",
    "wait_challenge",
    "prove_billing_fault",
    "sum_fault",
]

HAS_RESULTS = frozenset({ShardState.SUBMITTED, ShardState.DISPUTED, ShardState.FINALIZED})
"""Shard states whose result document is on-chain (and so can be fetched and checked)."""
MAX_REQUESTS = 2**32 - 1  # TaskRegistry's uint32 request indices


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------- errors


class JobError(QuarryError):
    """A problem posting, reading or disputing a task; the message names it."""


class DeadlineExpired(JobError):
    """The deadline is not in the future (by the chain's clock)."""


class InsufficientFunds(JobError, ChainInsufficientFunds):
    """The account cannot pay the task (or bond) plus gas (checked before sending; the chain
    client raises its parent for any other transaction)."""


class PaymentTooLow(JobError):
    """The offered price is below the ask of every miner that could claim the task."""


class MinerNotEligible(JobError):
    """The preferred miner cannot claim the task (not registered, model, reputation)."""


class MinerOnProbation(MinerNotEligible):
    """The preferred miner is on probation and the task does not allow miners on probation."""


class OfferFailed(JobError):
    """The task was created but the market refused its offer to the preferred miner.

    `task_id` and `tx` say what was created: the task is open to every eligible miner.
    """

    def __init__(self, message: str, task_id: int, tx: TxResult) -> None:
        self.task_id = task_id
        self.tx = tx
        super().__init__(message)


class ResultsNotReady(JobError):
    """Some shards have no submitted result yet."""


class DisputeNotPossible(JobError):
    """The request's shard cannot be disputed or challenged now (state, window, caller,
    evidence)."""


class JobTimeout(JobError):
    """A wait ran out of time."""


# ---------------------------------------------------------------------------- posting


def miner_ask(q: Quarry, miner: str, model_id: bytes, min_reputation_bps: int = 0,
              allow_probation: bool = False, precisions: int = ANY_PRECISION) -> int:
    """The on-chain ask (wei/token) of a miner that may claim tasks for `model_id` (in a
    precision the mask `precisions` accepts); `MinerNotEligible` says why one may not."""
    try:
        address = to_checksum_address(miner)
    except (TypeError, ValueError):
        raise MinerNotEligible(f"miner {miner!r} is not an address") from None
    if not q.gpu.is_registered(address):
        raise MinerNotEligible(f"miner {address} is not registered in GPURegistry")
    info = q.gpu.miner_info(address)
    if info.on_probation and not allow_probation and \
            q.gpu.is_eligible(address, model_id, min_reputation_bps, True):
        raise MinerOnProbation(f"miner {address} is on probation (new to the market, "
                               f"{info.passed_epochs} epoch(s) of challenges passed): allow "
                               "miners on probation to direct a job at it")
    why = why_not_eligible(q, address, model_id, min_reputation_bps, allow_probation)
    if why:
        raise MinerNotEligible(f"{why}: it may not claim this task for model "
                               f"{encode_hex(model_id)}")
    declared = q.gpu.precision_of(address, model_id)
    if declared is None or not accepts_precision(precisions, declared):
        raise MinerNotEligible(f"miner {address} serves model {encode_hex(model_id)} in "
                               f"{declared.label if declared else 'no declared precision'}; "
                               f"the task accepts {', '.join(mask_labels(precisions))}")
    return info.price_per_token



def check_funds(q: Quarry, account: LocalAccount, value: int, fn: Any, where: str,
                what: str) -> None:
    """Raise `InsufficientFunds` unless `value` plus the call's gas fits the balance, and the
    contract's own revert (decoded, named) when the call would fail. The gas and the fee
    cap are those `Chain.send` would use (`Chain.prepare`)."""
    address = account.address
    try:
        tx = q.chain.prepare(fn, account, value, where=where)
    except ChainError as exc:  # a revert is named; the estimate refuses a value over the balance
        if not is_insufficient_funds(exc):
            raise
        tx = None
    balance = q.chain.balance(address)
    if tx is None or balance < value:
        raise InsufficientFunds(
            f"not enough funds: the {what} is {value} wei but {address} holds {balance} wei")
    gas_cost = int(tx["gas"]) * int(tx.get("maxFeePerGas", tx.get("gasPrice", 0)))
    need = value + gas_cost
    if balance < need:
        raise InsufficientFunds(
            f"not enough funds: the {what} is {value} wei plus up to {gas_cost} wei "
            f"of gas, {need} wei in all, but {address} holds {balance} wei")


def post_batch(
    q: Quarry,
    account: LocalAccount,
    market: MarketAPI,
    data: bytes,
    request_hashes: Sequence[bytes],
    *,
    model_id: bytes,
    shard_size: int,
    max_tokens: int,
    price: int,
    deadline: int,
    min_reputation_bps: int = 0,
    arbiter: str = ZERO_ADDRESS,
    prefer_miner: str | None = None,
    allow_probation: bool = False,
    precisions: int = ANY_PRECISION,
    require_commitments: bool = False,
) -> tuple[int, TxResult]:
    """Upload a batch file and create its task, paying `n * max_tokens * price` into escrow.

    `data` is the JSONL file exactly as uploaded and `request_hashes` the hashes of its
    request lines in order (`parse_jsonl(data)`); `max_tokens` is the task's
    `maxTokensPerRequest` (at least every line's `body.max_tokens`), `deadline` an absolute
    chain time. With `prefer_miner`, the task is offered to that miner only (directed job:
    the market shows its shards to no one else until the deadline); the miner must be
    eligible and ask at most `price`. `allow_probation` lets miners on probation (new
    identities that have not yet passed the committee's challenges) claim it. `precisions` is
    the mask of precisions the task accepts (`precision.precision_mask`; 0: any), and
    `require_commitments` asks every non-empty output for an activation commitment. Every
    check runs before the upload and the transaction; returns the task id and the
    `createTask` transaction.
    """
    n = len(request_hashes)
    if n == 0:
        raise BatchError("the batch is empty")
    if n > MAX_REQUESTS:
        raise BatchError(f"a task holds at most {MAX_REQUESTS} requests, this batch has {n}")
    sizes = request_line_sizes(data)
    if len(sizes) != n:
        raise BatchError(f"the batch file has {len(sizes)} request lines but "
                         f"{n} request hashes were given")
    limits = market.limits()
    check_line_sizes(sizes, limits["maxRequestBytes"])
    if len(data) > limits["maxFileBytes"]:
        raise ContentTooLarge(len(data), limits["maxFileBytes"], "batch file")

    if not isinstance(model_id, bytes | bytearray) or len(model_id) != 32:
        raise JobError(f"model_id must be 32 bytes, got {model_id!r}")
    if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_REQUESTS:
        raise JobError(f"max_tokens must be an integer in [1, 2**32-1], got {max_tokens!r}")
    if not _is_int(price) or price <= 0:
        raise JobError(f"price must be a positive integer (wei per token), got {price!r}")
    if not _is_int(min_reputation_bps) or not 0 <= min_reputation_bps <= 10_000:
        raise JobError(f"min_reputation_bps must be in [0, 10000], got {min_reputation_bps!r}")
    if not _is_int(shard_size) or shard_size < 1:
        raise JobError(f"shard_size must be a positive integer, got {shard_size!r}")
    try:
        precisions = check_mask(precisions)
    except PrecisionError as exc:
        raise JobError(str(exc)) from None
    limit, block = q.chain.read([q.tasks.fn("maxShardsPerTask"),
                                 lambda eth: eth.get_block("latest")])
    if math.ceil(n / shard_size) > limit:
        raise JobError(f"shard_size {shard_size} gives {math.ceil(n / shard_size)} shards; "
                       f"a task may have at most {limit}")
    shard_size = min(shard_size, n)
    if not _is_int(deadline):
        raise JobError(f"deadline must be an absolute chain time (int), got {deadline!r}")
    now = int(block["timestamp"])
    if deadline <= now:
        raise DeadlineExpired(f"deadline {deadline} has already passed: the chain's time is "
                              f"{now}")
    try:
        arbiter = to_checksum_address(arbiter or ZERO_ADDRESS)
    except (TypeError, ValueError):
        raise JobError(f"arbiter {arbiter!r} is not an address") from None
    miner = None
    if prefer_miner is not None:
        ask = miner_ask(q, prefer_miner, bytes(model_id), min_reputation_bps, allow_probation,
                        precisions)
        miner = to_checksum_address(prefer_miner)
        if price < ask:
            raise PaymentTooLow(f"payment too low: {price} wei/token is below the ask of the "
                                f"preferred miner {miner} ({ask} wei/token)")

    payment = n * max_tokens * price
    root = input_tree(list(request_hashes)).root
    uri = content_uri(data)
    terms = (bytes(model_id), root, uri, n, shard_size, max_tokens, price, deadline,
             min_reputation_bps, arbiter, allow_probation, precisions, bool(require_commitments))
    check_funds(q, account, payment, q.tasks.contract.functions.createTask(terms),
                "TaskRegistry.createTask", "payment")

    stored = market.put(data)
    if stored != uri:
        raise StoreError(f"the market stored the batch as {stored}, expected {uri}")
    task_id, tx = q.tasks.create_task(
        account, model_id=bytes(model_id), input_root=root, input_uri=uri, num_requests=n,
        shard_size=shard_size, max_tokens_per_request=max_tokens, price_per_token=price,
        deadline=deadline, min_reputation_bps=min_reputation_bps, arbiter=arbiter,
        allow_probation=allow_probation, precisions=precisions,
        require_commitments=bool(require_commitments), payment=payment)
    if miner is not None:
        try:
            market.offer(account, task_id, miner)
        except QuarryError as exc:
            raise OfferFailed(f"task {task_id} was created, but the market refused to offer "
                              f"it to {miner} ({exc}); it is open to every eligible miner "
                              "(cancel it to get the open shards' budget back)",
                              task_id, tx) from exc
    return task_id, tx


# ---------------------------------------------------------------------------- following


SHARD_EVENTS = {
    "ShardClaimed": ShardState.CLAIMED,
    "ResultSubmitted": ShardState.SUBMITTED,
    "ClaimReclaimed": ShardState.OPEN,  # not reopened: a ShardRefunded follows
    "ShardDisputed": ShardState.DISPUTED,
    "ShardDisputeResolved": ShardState.SUBMITTED,  # miner at fault: a ShardRefunded follows
    "ShardFinalized": ShardState.FINALIZED,
    "ShardRefunded": ShardState.REFUNDED,
}
"""TaskRegistry's events that change one shard's state (task id and shard indexed), and the
state each leaves the shard in. Every stored state change emits one, in order; cancelling
emits `TaskCancelled` instead (the task's Open shards then read Refunded)."""


def shard_changes(q: Quarry, task_id: int, from_block: int,
                  to_block: int) -> tuple[dict[int, ShardState], bool]:
    """The new state of every shard of `task_id` that changed in blocks [from_block,
    to_block] (its last event's), from one `eth_getLogs` call, and whether the task was
    cancelled in them. Following these instead of reading every pending shard keeps a wait's
    cost to one call per poll, whatever the job's size."""
    topic = "0x" + int(task_id).to_bytes(32, "big").hex()
    states: dict[int, ShardState] = {}
    cancelled = False
    for name, topics in q.chain.log_topics(q.tasks.address, from_block, to_block,
                                           [None, topic]):
        if name == "TaskCancelled":
            cancelled = True
        elif name in SHARD_EVENTS and len(topics) > 2:
            states[int.from_bytes(topics[2], "big")] = SHARD_EVENTS[name]
    return states, cancelled


# ---------------------------------------------------------------------------- results


def fetch_result_document(market: MarketAPI, shard: int, uri: str) -> ShardResult:
    """A shard's result document by its content address; a wrong or unparsable document
    raises `ResultCheckFailed` ("content address" / "format"), a missing one
    `ContentNotFound`."""
    try:
        data = market.get(uri)
    except ContentNotFound:
        raise
    except StoreError as exc:
        raise ResultCheckFailed("content address", f"shard {shard}: {exc}") from exc
    try:
        return ShardResult.from_bytes(data)
    except ResultFormatError as exc:
        raise ResultCheckFailed("format", f"shard {shard}: {exc}") from exc


def task_shard_range(t: Task, shard: int) -> tuple[int, int]:
    """Shard `shard`'s requests [start, end) in task `t`, as TaskRegistry._range computes
    them (no chain call)."""
    start = shard * t.shard_size
    return start, min(start + t.shard_size, t.num_requests)


def verified_shard(q: Quarry, market: MarketAPI, task_id: int, shard: int,
                   request_hashes: Sequence[bytes], *, task: Task | None = None,
                   state: Shard | None = None) -> tuple[Shard, list[ResultItem]]:
    """The shard as the chain has it and its result items, each checked against it.

    `request_hashes` are the task's request hashes (all of them, or only this shard's);
    `task` and `state` (the shard as just read from the chain), when given, save reading
    them again. `ResultCheckFailed` names the first check that fails, `ResultsNotReady` says
    the shard has no result yet.
    """
    t = task or q.tasks.get_task(task_id)
    s = state or q.tasks.get_shard(task_id, shard)
    if s.state not in HAS_RESULTS:
        raise ResultsNotReady(f"task {task_id} shard {shard} is {s.state.name}: no result yet")
    if not 0 <= shard < t.num_shards:
        raise JobError(f"task {task_id} has no shard {shard} ({t.num_shards} shards)")
    start, end = task_shard_range(t, shard)
    if len(request_hashes) == t.num_requests:
        hashes = list(request_hashes[start:end])
    elif len(request_hashes) == end - start:
        hashes = list(request_hashes)
    else:
        raise JobError(f"{len(request_hashes)} request hashes given for task {task_id} shard "
                       f"{shard}: expected the task's {t.num_requests} or the shard's "
                       f"{end - start}")
    items = verify_shard_result(
        fetch_result_document(market, shard, s.result_uri), task_id=task_id, shard=shard,
        start=start, miner=s.miner, model_id=t.model_id, result_root=s.result_root,
        tokens_used=s.tokens_used, request_hashes=hashes, chain_id=q.chain.chain_id,
        task_registry=q.tasks.address, max_tokens_per_request=t.max_tokens_per_request,
        require_commitments=t.require_commitments)
    return s, items


def fetch_shard_result(q: Quarry, market: MarketAPI, task_id: int, shard: int,
                       request_hashes: Sequence[bytes]) -> list[ResultItem]:
    """Shard `shard`'s result items, in request order, every one verified against the chain
    (signature, Merkle proof under the on-chain root, output hash, billing)."""
    return verified_shard(q, market, task_id, shard, request_hashes)[1]


# ---------------------------------------------------------------------------- disputes


@dataclass(frozen=True)
class DisputeInfo:
    """A dispute as the chain has it, with what its outcome moved."""

    dispute_id: int
    task_id: int
    shard: int
    index: int
    status: DisputeStatus
    opener: str
    miner: str
    bond: int
    opened_at: int
    deadline: int
    evidence_uri: str
    slashed: int = 0  # wei slashed from the miner's stake (MINER_AT_FAULT)
    refunded: int = 0  # the shard's budget released back to the client (MINER_AT_FAULT)
    voters: tuple[str, ...] = ()  # committee members whose votes resolved it
    epoch: int = 0  # the epoch whose committee judges it
    absent: tuple[str, ...] = ()  # members reported absent after it expired

    @property
    def settled(self) -> bool:
        return self.status != DisputeStatus.OPEN

    def outcome(self) -> str:
        """One line saying what happened (or that it is still open)."""
        if self.status == DisputeStatus.MINER_AT_FAULT:
            return (f"miner at fault: bond of {self.bond} wei returned, shard budget of "
                    f"{self.refunded} wei refunded, miner slashed {self.slashed} wei "
                    f"({len(self.voters)} votes)")
        if self.status == DisputeStatus.MINER_NOT_AT_FAULT:
            return (f"miner not at fault: bond of {self.bond} wei forfeited to the miner and "
                    f"the {len(self.voters)} voters")
        if self.status == DisputeStatus.EXPIRED:
            absent = (f"; {len(self.absent)} member(s) that cast no vote lost their seats"
                      if self.absent else "")
            return (f"expired with no committee verdict: bond of {self.bond} wei returned, "
                    f"the shard is paid as submitted{absent}")
        return f"open until chain time {self.deadline}"

    def to_json(self) -> dict[str, Any]:
        return {"disputeId": self.dispute_id, "taskId": self.task_id, "shard": self.shard,
                "index": self.index, "status": self.status.name, "opener": self.opener,
                "miner": self.miner, "bond": self.bond, "openedAt": self.opened_at,
                "deadline": self.deadline, "evidenceUri": self.evidence_uri,
                "slashed": self.slashed, "refunded": self.refunded,
                "voters": list(self.voters), "epoch": self.epoch, "absent": list(self.absent),
                "outcome": self.outcome()}


def dispute_info(q: Quarry, dispute_id: int) -> DisputeInfo:
    """The dispute, read from Arbitration (and, once resolved, its event)."""
    arb = q.arbitration
    try:
        d = arb.get_dispute(dispute_id)
    except ContractRevert as exc:
        if exc.error == "UnknownDispute":
            raise JobError(f"no dispute {dispute_id} on the chain") from None
        raise
    slashed = refunded = 0
    voters: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    if d.status == DisputeStatus.EXPIRED:
        absent = tuple(to_checksum_address(ev["member"]) for ev in arb.events(
            "AbsenceReported", q.deployment.deploy_block, disputeId=dispute_id))
    if d.status in (DisputeStatus.MINER_AT_FAULT, DisputeStatus.MINER_NOT_AT_FAULT):
        events = arb.events("DisputeResolved", q.deployment.deploy_block,
                            disputeId=dispute_id)
        if events:
            slashed = int(events[-1]["slashed"])
            voters = tuple(to_checksum_address(v) for v in events[-1]["voters"])
        if d.status == DisputeStatus.MINER_AT_FAULT:
            refunded = q.tasks.shard_budget(d.task_id, d.shard)
    return DisputeInfo(dispute_id, d.task_id, d.shard, d.receipt.index, d.status,
                       to_checksum_address(d.opener), to_checksum_address(d.miner), d.bond,
                       d.opened_at, d.deadline, d.evidence_uri, slashed, refunded, voters,
                       d.epoch, absent)


def task_disputes(q: Quarry, task_id: int,
                  opened: Sequence[dict[str, Any]] | None = None) -> list[DisputeInfo]:
    """Every dispute opened on a task, oldest first, with its current status (`opened`: the
    task's `DisputeOpened` events, when already read)."""
    if opened is None:
        opened = q.arbitration.events("DisputeOpened", q.deployment.deploy_block,
                                      taskId=task_id)
    return [dispute_info(q, int(ev["disputeId"])) for ev in opened]


def _challengeable(q: Quarry, account: LocalAccount, task_id: int, index: int,
                   what: str) -> tuple[Task, int, Shard]:
    """(task, shard, shard state) for request `index`, after checking what Arbitration
    checks of a dispute or challenge: the account is the client, the arbiter or an auditor
    (a member with weight in the current epoch's committee), and the shard is Submitted
    inside its window (`DisputeNotPossible` naming the condition that fails)."""
    try:
        t = q.tasks.get_task(task_id)
    except ContractRevert as exc:
        if exc.error == "UnknownTask":
            raise DisputeNotPossible(f"no task {task_id} on the chain") from None
        raise
    if not _is_int(index) or not 0 <= index < t.num_requests:
        raise DisputeNotPossible(f"request index {index!r} is not in task {task_id} "
                                 f"(0..{t.num_requests - 1})")
    me = str(account.address)
    if me not in (to_checksum_address(t.client), to_checksum_address(t.arbiter)) and \
            q.committee.weight_at(me, q.committee.current_epoch()) == 0:
        raise DisputeNotPossible(f"{me} is neither task {task_id}'s client nor its arbiter, "
                                 "nor a sitting committee member (an auditor)")
    k = index // t.shard_size
    s = q.tasks.get_shard(task_id, k)
    if s.state != ShardState.SUBMITTED:
        raise DisputeNotPossible(
            f"request {index} is in shard {k}, which is {s.state.name}: only a Submitted "
            f"shard inside its challenge window can be {what}")
    now = q.chain.timestamp()
    if now >= s.window_end:
        raise DisputeNotPossible(f"shard {k}'s challenge window closed at {s.window_end} "
                                 f"(chain time {now})")
    return t, k, s


def _bond(value: int | None, minimum: int) -> int:
    if value is not None and (not _is_int(value) or value <= 0):
        raise DisputeNotPossible(f"bond must be a positive integer (wei), got {value!r}")
    return minimum if value is None else value


def _document_item(market: MarketAPI, s: Shard, k: int, start: int, size: int,
                   index: int) -> ResultItem | None:
    """Request `index`'s item from the shard's result document when the document is there
    and its receipt is proven under the shard's commitment; None otherwise."""
    try:
        doc = fetch_result_document(market, k, s.result_uri)
    except (ContentNotFound, ResultCheckFailed, StoreError, QuarryError):
        return None
    item = next((it for it in doc.items if it.index == index), None)
    if item is None or not receipt_proven(item.receipt, item.proof, result_root=s.result_root,
                                          tokens_used=s.tokens_used, start=start, size=size):
        return None
    return item


def open_dispute(q: Quarry, account: LocalAccount, market: MarketAPI, task_id: int, index: int,
                 *, bond: int | None = None, evidence_uri: str | None = None) -> int:
    """Dispute request `index`'s receipt in Arbitration; returns the dispute id.

    The receipt and its proof come from the shard's result document or, when that is
    missing or does not prove it, from an answered availability challenge on the request
    (the committee then judges the withheld output as the miner's fault). `bond` defaults to
    the minimum bond, `evidence_uri` to the shard's result document. The shard must be
    Submitted and inside its challenge window, and `account` the task's client or arbiter, or an
    auditor:
    `DisputeNotPossible` says which condition fails, before any transaction.
    """
    _, k, s = _challengeable(q, account, task_id, index, "disputed")
    start, end = q.tasks.shard_range(task_id, k)
    item = _document_item(market, s, k, start, end - start, index)
    if item is not None:
        receipt, proof = item.receipt, item.proof
    else:
        answer = answered_receipt(q, task_id, k, index)
        if answer is None:
            raise DisputeNotPossible(
                f"shard {k}'s result document is missing or does not prove request {index}'s "
                "receipt, and no availability challenge on it was answered: challenge its "
                f"availability first (`client challenge {task_id} {index}`)")
        receipt, proof = answer
    epoch = q.committee.current_epoch()
    if q.committee.total_weight_at(epoch) == 0:
        raise DisputeNotPossible(
            f"no verifier committee sits in epoch {epoch}, so no one could judge a dispute: "
            "start verifiers (`verifier register`, then `verifier run`; a seat takes effect "
            f"at the next epoch boundary, chain time {q.committee.epoch_start(epoch + 1)}) "
            f"and dispute before shard {k}'s window closes at chain time {s.window_end}")
    arb = q.arbitration
    bond = _bond(bond, arb.min_bond())
    evidence = s.result_uri if evidence_uri is None else evidence_uri
    args = (task_id, k, receipt.as_tuple(), [p.as_tuple() for p in proof], evidence)
    check_funds(q, account, bond, arb.contract.functions.openDispute(*args),
                "Arbitration.openDispute", "bond")
    dispute_id, _ = arb.open_dispute(account, task_id, k, receipt, proof, evidence, bond)
    return dispute_id


def judging_committee(q: Quarry, epoch: int) -> list[str]:
    """The members of `epoch`'s committee who can still vote or be penalized (weight > 0).
    `membersAt` drops members whose seats were pruned since; registrations are read too."""
    c = q.committee
    candidates = set(c.members_at(epoch)) | {
        to_checksum_address(ev["verifier"])
        for ev in c.events("VerifierRegistered", q.deployment.deploy_block)}
    return sorted((m for m in candidates if c.weight_at(m, epoch) > 0), key=lambda a: int(a, 16))


def report_absent(q: Quarry, account: LocalAccount, dispute_id: int) -> tuple[str, ...]:
    """Report every member of an expired dispute's committee that cast no vote (each loses
    its seat, and stake past the committee's limit, burned); returns those this call
    reported. A reporter racing this one makes the batch revert `NotAbsent`: the ballots are
    read again and the rest reported."""
    d = q.arbitration.get_dispute(dispute_id)
    if d.status != DisputeStatus.EXPIRED:
        return ()
    committee = judging_committee(q, d.epoch)
    for _ in range(3):
        absent = tuple(m for m in committee
                       if q.arbitration.ballot_of(dispute_id, m) == Ballot.NONE)
        if not absent:
            return ()
        try:
            q.arbitration.report_absence(account, dispute_id, absent)
            return absent
        except ContractRevert as exc:
            if exc.error != "NotAbsent":
                raise
    return ()


def wait_dispute(
    q: Quarry,
    dispute_id: int,
    *,
    timeout: float | None = None,
    poll_s: float = 0.5,
    expire_as: LocalAccount | None = None,
    on_poll: Callable[[DisputeInfo, int], None] | None = None,
) -> DisputeInfo:
    """Block until the dispute is settled, and return it.

    No verdict can come after the dispute's deadline, so the wait ends there at the latest:
    with `expire_as`, that account then calls `expireDispute` (the bond goes back to the
    opener and the shard unfreezes) and reports the committee members that cast no vote;
    without it, the still-open dispute is returned.
    `on_poll(info, chain_time)` sees every poll (progress display). `JobTimeout` after
    `timeout` seconds of wall time.
    """
    def expire() -> None:
        assert expire_as is not None
        try:
            q.arbitration.expire_dispute(expire_as, dispute_id)
        except ContractRevert as exc:
            if exc.error != "DisputeNotOpen":  # settled by someone else meanwhile: fine
                raise
        report_absent(q, expire_as, dispute_id)

    return _poll_until_deadline(q, lambda: dispute_info(q, dispute_id), f"dispute {dispute_id}",
                                close=expire if expire_as is not None else None,
                                timeout=timeout, poll_s=poll_s, on_poll=on_poll)


class _Deadlined(Protocol):
    @property
    def settled(self) -> bool: ...

    @property
    def deadline(self) -> int: ...


_D = TypeVar("_D", bound=_Deadlined)


def _poll_until_deadline(q: Quarry, read: Callable[[], _D], what: str, *,
                         close: Callable[[], None] | None, timeout: float | None,
                         poll_s: float, on_poll: Callable[[_D, int], None] | None) -> _D:
    """Poll `read()` until it is settled or its deadline passes on the chain's clock; then
    `close()` it (expire, settle) when given and read it once more. Nothing can change it
    after the deadline but closing, so the wait never outlasts it."""
    started = time.monotonic()
    while True:
        info = read()
        now = q.chain.timestamp()
        if on_poll is not None:
            on_poll(info, now)
        if info.settled:
            return info
        if now >= info.deadline:
            if close is None:
                return info
            close()
            return read()
        if timeout is not None and time.monotonic() - started >= timeout:
            raise JobTimeout(f"{what} is still open after {timeout:g} s (its deadline is "
                             f"chain time {info.deadline}, now {now})")
        time.sleep(poll_s)


# ---------------------------------------------------------------------------- availability


@dataclass(frozen=True)
class ChallengeInfo(AvailabilityChallenge):
    """An availability challenge as the chain has it, with its id and its answer or
    settlement (from the events)."""

    challenge_id: int = 0
    receipt: Receipt | None = None  # the answer (ANSWERED)
    proof: tuple[SumNode, ...] = ()
    window_end: int = 0  # the shard's window after the answer (ANSWERED)
    slashed: int = 0  # the miner's stake taken (UNANSWERED), burned

    @property
    def settled(self) -> bool:
        return self.status != ChallengeStatus.OPEN

    def outcome(self) -> str:
        if self.status == ChallengeStatus.ANSWERED:
            return (f"answered: the miner showed request {self.index}'s receipt on-chain and "
                    f"got the bond of {self.bond} wei; the shard can be disputed until chain "
                    f"time {self.window_end}")
        if self.status == ChallengeStatus.UNANSWERED:
            return (f"unanswered: miner at fault, shard budget refunded, miner slashed "
                    f"{self.slashed} wei (burned), bond of {self.bond} wei returned")
        return f"open: the miner must answer by chain time {self.deadline}"

    def to_json(self) -> dict[str, Any]:
        return {"challengeId": self.challenge_id, "taskId": self.task_id, "shard": self.shard,
                "index": self.index, "status": self.status.name, "challenger": self.challenger,
                "miner": self.miner, "bond": self.bond, "openedAt": self.opened_at,
                "deadline": self.deadline, "windowEnd": self.window_end,
                "slashed": self.slashed, "outcome": self.outcome()}


def challenge_availability(q: Quarry, account: LocalAccount, task_id: int, index: int, *,
                           bond: int | None = None) -> int:
    """Challenge the miner of request `index`'s shard to show its receipt on-chain; returns
    the challenge id. `bond` defaults to Arbitration's minimum (it pays the miner's answer).
    `DisputeNotPossible` names what forbids it, before any transaction."""
    _, k, _ = _challengeable(q, account, task_id, index, "challenged")
    arb = q.arbitration
    bond = _bond(bond, arb.min_availability_bond())
    check_funds(q, account, bond, arb.contract.functions.challengeAvailability(task_id, k, index),
                "Arbitration.challengeAvailability", "bond")
    challenge_id, _ = arb.challenge_availability(account, task_id, k, index, bond)
    return challenge_id


def _answer_from_event(ev: dict[str, Any]) -> tuple[Receipt, tuple[SumNode, ...]]:
    return (Receipt.from_message(ev["receipt"]),
            tuple(SumNode(bytes(p["hash"]), int(p["sum"])) for p in ev["proof"]))


def challenge_info(q: Quarry, challenge_id: int) -> ChallengeInfo:
    """The challenge, read from Arbitration (and its answer or settlement event)."""
    arb = q.arbitration
    try:
        c = arb.get_challenge(challenge_id)
    except ContractRevert as exc:
        if exc.error == "UnknownChallenge":
            raise JobError(f"no availability challenge {challenge_id} on the chain") from None
        raise
    info = ChallengeInfo(**{**dataclasses.asdict(c), "challenge_id": challenge_id,
                            "challenger": to_checksum_address(c.challenger),
                            "miner": to_checksum_address(c.miner)})
    since = q.deployment.deploy_block
    if c.status == ChallengeStatus.ANSWERED:
        ev = arb.events("AvailabilityAnswered", since, challengeId=challenge_id)[-1]
        receipt, proof = _answer_from_event(ev)
        return dataclasses.replace(info, receipt=receipt, proof=proof,
                                   window_end=int(ev["windowEnd"]))
    if c.status == ChallengeStatus.UNANSWERED:
        ev = arb.events("AvailabilityUnanswered", since, challengeId=challenge_id)[-1]
        return dataclasses.replace(info, slashed=int(ev["slashed"]))
    return info


def answered_receipt(q: Quarry, task_id: int, shard: int, index: int
                     ) -> tuple[Receipt, tuple[SumNode, ...]] | None:
    """The receipt and proof a miner showed on-chain for request `index`, if any."""
    for ev in reversed(q.arbitration.events("AvailabilityAnswered", q.deployment.deploy_block,
                                            taskId=task_id, shard=shard)):
        if int(ev["index"]) == index:
            return _answer_from_event(ev)
    return None


def wait_challenge(
    q: Quarry,
    challenge_id: int,
    *,
    timeout: float | None = None,
    poll_s: float = 0.5,
    settle_as: LocalAccount | None = None,
    on_poll: Callable[[ChallengeInfo, int], None] | None = None,
) -> ChallengeInfo:
    """Block until the challenge is answered or its deadline passes, and return it. With
    `settle_as`, that account then settles an unanswered challenge (the miner at fault);
    without it, the still-open challenge is returned. `JobTimeout` after `timeout` s."""
    def settle() -> None:
        assert settle_as is not None
        try:
            q.arbitration.settle_unanswered(settle_as, challenge_id)
        except ContractRevert as exc:
            if exc.error != "ChallengeNotOpen":  # answered or settled meanwhile
                raise

    return _poll_until_deadline(q, lambda: challenge_info(q, challenge_id),
                                f"availability challenge {challenge_id}",
                                close=settle if settle_as is not None else None,
                                timeout=timeout, poll_s=poll_s, on_poll=on_poll)


# ---------------------------------------------------------------------------- billing


def sum_fault(market: MarketAPI, s: Shard, k: int, start: int, size: int,
              index: int) -> tuple[Receipt, list[SumStep]] | None:
    """A receipt and the `SumStep` path proving that shard `k`'s result tree records a false
    sum (a lie in an inner node, or a `tokensUsed` its receipts do not add up to), found from
    the shard's result document (its receipts, and the sums the miner's proofs record);
    request `index`'s path is tried first. None when the document is missing or incomplete,
    or shows no such lie."""
    try:
        doc = fetch_result_document(market, k, s.result_uri)
    except (ContentNotFound, ResultCheckFailed, StoreError, QuarryError):
        return None
    if [it.index for it in doc.items] != list(range(start, start + size)):
        return None  # every leaf is needed to recompute the sums
    found = sum_lie_path([receipt_leaf(it.receipt) for it in doc.items],
                         {m: it.proof for m, it in enumerate(doc.items)},
                         s.result_root, s.tokens_used, prefer=(index - start,))
    if found is None:
        return None
    m, path = found
    return doc.items[m].receipt, path


def prove_billing_fault(q: Quarry, account: LocalAccount, market: MarketAPI, task_id: int,
                        index: int) -> TxResult:
    """Prove on-chain that request `index`'s receipt over-bills: it claims more tokens than
    a request may have, or than its own output (the document's token ids) holds; or that
    its shard's result tree records a false sum (`sum_fault`: from `index`'s path when the
    lie is on it, else from another request's). The shard is refunded and the miner
    slashed at once. `DisputeNotPossible` when the shard cannot be challenged or the
    document shows no billing fault."""
    t, k, s = _challengeable(q, account, task_id, index, "challenged")
    start, end = q.tasks.shard_range(task_id, k)
    item = _document_item(market, s, k, start, end - start, index)
    over = item is not None and (item.receipt.output_tokens > t.max_tokens_per_request
                                 or item.receipt.output_tokens > len(item.token_ids))
    if not over:
        lie = sum_fault(market, s, k, start, end - start, index)
        if lie is not None:
            receipt, path = lie
            call = q.arbitration.contract.functions.proveSumFault(
                task_id, k, receipt.as_tuple(), [p.as_tuple() for p in path])
            check_funds(q, account, 0, call, "Arbitration.proveSumFault", "billing proof")
            return q.arbitration.prove_sum_fault(account, task_id, k, receipt, path)
    if item is None:
        raise DisputeNotPossible(f"shard {k}'s result document does not prove request "
                                 f"{index}'s receipt; challenge its availability instead")
    r = item.receipt
    if not over:
        raise DisputeNotPossible(f"request {index}'s receipt bills {r.output_tokens} tokens, "
                                 f"its output holds {len(item.token_ids)}: no over-billing to "
                                 "prove")
    args = (task_id, k, r.as_tuple(), [p.as_tuple() for p in item.proof],
            keccak(item.text.encode("utf-8")), list(item.token_ids))
    check_funds(q, account, 0, q.arbitration.contract.functions.proveBillingFault(*args),
                "Arbitration.proveBillingFault", "billing proof")
    return q.arbitration.prove_billing_fault(account, task_id, k, r, item.proof, args[4],
                                             item.token_ids)
