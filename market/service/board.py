"""The job board: one database shared by the apps and the workers (a SQLite file, or
PostgreSQL for replicas on several hosts: `market.service.boardsql`), in three parts.

- `market.service.indexer.ChainIndex`: chain events applied to the chain tables. Those can
  always be rebuilt from the chain, so their layout (`CHAIN_LAYOUT`, meta key `schema`) is
  not migrated: a file of an older layout has them dropped and indexed again from the
  deploy block (`reset()` does the same for a chain reset under the market).
- `market.service.queries.BoardQueries`: the reads the API and the sweeps make.
- `market.service.state.MarketState`: what only the market knows (manifests, heartbeats,
  offers, committee messages). It cannot be rebuilt, so it has versioned migrations
  (`state.MIGRATIONS`) applied at open and is never dropped.

`Board` is the three together; opening it creates, migrates or rebuilds what is needed in
one write transaction, so processes opening the same database at once agree. The names below
are re-exported for the modules that import them from here.
"""

from __future__ import annotations

from pathlib import Path

from market.service.boarddb import (
    C_ANSWERED,
    C_OPEN,
    C_UNANSWERED,
    CHALLENGE_STATUS,
    CLAIMED,
    D_EXPIRED,
    D_OPEN,
    DISPUTE_STATUS,
    DISPUTED,
    FINALIZED,
    I64_MAX,
    KEPT_META,
    OPEN,
    REFUNDED,
    STATE_NAMES,
    SUBMITTED,
    ZERO_ADDRESS,
    BoardError,
    MessageConflict,
    checksum,
    deployment_identity,
    model_id_bytes,
)
from market.service.boardsql import Conn, DatabaseUnusable, open_database
from market.service.indexer import (
    CHAIN_LAYOUT,
    CHAIN_SCHEMA,
    CHAIN_TABLES,
    INDEXED_EVENTS,
    ChainIndex,
)
from market.service.queries import BoardQueries
from market.service.state import STATE_VERSION, MarketState, migrate_state

__all__ = [
    "C_ANSWERED", "C_OPEN", "C_UNANSWERED", "CHAIN_LAYOUT", "CHALLENGE_STATUS", "CLAIMED",
    "D_EXPIRED", "D_OPEN", "DISPUTED", "DISPUTE_STATUS", "FINALIZED", "I64_MAX",
    "INDEXED_EVENTS", "OPEN", "REFUNDED", "STATE_NAMES", "STATE_VERSION", "SUBMITTED",
    "ZERO_ADDRESS", "Board", "BoardError", "MessageConflict", "checksum",
    "deployment_identity", "model_id_bytes",
]


class Board(ChainIndex, BoardQueries, MarketState):
    """The job board at `location`: a SQLite file's path (created on first use) or a
    `postgresql://` URL (see the module doc)."""

    upgraded_from: tuple[str | None, int]
    """The chain layout (None: a new database) and market-state version found at open."""

    def __init__(self, location: Path | str) -> None:
        self.db = open_database(location)
        unusable: tuple[type[Exception], ...] = (DatabaseUnusable, *self.db.errors())
        try:
            self.db.open()
            with self.db.write() as conn:
                self._create(conn)
        except unusable as exc:
            raise BoardError(f"board database {self.where} is unusable: {exc}") from exc

    def _create(self, conn: Conn) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, "
                     "value TEXT NOT NULL)")
        layout = self._meta(conn, "schema")
        if layout is not None and layout != CHAIN_LAYOUT:
            if not layout.isdigit() or int(layout) > int(CHAIN_LAYOUT):
                raise BoardError(
                    f"board database {self.where} has chain layout {layout}, newer than "
                    f"this market's {CHAIN_LAYOUT}: upgrade the market")
            self._drop_chain_tables(conn)
        for statement in CHAIN_SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        self._set_meta(conn, "schema", CHAIN_LAYOUT)
        self.upgraded_from = (layout, migrate_state(conn, self.where))

    @staticmethod
    def _drop_chain_tables(conn: Conn) -> None:
        """An older chain layout: drop what the chain rebuilds (the next `index` starts over
        from the deploy block); the market's state is migrated, never dropped."""
        for table in CHAIN_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DELETE FROM meta WHERE key NOT IN {KEPT_META}")
