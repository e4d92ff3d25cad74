"""The market's background work on Celery, with Redis as broker and result backend.

Tasks (enqueued by `market serve`'s ticker; any number of workers may run them):

- `quarry.index_events`: apply new chain events to the SQLite board.
- `quarry.sweep`: settlement (finalize, reclaim expired claims, refund past the deadline,
  settle unanswered availability challenges, expire overdue disputes and report the committee
  members that did not vote).
- `quarry.recommend`: per alive miner, the open shards it should claim, best first.

Each takes a Redis lock without blocking (`quarry:lock:index`, `quarry:lock:sweep`,
`quarry:lock:recommend`): a worker that cannot take it returns at once, so several workers
never do the same work twice. A lock lives `LOCK_TTL_S` (10 s) and its holder extends it
while it works, so a worker killed while holding one (SIGKILL, OOM) stalls the others at
most that long. Every step is idempotent, so acks-late redelivery after a crash or a broker
restart is harmless.

Every worker also heartbeats `quarry:worker:<node>` with a `ALIVE_TTL_S` TTL; `/health`
counts those keys, so a dead worker disappears from it within 10 s (`live_workers`).

Settings come from `MarketSettings.load()` (the `QUARRY_MARKET_*` environment that
`processes.start_worker` or `market worker --config` sets) at import, or from `configure()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from celery import Celery
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from market.logs import celery_worker_logging
from market.service.settings import MarketSettings

if TYPE_CHECKING:
    import redis

    from market.chain.deploy import Quarry
    from market.chain.heads import HeadFeed
    from market.service.board import Board

log = logging.getLogger("quarry.worker")

INDEX_LOCK = "quarry:lock:index"
SWEEP_LOCK = "quarry:lock:sweep"
RECOMMEND_LOCK = "quarry:lock:recommend"
# A lock outlives a crashed holder by at most this long; a live holder extends it every
# third of it. The work under it is idempotent, so a run that loses its lock anyway (frozen
# longer than the TTL) costs only duplicate reads.
LOCK_TTL_S = 10
INDEXED_CHANNEL = "quarry:indexed"
"""Where a worker publishes its cursor once it has indexed new blocks and refreshed the
miners' recommendations: the app's long polls (`deps.IndexWatch`) answer at once."""
ALIVE_PREFIX = "quarry:worker:"
ALIVE_TTL_S = 8
"""A worker's liveness key lives this long; the worker refreshes it every `ALIVE_EVERY_S`."""
ALIVE_EVERY_S = 2.0
RECOMMEND_LIMIT = 50
FOLLOW_MAX_INTERVALS = 2.0
"""The longest an index task follows the chain, in index intervals; it stops sooner as soon
as any task waits in the queue (normally the next tick's index task, which takes over)."""
FOLLOW_EVERY_S = 0.05
"""How often a following index task asks the chain for its head (one `eth_blockNumber`) when
the node pushed none (`HeadFeed`: pushed heads are indexed as they come)."""
QUEUE = "quarry"

TASK_INDEX = "quarry.index_events"
TASK_SWEEP = "quarry.sweep"
TASK_RECOMMEND = "quarry.recommend"

celery_app = Celery("quarry", set_as_current=False)
# JSON lines when $QUARRY_LOG_FORMAT=json (`market worker --log-format json` sets it; a local
# stack's workers inherit it), and the quarry.* loggers at INFO whatever Celery's --loglevel:
# each sweep's transactions and each indexed event (quarry.index) show up either way.
celery_worker_logging("market-worker")
_settings: MarketSettings | None = None
_cache: dict[str, Any] = {}


def configure(settings: MarketSettings) -> Celery:
    """Point `celery_app` (broker, result backend) and the tasks at `settings`."""
    global _settings
    _settings = settings
    _cache.clear()
    celery_app.conf.update(
        broker_url=settings.redis_url,
        result_backend=settings.redis_url,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # a Redis outage never ends a worker
        broker_connection_timeout=2.0,
        broker_transport_options={"visibility_timeout": 600},
        result_backend_always_retry=True,
        result_backend_max_retries=10,
        result_expires=3600,
        redis_socket_connect_timeout=2.0,
        redis_backend_health_check_interval=10,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0,
                                   "interval_step": 0.2, "interval_max": 0.5},
        worker_hijack_root_logger=False,
        timezone="UTC",
    )
    return celery_app


def settings() -> MarketSettings:
    if _settings is None:
        configure(MarketSettings.load())
    assert _settings is not None
    return _settings


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    """A forked pool process must not share its parent's sockets or SQLite handle."""
    _cache.clear()


def _redis() -> redis.Redis:
    client = _cache.get("redis")
    if client is None:
        import redis

        client = redis.Redis.from_url(settings().redis_url, socket_timeout=10,
                                      socket_connect_timeout=2, health_check_interval=10)
        _cache["redis"] = client
    return client


