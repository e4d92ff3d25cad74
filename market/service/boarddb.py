"""What the board's three parts share: the database's transactions (`market.service.boardsql`:
a SQLite file or PostgreSQL), the small `meta` table, the board's errors and the value
helpers (addresses, modelIds, clamped times).

Any number of processes (the FastAPI apps, every Celery worker) and threads share the
database safely. Wei amounts are stored as decimal text (they overflow 64-bit integers);
times are integers (uint64 values beyond 2**63-1 are clamped, which changes no comparison
with a real clock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.errors import QuarryError
from market.service.boardsql import Conn, Database, SqliteDatabase

if TYPE_CHECKING:
    from market.chain.deploy import Quarry

STATE_NAMES = ("Open", "Claimed", "Submitted", "Disputed", "Finalized", "Refunded")
"""TaskRegistry's ShardState names, by value (market.chain.contracts.ShardState)."""
OPEN, CLAIMED, SUBMITTED, DISPUTED, FINALIZED, REFUNDED = range(6)
DISPUTE_STATUS = ("None", "Open", "MinerAtFault", "MinerNotAtFault", "Expired")
CHALLENGE_STATUS = ("None", "Open", "Answered", "Unanswered")
"""Arbitration's ChallengeStatus names, by value (market.chain.contracts.ChallengeStatus)."""
D_OPEN, D_EXPIRED = 1, 4
C_OPEN, C_ANSWERED, C_UNANSWERED = 1, 2, 3
ZERO_ADDRESS = "0x" + "00" * 20
I64_MAX = 2**63 - 1
KEPT_META = "('schema', 'state_version')"
"""The meta keys a chain reset keeps (the layouts), as an SQL list."""


class BoardError(QuarryError):
    """The board cannot follow the chain (reset, another deployment) or got bad input."""


class MessageConflict(BoardError):
    """A committee message under an (author, kind, epoch, topic) already holding another."""


def deployment_identity(q: Quarry) -> str:
    """What tells one deployment from another: chain id, contract addresses, deploy block.
    The board is built for one; messages and offers are filed under theirs."""
    return (f"{q.deployment.chain_id}:{q.tasks.address}:{q.gpu.address}:"
            f"{q.arbitration.address}:{q.deployment.deploy_block}")


def _i64(value: int) -> int:
    return min(int(value), I64_MAX)


def _hex(value: bytes) -> str:
    return "0x" + bytes(value).hex()


def _addr(value: str | None) -> str | None:
    """A checksummed address, or None for the zero address."""
    from eth_utils import to_checksum_address

    if not value or int(value, 16) == 0:
        return None
    return str(to_checksum_address(value))


def checksum(address: str, what: str = "address") -> str:
    """`address` checksummed; BoardError naming `what` when it is not an address."""
    from eth_utils import is_address, to_checksum_address

    if not isinstance(address, str) or not is_address(address):
        raise BoardError(f"{what} {address!r} is not an address (0x + 40 hex digits)")
    return str(to_checksum_address(address))


def model_id_bytes(model_id: str | bytes) -> bytes:
    """A modelId as 32 bytes from `0x` + 64 hex digits; BoardError naming a malformed one."""
    if isinstance(model_id, bytes):
        raw = model_id
    else:
        text = str(model_id).lower().removeprefix("0x")
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
    if len(raw) != 32:
        raise BoardError(f"modelId {model_id!r} is not 32 bytes (0x + 64 hex digits)")
    return raw


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return _hex(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _range(task: Any, shard: int) -> tuple[int, int]:
    start = shard * task["shard_size"]
    return start, min(start + task["shard_size"], task["num_requests"])


class BoardBase:
    """The board's database (`market.service.boardsql`); `Board` opens (and migrates) it."""

    db: Database

    @property
    def db_path(self) -> Path:
        """The SQLite file (BoardError for a board on PostgreSQL, which has none)."""
        if isinstance(self.db, SqliteDatabase):
            return self.db.path
        raise BoardError(f"board {self.where} is not a SQLite file")

    @property
    def where(self) -> str:
        """The database, for messages: a SQLite file's path or a URL without password."""
        return self.db.where

    # ------------------------------------------------------------------ connections
    @contextmanager
    def _read(self) -> Iterator[Conn]:
        held = self._held().conn
        if held is not None:  # inside snapshot(): the same read transaction
            yield held
            return
        with self.db.read() as conn:
            yield conn

    def _held(self) -> threading.local:
        """This thread's snapshot connection, if any (per board, created on first use)."""
        local = self.__dict__.setdefault("_snapshot_local", threading.local())
        if not hasattr(local, "conn"):
            local.conn = None
        return local

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read in this thread inside the block sees one state of the database (one
        read transaction), so a page drawn from several queries is never part before and
        part after an indexed batch of blocks."""
        local = self._held()
        if local.conn is not None:
            yield
            return
        with self.db.snapshot() as conn:
            local.conn = conn
            try:
                yield
            finally:
                local.conn = None

    @contextmanager
    def _write(self, *, alone: bool = True) -> Iterator[Conn]:
        """One write transaction; writers take turns instead of failing. `alone=False` for
        a single upsert that reads nothing first: on PostgreSQL it need not wait its turn."""
        with self.db.write(alone=alone) as conn:
            yield conn

    @staticmethod
    def _meta(conn: Conn, key: str) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def _set_meta(conn: Conn, key: str, value: Any) -> None:
        conn.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                     "value=excluded.value", (key, str(value)))
