"""The market's own state: what only the market knows and the chain cannot give back
(uploaded model manifests, miner heartbeats, clients' task offers, the verifier committee's
relayed messages, swarm members with their last join, live swarm plans by version and the
members' consents to them).

Because it cannot be rebuilt, its layout is never dropped: it is versioned (SQLite's
`PRAGMA user_version`; a `meta` row on PostgreSQL) and upgraded at open by `MIGRATIONS`, an
ordered list applied from the database's version to the last one, in the same transaction
as the version bump. The same migrations serve both databases (`boardsql` translates
their DDL). `market migrate` copies these tables from one board to another.
(Files written before migrations existed are version 0 with the first migration's tables
already there, which it creates only if missing.) Messages and offers only mean something
on the deployment they were made for (epochs and task ids restart on a new one), so each
row carries its deployment's identity and is only read back on that deployment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from market.service.boarddb import (
    BoardBase,
    BoardError,
    MessageConflict,
    _hex,
    _i64,
    checksum,
    model_id_bytes,
)
from market.service.boardsql import Conn


def _v1_baseline(conn: Conn) -> None:
    """The four tables as they were before migrations (kept as they are in older files)."""
    for statement in STATE_BASELINE:
        conn.execute(statement)


def _v2_lookup_indexes(conn: Conn) -> None:
    """Indexes for the reads that scan these tables: the open-shards join on live offers
    and the relay's reads by topic."""
    conn.execute("CREATE INDEX IF NOT EXISTS offers_until ON offers (deployment, until)")
    conn.execute("CREATE INDEX IF NOT EXISTS committee_messages_topic "
                 "ON committee_messages (deployment, topic)")


def _v3_swarms(conn: Conn) -> None:
    """Swarms: members with what they last declared and when the market last heard from
    them, each model's plans by version (the served document and the state the next
    re-plan resumes from) and the members' SwarmConsent signatures per plan version."""
    conn.execute("""CREATE TABLE IF NOT EXISTS swarm_members (
        deployment TEXT NOT NULL, model_id TEXT NOT NULL, miner TEXT NOT NULL,
        memory_mib INTEGER NOT NULL, tflops REAL NOT NULL, endpoint TEXT NOT NULL,
        public_key TEXT NOT NULL, rtts TEXT NOT NULL, price_per_token TEXT NOT NULL,
        timestamp INTEGER NOT NULL, last_seen REAL NOT NULL,
        PRIMARY KEY (deployment, model_id, miner))""")
    conn.execute("""CREATE TABLE IF NOT EXISTS swarm_plans (
        deployment TEXT NOT NULL, model_id TEXT NOT NULL, version INTEGER NOT NULL,
        plan TEXT NOT NULL, state TEXT NOT NULL, swarm_id INTEGER, created_at REAL NOT NULL,
        PRIMARY KEY (deployment, model_id, version))""")
    conn.execute("""CREATE TABLE IF NOT EXISTS swarm_consents (
        deployment TEXT NOT NULL, model_id TEXT NOT NULL, version INTEGER NOT NULL,
        member TEXT NOT NULL, nonce TEXT NOT NULL, signature TEXT NOT NULL,
        received_at REAL NOT NULL, PRIMARY KEY (deployment, model_id, version, member))""")


STATE_BASELINE = (
    """CREATE TABLE IF NOT EXISTS models (
        model_id TEXT PRIMARY KEY, name TEXT NOT NULL, manifest TEXT NOT NULL,
        added_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS heartbeats (
        miner TEXT PRIMARY KEY, timestamp INTEGER NOT NULL, status TEXT NOT NULL,
        received_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS committee_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT, deployment TEXT NOT NULL, author TEXT NOT NULL,
        kind TEXT NOT NULL, epoch INTEGER NOT NULL, topic TEXT NOT NULL, body TEXT NOT NULL,
        signature TEXT NOT NULL, received_at REAL NOT NULL,
        UNIQUE (deployment, author, kind, epoch, topic))""",
    """CREATE INDEX IF NOT EXISTS committee_messages_epoch
        ON committee_messages (deployment, epoch, kind)""",
    """CREATE TABLE IF NOT EXISTS offers (
        deployment TEXT NOT NULL, task_id INTEGER NOT NULL, client TEXT NOT NULL,
        miner TEXT NOT NULL, until INTEGER NOT NULL, timestamp INTEGER NOT NULL,
        signature TEXT NOT NULL, received_at REAL NOT NULL,
        PRIMARY KEY (deployment, task_id))""",
)
MIGRATIONS: tuple[Callable[[Conn], None], ...] = (
    _v1_baseline, _v2_lookup_indexes, _v3_swarms)