def _queue_waiting() -> bool:
    """Whether a task waits in the queue (True too when Redis cannot say: stop following)."""
    import redis

    try:
        return bool(_redis().llen(QUEUE))
    except redis.RedisError:
        return True


def _board() -> Board:
    from market.service.board import Board

    location = settings().board_location
    board = _cache.get("board")
    if board is None or _cache.get("board_path") != location:
        board = Board(location)
        _cache["board"], _cache["board_path"] = board, location
    return board


def _quarry() -> Quarry:
    """The contracts of the deployment file, reconnected when the file changes."""
    from market.chain.deploy import WatchedDeployment

    path = Path(settings().deployment)
    watched = _cache.get("deployment")
    if watched is None or watched.path != path:
        watched = _cache["deployment"] = WatchedDeployment(path)
    return watched.quarry()


def _announce(cursor: int) -> None:
    """Tell the apps' long polls the board moved (best effort: they poll it anyway)."""
    import redis

    try:
        _redis().publish(INDEXED_CHANNEL, cursor)
    except redis.RedisError as exc:
        log.debug("announcing cursor %d: %s", cursor, exc)


def _heads(q: Quarry) -> HeadFeed:
    """This process's feed of the chain's new heads (kept between index tasks, so the
    subscription outlives each), renewed when the deployment's chain changes."""
    from market.chain.heads import HeadFeed

    feed = _cache.get("heads")
    if feed is None or feed.chain is not q.chain:
        if feed is not None:
            feed.close()
        feed = _cache["heads"] = HeadFeed(q.chain)
    return cast("HeadFeed", feed)


@contextmanager
def redis_lock(name: str, ttl_s: int = LOCK_TTL_S,
               client: redis.Redis | None = None) -> Iterator[bool]:
    """Take `name` without waiting; yields whether this caller holds it. While the caller
    works a thread extends the lock every third of `ttl_s`, so it never lapses under a live
    holder and lapses within `ttl_s` of a dead one. The lock's token is shared between
    threads (`thread_local=False`): redis-py keeps it per thread by default, and the keeper
    thread then had no token to extend with, so every lock lapsed at `ttl_s`."""
    from redis.exceptions import LockError, RedisError

    lock = (client or _redis()).lock(name, timeout=ttl_s, blocking=False, thread_local=False)
    held = bool(lock.acquire(blocking=False))
    done = threading.Event()

    def keep() -> None:
        while not done.wait(ttl_s / 3):
            try:
                lock.reacquire()
            except (LockError, RedisError) as exc:  # lost it (frozen past the TTL) or Redis down
                log.warning("lock %s could not be extended: %s", name, exc)
                return

    keeper = threading.Thread(target=keep, daemon=True, name=f"keep {name}")
    if held:
        keeper.start()
    try:
        yield held
    finally:
        if held:
            done.set()
            keeper.join()
            try:
                lock.release()
            except LockError:  # expired while we worked; someone else may hold it now
                log.warning("lock %s expired before release", name)


def live_workers(client: redis.Redis) -> list[str]:
    """The node names of the workers whose liveness key has not expired, sorted."""
    keys = client.scan_iter(match=f"{ALIVE_PREFIX}*", count=100)
    return sorted(k.decode()[len(ALIVE_PREFIX):] if isinstance(k, bytes)
                  else str(k)[len(ALIVE_PREFIX):] for k in keys)


class AliveBeacon:
    """Refreshes `quarry:worker:<node>` every `ALIVE_EVERY_S` in a daemon thread; the key
    expires `ALIVE_TTL_S` after the last refresh, i.e. soon after the process dies."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.client, self.key = client, f"{ALIVE_PREFIX}{node}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="alive beacon")

    def start(self) -> AliveBeacon:
        self._thread.start()
        return self

    def _run(self) -> None:
        from redis.exceptions import RedisError

        while True:
            try:
                self.client.set(self.key, str(time.time()), ex=ALIVE_TTL_S)
            except RedisError as exc:  # Redis restarting: the next beat retries
                log.debug("alive beacon: %s", exc)
            if self._stop.wait(ALIVE_EVERY_S):
                return

    def stop(self) -> None:
        """A clean exit: stop beating and remove the key (the worker is gone now)."""
        from redis.exceptions import RedisError

        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.client.delete(self.key)
        except RedisError:
            pass


@worker_ready.connect
def _beacon_on(sender: Any = None, **_: Any) -> None:
    """The worker's main process announces itself once it consumes tasks."""
    import redis

    node = str(getattr(sender, "hostname", None) or "worker")
    client = redis.Redis.from_url(settings().redis_url, socket_timeout=5,
                                  socket_connect_timeout=2)
    _beacon["beacon"] = AliveBeacon(client, node).start()


@worker_shutdown.connect
def _beacon_off(**_: Any) -> None:
    beacon = _beacon.pop("beacon", None)
    if beacon is not None:
        beacon.stop()


