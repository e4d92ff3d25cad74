"""The gateway's files and batches in one SQLite file, so a restart loses nothing; the files'
bytes beside it, one file each under `files/` (named by file id), so neither an upload nor
a download holds a whole file in memory.

A batch row holds everything the runner needs to pick a batch up again after a restart: its
state, its task id once the task exists, and (between the upload and the `createTask`
receipt) the block it started submitting at with the input root it submits, so a batch cut
off mid-submission is found on-chain instead of paid for twice. The layout is versioned with
`PRAGMA user_version` and upgraded at open by `MIGRATIONS` (append, never edit).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from market.config import quarry_home
from market.errors import QuarryError

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""States the runner still moves; the others are final."""
_JSON_COLUMNS = ("metadata", "errors", "quarry")


class StoreError(QuarryError):
    """The gateway's database cannot be used (newer layout, unreadable file)."""


def default_path() -> Path:
    """`$QUARRY_HOME/gateway/gateway.sqlite`."""
    return quarry_home() / "gateway" / "gateway.sqlite"


def _v1_baseline(conn: sqlite3.Connection, files_dir: Path) -> None:
    conn.execute("""CREATE TABLE files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, filename TEXT NOT NULL,
        purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
        data BLOB NOT NULL)""")
    conn.execute("""CREATE TABLE batches (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
        endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL,
        metadata TEXT, status TEXT NOT NULL, model TEXT, created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER,
        completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER,
        cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT, errors TEXT,
        total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        task_id INTEGER, submit_block INTEGER, input_root TEXT, quarry TEXT)""")
    conn.execute("CREATE INDEX batches_status ON batches (status)")


def _v2_files_on_disk(conn: sqlite3.Connection, files_dir: Path) -> None:
    """Files move out of their BLOBs into `files_dir` (written before the BLOB is emptied,
    so a crash in between leaves the row whole and the next open writes it again)."""
    files_dir.mkdir(parents=True, exist_ok=True)
    for file_id, data in conn.execute("SELECT id, data FROM files WHERE length(data) > 0"):
        os.replace(_temp_file(files_dir, bytes(data)), files_dir / file_id)
    conn.execute("UPDATE files SET data = x''")


MIGRATIONS: tuple[Callable[[sqlite3.Connection, Path], None], ...] = (
    _v1_baseline, _v2_files_on_disk)
"""Migration k takes the database from version k to k + 1; append, never edit."""
VERSION = len(MIGRATIONS)


