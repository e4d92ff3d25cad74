"""Settlement sweeps: the permissionless transactions that move money once time has passed.

- finalize every Submitted shard whose challenge window closed (pays the miner, refunds the
  rest of the shard's budget, unlocks collateral);
- reclaim every expired claim (slashes part of the collateral to the client, reopens the
  shard, or refunds it past the deadline);
- refund every shard still Open after the task's deadline;
- settle every availability challenge left unanswered past its deadline (the miner loses the
  shard: the client gets its budget and the challenger its bond back; the slash is burned);
- expire every dispute past its deadline (the bond goes back to the opener, the shard
  unfreezes), then report the members of its committee that cast no vote (each loses its seat
  and part of its stake, burned); a dispute someone else expired is reported too.

So silence never pays, even with the client offline: a miner that does not answer a challenge
is at fault, and a committee member that does not vote is reported absent.

The board says what looks due; the chain decides. Each action is checked against the
contract's state first and taken at most once across all workers through a `Guard`
(Redis `SET NX` with a TTL), so two sweeps running at once never send the same transaction.
A revert that means "someone already did it" (AlreadyFinalized, ChallengeNotOpen, ...)
counts as done, one that means "not yet" (WindowNotClosed, ResponseWindowOpen, ...) frees the
action for the next sweep. With no settler account the sweep only reports what is due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from market.logs import log_context

if TYPE_CHECKING:
    import redis
    from eth_account.signers.local import LocalAccount

    from market.chain.deploy import Quarry

log = logging.getLogger("quarry.sweep")

FINALIZE = "finalize"
RECLAIM = "reclaim"
REFUND = "refund"
SETTLE = "settle"  # settleUnanswered: an availability challenge past its deadline
EXPIRE = "expire"  # expireDispute, then reportAbsence of the members that cast no vote
REPORT = "report"  # reportAbsence on a dispute someone else expired
SHARD_ACTIONS = (FINALIZE, RECLAIM, REFUND)
ACTIONS = (*SHARD_ACTIONS, SETTLE, EXPIRE, REPORT)

# How long a taken action stays taken: long enough for the board to index its effect.
GUARD_TTL_S = 600

# Reverts that mean the action's effect is already on chain (another sender was first).
ALREADY_DONE = {
    FINALIZE: {"AlreadyFinalized", "ShardNotSubmitted", "DisputeOpen"},
    RECLAIM: {"ShardNotClaimed"},
    REFUND: {"ShardNotRefundable"},
    SETTLE: {"ChallengeNotOpen"},
    EXPIRE: {"DisputeNotOpen"},
    REPORT: {"NotAbsent"},
}
# Reverts that mean "too early on the chain's clock": try again on a later sweep.
NOT_YET = {
    FINALIZE: {"WindowNotClosed"},
    RECLAIM: {"ClaimNotExpired"},
    REFUND: {"DeadlineNotPassed", "ClaimNotExpired"},
    SETTLE: {"ResponseWindowOpen"},
    EXPIRE: {"DisputeNotExpired"},
    REPORT: {"DisputeNotExpiredStatus"},
}
# Shard states (ShardState values) in which each shard action can still do something.
ACTIONABLE = {FINALIZE: {2}, RECLAIM: {1}, REFUND: {0, 1}}


class SweepBoard(Protocol):
    """The part of `Board` a sweep reads."""

    def due_finalize(self, now: int) -> list[tuple[int, int]]: ...
    def expired_claims(self, now: int) -> list[tuple[int, int]]: ...
    def refundable(self, now: int) -> list[tuple[int, int]]: ...
    def due_settle(self, now: int) -> list[tuple[int, int, int]]: ...
    def due_expire(self, now: int) -> list[tuple[int, int, int]]: ...
    def due_report(self, now: int) -> list[tuple[int, int, int]]: ...
    def report_horizon(self) -> int: ...


class Guard(Protocol):
    """At-most-once across processes: `take` answers True to exactly one caller per key
    until the key expires or is released."""

    def take(self, key: str, ttl_s: int) -> bool: ...
    def release(self, key: str) -> None: ...


class RedisGuard:
    """`Guard` on Redis: `SET key 1 NX EX ttl`."""

    def __init__(self, client: redis.Redis, prefix: str = "quarry:once:") -> None:
        self.client = client
        self.prefix = prefix

    def take(self, key: str, ttl_s: int) -> bool:
        return bool(self.client.set(self.prefix + key, b"1", nx=True, ex=int(ttl_s)))

    def release(self, key: str) -> None:
        self.client.delete(self.prefix + key)


class MemoryGuard:
    """`Guard` within one process (threads), for a single sweeper or tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def take(self, key: str, ttl_s: int) -> bool:
        with self._lock:
            now = self._clock()
            if self._until.get(key, 0.0) > now:
                return False
            self._until[key] = now + ttl_s
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._until.pop(key, None)