_beacon: dict[str, AliveBeacon] = {}


@celery_app.task(name=TASK_INDEX)
def index_events() -> dict[str, Any]:
    """Apply every new chain event to the board; returns the cursor (last indexed block).

    Then it follows the chain, indexing a new block as soon as the node pushes its head
    (`HeadFeed`; else as soon as `eth_blockNumber`, read every `FOLLOW_EVERY_S`, shows one):
    a miner long-polling for open shards, or a client waiting on the board, hears of a new
    task at once instead of at the next tick; after new
    blocks it refreshes the miners' recommendations at once (`recommend`), which the
    open-shards answer prefers while fresh. It follows until any task waits in the queue
    (the next tick's index task takes over; a sweep gets the worker at once), so the chain
    is always followed and no backlog builds up behind it (one solo worker runs them all)."""
    with redis_lock(INDEX_LOCK) as held:
        if not held:
            return {"skipped": "locked"}
        started = time.monotonic()
        with reported("index") as out:
            board, q = _board(), _quarry()
            before = board.cursor()
            cursor = out["cursor"] = board.index(q)
            until = started + FOLLOW_MAX_INTERVALS * settings().index_interval_s
            heads = _heads(q)
            while True:
                if cursor != before:  # new blocks: the miners' open shards, right away
                    recommend()
                    _announce(cursor)
                if time.monotonic() + FOLLOW_EVERY_S >= until or _queue_waiting():
                    break
                before = cursor
                if heads.next_head(cursor, FOLLOW_EVERY_S) > cursor:
                    cursor = out["cursor"] = board.index(q)
            out["seconds"] = round(time.monotonic() - started, 3)
        return out


@celery_app.task(name=TASK_SWEEP)
def sweep() -> dict[str, Any]:
    """Send the settlement transactions that are due (or only report them, with no
    settler key); see `sweeps.sweep_once`."""
    from market.chain.client import as_account
    from market.service.sweeps import RedisGuard, chain_now, sweep_once

    with redis_lock(SWEEP_LOCK) as held:
        if not held:
            return {"skipped": "locked"}
        with reported("sweep") as out:
            s = settings()
            q = _quarry()
            settler = as_account(s.settler_key) if s.settler_key else None
            report = sweep_once(_board(), q, settler, chain_now(q), guard=RedisGuard(_redis()))
            if report.sent or report.errors:
                log.warning("sweep: %s", report.summary())
            _say_unsettled(report.pending)
            out.update(report.as_dict())
        return out


def _say_unsettled(pending: list[Any]) -> None:
    """Without a settler key nothing due is sent: say so, once per kind of action that
    waits (an expired claim stays claimed, a finished shard unpaid, until someone sends)."""
    kinds = sorted({item.action for item in pending})
    if kinds and _cache.get("unsettled") != kinds:
        log.warning("%d settlement(s) due (%s) and no settler key: set [market] settler_key "
                    "(or QUARRY_MARKET_SETTLER_KEY) to an account with ETH for gas and restart "
                    "the worker; until then expired claims are not reclaimed and finished "
                    "shards are not finalized unless their miners or clients do it",
                    len(pending), ", ".join(kinds))
    _cache["unsettled"] = kinds


@celery_app.task(name=TASK_RECOMMEND)
def recommend(limit: int = RECOMMEND_LIMIT) -> dict[str, Any]:
    """For every alive miner, store the open shards it should claim, best first."""
    from market.service import matching
    from market.service.sweeps import chain_now

    with redis_lock(RECOMMEND_LOCK) as held:
        if not held:
            return {"skipped": "locked"}
        with reported("recommend") as out:
            board = _board()
            now = chain_now(_quarry())
            open_shards = board.open_shards(None, now)
            ttl = settings().heartbeat_ttl_s
            wall = time.time()
            miners = 0
            for miner in board.miners():
                if not matching.miner_alive(miner, wall, ttl):
                    continue
                rows = matching.rank_open_shards(open_shards, miner, now, limit)
                board.set_recommendations(str(miner["address"]), rows, now)
                miners += 1
            out.update({"miners": miners, "openShards": len(open_shards), "now": now})
        return out


@contextmanager
def reported(task: str) -> Iterator[dict[str, Any]]:
    """Run a task's body; a QuarryError (chain down, chain reset, missing deployment) ends
    it with `{"error": ...}` and one log line, repeated only when the reason changes, so an
    outage does not flood the log with a traceback every tick."""
    from market.errors import QuarryError

    out: dict[str, Any] = {}
    key = f"failing:{task}"
    try:
        yield out
    except QuarryError as exc:
        message = f"{type(exc).__name__}: {exc}"
        if _cache.get(key) != message:
            log.warning("%s failed (retrying every tick): %s", task, message)
            _cache[key] = message
        out.clear()
        out["error"] = message
        return
    if _cache.pop(key, None) is not None:
        log.warning("%s recovered", task)


configure(MarketSettings.load())
