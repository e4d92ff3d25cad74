"""`LocalStack`: a whole private market on one machine, for the demo, the end-to-end tests
and the benchmark.

    with LocalStack(home=tmpdir) as stack:
        stack.quarry.tasks...      # the contracts on a fresh Anvil
        MarketAPI(stack.market_url)

brings up redis-server and Anvil (contracts deployed and wired, the deployment file under
`home`) on free ports, then `market serve` and one Celery worker, all pointing at `home`.
With `postgres=True` (or `QUARRY_STACK_POSTGRES=1` in the environment, which runs every
stack-based test that way) the board is a private PostgreSQL server's database instead of
the SQLite file.
Everything it started is stopped on exit, on an error in the block, or on a failed start;
every child also dies with the thread that started it (Linux), so even a killed parent
leaves nothing behind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from market.errors import QuarryError
from market.local import processes
from market.local.processes import ManagedProcess, ProcessError
from market.service.settings import MarketSettings

T = TypeVar("T")

if TYPE_CHECKING:
    from market.chain.deploy import DeployParams, Quarry
    from market.chain.deployment import Deployment
    from market.chain.devnet import AnvilProcess
    from market.local.postgres import PostgresServer

# Anvil's last default account settles (finalize, reclaim, refund, expire...): the demo's roles
# (deployer 0, clients and miners from 1 up) never send from it, so nonces never clash.
SETTLER_ACCOUNT = 19
POSTGRES_ENV = "QUARRY_STACK_POSTGRES"
"""Set to 1: every LocalStack's board is on a private PostgreSQL (the market's tests too)."""


class LocalStack:
    """Redis + Anvil (deployed) + market + Celery worker(s), private to `home`.

    `market=False` leaves the market out (then nothing enqueues the background work: send
    the tasks yourself); `market_settings` adds to or overrides the market's settings
    (`MarketSettings` fields, limits say). `timings` records how long each part took to
    start (seconds).
    """

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 1,
        worker_concurrency: int = 1,
        market: bool = True,
        deploy_params: DeployParams | None = None,
        settler_account: int | None = SETTLER_ACCOUNT,
        index_interval_s: float = 0.25,
        sweep_interval_s: float = 1.0,
        heartbeat_ttl_s: float = 30.0,
        die_with_parent: bool = True,
        market_settings: Mapping[str, Any] | None = None,
        postgres: bool | None = None,
    ) -> None:
        if workers < 0:
            raise ProcessError(f"workers must be >= 0, got {workers}")
        self.home = Path(home).resolve()
        self.logs = self.home / "logs"
        self._workers_wanted = workers
        self._with_market = market
        self._concurrency = worker_concurrency
        self._deploy_params = deploy_params
        self._settler_account = settler_account
        self._intervals = (index_interval_s, sweep_interval_s, heartbeat_ttl_s)
        self._die = die_with_parent
        self._market_settings = dict(market_settings or {})
        if postgres is None:
            postgres = os.environ.get(POSTGRES_ENV, "") not in ("", "0")
        self._postgres = postgres
        self.postgres: PostgresServer | None = None
        self.redis: ManagedProcess | None = None
        self.anvil: AnvilProcess | None = None
        self.market: ManagedProcess | None = None
        self.workers: list[ManagedProcess] = []
        self.deployment: Deployment | None = None
        self.quarry: Quarry = None  # type: ignore[assignment]  # set by start()
        self.settings: MarketSettings = None  # type: ignore[assignment]
        self.timings: dict[str, float] = {}
        self._worker_seq = 0
        self._lock = threading.Lock()

    # -- addresses --------------------------------------------------------------------

    @property
    def market_url(self) -> str:
        return self.settings.url

    @property
    def rpc_url(self) -> str:
        assert self.anvil is not None, "the stack is not started"
        return self.anvil.rpc_url

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url

    # -- life cycle -------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalStack:
        """Start every part; on any failure stop what was started and re-raise."""
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = round(time.monotonic() - began, 3)
        return self

    def _start(self) -> None:
        from market.chain.client import Chain, anvil_account
        from market.chain.deploy import DEVNET_PARAMS, Quarry, deploy
        from market.chain.devnet import DEVNET_BLOCK_TIME, start_anvil

        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        # Redis and Anvil are independent: Redis boots while Anvil starts. (Both from this
        # thread: a child set to die with its parent dies with the thread that forked it.)
        self.redis = processes.start_redis(self.home / "redis", wait=False,
                                           die_with_parent=self._die)
        self.anvil = start_anvil(log_path=self.logs / "anvil.log", silent=True,
                                 die_with_parent=self._die, block_time=DEVNET_BLOCK_TIME)
        self.timings["anvil"] = round(time.monotonic() - t, 3)
        processes.wait_redis(self.redis)
        self.timings["redis"] = round(time.monotonic() - t, 3)
        board: dict[str, Any] = {}
        if self._postgres and "database_url" not in self._market_settings:
            from market.local.postgres import start_postgres

            self.postgres = start_postgres(die_with_parent=self._die)
            board["database_url"] = self.postgres.create_database("market")
            self.timings["postgres"] = round(time.monotonic() - t, 3)
        assert self.anvil is not None and self.redis is not None
        t = time.monotonic()
        chain = Chain(self.anvil.rpc_url)
        self.deployment, _ = deploy(chain, anvil_account(0), self._deploy_params or DEVNET_PARAMS)
        self.deployment.anvil_pid = self.anvil.pid
        self.deployment.anvil_log = str(self.logs / "anvil.log")
        self.deployment.save(self.home / "deployment.json")
        self.quarry = Quarry(self.deployment, chain)
        self.timings["deploy"] = round(time.monotonic() - t, 3)

        index_s, sweep_s, ttl_s = self._intervals
        settler = ""
        if self._settler_account is not None:
            settler = "0x" + bytes(anvil_account(self._settler_account).key).hex()
        self.settings = MarketSettings(**{
            "redis_url": self.redis.extra["url"], "deployment": self.home / "deployment.json",
            "store_dir": self.home / "store", "db_path": self.home / "board.sqlite",
            "host": "127.0.0.1", "port": processes.free_port(), "settler_key": settler,
            "index_interval_s": index_s, "sweep_interval_s": sweep_s,
            "heartbeat_ttl_s": ttl_s, **board, **self._market_settings})
        # The market and the workers import their stacks in parallel (seconds each).
        t = time.monotonic()
        workers = [self._spawn_worker(wait=False) for _ in range(self._workers_wanted)]
        if self._with_market:
            self.market = self._start_market_with_retry()
        for w in workers:
            processes.wait_worker(w, self.settings.redis_url)
        self.timings["market+workers"] = round(time.monotonic() - t, 3)

    def _start_market_with_retry(self) -> ManagedProcess:
        """The free port picked for the market can be taken before it binds: try others."""
        for attempt in range(3):
            try:
                return processes.start_market(self.settings, log_path=self.logs / "market.log",
                                              die_with_parent=self._die, env=self._env())
            except ProcessError as exc:
                if attempt == 2 or "address already in use" not in str(exc).lower():
                    raise
                self.settings = self.settings.replace(port=processes.free_port())
        raise AssertionError("unreachable")

    def _spawn_worker(self, *, wait: bool, concurrency: int | None = None) -> ManagedProcess:
        with self._lock:
            self._worker_seq += 1
            seq = self._worker_seq
        name = f"quarry-w{seq}-{os.getpid()}"
        proc = processes.start_worker(
            self.settings, concurrency=concurrency or self._concurrency, name=name,
            log_path=self.logs / f"worker{seq}.log", wait=wait, die_with_parent=self._die,
            env=self._env())
        self.workers.append(proc)
        return proc

    def _env(self) -> dict[str, str]:
        """The children's QUARRY_HOME is the stack's, so nothing falls back to ./.quarry."""
        return {"QUARRY_HOME": str(self.home)}

    # -- operations the tests and the demo use -----------------------------------------

    def add_worker(self, concurrency: int | None = None) -> ManagedProcess:
        """One more Celery worker on the same Redis, board and deployment; returns once it
        consumes tasks."""
        self._require_started()
        return self._spawn_worker(wait=True, concurrency=concurrency)

    def stop_worker(self, proc: ManagedProcess) -> None:
        proc.stop()
        self.workers.remove(proc)

    def restart_market(self) -> None:
        """Stop the market and start it again on the same port (its state is rebuilt from
        the SQLite board and the chain)."""
        self._require_started()
        if not self._with_market:
            raise QuarryError("this LocalStack runs without a market (market=False)")
        if self.market is not None:
            self.market.stop()
            self.market = None
        self.market = processes.start_market(self.settings, log_path=self.logs / "market.log",
                                             die_with_parent=self._die, env=self._env())

    def restart_redis(self, down_s: float = 0.0) -> None:
        """Stop Redis (losing every queued task and lock: it keeps nothing on disk), leave
        it down `down_s` seconds, and start it again on the same port; the market and the
        workers reconnect by themselves."""
        self._require_started()
        assert self.redis is not None
        port = self.redis.port
        self.redis.stop()
        time.sleep(down_s)
        self.redis = processes.start_redis(self.home / "redis", port,
                                           die_with_parent=self._die)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every process's log, for an error message."""
        return "\n".join(f"--- {p.name}\n" + "\n".join(
            p.read_text(errors="replace").splitlines()[-lines:])
            for p in sorted(self.logs.glob("*.log")))

    def wait_until(self, predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
        """Poll `predicate()` until it is truthy and return it; on timeout raise
        ProcessError naming `what`, with every log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise ProcessError(f"timed out after {timeout:g} s waiting for {what}\n"
                                   + self.log_tails())
            time.sleep(0.1)

    def pids(self) -> list[int]:
        """Every live process this stack started, children included."""
        leaders = [p.pid for p in (self.redis, self.market, *self.workers) if p is not None]
        if self.anvil is not None:
            leaders.append(self.anvil.pid)
        return sorted({pid for leader in leaders for pid in processes.group_pids(leader)})

    def stop(self) -> None:
        """Stop everything started (workers, market, Redis, Anvil); idempotent. Raises the
        first failure to stop after trying every part."""
        failures: list[BaseException] = []
        parts: list[Any] = [*reversed(self.workers), self.market, self.redis, self.anvil,
                            self.postgres]
        for part in parts:
            if part is None:
                continue
            try:
                part.stop()
            except BaseException as exc:  # try every part before reporting
                failures.append(exc)
        self.workers = []
        self.market = self.redis = None
        self.anvil = None
        self.postgres = None
        if failures:
            raise failures[0]

    def _require_started(self) -> None:
        if self.settings is None or self.anvil is None:
            raise QuarryError("the LocalStack is not started (use `with LocalStack(...)`)")