class Item(NamedTuple):
    """One settlement action on one shard. `ref` names what the action settles when it is
    not the shard itself: the availability challenge (settle) or the dispute (expire,
    report); 0 for the shard actions."""

    action: str
    task_id: int
    shard: int
    ref: int = 0


@dataclass
class SweepReport:
    """What one sweep saw and did. `sent` lists the actions this call carried out (for a
    report: the members it found absent, in `absent_reported`, were reported by it or by a
    sweep racing it); `tx_hashes` and `gas_cost` cover the transactions it mined itself."""

    now: int
    sent: list[Item] = field(default_factory=list)
    already_done: list[Item] = field(default_factory=list)
    not_yet: list[Item] = field(default_factory=list)
    taken_elsewhere: list[Item] = field(default_factory=list)
    pending: list[Item] = field(default_factory=list)  # due, but no settler key to send with
    errors: list[str] = field(default_factory=list)
    tx_hashes: list[str] = field(default_factory=list)
    gas_cost: int = 0
    absent_reported: list[tuple[int, str]] = field(default_factory=list)  # (disputeId, member)

    def done(self, action: str) -> list[tuple[int, int]]:
        return [(i.task_id, i.shard) for i in self.sent if i.action == action]

    def refs(self, action: str) -> list[int]:
        """The challenge or dispute ids `action` was carried out on."""
        return [i.ref for i in self.sent if i.action == action]

    @property
    def finalized(self) -> list[tuple[int, int]]:
        return self.done(FINALIZE)

    @property
    def reclaimed(self) -> list[tuple[int, int]]:
        return self.done(RECLAIM)

    @property
    def refunded(self) -> list[tuple[int, int]]:
        return self.done(REFUND)

    @property
    def settled(self) -> list[int]:
        """Availability challenges settled as unanswered (challenge ids)."""
        return self.refs(SETTLE)

    @property
    def expired(self) -> list[int]:
        """Disputes expired (dispute ids)."""
        return self.refs(EXPIRE)

    def summary(self) -> str:
        parts = [f"{len(self.refs(a))} {a}" for a in ACTIONS]
        for label, items in (("already done", self.already_done), ("not yet", self.not_yet),
                             ("taken elsewhere", self.taken_elsewhere),
                             ("pending (no settler key)", self.pending)):
            if items:
                parts.append(f"{len(items)} {label}")
        if self.absent_reported:
            parts.append(f"{len(self.absent_reported)} absent member(s) reported")
        if self.errors:
            parts.append(f"{len(self.errors)} error(s): {self.errors[0]}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        def rows(items: list[Item]) -> list[list[Any]]:
            return [list(i) for i in items]

        def by_ref(action: str) -> list[list[int]]:
            return [[i.ref, i.task_id, i.shard] for i in self.sent if i.action == action]

        return {"now": self.now, "finalized": [list(x) for x in self.finalized],
                "reclaimed": [list(x) for x in self.reclaimed],
                "refunded": [list(x) for x in self.refunded],
                "settled": by_ref(SETTLE), "expired": by_ref(EXPIRE),
                "reported": by_ref(REPORT),
                "absentReported": [list(x) for x in self.absent_reported],
                "alreadyDone": rows(self.already_done), "notYet": rows(self.not_yet),
                "takenElsewhere": rows(self.taken_elsewhere), "pending": rows(self.pending),
                "errors": list(self.errors), "txHashes": list(self.tx_hashes),
                "gasCost": self.gas_cost}


def chain_now(q: Quarry) -> int:
    """The sweep's clock: the later of the wall clock and the latest block's timestamp
    (a devnet's clock runs ahead after `evm_increaseTime`; a real chain's lags a little)."""
    return max(int(time.time()), q.chain.timestamp())


def due_items(board: SweepBoard, now: int) -> list[Item]:
    """Every action the board thinks is due at `now`, in a stable order, without repeats:
    the shard actions by (taskId, shard), then settle, expire and report by id."""
    items: list[Item] = []
    seen: set[Item] = set()

    def add(item: Item) -> None:
        if item not in seen:
            seen.add(item)
            items.append(item)

    for action, pairs in ((FINALIZE, board.due_finalize(now)),
                          (RECLAIM, board.expired_claims(now)),
                          (REFUND, board.refundable(now))):
        for task_id, shard in sorted((int(t), int(s)) for t, s in pairs):
            add(Item(action, task_id, shard))
    for action, triples in ((SETTLE, board.due_settle(now)), (EXPIRE, board.due_expire(now)),
                            (REPORT, board.due_report(now))):
        for ref, task_id, shard in sorted((int(r), int(t), int(s)) for r, t, s in triples):
            add(Item(action, task_id, shard, ref))
    return items


def sweep_once(
    board: SweepBoard,
    q: Quarry,
    settler: LocalAccount | None,
    now: int,
    *,
    guard: Guard | None = None,
    ttl_s: int = GUARD_TTL_S,
) -> SweepReport:
    """Send every due settlement transaction once; see the module docstring.

    A chain that stops answering ends the sweep early (the rest waits for the next one);
    any other failure is recorded in `errors` and the sweep goes on.
    """
    report = SweepReport(now=now)
    items = due_items(board, now)
    if settler is None:
        report.pending.extend(items)
        return report
    run = _Runner(board, q, settler, now, guard if guard is not None else MemoryGuard(),
                  ttl_s, report)
    for item in items:
        if not run(item):
            break
    return report


@dataclass
class _Runner:
    """Carries out one item: check the chain, take the guard, send, classify the outcome."""

    board: SweepBoard
    q: Quarry
    settler: LocalAccount
    now: int
    guard: Guard
    ttl_s: int
    report: SweepReport

    def __call__(self, item: Item) -> bool:
        """Returns False when the chain stopped answering (the sweep ends). Whatever is
        logged meanwhile names the item's task and shard (and dispute or challenge)."""
        with log_context(task=item.task_id, shard=item.shard, **_ref_fields(item)):
            return self._run(item)

    def _run(self, item: Item) -> bool:
        from market.chain.errors import ChainError, ContractRevert

        report = self.report
        action, task_id, shard, ref = item
        where = _describe(item)
        try:
            taken = self._prepare(item)
        except ContractRevert as exc:
            report.errors.append(f"{action} {where}: {exc}")
            return True
        except ChainError as exc:
            report.errors.append(f"chain unavailable, sweep stopped: {exc}")
            return False
        if taken is None:
            report.already_done.append(item)
            return True
        key, ttl = taken
        if not self.guard.take(key, ttl):
            report.taken_elsewhere.append(item)
            return True
        try:
            result = self._send(item)
        except ContractRevert as exc:
            if exc.error in ALREADY_DONE[action]:
                report.already_done.append(item)
            elif exc.error in NOT_YET[action]:
                self.guard.release(key)
                report.not_yet.append(item)
            else:
                report.errors.append(f"{action} {where}: {exc}")
            return True
        except ChainError as exc:
            self.guard.release(key)
            report.errors.append(f"{action} {where}: {exc}")
            if not self.q.chain.is_up():
                report.errors.append("chain unavailable, sweep stopped")
                return False
            return True
        if action == REPORT:
            absent = tuple(result)
            if not absent:  # every member voted, or was reported already
                report.already_done.append(item)
                return True
            report.absent_reported.extend((ref, str(m)) for m in absent)
        else:
            report.tx_hashes.append(result.tx_hash)
            report.gas_cost += result.gas_cost
        report.sent.append(item)
        done = {"absent": [str(m) for m in result]} if action == REPORT else {
            "tx": result.tx_hash}
        log.info("%s %s: %s", action, where,
                 f"{len(tuple(result))} absent" if action == REPORT else result.tx_hash,
                 extra={"task": task_id, "shard": shard, "action": action, **done})
        if action == EXPIRE:
            # Report the silent members now rather than after the board indexes the expiry:
            # nobody else may, and absence must cost them.
            return self(Item(REPORT, task_id, shard, ref))
        return True

    def _prepare(self, item: Item) -> tuple[str, int] | None:
        """The guard key and TTL of an item the chain says is still to do; None when its
        effect is already there."""
        from market.chain.contracts import ChallengeStatus, DisputeStatus

        q = self.q
        action, task_id, shard, ref = item
        if action in SHARD_ACTIONS:
            state = q.tasks.get_shard(task_id, shard)
            if int(state.state) not in ACTIONABLE[action]:
                return None
            # One key per action on this shard's current claim, so a shard reclaimed, claimed
            # again and expired again is reclaimed again.
            key = f"{action}:{q.tasks.address}:{task_id}:{shard}"
            if action == RECLAIM:
                key += f":{state.miner}:{state.claim_expiry}"
            return key, self.ttl_s
        key = f"{action}:{q.arbitration.address}:{ref}"
        if action == SETTLE:
            challenge = q.arbitration.get_challenge(ref)
            return (key, self.ttl_s) if challenge.status == ChallengeStatus.OPEN else None
        dispute = q.arbitration.get_dispute(ref)
        if action == EXPIRE:
            return (key, self.ttl_s) if dispute.status == DisputeStatus.OPEN else None
        if dispute.status != DisputeStatus.EXPIRED:
            return None  # resolved: a verdict leaves nobody to report
        # Reported once for good: the key holds while the members can still be reported.
        until = dispute.deadline + self.board.report_horizon()
        return key, max(self.ttl_s, until - self.now)

    def _send(self, item: Item) -> Any:
        q, settler = self.q, self.settler
        action, task_id, shard, ref = item
        if action == FINALIZE:
            return q.tasks.finalize_shard(settler, task_id, shard)
        if action == RECLAIM:
            return q.tasks.reclaim_expired(settler, task_id, shard)
        if action == REFUND:
            return q.tasks.refund_unfinished(settler, task_id, shard)
        if action == SETTLE:
            return q.arbitration.settle_unanswered(settler, ref)
        if action == EXPIRE:
            return q.arbitration.expire_dispute(settler, ref)
        from market.jobs import report_absent

        return report_absent(q, settler, ref)


_REF_KIND = {SETTLE: "challenge", EXPIRE: "dispute", REPORT: "dispute"}
"""What an action's `ref` names (the other actions have none)."""


def _ref_fields(item: Item) -> dict[str, int]:
    """The log fields naming what a settle, expire or report action settles."""
    what = _REF_KIND.get(item.action)
    return {} if what is None else {what: item.ref}


def _describe(item: Item) -> str:
    what = _REF_KIND.get(item.action)
    shard = f"task {item.task_id} shard {item.shard}"
    return shard if what is None else f"{what} {item.ref} ({shard})"
