"""Settlement sweeps: the permissionless transactions that move money once time has passed.

- finalize every Submitted shard whose challenge window closed (pays the miner, refunds the
  rest of the shard's budget, unlocks collateral);
- reclaim every expired claim (slashes part of the collateral to the client, reopens the
  shard, or refunds it past the deadline);
- refund every shard still Open after the task's deadline.

The board says what looks due; the chain decides. Each action is checked against the
contract's shard state first and taken at most once across all workers through a `Guard`
(Redis `SET NX` with a TTL), so two sweeps running at once never send the same transaction.
A revert that means "someone already did it" (AlreadyFinalized, ShardNotSubmitted, ...)
counts as done, one that means "not yet" (WindowNotClosed, ...) frees the action for the
next sweep. With no settler account the sweep only reports what is due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import redis
    from eth_account.signers.local import LocalAccount

    from market.chain.deploy import Quarry

log = logging.getLogger("quarry.sweep")

FINALIZE = "finalize"
RECLAIM = "reclaim"
REFUND = "refund"
ACTIONS = (FINALIZE, RECLAIM, REFUND)

# How long a taken action stays taken: long enough for the board to index its effect.
GUARD_TTL_S = 600

# Reverts that mean the action's effect is already on chain (another sender was first).
ALREADY_DONE = {
    FINALIZE: {"AlreadyFinalized", "ShardNotSubmitted", "DisputeOpen"},
    RECLAIM: {"ShardNotClaimed"},
    REFUND: {"ShardNotRefundable"},
}
# Reverts that mean "too early on the chain's clock": try again on a later sweep.
NOT_YET = {
    FINALIZE: {"WindowNotClosed"},
    RECLAIM: {"ClaimNotExpired"},
    REFUND: {"DeadlineNotPassed", "ClaimNotExpired"},
}
# Shard states (ShardState values) in which each action can still do something.
ACTIONABLE = {FINALIZE: {2}, RECLAIM: {1}, REFUND: {0, 1}}


class SweepBoard(Protocol):
    """The part of `Board` a sweep reads."""

    def due_finalize(self, now: int) -> list[tuple[int, int]]: ...
    def expired_claims(self, now: int) -> list[tuple[int, int]]: ...
    def refundable(self, now: int) -> list[tuple[int, int]]: ...


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


Item = tuple[str, int, int]  # (action, taskId, shard)


@dataclass
class SweepReport:
    """What one sweep saw and did. `sent` lists the transactions this call mined."""

    now: int
    sent: list[Item] = field(default_factory=list)
    already_done: list[Item] = field(default_factory=list)
    not_yet: list[Item] = field(default_factory=list)
    taken_elsewhere: list[Item] = field(default_factory=list)
    pending: list[Item] = field(default_factory=list)  # due, but no settler key to send with
    errors: list[str] = field(default_factory=list)
    tx_hashes: list[str] = field(default_factory=list)
    gas_cost: int = 0

    def done(self, action: str) -> list[tuple[int, int]]:
        return [(t, s) for a, t, s in self.sent if a == action]

    @property
    def finalized(self) -> list[tuple[int, int]]:
        return self.done(FINALIZE)

    @property
    def reclaimed(self) -> list[tuple[int, int]]:
        return self.done(RECLAIM)

    @property
    def refunded(self) -> list[tuple[int, int]]:
        return self.done(REFUND)

    def summary(self) -> str:
        parts = [f"{len(self.done(a))} {a}" for a in ACTIONS]
        for label, items in (("already done", self.already_done), ("not yet", self.not_yet),
                             ("taken elsewhere", self.taken_elsewhere),
                             ("pending (no settler key)", self.pending)):
            if items:
                parts.append(f"{len(items)} {label}")
        if self.errors:
            parts.append(f"{len(self.errors)} error(s): {self.errors[0]}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        def rows(items: list[Item]) -> list[list[Any]]:
            return [list(i) for i in items]

        return {"now": self.now, "finalized": [list(x) for x in self.finalized],
                "reclaimed": [list(x) for x in self.reclaimed],
                "refunded": [list(x) for x in self.refunded],
                "alreadyDone": rows(self.already_done), "notYet": rows(self.not_yet),
                "takenElsewhere": rows(self.taken_elsewhere), "pending": rows(self.pending),
                "errors": list(self.errors), "txHashes": list(self.tx_hashes),
                "gasCost": self.gas_cost}


def chain_now(q: Quarry) -> int:
    """The sweep's clock: the later of the wall clock and the latest block's timestamp
    (a devnet's clock runs ahead after `evm_increaseTime`; a real chain's lags a little)."""
    return max(int(time.time()), q.chain.timestamp())


def due_items(board: SweepBoard, now: int) -> list[Item]:
    """Every action the board thinks is due at `now`, in a stable order, without repeats."""
    items: list[Item] = []
    seen: set[Item] = set()
    for action, rows in ((FINALIZE, board.due_finalize(now)),
                         (RECLAIM, board.expired_claims(now)),
                         (REFUND, board.refundable(now))):
        for task_id, shard in sorted((int(t), int(s)) for t, s in rows):
            item = (action, task_id, shard)
            if item not in seen:
                seen.add(item)
                items.append(item)
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
    from market.chain.errors import ChainError, ContractRevert

    report = SweepReport(now=now)
    items = due_items(board, now)
    if settler is None:
        report.pending.extend(items)
        return report
    guard = guard if guard is not None else MemoryGuard()
    for item in items:
        action, task_id, shard = item
        try:
            state = q.tasks.get_shard(task_id, shard)
        except ContractRevert as exc:
            report.errors.append(f"{action} task {task_id} shard {shard}: {exc}")
            continue
        except ChainError as exc:
            report.errors.append(f"chain unavailable, sweep stopped: {exc}")
            break
        if int(state.state) not in ACTIONABLE[action]:
            report.already_done.append(item)
            continue
        # One key per action on this shard's current claim, so a shard reclaimed, claimed
        # again and expired again is reclaimed again.
        key = f"{action}:{q.tasks.address}:{task_id}:{shard}"
        if action == RECLAIM:
            key += f":{state.miner}:{state.claim_expiry}"
        if not guard.take(key, ttl_s):
            report.taken_elsewhere.append(item)
            continue
        try:
            result = _send(q, settler, item)
        except ContractRevert as exc:
            if exc.error in ALREADY_DONE[action]:
                report.already_done.append(item)
            elif exc.error in NOT_YET[action]:
                guard.release(key)
                report.not_yet.append(item)
            else:
                report.errors.append(f"{action} task {task_id} shard {shard}: {exc}")
            continue
        except ChainError as exc:
            guard.release(key)
            report.errors.append(f"{action} task {task_id} shard {shard}: {exc}")
            if not q.chain.is_up():
                report.errors.append("chain unavailable, sweep stopped")
                break
            continue
        report.sent.append(item)
        report.tx_hashes.append(result.tx_hash)
        report.gas_cost += result.gas_cost
        log.info("%s task %d shard %d: %s", action, task_id, shard, result.tx_hash)
    return report


def _send(q: Quarry, settler: LocalAccount, item: Item) -> Any:
    action, task_id, shard = item
    if action == FINALIZE:
        return q.tasks.finalize_shard(settler, task_id, shard)
    if action == RECLAIM:
        return q.tasks.reclaim_expired(settler, task_id, shard)
    return q.tasks.refund_unfinished(settler, task_id, shard)
