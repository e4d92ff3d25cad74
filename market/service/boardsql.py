"""The two databases the board runs on, behind one small interface: a SQLite file (the
default, for one host) or PostgreSQL (`postgresql://...`, for replicas on several hosts).

The board's SQL is written once, in the subset both accept (`?` parameters, `ON CONFLICT`
upserts, `RETURNING`); `Database.read()`, `.write()` and `.snapshot()` hand out a `Conn`
that translates it for PostgreSQL (`%s` parameters; INTEGER/REAL columns as BIGINT/DOUBLE
PRECISION, an AUTOINCREMENT key as BIGSERIAL) and gives rows readable by name and index
on both. Transactions mean the same on both:

- a write is one transaction and writers take turns (SQLite: `BEGIN IMMEDIATE` on the file
  lock; PostgreSQL: a transaction-scoped advisory lock, so a read-modify-write such as the
  indexer's cursor check or a plan's version check is as safe across hosts as SQLite's
  file lock is on one host). A write that is one upsert reading nothing first
  (`write(alone=False)`: heartbeats, offers, swarm joins...) skips the turn on PostgreSQL,
  whose row locks order it, so it never queues behind an indexed chunk;
- a read never blocks a write nor waits for one (WAL; MVCC), and `snapshot()` is one
  consistent state for several queries (a WAL read transaction; REPEATABLE READ).

PostgreSQL connections come from one small pool per process (created after a fork, so
Celery's prefork children never share a parent's sockets).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from market.errors import QuarryError

WRITE_LOCK = 0x5155_4152
"""The advisory lock id PostgreSQL writers take (per database: two boards never meet)."""
POOL_MAX = 16
"""PostgreSQL connections one process holds at most (FastAPI's threads queue past it)."""
POOL_TIMEOUT_S = 30.0
"""How long a caller waits for a pooled connection (SQLite's busy timeout is the same)."""


class DatabaseUnusable(QuarryError):
    """The database cannot be reached or opened (a 503 from the API; opening a board says
    BoardError)."""


def one_line(exc: BaseException) -> str:
    """The driver's message on one line (libpq adds hints on lines of their own)."""
    return " ".join(str(exc).split())


def is_postgres(location: str | Path) -> bool:
    """Whether `location` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """`url` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


class Row(tuple[Any, ...]):
    """A PostgreSQL row read by column name or index, like `sqlite3.Row`."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault(name, i)  # the first of duplicated names, as sqlite3.Row
    return type("Row", (Row,), {"__slots__": (), "_index": index})


def _row_factory(cursor: Any) -> Any:
    if cursor.description is None:
        return tuple
    return _row_class(tuple(c.name for c in cursor.description))


_AUTOINCREMENT = re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", re.I)
_INTEGER = re.compile(r"\bINTEGER\b", re.I)
_REAL = re.compile(r"\bREAL\b", re.I)


@lru_cache(maxsize=1024)
def postgres_sql(sql: str) -> str:
    """The board's SQL as PostgreSQL takes it: `%s` parameters and, in a CREATE TABLE,
    64-bit integers and doubles (PostgreSQL's INTEGER and REAL are 32-bit)."""
    if sql.lstrip().upper().startswith("CREATE TABLE"):
        sql = _AUTOINCREMENT.sub("BIGSERIAL PRIMARY KEY", sql)
        sql = _REAL.sub("DOUBLE PRECISION", _INTEGER.sub("BIGINT", sql))
    return sql.replace("?", "%s")


class Conn:
    """One connection (in a transaction or not) taking the board's SQL on either database."""

    def __init__(self, raw: Any, postgres: bool) -> None:
        self.raw, self.postgres = raw, postgres

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; the cursor (fetchone, fetchall, rowcount, iteration)."""
        if self.postgres:
            return self.raw.execute(postgres_sql(sql), tuple(params))
        return self.raw.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        if self.postgres:
            with self.raw.cursor() as cur:
                cur.executemany(postgres_sql(sql), [tuple(r) for r in rows])
        else:
            self.raw.executemany(sql, rows)

    def user_version(self) -> int:
        """The market state's schema version (SQLite's user_version; a meta key on
        PostgreSQL, which has no such header)."""
        if not self.postgres:
            return int(self.raw.execute("PRAGMA user_version").fetchone()[0])
        row = self.execute("SELECT value FROM meta WHERE key='state_version'").fetchone()
        return 0 if row is None else int(row[0])

    def set_user_version(self, version: int) -> None:
        if not self.postgres:
            self.raw.execute(f"PRAGMA user_version = {int(version)}")
            return
        self.execute("INSERT INTO meta VALUES ('state_version', ?) ON CONFLICT (key) DO "
                     "UPDATE SET value=excluded.value", (str(int(version)),))


def upsert(conn: Conn, table: str, key: Sequence[str], columns: Sequence[str],
           values: Sequence[Any]) -> None:
    """Insert a row or overwrite every column of the one under the same `key` (SQLite's
    INSERT OR REPLACE, which PostgreSQL lacks): list every column a replace must reset."""
    sets = ", ".join(f"{c}=excluded.{c}" for c in columns if c not in key)
    conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                 f"({', '.join('?' * len(columns))}) ON CONFLICT ({', '.join(key)}) "
                 f"DO UPDATE SET {sets}", values)


class Database:
    """Where the board lives: `read()`, `write()` and `snapshot()` (see the module doc)."""

    postgres = False
    where = ""

    @contextmanager
    def read(self) -> Iterator[Conn]:
        raise NotImplementedError

    @contextmanager
    def write(self, *, alone: bool = True) -> Iterator[Conn]:
        raise NotImplementedError

    @contextmanager
    def snapshot(self) -> Iterator[Conn]:
        raise NotImplementedError

    def open(self) -> None:
        """Ready the database for its first transaction (SQLite: WAL mode)."""

    def errors(self) -> tuple[type[Exception], ...]:
        """The driver's errors that say the database itself is unusable or corrupt."""
        return (sqlite3.DatabaseError,)

    def tables(self) -> list[str]:
        """The tables the database holds (what `market migrate` inspects)."""
        raise NotImplementedError


class SqliteDatabase(Database):
    """A SQLite file: WAL, one connection per call, IMMEDIATE write transactions."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.where = str(self.path)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise DatabaseUnusable(str(exc)) from exc
        return conn

    def open(self) -> None:
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise DatabaseUnusable(str(exc)) from exc
        finally:
            conn.close()

    @contextmanager
    def read(self) -> Iterator[Conn]:
        conn = self._connect()
        try:
            yield Conn(conn, False)
        finally:
            conn.close()

    @contextmanager
    def snapshot(self) -> Iterator[Conn]:
        conn = self._connect()
        try:
            conn.execute("BEGIN")
            yield Conn(conn, False)
        finally:
            conn.close()  # ends the read transaction (nothing was written)

    @contextmanager
    def write(self, *, alone: bool = True) -> Iterator[Conn]:
        """One IMMEDIATE transaction: writers queue on the file lock instead of failing
        (every write is `alone` on a file)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield Conn(conn, False)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def tables(self) -> list[str]:
        with self.read() as conn:
            return [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND "
                "name NOT LIKE 'sqlite_%' ORDER BY name")]


