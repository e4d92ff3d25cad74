"""`market migrate`: a board's database brought up to this market's layout in place, and a
SQLite board's own state moved into another board (PostgreSQL, for replicas).

Opening a `Board` already upgrades it (the market state's migrations, the chain tables
rebuilt when their layout changed), so upgrading in place is opening. Moving copies only
what the chain cannot give back, the tables `state.STATE_TABLES` (manifests, heartbeats,
offers, committee messages, swarm members, plans and consents), rows as they are, ids
included (verifiers page committee messages by id); the chain tables fill again by
indexing from the deploy block. The copy is one write transaction on the target, checked
row by row before it commits: a target already holding a different row under a copied key
is refused and left as it was.
"""

from __future__ import annotations

from typing import Any

from market.service.board import Board, BoardError
from market.service.state import STATE_TABLES


def copy_state(source: Board, target: Board) -> dict[str, int]:
    """Copy the market state of `source` into `target`; returns the rows each table gained.
    Rows the target already holds identically are kept; a different row under the same key
    raises BoardError and copies nothing."""
    rows: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
    with source.snapshot(), source._read() as conn:
        for table in STATE_TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")
            columns = [d[0] for d in cur.description]
            rows[table] = (columns, [tuple(r) for r in cur.fetchall()])
    gained: dict[str, int] = {}
    with target._write() as conn:
        for table, (columns, values) in rows.items():
            names = ", ".join(columns)
            marks = ", ".join("?" * len(columns))
            before = _count(conn, table)
            for row in values:
                conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks}) "
                             "ON CONFLICT DO NOTHING", row)
            held = {tuple(r) for r in conn.execute(f"SELECT {names} FROM {table}")}
            missing = [row for row in values if row not in held]
            if missing:
                raise BoardError(
                    f"{target.where} already holds other rows in {table} under the keys of "
                    f"{len(missing)} of {source.where}'s (first: {missing[0][:3]}...); "
                    "nothing was copied: migrate into an empty board")
            gained[table] = _count(conn, table) - before
        if conn.postgres and rows["committee_messages"][1]:
            # Explicit ids leave the id sequence behind: the next message continues after them.
            conn.execute("SELECT setval(pg_get_serial_sequence('committee_messages', 'id'), "
                         "(SELECT MAX(id) FROM committee_messages))")
    return gained


def _count(conn: Any, table: str) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
