"""The long-poll watcher (`market.service.deps.IndexWatch`) against a board whose cursor the
test moves: a waiting `GET /shards/open` wakes when the cursor moves, and a request that
asked just after a move is woken again while the workers store recommendations
(`SETTLE_S`); once settled, it sleeps until its time is up."""

from __future__ import annotations

import asyncio

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