_pools: dict[tuple[str, int], Any] = {}
_pools_lock = threading.Lock()


class PostgresDatabase(Database):
    """A PostgreSQL database: pooled autocommit connections; writers serialized by a
    transaction-scoped advisory lock; snapshots in REPEATABLE READ."""

    postgres = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redacted(url)

    def errors(self) -> tuple[type[Exception], ...]:
        import psycopg

        return (psycopg.Error,)

    def _pool(self) -> Any:
        key = (self.url, os.getpid())
        pool = _pools.get(key)
        if pool is not None:
            return pool
        with _pools_lock:
            pool = _pools.get(key)
            if pool is None:
                import psycopg
                from psycopg_pool import ConnectionPool

                try:  # one plain connection first: a bad URL fails now, not after the timeout
                    psycopg.connect(self.url, connect_timeout=10).close()
                except psycopg.Error as exc:
                    raise DatabaseUnusable(f"cannot connect: {one_line(exc)}") from exc

                pool = ConnectionPool(
                    self.url, min_size=1, max_size=POOL_MAX, timeout=POOL_TIMEOUT_S,
                    kwargs={"autocommit": True, "row_factory": _row_factory},
                    name=f"quarry-board-{os.getpid()}", open=False)
                try:
                    pool.open(wait=True, timeout=POOL_TIMEOUT_S)
                except Exception as exc:
                    pool.close()
                    raise DatabaseUnusable(f"cannot connect: {one_line(exc)}") from exc
                _pools[key] = pool
        return pool

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            with self._pool().connection() as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise DatabaseUnusable(str(exc)) from exc

    @contextmanager
    def read(self) -> Iterator[Conn]:
        with self._connection() as conn:
            yield Conn(conn, True)

    @contextmanager
    def snapshot(self) -> Iterator[Conn]:
        with self._connection() as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield Conn(conn, True)
            finally:
                conn.execute("ROLLBACK")

    @contextmanager
    def write(self, *, alone: bool = True) -> Iterator[Conn]:
        """One READ COMMITTED transaction, holding the board's write lock when `alone`: each
        statement after the lock sees every earlier writer's commit."""
        with self._connection() as conn, conn.transaction():
            if alone:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield Conn(conn, True)

    def tables(self) -> list[str]:
        with self.read() as conn:
            return [r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "ORDER BY tablename")]


def open_database(location: str | Path) -> Database:
    """The database at `location`: a `postgresql://` URL, else a SQLite file's path."""
    if is_postgres(location):
        return PostgresDatabase(str(location))
    return SqliteDatabase(Path(location))


def close_pools(url: str | None = None) -> None:
    """Close this process's PostgreSQL pools (of `url` only, when given): a database about
    to be dropped, or a command that is done."""
    with _pools_lock:
        for key in [k for k in _pools if k[1] == os.getpid() and url in (None, k[0])]:
            _pools.pop(key).close()