"""Migration k takes the market state from version k to k + 1; append, never edit."""
STATE_VERSION = len(MIGRATIONS)
STATE_TABLES = ("models", "heartbeats", "committee_messages", "offers", "swarm_members",
                "swarm_plans", "swarm_consents")
"""The market's own tables, in the order `market migrate` copies them."""
PLAN_VERSIONS_KEPT = 8
"""A swarm's latest plan versions kept (a head may register one a few re-plans late)."""


def migrate_state(conn: Conn, path: object) -> int:
    """Apply the migrations `conn`'s database lacks (inside the caller's transaction);
    returns the version it had. BoardError for a database written by a newer market."""
    version = conn.user_version()
    if version > STATE_VERSION:
        raise BoardError(f"board database {path} holds market state of version {version}, "
                         f"newer than this market's {STATE_VERSION}: upgrade the market")
    for step in MIGRATIONS[version:]:
        step(conn)
    if version != STATE_VERSION:
        conn.set_user_version(STATE_VERSION)
    return version


class MarketState(BoardBase):
    """Manifests, heartbeats, offers, committee messages and swarms (see the module doc)."""

    def record_heartbeat(self, miner: str, timestamp: int, status: dict[str, Any]) -> None:
        """Store a (verified) heartbeat; an older one than the stored never replaces it."""
        with self._write(alone=False) as conn:
            conn.execute(
                "INSERT INTO heartbeats VALUES (?, ?, ?, ?) ON CONFLICT (miner) DO UPDATE SET "
                "timestamp=excluded.timestamp, status=excluded.status, "
                "received_at=excluded.received_at "
                "WHERE excluded.timestamp >= heartbeats.timestamp",
                (checksum(miner, "miner"), int(timestamp), json.dumps(status), time.time()))

    # ------------------------------------------------------------------ models
    def put_model(self, manifest: dict[str, Any]) -> str:
        """Store a model manifest under its modelId (keccak of its canonical JSON) and return
        the id as 0x hex. A `modelId` field in the body must match what the manifest hashes
        to."""
        from market.model.manifest import Manifest, ModelError

        try:
            m = Manifest.from_dict(manifest, "model manifest")
        except ModelError as exc:
            raise BoardError(str(exc)) from exc
        model_id = m.model_id_hex
        claimed = manifest.get("modelId")
        if claimed is not None and str(claimed).lower() != model_id:
            raise BoardError(f"model manifest says modelId {claimed} but hashes to {model_id}")
        with self._write(alone=False) as conn:
            conn.execute("INSERT INTO models VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (model_id, m.name, json.dumps(m.to_dict(), sort_keys=True),
                          time.time()))
        return model_id

    def model(self, model_id_hex: str) -> dict[str, Any] | None:
        """The manifest stored for a modelId, or None."""
        key = _hex(model_id_bytes(model_id_hex))
        with self._read() as conn:
            row = conn.execute("SELECT manifest FROM models WHERE model_id=?",
                               (key,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # ------------------------------------------------------------------ offers
    def put_offer(self, deployment: str, task_id: int, client: str, miner: str, until: int,
                  timestamp: int, signature: str) -> bool:
        """Store a (verified) offer of `task_id` to `miner` until chain time `until`; it
        replaces a stored one unless that one is newer. Returns whether it was stored."""
        with self._write(alone=False) as conn:
            return conn.execute(
                "INSERT INTO offers VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (deployment, task_id) DO UPDATE SET client=excluded.client, "
                "miner=excluded.miner, until=excluded.until, timestamp=excluded.timestamp, "
                "signature=excluded.signature, received_at=excluded.received_at "
                "WHERE excluded.timestamp >= offers.timestamp",
                (deployment, int(task_id), checksum(client, "client"), checksum(miner, "miner"),
                 _i64(until), int(timestamp), signature, time.time())).rowcount > 0

    def offer(self, deployment: str, task_id: int) -> dict[str, Any] | None:
        """The offer stored for `task_id` on `deployment`, or None."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM offers WHERE deployment=? AND task_id=?",
                               (deployment, int(task_id))).fetchone()
        if row is None:
            return None
        return {"taskId": row["task_id"], "client": row["client"], "miner": row["miner"],
                "until": row["until"], "timestamp": row["timestamp"],
                "signature": row["signature"], "receivedAt": row["received_at"]}

    # ------------------------------------------------------------------ committee relay
    def put_message(self, deployment: str, msg: dict[str, Any]) -> tuple[int, bool]:
        """Store a (verified) committee message on `deployment`; returns (id, created).
        Reposting the same body (and signature) returns the stored id; another one under the
        same (author, kind, epoch, topic) raises MessageConflict: a member cannot take back or
        change what it said."""
        from market.protocol.canonical import canonical_json

        key = (deployment, checksum(msg["author"], "author"), str(msg["kind"]),
               int(msg["epoch"]), str(msg["topic"]))
        body = canonical_json(msg["body"])
        with self._write() as conn:
            row = conn.execute(
                "SELECT id, body, signature FROM committee_messages WHERE deployment=? AND "
                "author=? AND kind=? AND epoch=? AND topic=?", key).fetchone()
            if row is not None:
                if row["body"] != body:
                    raise MessageConflict(
                        f"{key[1]} already posted another {key[2]!r} message for epoch "
                        f"{key[3]} topic {key[4]!r} (id {row['id']}); a message cannot be "
                        "changed")
                return int(row["id"]), False
            row = conn.execute(
                "INSERT INTO committee_messages (deployment, author, kind, epoch, topic, body, "
                "signature, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (*key, body, str(msg["signature"]), time.time())).fetchone()
            return int(row[0]), True

    def messages(self, deployment: str, *, epoch: int | None = None, kind: str | None = None,
                 topic: str | None = None, after_id: int = 0,
                 limit: int | None = None) -> list[dict[str, Any]]:
        """The committee messages of `deployment` with an id above `after_id`, filtered by
        epoch, kind and topic when given, ascending by id (at most `limit`)."""
        sql = "SELECT * FROM committee_messages WHERE deployment=? AND id>?"
        params: list[Any] = [deployment, int(after_id)]
        for column, value in (("epoch", epoch), ("kind", kind), ("topic", topic)):
            if value is not None:
                sql += f" AND {column}=?"
                params.append(value)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [{"id": r["id"], "author": r["author"], "kind": r["kind"], "epoch": r["epoch"],
                 "topic": r["topic"], "body": json.loads(r["body"]),
                 "signature": r["signature"], "receivedAt": r["received_at"]} for r in rows]

    # ------------------------------------------------------------------ swarms
    def record_swarm_member(self, deployment: str, model_id: str, member: dict[str, Any]
                            ) -> bool:
        """Store a (verified) swarm join and mark the member seen now; a join no newer than
        the stored one changes nothing (a replayed body cannot keep a member alive).
        Returns whether it was stored."""
        with self._write(alone=False) as conn:
            return conn.execute(
                "INSERT INTO swarm_members VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (deployment, model_id, miner) DO UPDATE SET "
                "memory_mib=excluded.memory_mib, tflops=excluded.tflops, "
                "endpoint=excluded.endpoint, public_key=excluded.public_key, "
                "rtts=excluded.rtts, price_per_token=excluded.price_per_token, "
                "timestamp=excluded.timestamp, last_seen=excluded.last_seen "
                "WHERE excluded.timestamp > swarm_members.timestamp",
                (deployment, model_id, checksum(member["miner"], "miner"),
                 int(member["memory_mib"]), float(member["tflops"]), str(member["endpoint"]),
                 str(member["public_key"]), json.dumps(member["rtts"], sort_keys=True),
                 str(int(member["price_per_token"])), int(member["timestamp"]),
                 time.time())).rowcount > 0

    @staticmethod
    def _swarm_member(row: Any) -> dict[str, Any]:
        return {"miner": row["miner"], "memory_mib": row["memory_mib"],
                "tflops": row["tflops"], "endpoint": row["endpoint"],
                "public_key": row["public_key"], "rtts": json.loads(row["rtts"]),
                "price_per_token": int(row["price_per_token"]),
                "timestamp": row["timestamp"], "last_seen": row["last_seen"]}

    def swarm_members(self, deployment: str, model_id: str, *,
                      seen_after: float | None = None) -> list[dict[str, Any]]:
        """A model's swarm members (those seen after `seen_after` when given), by address."""
        sql = "SELECT * FROM swarm_members WHERE deployment=? AND model_id=?"
        params: list[Any] = [deployment, model_id]
        if seen_after is not None:
            sql += " AND last_seen > ?"
            params.append(float(seen_after))
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return sorted((self._swarm_member(r) for r in rows), key=lambda m: int(m["miner"], 16))

    @staticmethod
    def _swarm_plan(row: Any) -> dict[str, Any] | None:
        if row is None:
            return None
        return {"version": row["version"], "plan": json.loads(row["plan"]),
                "state": json.loads(row["state"]), "swarm_id": row["swarm_id"],
                "created_at": row["created_at"]}

    def swarm_plan(self, deployment: str, model_id: str,
                   version: int | None = None) -> dict[str, Any] | None:
        """Plan `version` of a model's swarm (the latest when None): {version, plan, state,
        swarm_id, created_at}, or None."""
        with self._read() as conn:
            return self._latest_plan(conn, deployment, model_id, version)

    def _latest_plan(self, conn: Conn, deployment: str, model_id: str,
                     version: int | None = None) -> dict[str, Any] | None:
        if version is None:
            row = conn.execute("SELECT * FROM swarm_plans WHERE deployment=? AND model_id=? "
                               "ORDER BY version DESC LIMIT 1",
                               (deployment, model_id)).fetchone()
        else:
            row = conn.execute("SELECT * FROM swarm_plans WHERE deployment=? AND model_id=? "
                               "AND version=?", (deployment, model_id, int(version))).fetchone()
        return self._swarm_plan(row)

    def swarm_planning_input(self, deployment: str, model_id: str, seen_after: float
                             ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The live members (seen after `seen_after`) and the latest plan, read together
        (one read transaction): what a re-plan starts from, planned outside any write."""
        with self.snapshot(), self._read() as conn:
            live = self.swarm_members(deployment, model_id, seen_after=seen_after)
            return live, self._latest_plan(conn, deployment, model_id)

    def store_swarm_plan(self, deployment: str, model_id: str, after: int | None,
                         plan: dict[str, Any], state: dict[str, Any]) -> dict[str, Any] | None:
        """Store `plan` as the version after `after` (None: the first), its number filled in,
        unless another process stored that version first (then None: plan again from the new
        latest). Versions older than the latest `PLAN_VERSIONS_KEPT` are deleted with their
        consents, unless registered on-chain (a swarm id)."""
        version = 1 + (after or 0)
        plan = {**plan, "version": version}
        now = time.time()
        with self._write() as conn:
            latest = self._latest_plan(conn, deployment, model_id)
            if (None if latest is None else int(latest["version"])) != after:
                return None
            conn.execute("INSERT INTO swarm_plans VALUES (?, ?, ?, ?, ?, NULL, ?)",
                         (deployment, model_id, version, json.dumps(plan), json.dumps(state),
                          now))
            oldest_kept = version - PLAN_VERSIONS_KEPT + 1
            conn.execute("DELETE FROM swarm_consents WHERE deployment=? AND model_id=? AND "
                         "version < ? AND version IN (SELECT version FROM swarm_plans WHERE "
                         "deployment=? AND model_id=? AND swarm_id IS NULL)",
                         (deployment, model_id, oldest_kept, deployment, model_id))
            conn.execute("DELETE FROM swarm_plans WHERE deployment=? AND model_id=? AND "
                         "version < ? AND swarm_id IS NULL",
                         (deployment, model_id, oldest_kept))
        return {"version": version, "plan": plan, "state": state, "swarm_id": None,
                "created_at": now}

    def put_swarm_consent(self, deployment: str, model_id: str, version: int, member: str,
                          nonce: int, signature: str) -> None:
        """Store a (verified) member's consent to plan `version`; a later one replaces it."""
        with self._write(alone=False) as conn:
            conn.execute("INSERT INTO swarm_consents VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                         "(deployment, model_id, version, member) DO UPDATE SET "
                         "nonce=excluded.nonce, signature=excluded.signature, "
                         "received_at=excluded.received_at",
                         (deployment, model_id, int(version), checksum(member, "member"),
                          str(int(nonce)), signature, time.time()))

    def swarm_consents(self, deployment: str, model_id: str,
                       version: int) -> dict[str, dict[str, Any]]:
        """{member: {nonce, signature}} of the consents stored for plan `version`."""
        with self._read() as conn:
            rows = conn.execute("SELECT member, nonce, signature FROM swarm_consents WHERE "
                                "deployment=? AND model_id=? AND version=?",
                                (deployment, model_id, int(version))).fetchall()
        return {r["member"]: {"nonce": int(r["nonce"]), "signature": r["signature"]}
                for r in sorted(rows, key=lambda r: int(r["member"], 16))}

    def set_swarm_id(self, deployment: str, model_id: str, version: int, swarm_id: int) -> None:
        """Record that plan `version` is registered on-chain as `swarm_id` (checked)."""
        with self._write() as conn:
            conn.execute("UPDATE swarm_plans SET swarm_id=? WHERE deployment=? AND model_id=? "
                         "AND version=?", (int(swarm_id), deployment, model_id, int(version)))
