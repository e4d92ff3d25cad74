"""Managed child processes: private redis-server, the market (`market serve`) and Celery
workers, each in its own process group with a log file, stopped as a whole group.

Used by `LocalStack` (the demo, the end-to-end tests, the benchmark). The devnet's process
handling (`market.chain.devnet`: free ports, die-with-parent) is reused here, not copied.
Kept free of web3 and Celery at import time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from market.chain.devnet import _die_with_parent, _log_tail, _port_in_use, free_port
from market.config import PROJECT_ROOT
from market.errors import QuarryError

if TYPE_CHECKING:
    from market.service.settings import MarketSettings

__all__ = [
    "ManagedProcess",
    "ProcessError",
    "free_port",
    "group_pids",
    "spawn",
    "start_market",
    "start_redis",
    "start_worker",
    "wait_market",
    "wait_redis",
    "wait_worker",
    "worker_nodename",
]


class ProcessError(QuarryError):
    """A managed process could not be started, did not become ready, or did not stop."""


@dataclass
class ManagedProcess:
    """One child process leading its own process group (so its children stop with it)."""

    name: str
    cmd: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path | None = None
    port: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        return _log_tail(self.log_path, lines)

    def group(self) -> list[int]:
        """Pids of every live process in this process's group (the leader and its children)."""
        return group_pids(self.pid)

    def check_running(self) -> None:
        if not self.alive():
            raise ProcessError(f"{self.name} (pid {self.pid}) exited with code "
                               f"{self.popen.returncode}" + self.log_tail())

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the whole group, then SIGKILL what lingers; reaps the leader."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.popen.poll()
                if not group_pids(self.pid) and self.popen.poll() is not None:
                    return
                time.sleep(0.05)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ProcessError(f"{self.name} (pid {self.pid}) did not stop") from exc
        left = group_pids(self.pid)
        if left:
            raise ProcessError(f"{self.name}: processes {left} of its group did not stop")

    def wait_ready(self, probe: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll `probe` until it answers True; fail early (with the log tail) if the process
        exits, or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            try:
                if probe():
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise ProcessError(f"{self.name} (pid {self.pid}) did not answer on {what} "
                                   f"within {timeout:g}s" + self.log_tail())
            time.sleep(0.05)

    def wait_port(self, port: int, timeout: float = 20.0) -> None:
        self.wait_ready(lambda: _port_in_use(port), f"127.0.0.1:{port}", timeout)

    def wait_http(self, url: str, timeout: float = 30.0) -> None:
        self.wait_ready(lambda: http_ok(url), url, timeout)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is `pgid`, read from /proc."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # fields: state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether `url` answers 200 to a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status) == 200
    except urllib.error.HTTPError:
        return False
    except (OSError, ValueError):
        return False


def spawn(
    cmd: Sequence[str],
    *,
    name: str,
    log_path: Path | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    port: int | None = None,
    die_with_parent: bool = True,
) -> ManagedProcess:
    """Start `cmd` in a new session (its own process group), stdout and stderr appended to
    `log_path`. `die_with_parent`: the kernel sends it SIGTERM if the thread that started
    it dies (so a crashed test or demo leaves nothing behind); hence start long-lived
    children from a long-lived thread (the main one), never from a short-lived pool."""
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        popen = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            close_fds=True, preexec_fn=_die_with_parent if die_with_parent else None,
        )
    except OSError as exc:
        raise ProcessError(f"cannot start {name} ({cmd[0]}): {exc}") from exc
    finally:
        if log is not subprocess.DEVNULL:
            log.close()  # type: ignore[union-attr]
    return ManagedProcess(name, list(cmd), popen, log_path, port)


# -- Redis --------------------------------------------------------------------------------


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise ProcessError(
            "redis-server is not installed: run `make setup` (as root it installs it with "
            "apt-get), or `sudo apt-get install redis-server`")
    return found


