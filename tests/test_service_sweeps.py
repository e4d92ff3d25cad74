"""Settlement sweep logic (against an in-memory fake of the contract's shard states), the
Redis guard on a real redis-server, and the `market serve` ticker's outage handling."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from market.chain.contracts import Shard, ShardState
from market.chain.errors import ChainError, revert_class
from market.service.cli import Ticker
from market.service.sweeps import (
    FINALIZE,
    RECLAIM,
    REFUND,
    MemoryGuard,
    RedisGuard,
    due_items,
    sweep_once,
)

SETTLER: Any = object()  # the fake contract does not sign


def _revert(name: str) -> Exception:
    return revert_class(name)(f"TaskRegistry reverted: {name}()", error=name, args={},
                              data=b"")


def _shard(state: ShardState, miner: str = "0xM", expiry: int = 100) -> Shard:
    return Shard(state=state, miner=miner, claim_expiry=expiry, submitted_at=0, window_end=0,
                 tokens_used=0, collateral=0, result_root=b"", result_uri="")


@dataclass
class FakeTx:
    tx_hash: str
    gas_cost: int = 21_000


class FakeTasks:
    """TaskRegistry's settlement calls over a dict of shard states; counts every send."""

    address = "0x" + "ab" * 20

    def __init__(self, shards: dict[tuple[int, int], Shard], delay: float = 0.0) -> None:
        self.shards = shards
        self.sends: list[tuple[str, int, int]] = []
        self.fail: dict[tuple[str, int, int], Exception] = {}
        self.delay = delay
        self.down = False
        self._lock = threading.Lock()

    def get_shard(self, task_id: int, shard: int) -> Shard:
        if self.down:
            raise ChainError("chain at http://x did not answer")
        return self.shards[(task_id, shard)]

    def _act(self, action: str, task_id: int, shard: int, to: ShardState) -> FakeTx:
        with self._lock:
            self.sends.append((action, task_id, shard))
            n = len(self.sends)
        time.sleep(self.delay)  # widen the race between two sweeps
        failure = self.fail.get((action, task_id, shard))
        if failure is not None:
            raise failure
        self.shards[(task_id, shard)] = replace(self.shards[(task_id, shard)], state=to)
        return FakeTx(f"0x{n:064x}")

    def finalize_shard(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(FINALIZE, task_id, shard, ShardState.FINALIZED)

    def reclaim_expired(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(RECLAIM, task_id, shard, ShardState.OPEN)

    def refund_unfinished(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(REFUND, task_id, shard, ShardState.REFUNDED)


class FakeChain:
    def __init__(self, tasks: FakeTasks) -> None:
        self.tasks = tasks

    def is_up(self) -> bool:
        return not self.tasks.down


class FakeQuarry:
    def __init__(self, tasks: FakeTasks) -> None:
        self.tasks = tasks
        self.chain = FakeChain(tasks)


@dataclass
class FakeBoard:
    """What an indexed board would list (it lags the chain: it never updates here)."""

    finalize: list[tuple[int, int]]
    expired: list[tuple[int, int]]
    refund: list[tuple[int, int]]

    def due_finalize(self, now: int) -> list[tuple[int, int]]:
        return list(self.finalize)

    def expired_claims(self, now: int) -> list[tuple[int, int]]:
        return list(self.expired)

    def refundable(self, now: int) -> list[tuple[int, int]]:
        return list(self.refund)


def _world(delay: float = 0.0) -> tuple[FakeBoard, FakeQuarry]:
    shards = {
        (1, 0): _shard(ShardState.SUBMITTED), (1, 1): _shard(ShardState.SUBMITTED),
        (2, 0): _shard(ShardState.CLAIMED, "0xA", 50), (3, 0): _shard(ShardState.OPEN),
        (3, 1): _shard(ShardState.OPEN),
    }
    board = FakeBoard(finalize=[(1, 1), (1, 0)], expired=[(2, 0)], refund=[(3, 0), (3, 1)])
    return board, FakeQuarry(FakeTasks(shards, delay))


def test_due_items_stable_order_without_repeats() -> None:
    board = FakeBoard(finalize=[(1, 1), (1, 0), (1, 1)], expired=[(2, 0)], refund=[(3, 0)])
    assert due_items(board, 0) == [(FINALIZE, 1, 0), (FINALIZE, 1, 1), (RECLAIM, 2, 0),
                                   (REFUND, 3, 0)]


def test_without_settler_only_reports() -> None:
    board, q = _world()
    report = sweep_once(board, q, None, 1000)  # type: ignore[arg-type]
    assert q.tasks.sends == []
    assert len(report.pending) == 5 and not report.sent
    assert "5 pending (no settler key)" in report.summary()


def test_sends_each_due_action_once() -> None:
    board, q = _world()
    guard = MemoryGuard()
    report = sweep_once(board, q, SETTLER, 1000, guard=guard)  # type: ignore[arg-type]
    assert report.finalized == [(1, 0), (1, 1)]
    assert report.reclaimed == [(2, 0)]
    assert report.refunded == [(3, 0), (3, 1)]
    assert len(report.tx_hashes) == 5 and report.gas_cost == 5 * 21_000
    assert report.errors == []
    # The board has not caught up: a second sweep sees the chain's new states and sends
    # nothing (the reclaimed shard is Open again: no longer a reclaim).
    again = sweep_once(board, q, SETTLER, 1001, guard=guard)  # type: ignore[arg-type]
    assert again.sent == [] and len(q.tasks.sends) == 5
    assert len(again.already_done) == 5
    assert report.as_dict()["finalized"] == [[1, 0], [1, 1]]


def test_reverts_classified() -> None:
    board, q = _world()
    q.tasks.fail = {
        (FINALIZE, 1, 0): _revert("AlreadyFinalized"),  # another sender was first
        (FINALIZE, 1, 1): _revert("WindowNotClosed"),  # the chain's clock is behind
        (RECLAIM, 2, 0): _revert("BadShard"),  # a real error: reported, sweep goes on
    }
    guard = MemoryGuard()
    report = sweep_once(board, q, SETTLER, 1000, guard=guard)  # type: ignore[arg-type]
    assert report.already_done == [(FINALIZE, 1, 0)]
    assert report.not_yet == [(FINALIZE, 1, 1)]
    assert len(report.errors) == 1 and "BadShard" in report.errors[0]
    assert report.refunded == [(3, 0), (3, 1)]
    # "Not yet" frees the action for the next sweep; "already done" and errors keep it taken.
    del q.tasks.fail[(FINALIZE, 1, 1)]
    later = sweep_once(board, q, SETTLER, 1030, guard=guard)  # type: ignore[arg-type]
    assert later.finalized == [(1, 1)]
    assert (RECLAIM, 2, 0) in later.taken_elsewhere


def test_new_claim_is_reclaimed_again() -> None:
    """The reclaim key names the claim: a shard claimed again after a reclaim and expired
    again is reclaimed again, even within the guard's TTL."""
    board = FakeBoard(finalize=[], expired=[(2, 0)], refund=[])
    q = FakeQuarry(FakeTasks({(2, 0): _shard(ShardState.CLAIMED, "0xA", 50)}))
    guard = MemoryGuard()
    assert sweep_once(board, q, SETTLER, 100, guard=guard).reclaimed == [(2, 0)]  # type: ignore[arg-type]
    q.tasks.shards[(2, 0)] = _shard(ShardState.CLAIMED, "0xB", 90)
    assert sweep_once(board, q, SETTLER, 200, guard=guard).reclaimed == [(2, 0)]  # type: ignore[arg-type]
    assert q.tasks.sends == [(RECLAIM, 2, 0), (RECLAIM, 2, 0)]


def test_chain_down_stops_the_sweep() -> None:
    board, q = _world()
    q.tasks.down = True
    report = sweep_once(board, q, SETTLER, 1000, guard=MemoryGuard())  # type: ignore[arg-type]
    assert report.sent == [] and len(report.errors) == 1
    assert "chain unavailable" in report.errors[0]


@pytest.mark.timeout(30)
def test_concurrent_sweeps_send_each_action_once() -> None:
    """Four sweeps at once (no sweep lock), sharing one guard: every action is sent exactly
    once in total, even though each sweep sees every action as due."""
    board, q = _world(delay=0.02)
    guard = MemoryGuard()
    reports: list[Any] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        reports.append(sweep_once(board, q, SETTLER, 1000, guard=guard))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(q.tasks.sends) == sorted(due_items(board, 1000))
    assert sum(len(r.sent) for r in reports) == 5
    assert all(not r.errors for r in reports)


# -- the Redis guard on a real redis-server -------------------------------------------------


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from market.service.processes import start_redis

    proc = start_redis(Path(tmp_path_factory.mktemp("redis")))
    try:
        yield proc.extra["url"]
    finally:
        proc.stop()


@pytest.mark.timeout(30)
def test_redis_guard(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    a, b = RedisGuard(client), RedisGuard(client)
    assert a.take("finalize:x:1:0", 60)
    assert not b.take("finalize:x:1:0", 60)
    assert 0 < client.ttl("quarry:once:finalize:x:1:0") <= 60
    a.release("finalize:x:1:0")
    assert b.take("finalize:x:1:0", 60)
    assert a.take("finalize:x:1:1", 1)
    client.pexpire("quarry:once:finalize:x:1:1", 1)  # let it lapse now
    time.sleep(0.05)
    assert b.take("finalize:x:1:1", 60)


@pytest.mark.timeout(30)
def test_concurrent_sweeps_with_redis_guard(redis_url: str) -> None:
    import redis

    board, q = _world(delay=0.02)
    reports: list[Any] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        guard = RedisGuard(redis.Redis.from_url(redis_url), prefix="quarry:test-once:")
        barrier.wait()
        reports.append(sweep_once(board, q, SETTLER, 1000, guard=guard))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(q.tasks.sends) == sorted(due_items(board, 1000))
    assert sum(len(r.sent) for r in reports) == 5


# -- the ticker ---------------------------------------------------------------------------


def test_ticker_survives_an_outage() -> None:
    now = [0.0]
    sent: list[str] = []
    warnings: list[str] = []
    broker_up = [True]

    def send(name: str, expires: float) -> None:
        if not broker_up[0]:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        assert expires >= 10
        sent.append(name)

    ticker = Ticker([("index", 1.0), ("sweep", 2.0)], send, warn=warnings.append,
                    clock=lambda: now[0])
    due: dict[str, float] = {}
    ticker.tick(due)
    assert sent == ["index", "sweep"]
    now[0] = 1.0
    ticker.tick(due)
    assert sent == ["index", "sweep", "index"]  # sweep is not due before t=2
    broker_up[0] = False
    for t in (2.0, 3.0, 4.0):
        now[0] = t
        ticker.tick(due)
    assert len(warnings) == 1 and "cannot reach Redis" in warnings[0]
    assert "Connection refused" in warnings[0]
    broker_up[0] = True
    now[0] = 5.0
    ticker.tick(due)
    assert sent[-2:] == ["index", "sweep"]
    assert len(warnings) == 2 and "back" in warnings[1]


def test_ticker_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval for sweep must be positive"):
        Ticker([("sweep", 0.0)], lambda name, expires: None)


# -- task failure reporting ---------------------------------------------------------------


def test_task_failures_logged_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    from market.errors import QuarryError
    from market.service.worker import miner_alive, reported

    def run(fail: str | None) -> dict[str, Any]:
        with reported("index") as out:
            if fail:
                raise QuarryError(fail)
            out["cursor"] = 7
        return out

    with caplog.at_level("WARNING", logger="quarry.worker"):
        assert run("chain at http://x did not answer") == {
            "error": "QuarryError: chain at http://x did not answer"}
        run("chain at http://x did not answer")
        run("chain reset: no TaskRegistry code")
        assert run(None) == {"cursor": 7}
        run(None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "did not answer" in lines[0] and "chain reset" in lines[1]
    assert lines[2] == "index recovered"
    with pytest.raises(ValueError):  # a bug is not swallowed
        with reported("index"):
            raise ValueError("bug")
    assert miner_alive({"alive": False, "lastSeen": 100}, 101, 30) is False
    assert miner_alive({"lastSeen": 100}, 129, 30) and not miner_alive({"lastSeen": 100}, 131, 30)
    assert not miner_alive({"lastSeen": None}, 0, 30)
