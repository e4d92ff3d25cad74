"""What the routers share, handed to them through FastAPI's `Depends`: the settings, the
board, the store, the watched deployment, the index watch behind the long polls and the
per-miner limit on swarm joins.

`create_app` builds one `Market` and keeps it on `app.state.market`; every dependency below
reads it from the request's app, so two apps in one process (tests) never share state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from market.admission import Limit, SignedLimiter
from market.chain.deploy import Quarry, WatchedDeployment
from market.service.board import Board
from market.service.settings import MarketSettings
from market.store import ContentStore

WATCH_EVERY_S = 0.02
"""How often the one index watcher of an app reads the board's cursor while requests wait
(one small SQLite read; none while nobody waits) when no worker announced an index: a
miner's long poll hears of a newly indexed shard within about that, or at once when the
worker's announcement comes (`worker.INDEXED_CHANNEL`)."""
ANNOUNCED_EVERY_S = 0.5
"""While the workers' announcements are heard, how often the watcher reads the cursor
without one (outside `SETTLE_S` of a move): a lost announcement costs at most this."""
RESUBSCRIBE_S = 5.0
"""After Redis fails the watcher, how long it polls before subscribing again."""
SETTLE_S = 0.5
"""For this long after the cursor moves, the watcher wakes the waiting requests at every
read: the workers store the miners' recommendations just after indexing, and a request
that asked in between (and found its fresh but older recommendations empty) looks again."""


class IndexWatch:
    """Wakes long-polling requests when the board's cursor moves (a worker indexed blocks).

    The workers index in other processes: while any request waits, one asyncio task per app
    reads the cursor (one small SQLite read) as soon as a worker announces an index on
    Redis (`worker.INDEXED_CHANNEL`), or every `WATCH_EVERY_S` without one, and wakes them
    all when it changes. Requests never poll SQLite themselves, however many wait; the
    cursor, not the announcement, is what counts, so a lost announcement costs one
    interval."""

    def __init__(self, board: Board, redis_url: str | None = None) -> None:
        self.board = board
        self.redis_url = redis_url
        self._redis: Any = None  # (redis.asyncio client, its PubSub)
        self._resubscribe_at = 0.0
        self._cond: asyncio.Condition | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiters = 0
        self.cursor = -1
        self.wakes = 0  # how many times the waiters were woken (see SETTLE_S)
        self._moved_at = float("-inf")

    async def wait(self, since: int, timeout: float) -> bool:
        """Wait until the cursor differs from `since` (read before the caller's query, so
        an index between the query and this call is not missed), or until the next wake-up
        within `SETTLE_S` of a move, or until `timeout` passes; returns whether it woke."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        cond = self._cond
        self._waiters += 1
        try:
            if self._task is None or self._task.done():
                self.cursor = await run_in_threadpool(self.board.cursor)
                self._task = asyncio.get_running_loop().create_task(self._watch())
            entered = self.wakes
            async with cond:
                try:
                    await asyncio.wait_for(cond.wait_for(
                        lambda: self.cursor != since or self.wakes != entered), timeout)
                except TimeoutError:
                    return False
                return True
        finally:
            self._waiters -= 1

    async def _watch(self) -> None:
        while self._waiters > 0:  # the subscription stays for the next waiters
            settling = time.monotonic() - self._moved_at < SETTLE_S
            await self._announced(WATCH_EVERY_S if settling or self._redis is None
                                  else ANNOUNCED_EVERY_S)
            await self._read()

    async def _announced(self, timeout: float) -> None:
        """Until a worker announces an index on `worker.INDEXED_CHANNEL`, or `timeout`
        passes (all of it without Redis)."""
        if self._redis is None and self.redis_url and time.monotonic() >= self._resubscribe_at:
            import redis.asyncio

            from market.service.worker import INDEXED_CHANNEL

            client = redis.asyncio.Redis.from_url(self.redis_url, socket_connect_timeout=0.5)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            self._redis = (client, pubsub)
            try:
                await pubsub.subscribe(INDEXED_CHANNEL)
            except Exception:  # Redis down: poll, and subscribe again later
                await self._unsubscribe()
        if self._redis is None:
            await asyncio.sleep(timeout)
            return
        try:
            await self._redis[1].get_message(timeout=timeout)
        except Exception:  # Redis went away: the same
            await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        """Drop a failed subscription; the watcher polls until `RESUBSCRIBE_S` passes."""
        held, self._redis = self._redis, None
        self._resubscribe_at = time.monotonic() + RESUBSCRIBE_S
        for part in reversed(held or ()):
            try:
                await part.aclose()
            except Exception:  # already gone
                pass

    async def _read(self) -> None:
        """Read the cursor and wake the waiters when it moved (or while it settles)."""
        assert self._cond is not None
        try:
            cursor = await run_in_threadpool(self.board.cursor)
        except Exception:  # a locked or vanished file: the next read retries
            return
        now = time.monotonic()
        if cursor != self.cursor:
            self._moved_at = now
        if cursor != self.cursor or now - self._moved_at < SETTLE_S:
            async with self._cond:
                self.cursor = cursor
                self.wakes += 1
                self._cond.notify_all()


@dataclass
class Market:
    """One market's shared resources (see the module doc)."""

    settings: MarketSettings
    board: Board
    store: ContentStore
    deployment: WatchedDeployment
    watch: IndexWatch = field(init=False)
    joins_by_miner: SignedLimiter = field(init=False)
    """Each signing miner's swarm joins (`swarm_joins_per_miner_per_s`)."""

    def __post_init__(self) -> None:
        self.watch = IndexWatch(self.board, self.settings.redis_url)
        self.joins_by_miner = SignedLimiter(Limit.over(
            self.settings.swarm_joins_per_miner_per_s, self.settings.limit_burst_s))

    @property
    def manifests_dir(self) -> Path:
        """Uploaded manifests, beside the store's files: the chain holds only modelIds, so
        they refill a rebuilt board."""
        return self.settings.store_dir / "manifests"

    def now(self) -> int:
        """The later of the wall clock and the last indexed block's time (a devnet's clock
        may run ahead), for deadlines."""
        return max(int(time.time()), self.board.cursor_time())


def get_market(request: Request) -> Market:
    market: Market = request.app.state.market
    return market


def get_board(request: Request) -> Board:
    return get_market(request).board


def get_settings(request: Request) -> MarketSettings:
    return get_market(request).settings


def get_store(request: Request) -> ContentStore:
    return get_market(request).store


def get_quarry(request: Request) -> Quarry:
    """The deployment's contracts (ConfigError -> 503 while there is no usable file)."""
    return get_market(request).deployment.quarry()


MarketDep = Annotated[Market, Depends(get_market)]
BoardDep = Annotated[Board, Depends(get_board)]
SettingsDep = Annotated[MarketSettings, Depends(get_settings)]
StoreDep = Annotated[ContentStore, Depends(get_store)]
QuarryDep = Annotated[Quarry, Depends(get_quarry)]