def redis_ping(port: int, timeout: float = 1.0) -> bool:
    """Whether a Redis on 127.0.0.1:`port` answers PING with PONG."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


def start_redis(
    directory: Path, port: int | None = None, *, wait: bool = True, timeout: float = 10.0,
    die_with_parent: bool = True,
) -> ManagedProcess:
    """A private, non-persistent redis-server on 127.0.0.1 (`port`, or a free one), its
    working files and log in `directory`. A chosen port already in use fails at once; a
    free port taken by someone else before Redis binds it is retried. With `wait=False`
    it returns at once (call `wait_redis`), so other processes can start meanwhile."""
    binary = redis_binary()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if port is not None and _port_in_use(port):
        raise ProcessError(f"cannot start Redis: port {port} is already in use on 127.0.0.1")
    attempts = 1 if port is not None or not wait else 3
    error: ProcessError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port()
        cmd = [binary, "--bind", "127.0.0.1", "--port", str(chosen), "--save", "",
               "--appendonly", "no", "--dir", str(directory), "--daemonize", "no",
               "--loglevel", "warning"]
        proc = spawn(cmd, name=f"redis-server :{chosen}", log_path=directory / "redis.log",
                     port=chosen, die_with_parent=die_with_parent)
        proc.extra["url"] = f"redis://127.0.0.1:{chosen}/0"
        if not wait:
            return proc
        try:
            wait_redis(proc, timeout)
            return proc
        except ProcessError as exc:
            error = exc
            proc.stop()
    assert error is not None
    raise error


def wait_redis(proc: ManagedProcess, timeout: float = 10.0) -> None:
    """Wait until the Redis `proc` answers PING (stopping it if it never does)."""
    assert proc.port is not None
    port = proc.port
    try:
        proc.wait_ready(lambda: redis_ping(port), proc.extra["url"], timeout)
    except BaseException:
        proc.stop()
        raise


# -- the market and its workers -----------------------------------------------------------


def _child_env(settings: MarketSettings, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env.update(settings.to_env())
    env["PYTHONUNBUFFERED"] = "1"
    # The children import `market` from this checkout even when it is not installed.
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
    return env


def start_market(
    settings: MarketSettings, *, log_path: Path | None = None, timeout: float = 60.0,
    die_with_parent: bool = True, env: Mapping[str, str] | None = None, wait: bool = True,
) -> ManagedProcess:
    """`market serve` (the FastAPI app plus the ticker that enqueues the background work)
    on `settings.host:port`, with `settings` (and `env`) passed in the environment; returns
    once `/health` answers (with `wait=False` at once: call `wait_market`, so several
    replicas start together)."""
    cmd = [sys.executable, "-m", "market.cli", "serve"]
    proc = spawn(cmd, name=f"market {settings.url}", log_path=log_path,
                 env=_child_env(settings, env), cwd=PROJECT_ROOT, port=settings.port,
                 die_with_parent=die_with_parent)
    if wait:
        wait_market(proc, settings, timeout)
    return proc


def wait_market(proc: ManagedProcess, settings: MarketSettings, timeout: float = 60.0) -> None:
    """Wait until the market `proc` answers `/health` (stopping it if it never does)."""
    try:
        proc.wait_http(f"{settings.url}/health", timeout)
    except BaseException:
        proc.stop()
        raise


def worker_nodename(name: str) -> str:
    """Celery's node name for a worker started with `-n name`."""
    return name if "@" in name else f"{name}@{socket.gethostname()}"


def start_worker(
    settings: MarketSettings, *, concurrency: int = 1, name: str | None = None,
    log_path: Path | None = None, wait: bool = True, timeout: float = 60.0,
    die_with_parent: bool = True, env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """A Celery worker of `market.service.worker:celery_app` (solo pool for one task at a
    time, prefork above), named uniquely; with `wait`, returns once it answers a ping over
    the broker, i.e. it consumes tasks."""
    if concurrency < 1:
        raise ProcessError(f"worker concurrency must be at least 1, got {concurrency}")
    node = worker_nodename(name or f"quarry-{os.getpid()}-{time.monotonic_ns()}")
    pool = ["--pool=solo", "--concurrency=1"] if concurrency == 1 else ["--pool=prefork",
                                                     f"--concurrency={concurrency}"]
    cmd = [sys.executable, "-m", "celery", "-A", "market.service.worker:celery_app", "worker",
           *pool, "-n", node, "--loglevel=WARNING", "--without-mingle", "--without-gossip"]
    proc = spawn(cmd, name=f"celery worker {node}", log_path=log_path,
                 env=_child_env(settings, env), cwd=PROJECT_ROOT,
                 die_with_parent=die_with_parent)
    proc.extra["node"] = node
    if wait:
        try:
            wait_worker(proc, settings.redis_url, timeout)
        except BaseException:
            proc.stop()
            raise
    return proc


def wait_worker(proc: ManagedProcess, redis_url: str, timeout: float = 60.0) -> None:
    """Wait until the worker `proc` answers a remote-control ping through `redis_url`."""
    from celery import Celery  # Celery only where a worker is awaited

    node = proc.extra["node"]
    app = Celery("quarry-ping", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True

    def answers() -> bool:
        try:
            return bool(app.control.ping(destination=[node], timeout=0.3))
        except Exception:  # Redis not reachable yet: kombu and redis-py raise their own types
            return False

    try:
        proc.wait_ready(answers, f"a ping to {node} via {redis_url}", timeout)
    finally:
        app.close()
