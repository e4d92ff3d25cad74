"""The long-poll watcher (`market.service.deps.IndexWatch`) against a board whose cursor the
test moves: a waiting `GET /shards/open` wakes when the cursor moves, and a request that
asked just after a move is woken again while the workers store recommendations
(`SETTLE_S`); once settled, it sleeps until its time is up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from market.service import deps


class MovableCursor:
    """Only what the watcher reads of a board: its cursor."""

    def __init__(self) -> None:
        self.value = 5

    def cursor(self) -> int:
        return self.value


def test_watch_wakes_on_a_move_and_again_while_it_settles() -> None:
    board = MovableCursor()
    watch = deps.IndexWatch(board)  # type: ignore[arg-type]

    async def scenario() -> list[bool]:
        woke = [await watch.wait(5, 0.2)]  # nothing moved: its time is up
        waiter = asyncio.create_task(watch.wait(5, 10))
        await asyncio.sleep(0.1)
        board.value = 6
        woke.append(await waiter)
        # Asked after the move (it read cursor 6): woken again while the move settles,
        # long before its 10 s are up.
        woke.append(await watch.wait(6, 10))
        await asyncio.sleep(deps.SETTLE_S + 0.2)
        woke.append(await watch.wait(6, 0.3))  # settled: nothing wakes it
        return woke

    assert asyncio.run(scenario()) == [False, True, True, False]


def test_an_announced_index_wakes_the_waiters_at_once(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a worker's announcement on Redis (a real redis-server), the watcher reads the
    board at once: with the polling interval set past the wait's timeout, only the
    announcement can wake the waiter in time."""
    import redis

    from market.local import processes
    from market.service.worker import INDEXED_CHANNEL

    server = processes.start_redis(tmp_path / "redis")
    try:
        url = server.extra["url"]
        monkeypatch.setattr(deps, "WATCH_EVERY_S", 60.0)
        board = MovableCursor()
        watch = deps.IndexWatch(board, url)  # type: ignore[arg-type]
        publisher = redis.Redis.from_url(url)

        async def scenario() -> bool:
            waiter = asyncio.create_task(watch.wait(5, 10))
            while not publisher.pubsub_numsub(INDEXED_CHANNEL)[0][1]:  # subscribed
                await asyncio.sleep(0.01)
            board.value = 6
            publisher.publish(INDEXED_CHANNEL, 6)
            return await waiter

        assert asyncio.run(scenario()) is True and watch.cursor == 6
        publisher.close()
    finally:
        server.stop()