class GatewayStore:
    """Files and batches; every method is one short transaction (safe from any thread)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.files_dir = self.path.parent / "files"
        self._lock = threading.Lock()
        try:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False,
                                         isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            with self._tx() as conn:
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if version > VERSION:
                    raise StoreError(f"gateway database {self.path} has layout version "
                                     f"{version}, newer than this gateway's {VERSION}: "
                                     "upgrade quarry")
                for step in MIGRATIONS[version:]:
                    step(conn, self.files_dir)
                conn.execute(f"PRAGMA user_version = {VERSION}")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the gateway database {self.path}: {exc}") from exc

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # ------------------------------------------------------------------ files
    def add_file(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        """A file the gateway wrote itself (a batch's output or errors)."""
        return self.add_file_from(_temp_file(self.files_dir, data), filename, purpose,
                                  len(data))

    def add_file_from(self, path: Path, filename: str, purpose: str,
                      size: int) -> dict[str, Any]:
        """A file whose bytes are already on disk at `path` (an upload, same filesystem):
        moved under `files_dir`, then listed."""
        file_id, now = f"file-{secrets.token_hex(12)}", int(time.time())
        try:
            os.replace(path, self.files_dir / file_id)
            with self._tx() as conn:
                conn.execute("INSERT INTO files (id, filename, purpose, bytes, created_at, "
                             "data) VALUES (?, ?, ?, ?, ?, x'')",
                             (file_id, filename, purpose, int(size), now))
        except BaseException:
            path.unlink(missing_ok=True)
            (self.files_dir / file_id).unlink(missing_ok=True)
            raise
        return {"id": file_id, "filename": filename, "purpose": purpose, "bytes": int(size),
                "created_at": now}

    def file(self, file_id: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            r = conn.execute("SELECT id, filename, purpose, bytes, created_at FROM files "
                             "WHERE id = ?", (file_id,)).fetchone()
        return None if r is None else dict(r)

    def file_path(self, file_id: str) -> Path | None:
        """Where a listed file's bytes are (None for an unknown id)."""
        return None if self.file(file_id) is None else self.files_dir / file_id

    def file_data(self, file_id: str) -> bytes | None:
        path = self.file_path(file_id)
        return None if path is None else path.read_bytes()

    def files(self, *, purpose: str | None, after: str | None, limit: int,
              ascending: bool) -> tuple[list[dict[str, Any]], bool]:
        """A page of files in upload order (or its reverse) after the file `after`, and
        whether more follow. `after` must exist (KeyError otherwise)."""
        return self._page("files", "id, filename, purpose, bytes, created_at",
                          "purpose = ?" if purpose else None, (purpose,) if purpose else (),
                          after, limit, ascending)

    def delete_file(self, file_id: str) -> bool:
        with self._tx() as conn:
            deleted = conn.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0
        if deleted:
            (self.files_dir / file_id).unlink(missing_ok=True)
        return deleted

    # ------------------------------------------------------------------ batches
    def add_batch(self, **fields: Any) -> dict[str, Any]:
        fields = {"id": f"batch_{secrets.token_hex(12)}", "status": "validating",
                  "created_at": int(time.time()), **fields}
        cols = ", ".join(fields)
        with self._tx() as conn:
            conn.execute(f"INSERT INTO batches ({cols}) VALUES "
                         f"({', '.join('?' * len(fields))})",
                         [_encode(k, v) for k, v in fields.items()])
        batch = self.batch(fields["id"])
        assert batch is not None
        return batch

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            r = conn.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if r is None else _decode(r)

    def batches(self, *, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """A page of batches, newest first (as OpenAI lists them), after batch `after`."""
        return self._page("batches", "*", None, (), after, limit, ascending=False)

    def active_batches(self) -> list[dict[str, Any]]:
        with self._tx() as conn:
            rows = conn.execute(f"SELECT * FROM batches WHERE status IN "
                                f"({', '.join('?' * len(ACTIVE))}) ORDER BY seq",
                                ACTIVE).fetchall()
        return [_decode(r) for r in rows]

    def update_batch(self, batch_id: str, *, only_if: str | None = None,
                     **fields: Any) -> bool:
        """Set `fields`; with `only_if`, only while the batch is in that state (so a cancel
        and the runner cannot overwrite each other's state). Returns whether it changed."""
        sets = ", ".join(f"{k} = ?" for k in fields)
        where, args = "id = ?", [batch_id]
        if only_if is not None:
            where, args = "id = ? AND status = ?", [batch_id, only_if]
        with self._tx() as conn:
            cur = conn.execute(f"UPDATE batches SET {sets} WHERE {where}",
                               [*(_encode(k, v) for k, v in fields.items()), *args])
            return cur.rowcount > 0

    def _page(self, table: str, cols: str, where: str | None, args: tuple[Any, ...],
              after: str | None, limit: int, ascending: bool
              ) -> tuple[list[dict[str, Any]], bool]:
        clauses, params = ([where], list(args)) if where else ([], [])
        with self._tx() as conn:
            if after is not None:
                r = conn.execute(f"SELECT seq FROM {table} WHERE id = ?", (after,)).fetchone()
                if r is None:
                    raise KeyError(after)
                clauses.append("seq > ?" if ascending else "seq < ?")
                params.append(int(r[0]))
            sql = (f"SELECT {cols} FROM {table}"
                   + (f" WHERE {' AND '.join(clauses)}" if clauses else "")
                   + f" ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?")
            rows = conn.execute(sql, [*params, limit + 1]).fetchall()
        out = [_decode(r) for r in rows[:limit]]
        return out, len(rows) > limit


def _encode(key: str, value: Any) -> Any:
    return json.dumps(value) if key in _JSON_COLUMNS and value is not None else value


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out.pop("seq", None)
    for key in _JSON_COLUMNS:
        if out.get(key) is not None:
            out[key] = json.loads(out[key])
    return out


def _temp_file(directory: Path, data: bytes) -> Path:
    """`data` in a new temporary file under `directory` (to be moved into place)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".new-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)
