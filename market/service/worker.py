"""The market's background work on Celery, with Redis as broker and result backend.

Tasks (enqueued by `market serve`'s ticker; any number of workers may run them):

- `quarry.index_events`: apply new chain events to the SQLite board.
- `quarry.sweep`: settlement (finalize, reclaim expired claims, refund past the deadline,
  settle unanswered availability challenges, expire overdue disputes and report the committee
  members that did not vote).
- `quarry.recommend`: per alive miner, the open shards it should claim, best first.

Each takes a Redis lock without blocking (`quarry:lock:index`, `quarry:lock:sweep`,
`quarry:lock:recommend`): a worker that cannot take it returns at once, so several workers
never do the same work twice. Every step is idempotent, so acks-late redelivery after a
crash or a broker restart is harmless.

Settings come from `MarketSettings.load()` (the `QUARRY_MARKET_*` environment that
`processes.start_worker` or `market worker --config` sets) at import, or from `configure()`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import worker_process_init

from market.service.settings import MarketSettings

if TYPE_CHECKING:
    import redis

    from market.chain.deploy import Quarry
    from market.service.board import Board

log = logging.getLogger("quarry.worker")

INDEX_LOCK = "quarry:lock:index"
SWEEP_LOCK = "quarry:lock:sweep"
RECOMMEND_LOCK = "quarry:lock:recommend"
# A lock outlives a crashed holder by at most this long; the work under it is idempotent, so
# an overlong run that loses its lock costs only duplicate reads.
LOCK_TTL_S = 120
RECOMMEND_LIMIT = 50
QUEUE = "quarry"

TASK_INDEX = "quarry.index_events"
TASK_SWEEP = "quarry.sweep"
TASK_RECOMMEND = "quarry.recommend"

celery_app = Celery("quarry", set_as_current=False)
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


def _board() -> Board:
    from market.service.board import Board

    path = Path(settings().db_path)
    board = _cache.get("board")
    if board is None or _cache.get("board_path") != path:
        path.parent.mkdir(parents=True, exist_ok=True)
        board = Board(path)
        _cache["board"], _cache["board_path"] = board, path
    return board


def _quarry() -> Quarry:
    """The contracts of the deployment file, reconnected when the file changes."""
    from market.chain.deploy import WatchedDeployment

    path = Path(settings().deployment)
    watched = _cache.get("deployment")
    if watched is None or watched.path != path:
        watched = _cache["deployment"] = WatchedDeployment(path)
    return watched.quarry()


@contextmanager
def redis_lock(name: str, ttl_s: int = LOCK_TTL_S) -> Iterator[bool]:
    """Take `name` without waiting; yields whether this caller holds it."""
    from redis.exceptions import LockError

    lock = _redis().lock(name, timeout=ttl_s, blocking=False)
    held = bool(lock.acquire(blocking=False))
    try:
        yield held
    finally:
        if held:
            try:
                lock.release()
            except LockError:  # expired while we worked; someone else may hold it now
                log.warning("lock %s expired before release", name)


@celery_app.task(name=TASK_INDEX)
def index_events() -> dict[str, Any]:
    """Apply every new chain event to the board; returns the cursor (last indexed block)."""
    with redis_lock(INDEX_LOCK) as held:
        if not held:
            return {"skipped": "locked"}
        started = time.monotonic()
        with reported("index") as out:
            out["cursor"] = _board().index(_quarry())
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
            out.update(report.as_dict())
        return out


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
                if not miner_alive(miner, wall, ttl):
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


def miner_alive(miner: dict[str, Any], wall: float, ttl_s: float) -> bool:
    """The row's own `alive` when the board computed it, else last heartbeat within ttl."""
    if miner.get("alive") is not None:
        return bool(miner["alive"])
    last = miner.get("lastSeen")
    return last is not None and wall - float(last) < ttl_s


configure(MarketSettings.load())
