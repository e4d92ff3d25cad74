"""A private PostgreSQL server for the tests and the benchmark, as `processes.start_redis`
is for Redis: `initdb` into a fresh directory, then `postgres` in the foreground on a free
port of 127.0.0.1 (a managed process group, stopped with it, its directory removed).

Debian's `postgresql` package (which `make setup` installs) keeps the binaries in
/usr/lib/postgresql/<version>/bin, off PATH; both places are searched. PostgreSQL refuses
to run as root, so under root the server runs as the package's `postgres` user, in a
directory under the system's temporary directory that user can reach.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from market.local.processes import ManagedProcess, ProcessError, free_port, spawn

SERVER_USER = "postgres"
"""Who runs the server when we are root (the Debian package creates this user)."""


def postgres_bin(name: str) -> str | None:
    """The path of PostgreSQL's `name` binary (initdb, postgres), or None if absent."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit()
                      else 0)
    return versions[-1] if versions else None


def missing_binaries() -> list[str]:
    """The PostgreSQL binaries this module needs that are not installed."""
    return [name for name in ("initdb", "postgres") if postgres_bin(name) is None]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups",
            "--pdeathsig=SIGTERM", *cmd]


class PostgresServer:
    """A running private server: `url(db)`, `create_database()`, `stop()`."""

    def __init__(self, proc: ManagedProcess, directory: Path, port: int) -> None:
        self.proc, self.directory, self.port = proc, directory, port
        self._created = 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement)

    def create_database(self, prefix: str = "board") -> str:
        """A new empty database; its URL."""
        self._created += 1
        name = f"{prefix}_{self._created}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database of `url`, closing this process's pool for it first."""
        from market.service.boardsql import close_pools

        close_pools(url)
        name = url.rsplit("/", 1)[1]
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        try:
            self.proc.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres(*, durable: bool = False, timeout: float = 30.0,
                   die_with_parent: bool = True, max_connections: int = 200) -> PostgresServer:
    """A fresh server on a free port. `durable=False` (tests) turns fsync off; otherwise
    only commits are asynchronous, like the SQLite board's WAL with synchronous=NORMAL (a
    crash may lose the last commits, never corrupt the database)."""
    missing = missing_binaries()
    if missing:
        raise ProcessError(
            f"PostgreSQL is not installed ({', '.join(missing)} missing): run `make setup` (as "
            "root it installs it with apt-get), or `sudo apt-get install postgresql`")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise ProcessError(
                f"PostgreSQL refuses to run as root and there is no {SERVER_USER!r} user to "
                "run it as: install Debian's postgresql package (`make setup`), which "
                "creates it") from None
    directory = Path(tempfile.mkdtemp(prefix="quarry-pg-"))
    data = directory / "data"
    if os.geteuid() == 0:
        shutil.chown(directory, SERVER_USER, SERVER_USER)
    initdb = _as_server_user([str(postgres_bin("initdb")), "-D", str(data), "-U", SERVER_USER,
                              "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"])
    done = subprocess.run(initdb, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise ProcessError(f"initdb failed: {(done.stderr or done.stdout).strip()[-500:]}")
    settings = ["-c", "synchronous_commit=off", "-c", f"max_connections={max_connections}"]
    if not durable:
        settings += ["-c", "fsync=off", "-c", "full_page_writes=off"]
    for _ in range(3):
        port = free_port()
        cmd = _as_server_user([str(postgres_bin("postgres")), "-D", str(data), "-p", str(port),
                               "-h", "127.0.0.1", "-k", str(directory), *settings])
        proc = spawn(cmd, name=f"postgres :{port}", log_path=None, port=port,
                     die_with_parent=die_with_parent)
        server = PostgresServer(proc, directory, port)
        if _wait_ready(server, timeout):
            return server
        proc.stop()
    shutil.rmtree(directory, ignore_errors=True)
    raise ProcessError(f"PostgreSQL in {data} did not accept connections in {timeout:g} s")


def _wait_ready(server: PostgresServer, timeout: float) -> bool:
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.popen.poll() is not None:
            return False  # exited: most likely the port was taken
        try:
            with psycopg.connect(server.url(), connect_timeout=1):
                return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False
