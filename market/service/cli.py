"""`market serve` (the market's HTTP API plus the ticker that schedules its background work)
and `market worker` (a Celery worker that does that work).

Both read the same settings (`--config FILE`'s `[market]` table, then `QUARRY_MARKET_*`,
then flags), so one market's processes share one store, one board and one Redis. Cheap to
import: uvicorn, Celery and web3 load inside the handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from market.cliutil import add_log_format
from market.logs import ENV as LOG_FORMAT_ENV
from market.logs import configure_logging, json_logs, log_format, say


def add_commands(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the market service (HTTP API and background-work ticker)",
        description="Serve the market's HTTP API (OpenAPI at /docs) and enqueue its "
        "background work (event indexing, settlement sweeps, recommendations) on Celery "
        "through Redis; run `market worker` to do that work.",
    )
    _settings_flags(serve)
    serve.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8600)")
    serve.add_argument("--no-ticker", action="store_true",
                       help="serve the API only; another `market serve` schedules the work")
    serve.add_argument("--log-level", default="warning",
                       choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn's log level (default warning; the market's own "
                       "quarry.* lines log at info)")
    add_log_format(serve)
    serve.set_defaults(func=_serve)

    worker = subparsers.add_parser(
        "worker", help="run a Celery worker for the market's background work",
        description="Run a Celery worker (app market.service.worker:celery_app) that indexes "
        "chain events, sends settlement transactions and computes recommendations. Any "
        "number may run at once: Redis locks keep them from doing the same work twice.",
    )
    _settings_flags(worker)
    worker.add_argument("--concurrency", type=int, default=1,
                        help="tasks at once (1: solo pool; more: prefork processes)")
    worker.add_argument("--name", default=None,
                        help="worker node name (default quarry-<pid>@<host>)")
    worker.add_argument("--log-level", default="warning",
                        choices=("critical", "error", "warning", "info", "debug"),
                        help="Celery's log level (default warning; the work's own quarry.* "
                        "lines, e.g. each sweep's transactions and each indexed event, log "
                        "at info)")
    add_log_format(worker)
    worker.set_defaults(func=_worker)

    migrate = subparsers.add_parser(
        "migrate", help="upgrade the board's database in place, or move a SQLite board's "
        "state into it",
        description="Bring the configured board (--database-url, else --db-path) up to this "
        "market's layout in place. With --from-sqlite, also copy that SQLite board's own "
        "state (manifests, heartbeats, offers, committee messages, swarms) into it, checked "
        "row by row; the chain tables are rebuilt by indexing.",
    )
    _settings_flags(migrate)
    migrate.add_argument("--from-sqlite", type=Path, default=None, metavar="PATH",
                         help="a SQLite board whose market state moves into the board")
    migrate.set_defaults(func=_migrate)


def _settings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None,
                        help="TOML file with a [market] table")
    parser.add_argument("--redis-url", default=None,
                        help="Celery broker and result backend (default "
                        "redis://127.0.0.1:6379/0)")
    parser.add_argument("--deployment", type=Path, default=None,
                        help="deployment file (default $QUARRY_HOME/deployment.json)")
    parser.add_argument("--store-dir", type=Path, default=None,
                        help="content store directory (default $QUARRY_HOME/store)")
    parser.add_argument("--db-path", type=Path, default=None,
                        help="SQLite board (default $QUARRY_HOME/board.sqlite)")
    parser.add_argument("--database-url", default=None,
                        help="PostgreSQL board shared by replicas (postgresql://...; "
                        "default: the SQLite board)")


def _load(args: argparse.Namespace, **extra: Any) -> Any:
    from market.service.settings import MarketSettings

    return MarketSettings.load(args.config, redis_url=args.redis_url,
                               deployment=args.deployment, store_dir=args.store_dir,
                               db_path=args.db_path, database_url=args.database_url,
                               **extra)


class Ticker(threading.Thread):
    """Enqueues each task every `interval` seconds. While the broker is unreachable it
    prints one warning, keeps trying, and says so once when it is back.

    `schedule`: (task name, interval seconds). `send(name, expires)` enqueues one task; an
    enqueued task expires after a few intervals, so a backlog never builds up while no
    worker runs.
    """

    def __init__(
        self,
        schedule: list[tuple[str, float]],
        send: Callable[[str, float], None],
        *,
        where: str = "Redis",
        warn: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="quarry-ticker", daemon=True)
        for name, interval in schedule:
            if interval <= 0:
                raise ValueError(f"interval for {name} must be positive, got {interval}")
        self.schedule = schedule
        self.send = send
        self.where = where
        self.warn = warn or (lambda line: say(line, logger="quarry.ticker",
                                              level=logging.WARNING))
        self.clock = clock
        self.stopped = threading.Event()
        self.down = False
        self.sent = 0

    def stop(self) -> None:
        self.stopped.set()

    def tick(self, due: dict[str, float]) -> None:
        """Send every task whose time has come; `due` maps name -> next time."""
        now = self.clock()
        for name, interval in self.schedule:
            if due.get(name, 0.0) > now:
                continue
            try:
                self.send(name, max(10.0, 5 * interval))
            except Exception as exc:  # kombu/redis errors: the outage is reported, not fatal
                if not self.down:
                    self.warn(f"market: cannot reach {self.where} ({type(exc).__name__}: "
                              f"{exc}); background work paused, retrying")
                    self.down = True
                due[name] = now + interval
                return  # no point trying the others this round
            if self.down:
                self.warn(f"market: {self.where} is back; background work resumed")
                self.down = False
            self.sent += 1
            due[name] = now + interval

    def run(self) -> None:
        due: dict[str, float] = {}
        step = min(interval for _, interval in self.schedule) / 4
        while not self.stopped.is_set():
            self.tick(due)
            self.stopped.wait(max(0.05, step))


def listen(host: str, port: int) -> socket.socket:
    """The bound socket the API will serve on. Bound first, so a busy port ends `serve`
    with one line before it creates the board or starts the ticker."""
    from market.errors import ConfigError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on port {port} of {host}: {exc.strerror} (another "
                          "process holds it; pick another with --port)") from None
    sock.set_inheritable(True)
    return sock


def _serve(args: argparse.Namespace) -> int:
    level = getattr(logging, args.log_level.upper())
    configure_logging("market", fmt=args.log_format, level=level,
                      quarry_level=min(level, logging.INFO))
    settings = _load(args, host=args.host, port=args.port)
    sock = listen(settings.host, settings.port)
    try:
        return _serve_on(sock, settings, args)
    finally:
        sock.close()


def tick_schedule(settings: Any) -> list[tuple[str, float]]:
    """The ticker's tasks, in the order each tick sends them. The index task goes last: it
    follows the chain until another task is queued, so a task queued behind it in the same
    tick would stop it at once and leave the chain unfollowed until the next tick (new tasks
    then waited up to an index interval to be seen)."""
    from market.service import worker

    return [(worker.TASK_RECOMMEND, settings.index_interval_s),
            (worker.TASK_SWEEP, settings.sweep_interval_s),
            (worker.TASK_INDEX, settings.index_interval_s)]


def _serve_on(sock: socket.socket, settings: Any, args: argparse.Namespace) -> int:
    import uvicorn

    from market.service import worker
    from market.service.app import create_app

    app = create_app(settings)
    ticker: Ticker | None = None
    if not args.no_ticker:
        celery_app = worker.configure(settings)

        def send(name: str, expires: float) -> None:
            celery_app.send_task(name, expires=expires, retry=False)

        ticker = Ticker(tick_schedule(settings), send, where=f"Redis at {settings.redis_url}")
        ticker.start()
    say(f"market: serving {settings.url} (API docs {settings.url}/docs), board "
        f"{settings.board_name}, Redis {settings.redis_url}", logger="quarry.serve")
    # JSON: uvicorn's own loggers (uvicorn, uvicorn.error, uvicorn.access) get no handlers
    # of their own and go through the root's JSON one; text keeps uvicorn's look.
    extra: dict[str, Any] = {"log_config": None} if json_logs() else {}
    try:
        config = uvicorn.Config(app, host=settings.host, port=settings.port,
                                log_level=args.log_level, **extra)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if ticker is not None:
            ticker.stop()
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from market.errors import ConfigError
    from market.service.board import CHAIN_LAYOUT, STATE_VERSION, Board
    from market.service.boardsql import close_pools
    from market.service.migrate import copy_state

    settings = _load(args)
    source_path = args.from_sqlite
    if source_path is not None and not source_path.is_file():
        raise ConfigError(f"--from-sqlite {source_path}: no such file")
    if source_path is not None and not settings.database_url and \
            source_path.resolve() == settings.db_path.resolve():
        raise ConfigError(f"--from-sqlite {source_path} is the board itself: set "
                          "--database-url to the board it moves into")
    try:
        target = Board(settings.board_location)
        layout, version = target.upgraded_from
        print(f"market: board {settings.board_name}: chain layout {layout or 'none'} -> "
              f"{CHAIN_LAYOUT}, market state version {version} -> {STATE_VERSION}")
        if source_path is not None:
            gained = copy_state(Board(source_path), target)
            print(f"market: copied from {source_path}: " + ", ".join(
                f"{table} {n}" for table, n in gained.items())
                + " rows; the chain tables fill as the workers index")
    finally:
        close_pools()
    return 0


def _worker(args: argparse.Namespace) -> int:
    from market.errors import ConfigError

    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {args.concurrency}")
    # Checked here, then handed to the worker through the environment: its setup (see
    # `market.logs.celery_worker_logging`) reads it as Celery starts, as it does in a worker
    # started with `celery -A market.service.worker:celery_app worker`.
    os.environ[LOG_FORMAT_ENV] = log_format(args.log_format)
    settings = _load(args)
    os.environ.update(settings.to_env())  # pool processes and anything they start
    from market.service import worker

    celery_app = worker.configure(settings)
    name = args.name or f"quarry-{os.getpid()}@{socket.gethostname()}"
    pool = "solo" if args.concurrency == 1 else "prefork"
    celery_app.worker_main(["worker", f"--pool={pool}", f"--concurrency={args.concurrency}",
                            "-n", name, f"--loglevel={args.log_level.upper()}",
                            "--without-mingle", "--without-gossip"])
    return 0
