"""The job board: Quarry's chain events indexed into SQLite, shared by the app and the workers.

The chain stays the source of truth. The board replays TaskRegistry, GPURegistry and
Arbitration events (and VerifierCommittee's unbonding period, which bounds how long absences
stay reportable) in (block, logIndex) order into tables the market can query cheaply
(open shards for a model, shards due for settlement, the miner directory, the disputes and
availability challenges on each task), so deleting the file and indexing again rebuilds the
same board. Each event is applied once: its (block, logIndex) is recorded in the same
transaction that applies it and moves the cursor, so a crash or two indexers racing never
double-apply one. The few fields no event carries are read from the chain as the event is
indexed (a task's parameters, a dispute's committee epoch and weight, which never change, and
a registered miner's probation, which ProbationEnded later clears), so a board rebuilt later
ends in the same state.

SQLite runs in WAL mode with a busy timeout and one connection per call, so any number of
processes (the FastAPI app, every Celery worker) and threads share the file safely. Wei
amounts are stored as decimal text (they overflow SQLite's 64-bit integers); times are
integers (uint64 values beyond 2**63-1 are clamped, which changes no comparison with a real
clock).

Besides the chain-derived tables the board keeps what only the market knows: uploaded model
manifests, miner heartbeats, matching recommendations, the verifier committee's relayed
messages and clients' task offers. `reset()` drops the former (and the recommendations) and
keeps the rest, for a chain that was reset under the market; a board file of an older schema
is migrated the same way (its chain-derived tables are rebuilt, the rest kept). Messages and
offers cannot be rebuilt from the chain, yet only mean something on the deployment they were
made for (epochs and task ids restart on a new one), so each row carries its deployment's
identity and is only read back on that deployment: a redeploy neither loses nor revives them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.errors import QuarryError

if TYPE_CHECKING:
    from market.chain.deploy import Quarry

SCHEMA_VERSION = "2"
REBUILDABLE_SCHEMAS = ("1",)
"""Older schemas whose market-only tables this one keeps: their chain tables are rebuilt."""
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

# The events the board applies, by contract (Quarry attribute, contract name).
INDEXED_EVENTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("tasks", "TaskRegistry"): (
        "TaskCreated", "ShardClaimed", "ResultSubmitted", "ClaimReclaimed", "ShardFinalized",
        "ShardRefunded", "TaskCancelled", "ShardDisputed", "ShardDisputeResolved",
    ),
    ("gpu", "GPURegistry"): (
        "MinerRegistered", "MinerUpdated", "StakeAdded", "ExitRequested", "StakeWithdrawn",
        "CollateralLocked", "CollateralUnlocked", "Slashed", "ReputationSet", "MinStakeSet",
        "UntrustedBelowSet", "InitialReputationSet", "ProbationEnded",
    ),
    ("committee", "VerifierCommittee"): ("UnbondingPeriodSet",),
    ("arbitration", "Arbitration"): (
        "DisputeOpened", "VoteCast", "DisputeResolved", "DisputeExpired", "AbsenceReported",
        "AvailabilityChallenged", "AvailabilityAnswered", "AvailabilityUnanswered",
        "BillingFaultProven",
    ),
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    block INTEGER NOT NULL, log_index INTEGER NOT NULL, tx_hash TEXT NOT NULL,
    contract TEXT NOT NULL, name TEXT NOT NULL, args TEXT NOT NULL,
    PRIMARY KEY (block, log_index));
CREATE TABLE IF NOT EXISTS tasks (
    task_id INTEGER PRIMARY KEY, client TEXT NOT NULL, arbiter TEXT NOT NULL,
    model_id TEXT NOT NULL, input_root TEXT NOT NULL, input_uri TEXT NOT NULL,
    num_requests INTEGER NOT NULL, shard_size INTEGER NOT NULL, num_shards INTEGER NOT NULL,
    max_tokens INTEGER NOT NULL, price TEXT NOT NULL, payment TEXT NOT NULL,
    deadline INTEGER NOT NULL, created_at INTEGER NOT NULL, min_rep INTEGER NOT NULL,
    allow_probation INTEGER NOT NULL DEFAULT 0, cancelled INTEGER NOT NULL DEFAULT 0,
    cancel_refund TEXT NOT NULL DEFAULT '0', created_block INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_client ON tasks (client);
CREATE INDEX IF NOT EXISTS tasks_model ON tasks (model_id);
CREATE TABLE IF NOT EXISTS shards (
    task_id INTEGER NOT NULL, shard INTEGER NOT NULL, state INTEGER NOT NULL,
    miner TEXT, claim_expiry INTEGER NOT NULL DEFAULT 0, collateral TEXT NOT NULL DEFAULT '0',
    window_end INTEGER NOT NULL DEFAULT 0, tokens_used TEXT NOT NULL DEFAULT '0',
    result_root TEXT, result_uri TEXT, payment TEXT NOT NULL DEFAULT '0',
    refund TEXT NOT NULL DEFAULT '0', reclaims INTEGER NOT NULL DEFAULT 0,
    penalty TEXT NOT NULL DEFAULT '0',
    PRIMARY KEY (task_id, shard));
CREATE INDEX IF NOT EXISTS shards_state ON shards (state);
CREATE TABLE IF NOT EXISTS miners (
    address TEXT PRIMARY KEY, models TEXT NOT NULL, gpu TEXT NOT NULL, endpoint TEXT NOT NULL,
    price TEXT NOT NULL, stake TEXT NOT NULL, locked TEXT NOT NULL DEFAULT '0',
    slashed TEXT NOT NULL DEFAULT '0', reputation_bps INTEGER NOT NULL,
    exit_requested INTEGER NOT NULL DEFAULT 0, withdrawable_at INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1, on_probation INTEGER NOT NULL DEFAULT 0,
    registered_block INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS disputes (
    dispute_id INTEGER PRIMARY KEY, task_id INTEGER NOT NULL, shard INTEGER NOT NULL,
    request_index INTEGER NOT NULL, opener TEXT NOT NULL, miner TEXT NOT NULL,
    bond TEXT NOT NULL, deadline INTEGER NOT NULL, evidence_uri TEXT NOT NULL,
    status INTEGER NOT NULL, slashed TEXT NOT NULL DEFAULT '0', opened_block INTEGER NOT NULL,
    epoch INTEGER NOT NULL, total_weight TEXT NOT NULL,
    fault_weight TEXT NOT NULL DEFAULT '0', no_fault_weight TEXT NOT NULL DEFAULT '0',
    votes INTEGER NOT NULL DEFAULT 0, absent INTEGER NOT NULL DEFAULT 0,
    absent_slashed TEXT NOT NULL DEFAULT '0');
CREATE INDEX IF NOT EXISTS disputes_task ON disputes (task_id);
CREATE INDEX IF NOT EXISTS disputes_status ON disputes (status);
CREATE TABLE IF NOT EXISTS challenges (
    challenge_id INTEGER PRIMARY KEY, task_id INTEGER NOT NULL, shard INTEGER NOT NULL,
    request_index INTEGER NOT NULL, challenger TEXT NOT NULL, miner TEXT NOT NULL,
    bond TEXT NOT NULL, deadline INTEGER NOT NULL, status INTEGER NOT NULL,
    window_end INTEGER NOT NULL DEFAULT 0, slashed TEXT NOT NULL DEFAULT '0',
    opened_block INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS challenges_task ON challenges (task_id);
CREATE INDEX IF NOT EXISTS challenges_status ON challenges (status);
CREATE TABLE IF NOT EXISTS billing_faults (
    task_id INTEGER NOT NULL, shard INTEGER NOT NULL, request_index INTEGER NOT NULL,
    prover TEXT NOT NULL, slashed TEXT NOT NULL, proven_block INTEGER NOT NULL,
    PRIMARY KEY (task_id, shard));
CREATE TABLE IF NOT EXISTS models (
    model_id TEXT PRIMARY KEY, name TEXT NOT NULL, manifest TEXT NOT NULL,
    added_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS heartbeats (
    miner TEXT PRIMARY KEY, timestamp INTEGER NOT NULL, status TEXT NOT NULL,
    received_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS recommendations (
    miner TEXT PRIMARY KEY, rows TEXT NOT NULL, computed_at REAL NOT NULL,
    stored_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS committee_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, deployment TEXT NOT NULL, author TEXT NOT NULL,
    kind TEXT NOT NULL, epoch INTEGER NOT NULL, topic TEXT NOT NULL, body TEXT NOT NULL,
    signature TEXT NOT NULL, received_at REAL NOT NULL,
    UNIQUE (deployment, author, kind, epoch, topic));
CREATE INDEX IF NOT EXISTS committee_messages_epoch
    ON committee_messages (deployment, epoch, kind);
CREATE TABLE IF NOT EXISTS offers (
    deployment TEXT NOT NULL, task_id INTEGER NOT NULL, client TEXT NOT NULL,
    miner TEXT NOT NULL, until INTEGER NOT NULL, timestamp INTEGER NOT NULL,
    signature TEXT NOT NULL, received_at REAL NOT NULL,
    PRIMARY KEY (deployment, task_id));
"""
# What `reset()` clears: everything derived from the chain.
_CHAIN_TABLES = ("events", "tasks", "shards", "miners", "disputes", "challenges",
                 "billing_faults", "recommendations")


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


class Board:
    """The SQLite job board at `db_path` (created on first use; see the module docstring)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, "
                         "value TEXT NOT NULL)")
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is not None and row[0] in REBUILDABLE_SCHEMAS:
                self._migrate(conn)
                row = (SCHEMA_VERSION,)
            if row is None or row[0] == SCHEMA_VERSION:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                             (SCHEMA_VERSION,))
                row = (SCHEMA_VERSION,)
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise BoardError(f"board database {self.db_path} is unusable: {exc}") from exc
        finally:
            if conn is not None:
                conn.close()
        if row[0] != SCHEMA_VERSION:
            raise BoardError(
                f"board database {self.db_path} has schema {row[0]}, this market expects "
                f"{SCHEMA_VERSION}: delete it; the board is rebuilt from the chain")

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """From an older schema: drop what the chain rebuilds (the next `index` starts over
        from the deploy block), keep the market-only tables, whose layout is unchanged."""
        for table in _CHAIN_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("DELETE FROM meta WHERE key != 'schema'")
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (SCHEMA_VERSION,))

    # ------------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: writers queue on the file lock instead of failing."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    @staticmethod
    def _meta(conn: sqlite3.Connection, key: str) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def _set_meta(conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    # ------------------------------------------------------------------ indexing
    def cursor(self) -> int:
        """The last block applied (-1 before the first `index`)."""
        with self._read() as conn:
            value = self._meta(conn, "cursor")
        return -1 if value is None else int(value)

    def cursor_time(self) -> int:
        """The chain timestamp of the cursor block (0 before the first `index`)."""
        with self._read() as conn:
            value = self._meta(conn, "cursor_time")
        return 0 if value is None else int(value)

    def reset(self) -> None:
        """Forget everything indexed from the chain (models, heartbeats, committee messages
        and offers stay), so the next `index` rebuilds the board, e.g. after the devnet was
        restarted and redeployed."""
        with self._write() as conn:
            for table in _CHAIN_TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DELETE FROM meta WHERE key != 'schema'")

    def index(self, q: Quarry, *, max_blocks: int = 2000) -> int:
        """Apply every indexed event since the cursor up to the chain head, `max_blocks`
        blocks per `eth_getLogs` call, each chunk in one transaction; returns the cursor.

        Raises BoardError when the chain no longer holds what was indexed (head below the
        cursor, another block at the cursor, the contracts gone) or the database was built
        for another deployment: `reset()` (or deleting the file) rebuilds it."""
        if max_blocks < 1:
            raise BoardError(f"max_blocks must be at least 1, got {max_blocks}")
        rpc = q.chain._rpc
        w3 = q.chain.w3
        identity = deployment_identity(q)
        with self._read() as conn:
            stored_identity = self._meta(conn, "deployment")
            cursor_value = self._meta(conn, "cursor")
            cursor_hash = self._meta(conn, "cursor_hash")
        if stored_identity is not None and stored_identity != identity:
            raise BoardError(
                f"board database {self.db_path} was built for another deployment "
                f"({stored_identity}), not {identity}: delete it (or reset the board) to "
                "index this one")
        if not rpc(lambda: w3.eth.get_code(q.tasks.address)):
            raise BoardError(
                f"chain reset: no TaskRegistry code at {q.tasks.address} on "
                f"{q.deployment.rpc_url}; the chain was restarted without this deployment")
        head = int(rpc(lambda: w3.eth.block_number))
        if cursor_value is None:
            cursor = q.deployment.deploy_block - 1
            self._init_params(q, identity)
        else:
            cursor = int(cursor_value)
            if head < cursor:
                raise BoardError(
                    f"chain reset: the head is block {head}, below the board's block "
                    f"{cursor}; the chain was reset or replaced, so the board must be rebuilt")
            if cursor_hash is not None:
                now_hash = _hex(rpc(lambda: w3.eth.get_block(cursor))["hash"])
                if now_hash != cursor_hash:
                    raise BoardError(
                        f"chain reset: block {cursor} is now {now_hash}, the board indexed "
                        f"{cursor_hash}; the chain was reset or reorganised, so the board "
                        "must be rebuilt")
        decoders = self._decoders(q)
        address_list = sorted({c.address for c, _ in decoders.values()})
        topics = ["0x" + topic.hex() for topic in decoders]
        while cursor < head:
            start, end = cursor + 1, min(cursor + max_blocks, head)
            logs = rpc(lambda s=start, e=end: w3.eth.get_logs({
                "fromBlock": s, "toBlock": e, "address": address_list, "topics": [topics]}))
            block = rpc(lambda e=end: w3.eth.get_block(e))
            events = self._decode(q, decoders, logs)
            extra = self._prefetch(q, events)
            with self._write() as conn:
                for event in events:
                    key = (event["block"], event["logIndex"])
                    inserted = conn.execute(
                        "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?)",
                        (*key, event["tx"], event["contract"], event["name"],
                         json.dumps(_jsonable(event["args"]), sort_keys=True))).rowcount
                    if inserted:
                        getattr(self, f"_on_{event['name']}")(conn, event, extra)
                stored = self._meta(conn, "cursor")
                if stored is None or int(stored) < end:
                    self._set_meta(conn, "cursor", end)
                    self._set_meta(conn, "cursor_hash", _hex(block["hash"]))
                    self._set_meta(conn, "cursor_time", int(block["timestamp"]))
            cursor = end
        return cursor

    def _init_params(self, q: Quarry, identity: str) -> None:
        """The parameters the board's answers depend on, before their Set events: the
        deployment's constructor arguments when recorded, else the contract's values now.
        GPURegistry's shape eligibility; VerifierCommittee's unbonding period bounds how long
        an expired dispute's absent members can still be reported (`due_report`)."""
        params = q.deployment.params
        min_stake = params.get("min_stake")
        initial_rep = params.get("initial_reputation_bps")
        unbonding = params.get("verifier_unbonding_period")
        values = {
            "min_stake": min_stake if min_stake is not None else q.gpu.min_stake(),
            "initial_reputation_bps": initial_rep if initial_rep is not None
            else int(q.gpu._call("initialReputationBps")),
            "untrusted_below_bps": int(q.gpu._call("untrustedBelowBps")),
            "verifier_unbonding_period": unbonding if unbonding is not None
            else int(q.committee._call("unbondingPeriod")),
        }
        with self._write() as conn:
            if self._meta(conn, "deployment") is None:
                self._set_meta(conn, "deployment", identity)
                for key, value in values.items():
                    self._set_meta(conn, key, value)

    @staticmethod
    def _decoders(q: Quarry) -> dict[bytes, tuple[Any, str]]:
        from eth_utils import event_abi_to_log_topic

        out: dict[bytes, tuple[Any, str]] = {}
        for (attr, _name), names in INDEXED_EVENTS.items():
            wrapper = getattr(q, attr)
            for item in wrapper.contract.abi:
                if item.get("type") == "event" and item["name"] in names:
                    out[bytes(event_abi_to_log_topic(item))] = (wrapper, item["name"])
        return out

    @staticmethod
    def _decode(q: Quarry, decoders: dict[bytes, tuple[Any, str]],
                logs: list[Any]) -> list[dict[str, Any]]:
        from market.chain.client import plain

        events = []
        for log in logs:
            if not log["topics"] or log.get("removed"):
                continue
            found = decoders.get(bytes(log["topics"][0]))
            if found is None:
                continue
            wrapper, name = found
            if wrapper.address.lower() != str(log["address"]).lower():
                continue  # same signature from another contract (e.g. GPURegistrySet)
            decoded = wrapper.contract.events[name]().process_log(log)
            events.append({
                "block": int(log["blockNumber"]), "logIndex": int(log["logIndex"]),
                "tx": _hex(log["transactionHash"]), "contract": wrapper.NAME, "name": name,
                "args": plain(decoded["args"]),
            })
        events.sort(key=lambda e: (e["block"], e["logIndex"]))
        return events

    @staticmethod
    def _prefetch(q: Quarry, events: list[dict[str, Any]]) -> dict[str, Any]:
        """Chain reads some events need, done before the write transaction: the task fields
        TaskCreated does not carry, a dispute's committee epoch and weight (fixed when it
        opens), whether a registered miner is on probation (the registry's probation length
        decides, and ProbationEnded later clears it), and the window a shard reopens with
        after a no-fault resolution: an answered availability challenge's (its event, in the
        same transaction), else the resolving block's time."""
        from market.chain.errors import ContractRevert

        tasks: dict[int, Any] = {}
        disputes: dict[int, Any] = {}
        probation: dict[str, bool] = {}
        windows: dict[tuple[str, int, int], int] = {}
        for event in events:
            a = event["args"]
            if event["name"] == "AvailabilityAnswered":
                windows[(event["tx"], int(a["taskId"]), int(a["shard"]))] = int(a["windowEnd"])
        for event in events:
            name, a = event["name"], event["args"]
            if name == "TaskCreated":
                task_id = int(a["taskId"])
                try:
                    tasks[task_id] = q.tasks.get_task(task_id)
                except ContractRevert as exc:
                    raise BoardError(
                        f"chain reset: task {task_id} created in block {event['block']} is "
                        f"unknown to TaskRegistry now ({exc})") from exc
            elif name == "DisputeOpened":
                dispute_id = int(a["disputeId"])
                try:
                    disputes[dispute_id] = q.arbitration.get_dispute(dispute_id)
                except ContractRevert as exc:
                    raise BoardError(
                        f"chain reset: dispute {dispute_id} opened in block {event['block']} "
                        f"is unknown to Arbitration now ({exc})") from exc
            elif name == "MinerRegistered":
                miner = str(_addr(a["miner"]))
                probation[miner] = q.gpu.on_probation(miner)
            elif name == "ShardDisputeResolved" and not a["minerAtFault"]:
                key = (event["tx"], int(a["taskId"]), int(a["shard"]))
                if key not in windows:
                    number = event["block"]
                    windows[key] = int(q.chain._rpc(
                        lambda n=number: q.chain.w3.eth.get_block(n))["timestamp"])
        return {"tasks": tasks, "disputes": disputes, "probation": probation,
                "windows": windows}

    # -- TaskRegistry -------------------------------------------------------------------
    def _on_TaskCreated(self, conn: sqlite3.Connection, e: dict[str, Any],
                        extra: dict[str, Any]) -> None:
        a = e["args"]
        task_id = int(a["taskId"])
        t = extra["tasks"][task_id]
        conn.execute(
            "INSERT OR REPLACE INTO tasks (task_id, client, arbiter, model_id, input_root, "
            "input_uri, num_requests, shard_size, num_shards, max_tokens, price, payment, "
            "deadline, created_at, min_rep, allow_probation, created_block) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (task_id, _addr(a["client"]), _addr(t.arbiter) or ZERO_ADDRESS,
             _hex(a["modelId"]), _hex(a["inputRoot"]), a["inputURI"], int(a["numRequests"]),
             int(a["shardSize"]), int(a["numShards"]), int(t.max_tokens_per_request),
             str(t.price_per_token), str(a["payment"]), _i64(a["deadline"]),
             _i64(t.created_at), int(t.min_reputation_bps), int(bool(a["allowProbation"])),
             e["block"]))
        conn.executemany("INSERT OR REPLACE INTO shards (task_id, shard, state) VALUES (?, ?, ?)",
                         [(task_id, k, OPEN) for k in range(int(a["numShards"]))])

    def _on_ShardClaimed(self, conn: sqlite3.Connection, e: dict[str, Any],
                         extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute(
            "UPDATE shards SET state=?, miner=?, claim_expiry=?, collateral=? "
            "WHERE task_id=? AND shard=?",
            (CLAIMED, _addr(a["miner"]), _i64(a["claimExpiry"]), str(a["collateral"]),
             int(a["taskId"]), int(a["shard"])))

    def _on_ResultSubmitted(self, conn: sqlite3.Connection, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute(
            "UPDATE shards SET state=?, result_root=?, result_uri=?, tokens_used=?, "
            "window_end=? WHERE task_id=? AND shard=?",
            (SUBMITTED, _hex(a["resultRoot"]), a["resultURI"], str(a["tokensUsed"]),
             _i64(a["windowEnd"]), int(a["taskId"]), int(a["shard"])))

    def _on_ClaimReclaimed(self, conn: sqlite3.Connection, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        a = e["args"]
        key = (int(a["taskId"]), int(a["shard"]))
        row = conn.execute("SELECT penalty FROM shards WHERE task_id=? AND shard=?",
                           key).fetchone()
        penalty = str(int(row["penalty"]) + int(a["penalty"])) if row else str(a["penalty"])
        # The contract deletes the shard: it reopens, or reads Refunded (ShardRefunded follows).
        conn.execute(
            "UPDATE shards SET state=?, miner=NULL, claim_expiry=0, collateral='0', "
            "window_end=0, tokens_used='0', result_root=NULL, result_uri=NULL, "
            "reclaims=reclaims+1, penalty=? WHERE task_id=? AND shard=?",
            (OPEN if a["reopened"] else REFUNDED, penalty, *key))

    def _on_ShardFinalized(self, conn: sqlite3.Connection, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=?, payment=?, refund=? WHERE task_id=? AND shard=?",
                     (FINALIZED, str(a["payment"]), str(a["refund"]), int(a["taskId"]),
                      int(a["shard"])))

    def _on_ShardRefunded(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=?, refund=? WHERE task_id=? AND shard=?",
                     (REFUNDED, str(a["amount"]), int(a["taskId"]), int(a["shard"])))

    def _on_TaskCancelled(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        task_id = int(a["taskId"])
        conn.execute("UPDATE tasks SET cancelled=1, cancel_refund=? WHERE task_id=?",
                     (str(a["refund"]), task_id))
        task = conn.execute("SELECT * FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        if task is None:
            return
        # Every shard still Open reads Refunded from now on and got its budget back.
        for row in conn.execute("SELECT shard FROM shards WHERE task_id=? AND state=?",
                                (task_id, OPEN)).fetchall():
            start, end = _range(task, row["shard"])
            budget = (end - start) * task["max_tokens"] * int(task["price"])
            conn.execute("UPDATE shards SET state=?, refund=? WHERE task_id=? AND shard=?",
                         (REFUNDED, str(budget), task_id, row["shard"]))

    def _on_ShardDisputed(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=? WHERE task_id=? AND shard=?",
                     (DISPUTED, int(a["taskId"]), int(a["shard"])))

    def _on_ShardDisputeResolved(self, conn: sqlite3.Connection, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        a = e["args"]
        if a["minerAtFault"]:
            return  # ShardRefunded follows in the same transaction
        # No fault: back to Submitted, the window closed at the resolving block (a verdict, an
        # expiry) or extended (an answered availability challenge).
        window = extra["windows"][(e["tx"], int(a["taskId"]), int(a["shard"]))]
        conn.execute("UPDATE shards SET state=?, window_end=? WHERE task_id=? AND shard=?",
                     (SUBMITTED, _i64(window), int(a["taskId"]), int(a["shard"])))

    # -- GPURegistry --------------------------------------------------------------------
    def _on_MinerRegistered(self, conn: sqlite3.Connection, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        rep = int(self._meta(conn, "initial_reputation_bps") or 0)
        miner = _addr(a["miner"])
        conn.execute(
            "INSERT OR REPLACE INTO miners (address, models, gpu, endpoint, price, stake, "
            "locked, slashed, reputation_bps, exit_requested, withdrawable_at, active, "
            "on_probation, registered_block) VALUES (?, ?, ?, ?, ?, ?, '0', '0', ?, 0, 0, 1, "
            "?, ?)",
            (miner, json.dumps([_hex(m) for m in a["modelIds"]]),
             json.dumps(_gpu(a["gpu"])), a["endpoint"], str(a["pricePerToken"]),
             str(a["stake"]), rep, int(extra["probation"][miner]), e["block"]))

    def _on_MinerUpdated(self, conn: sqlite3.Connection, e: dict[str, Any],
                         extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET models=?, gpu=?, endpoint=?, price=? WHERE address=?",
                     (json.dumps([_hex(m) for m in a["modelIds"]]), json.dumps(_gpu(a["gpu"])),
                      a["endpoint"], str(a["pricePerToken"]), _addr(a["miner"])))

    def _on_StakeAdded(self, conn: sqlite3.Connection, e: dict[str, Any],
                       extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET stake=? WHERE address=?",
                     (str(a["stake"]), _addr(a["miner"])))

    def _on_ExitRequested(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET exit_requested=1, withdrawable_at=? WHERE address=?",
                     (_i64(a["withdrawableAt"]), _addr(a["miner"])))

    def _on_StakeWithdrawn(self, conn: sqlite3.Connection, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE miners SET active=0, stake='0', locked='0', models='[]' "
                     "WHERE address=?", (_addr(e["args"]["miner"]),))

    def _on_CollateralLocked(self, conn: sqlite3.Connection, e: dict[str, Any],
                             extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET locked=? WHERE address=?",
                     (str(a["locked"]), _addr(a["miner"])))

    _on_CollateralUnlocked = _on_CollateralLocked

    def _on_Slashed(self, conn: sqlite3.Connection, e: dict[str, Any],
                    extra: dict[str, Any]) -> None:
        a = e["args"]
        row = conn.execute("SELECT stake, locked, slashed FROM miners WHERE address=?",
                           (_addr(a["miner"]),)).fetchone()
        if row is None:
            return
        stake = int(row["stake"]) - int(a["amount"])
        locked = min(int(row["locked"]), stake)
        conn.execute("UPDATE miners SET stake=?, locked=?, slashed=? WHERE address=?",
                     (str(stake), str(locked), str(int(row["slashed"]) + int(a["amount"])),
                      _addr(a["miner"])))

    def _on_ReputationSet(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET reputation_bps=? WHERE address=?",
                     (int(a["bps"]), _addr(a["miner"])))

    def _on_ProbationEnded(self, conn: sqlite3.Connection, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE miners SET on_probation=0 WHERE address=?",
                     (_addr(e["args"]["miner"]),))

    def _on_MinStakeSet(self, conn: sqlite3.Connection, e: dict[str, Any],
                        extra: dict[str, Any]) -> None:
        self._set_meta(conn, "min_stake", int(e["args"]["minStake"]))

    def _on_UntrustedBelowSet(self, conn: sqlite3.Connection, e: dict[str, Any],
                              extra: dict[str, Any]) -> None:
        self._set_meta(conn, "untrusted_below_bps", int(e["args"]["bps"]))

    def _on_InitialReputationSet(self, conn: sqlite3.Connection, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        self._set_meta(conn, "initial_reputation_bps", int(e["args"]["bps"]))

    # -- VerifierCommittee --------------------------------------------------------------
    def _on_UnbondingPeriodSet(self, conn: sqlite3.Connection, e: dict[str, Any],
                               extra: dict[str, Any]) -> None:
        # The longest period seen: a leaving member stays bonded for the later of the period
        # when it left and the current one, so absences stay reportable at least this long.
        seen = int(self._meta(conn, "verifier_unbonding_period") or 0)
        self._set_meta(conn, "verifier_unbonding_period", max(seen, int(e["args"]["v"])))

    # -- Arbitration --------------------------------------------------------------------
    def _on_DisputeOpened(self, conn: sqlite3.Connection, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        dispute_id = int(a["disputeId"])
        d = extra["disputes"][dispute_id]
        conn.execute(
            "INSERT OR REPLACE INTO disputes (dispute_id, task_id, shard, request_index, "
            "opener, miner, bond, deadline, evidence_uri, status, opened_block, epoch, "
            "total_weight) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (dispute_id, int(a["taskId"]), int(a["shard"]),
             int(a["receipt"]["index"]), _addr(a["opener"]), _addr(a["miner"]),
             str(a["bond"]), _i64(a["deadline"]), a["evidenceURI"], D_OPEN, e["block"],
             int(d.epoch), str(d.total_weight)))

    def _on_VoteCast(self, conn: sqlite3.Connection, e: dict[str, Any],
                     extra: dict[str, Any]) -> None:
        a = e["args"]
        column = "fault_weight" if a["minerAtFault"] else "no_fault_weight"
        row = conn.execute(f"SELECT {column} FROM disputes WHERE dispute_id=?",
                           (int(a["disputeId"]),)).fetchone()
        if row is None:
            return
        conn.execute(f"UPDATE disputes SET {column}=?, votes=votes+1 WHERE dispute_id=?",
                     (str(int(row[0]) + int(a["weight"])), int(a["disputeId"])))

    def _on_AbsenceReported(self, conn: sqlite3.Connection, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        row = conn.execute("SELECT absent_slashed FROM disputes WHERE dispute_id=?",
                           (int(a["disputeId"]),)).fetchone()
        if row is None:
            return
        conn.execute("UPDATE disputes SET absent=absent+1, absent_slashed=? WHERE dispute_id=?",
                     (str(int(row[0]) + int(a["slashed"])), int(a["disputeId"])))

    def _on_AvailabilityChallenged(self, conn: sqlite3.Connection, e: dict[str, Any],
                                   extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute(
            "INSERT OR REPLACE INTO challenges (challenge_id, task_id, shard, request_index, "
            "challenger, miner, bond, deadline, status, opened_block) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (int(a["challengeId"]), int(a["taskId"]), int(a["shard"]), int(a["index"]),
             _addr(a["challenger"]), _addr(a["miner"]), str(a["bond"]), _i64(a["deadline"]),
             C_OPEN, e["block"]))

    def _on_AvailabilityAnswered(self, conn: sqlite3.Connection, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE challenges SET status=?, window_end=? WHERE challenge_id=?",
                     (C_ANSWERED, _i64(a["windowEnd"]), int(a["challengeId"])))

    def _on_AvailabilityUnanswered(self, conn: sqlite3.Connection, e: dict[str, Any],
                                   extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE challenges SET status=?, slashed=? WHERE challenge_id=?",
                     (C_UNANSWERED, str(a["slashed"]), int(a["challengeId"])))

    def _on_BillingFaultProven(self, conn: sqlite3.Connection, e: dict[str, Any],
                               extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("INSERT OR REPLACE INTO billing_faults VALUES (?, ?, ?, ?, ?, ?)",
                     (int(a["taskId"]), int(a["shard"]), int(a["index"]), _addr(a["prover"]),
                      str(a["slashed"]), e["block"]))

    def _on_DisputeResolved(self, conn: sqlite3.Connection, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE disputes SET status=?, slashed=? WHERE dispute_id=?",
                     (2 if a["minerAtFault"] else 3, str(a["slashed"]), int(a["disputeId"])))

    def _on_DisputeExpired(self, conn: sqlite3.Connection, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE disputes SET status=? WHERE dispute_id=?",
                     (D_EXPIRED, int(e["args"]["disputeId"])))

    # ------------------------------------------------------------------ jobs
    def job(self, task_id: int) -> dict[str, Any] | None:
        """The task with every shard, dispute, availability challenge and proven billing
        fault, or None when the board has no such task. Shard k covers requests
        [k*shardSize, min((k+1)*shardSize, numRequests))."""
        with self._read() as conn:
            task = conn.execute("SELECT * FROM tasks WHERE task_id=?", (task_id,)).fetchone()
            if task is None:
                return None
            shards = conn.execute("SELECT * FROM shards WHERE task_id=? ORDER BY shard",
                                  (task_id,)).fetchall()
            disputes = conn.execute("SELECT * FROM disputes WHERE task_id=? ORDER BY "
                                    "dispute_id", (task_id,)).fetchall()
            challenges = conn.execute("SELECT * FROM challenges WHERE task_id=? ORDER BY "
                                      "challenge_id", (task_id,)).fetchall()
            faults = conn.execute("SELECT * FROM billing_faults WHERE task_id=? ORDER BY "
                                  "shard", (task_id,)).fetchall()
        out = _task_json(task, shards)
        out["shards"] = [_shard_json(task, s) for s in shards]
        out["disputes"] = [_dispute_json(d) for d in disputes]
        out["challenges"] = [_challenge_json(c) for c in challenges]
        out["billingFaults"] = [_billing_json(f) for f in faults]
        return out

    def jobs(self, client: str | None = None) -> list[dict[str, Any]]:
        """Every task (of `client` when given), oldest first, without its shard list."""
        with self._read() as conn:
            if client is None:
                tasks = conn.execute("SELECT * FROM tasks ORDER BY task_id").fetchall()
            else:
                tasks = conn.execute("SELECT * FROM tasks WHERE client=? ORDER BY task_id",
                                     (checksum(client, "client"),)).fetchall()
            shards: dict[int, list[sqlite3.Row]] = {}
            ids = [t["task_id"] for t in tasks]
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                marks = ",".join("?" * len(part))
                for s in conn.execute(f"SELECT * FROM shards WHERE task_id IN ({marks})",
                                      part):
                    shards.setdefault(s["task_id"], []).append(s)
        return [_task_json(t, shards.get(t["task_id"], [])) for t in tasks]

    def open_shards(self, model_id: bytes | None, now: int) -> list[dict[str, Any]]:
        """Shards a miner could claim now: Open, task not cancelled, deadline after `now`.
        `offeredTo` is the one miner the task's client offered it to (None: anyone)."""
        sql = ("SELECT t.*, s.shard, o.miner AS offered_to FROM shards s "
               "JOIN tasks t ON t.task_id = s.task_id "
               "LEFT JOIN offers o ON o.task_id = t.task_id AND o.until > ? AND "
               "o.deployment = (SELECT value FROM meta WHERE key='deployment') "
               "WHERE s.state=? AND t.cancelled=0 AND t.deadline > ?")
        params: list[Any] = [int(now), OPEN, int(now)]
        if model_id is not None:
            sql += " AND t.model_id=?"
            params.append(_hex(model_id_bytes(model_id)))
        sql += " ORDER BY t.task_id, s.shard"
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        out = []
        for r in rows:
            start, end = _range(r, r["shard"])
            out.append({
                "taskId": r["task_id"], "shard": r["shard"], "modelId": r["model_id"],
                "pricePerToken": int(r["price"]), "deadline": r["deadline"],
                "inputUri": r["input_uri"], "inputRoot": r["input_root"], "start": start,
                "end": end, "maxTokensPerRequest": r["max_tokens"],
                "minReputationBps": r["min_rep"],
                "allowProbation": bool(r["allow_probation"]),
                "budget": (end - start) * r["max_tokens"] * int(r["price"]),
                "offeredTo": r["offered_to"],
            })
        return out

    def _pairs(self, sql: str, params: tuple[Any, ...]) -> list[tuple[int, int]]:
        with self._read() as conn:
            return [(r[0], r[1]) for r in conn.execute(sql, params).fetchall()]

    def due_finalize(self, now: int) -> list[tuple[int, int]]:
        """(taskId, shard) Submitted whose challenge window closed by `now`."""
        return self._pairs("SELECT task_id, shard FROM shards WHERE state=? AND window_end<=? "
                           "ORDER BY task_id, shard", (SUBMITTED, int(now)))

    def expired_claims(self, now: int) -> list[tuple[int, int]]:
        """(taskId, shard) Claimed whose claim expired by `now` (reclaimExpired applies)."""
        return self._pairs("SELECT task_id, shard FROM shards WHERE state=? AND "
                           "claim_expiry<=? ORDER BY task_id, shard", (CLAIMED, int(now)))

    def refundable(self, now: int) -> list[tuple[int, int]]:
        """(taskId, shard) still Open at or after the task's deadline (refundUnfinished)."""
        return self._pairs(
            "SELECT s.task_id, s.shard FROM shards s JOIN tasks t ON t.task_id = s.task_id "
            "WHERE s.state=? AND t.cancelled=0 AND t.deadline<=? ORDER BY s.task_id, s.shard",
            (OPEN, int(now)))

    def _triples(self, sql: str, params: tuple[Any, ...]) -> list[tuple[int, int, int]]:
        with self._read() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(sql, params).fetchall()]

    def due_settle(self, now: int) -> list[tuple[int, int, int]]:
        """(challengeId, taskId, shard) of availability challenges still Open at their
        deadline by `now`: unanswered, so the miner is at fault (settleUnanswered)."""
        return self._triples("SELECT challenge_id, task_id, shard FROM challenges WHERE "
                             "status=? AND deadline<=? ORDER BY challenge_id",
                             (C_OPEN, int(now)))

    def due_expire(self, now: int) -> list[tuple[int, int, int]]:
        """(disputeId, taskId, shard) of disputes still Open at their deadline by `now`: no
        verdict can come any more (expireDispute)."""
        return self._triples("SELECT dispute_id, task_id, shard FROM disputes WHERE "
                             "status=? AND deadline<=? ORDER BY dispute_id",
                             (D_OPEN, int(now)))

    def report_horizon(self) -> int:
        """Seconds after an expired dispute's deadline its absent members can surely still
        be reported: VerifierCommittee's unbonding period (the longest seen), since a member's
        stake stays bonded that long past the deadline of any dispute its seat judged."""
        with self._read() as conn:
            return int(self._meta(conn, "verifier_unbonding_period") or 0)

    def due_report(self, now: int) -> list[tuple[int, int, int]]:
        """(disputeId, taskId, shard) of expired disputes whose committee may have absent
        members nobody reported yet (reportAbsence): some weight cast no vote and no absence
        is indexed, within `report_horizon()` of the deadline (after that the members can
        have left)."""
        horizon = self.report_horizon()
        with self._read() as conn:
            rows = conn.execute(
                "SELECT dispute_id, task_id, shard, fault_weight, no_fault_weight, "
                "total_weight FROM disputes WHERE status=? AND absent=0 AND deadline>? "
                "ORDER BY dispute_id", (D_EXPIRED, int(now) - horizon)).fetchall()
        # Weights are wei (text): compared in Python, past SQLite's 64-bit integers.
        return [(r[0], r[1], r[2]) for r in rows
                if int(r[3]) + int(r[4]) < int(r[5])]

    # ------------------------------------------------------------------ miners
    def miners(self) -> list[dict[str, Any]]:
        """Registered miners (GPURegistry events) with their last heartbeat.
        `eligibleAllowingProbation` is the model-independent part of `isEligible` for a task
        that allows probation: active, not exiting, stake >= minStake and reputation >= the
        untrusted floor; `eligible` is the same for an ordinary task, so also not
        `onProbation` (a new or re-registered miner that has not yet passed the committee's
        challenges may claim only tasks that allow it)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT m.*, h.timestamp AS hb_time, h.status AS hb_status FROM miners m "
                "LEFT JOIN heartbeats h ON h.miner = m.address WHERE m.active=1 "
                "ORDER BY m.registered_block, m.address").fetchall()
            min_stake = int(self._meta(conn, "min_stake") or 0)
            floor = int(self._meta(conn, "untrusted_below_bps") or 0)
        out = []
        for r in rows:
            stake, rep = int(r["stake"]), r["reputation_bps"]
            base = bool(not r["exit_requested"] and stake >= min_stake and rep >= floor)
            out.append({
                "address": r["address"], "endpoint": r["endpoint"],
                "models": json.loads(r["models"]), "gpu": json.loads(r["gpu"]),
                "pricePerToken": int(r["price"]), "stake": stake, "locked": int(r["locked"]),
                "slashed": int(r["slashed"]), "reputationBps": rep,
                "exiting": bool(r["exit_requested"]), "withdrawableAt": r["withdrawable_at"],
                "onProbation": bool(r["on_probation"]),
                "eligible": base and not r["on_probation"],
                "eligibleAllowingProbation": base,
                "registeredBlock": r["registered_block"],
                "lastSeen": r["hb_time"],
                "status": None if r["hb_status"] is None else json.loads(r["hb_status"]),
            })
        return out

    def miner(self, address: str) -> dict[str, Any] | None:
        """One registered miner's `miners()` row, or None."""
        address = checksum(address, "miner")
        return next((m for m in self.miners() if m["address"] == address), None)

    def record_heartbeat(self, miner: str, timestamp: int, status: dict[str, Any]) -> None:
        """Store a (verified) heartbeat; an older one than the stored never replaces it."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO heartbeats VALUES (?, ?, ?, ?) ON CONFLICT (miner) DO UPDATE SET "
                "timestamp=excluded.timestamp, status=excluded.status, "
                "received_at=excluded.received_at WHERE excluded.timestamp >= timestamp",
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
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO models VALUES (?, ?, ?, ?)",
                         (model_id, m.name, json.dumps(m.to_dict(), sort_keys=True),
                          time.time()))
        return model_id

    def models(self) -> list[dict[str, Any]]:
        """Known models: every uploaded manifest and every modelId an active miner serves,
        with how many miners may claim an ordinary task for it and their lowest price (None:
        no miner), as `isEligible` says for a task that does not allow probation.
        `probationMiners` counts those that could claim it only from a task that allows
        probation (their asks are not a price an ordinary task can get)."""
        with self._read() as conn:
            manifests = conn.execute("SELECT model_id, name FROM models ORDER BY added_at, "
                                     "model_id").fetchall()

        def empty(model_id: str, name: str | None, manifest: bool) -> dict[str, Any]:
            return {"modelId": model_id, "name": name, "miners": 0, "minPricePerToken": None,
                    "probationMiners": 0, "hasManifest": manifest}

        rows = {r["model_id"]: empty(r["model_id"], r["name"], True) for r in manifests}
        for miner in self.miners():
            for model_id in miner["models"]:
                row = rows.setdefault(model_id, empty(model_id, None, False))
                if miner["eligibleAllowingProbation"] and not miner["eligible"]:
                    row["probationMiners"] += 1
                if not miner["eligible"]:
                    continue
                row["miners"] += 1
                price = miner["pricePerToken"]
                if row["minPricePerToken"] is None or price < row["minPricePerToken"]:
                    row["minPricePerToken"] = price
        return list(rows.values())

    def model(self, model_id_hex: str) -> dict[str, Any] | None:
        """The manifest stored for a modelId, or None."""
        key = _hex(model_id_bytes(model_id_hex))
        with self._read() as conn:
            row = conn.execute("SELECT manifest FROM models WHERE model_id=?",
                               (key,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # ------------------------------------------------------------------ recommendations
    def set_recommendations(self, miner: str, rows: list[dict[str, Any]],
                            computed_at: int) -> None:
        """Replace the ranked open shards stored for `miner`. `computed_at` is the caller's
        clock (chain or wall seconds); freshness is judged on the wall clock at storing."""
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO recommendations VALUES (?, ?, ?, ?)",
                         (checksum(miner, "miner"), json.dumps(rows), float(computed_at),
                          time.time()))

    def recommendations(self, miner: str) -> tuple[list[dict[str, Any]], int] | None:
        """The stored recommendations for `miner` and when they were computed, or None."""
        with self._read() as conn:
            row = conn.execute("SELECT rows, computed_at FROM recommendations WHERE miner=?",
                               (checksum(miner, "miner"),)).fetchone()
        return None if row is None else (list(json.loads(row[0])), int(row[1]))

    def fresh_recommendations(self, miner: str, max_age_s: float) -> list[dict[str, Any]] | None:
        """The stored recommendations for `miner` if stored less than `max_age_s` ago (wall
        clock, so a devnet clock moved ahead cannot keep old ones fresh), else None."""
        with self._read() as conn:
            row = conn.execute("SELECT rows, stored_at FROM recommendations WHERE miner=?",
                               (checksum(miner, "miner"),)).fetchone()
        if row is None or time.time() - float(row[1]) >= max_age_s:
            return None
        return list(json.loads(row[0]))

    # ------------------------------------------------------------------ offers
    def put_offer(self, deployment: str, task_id: int, client: str, miner: str, until: int,
                  timestamp: int, signature: str) -> bool:
        """Store a (verified) offer of `task_id` to `miner` until chain time `until`; it
        replaces a stored one unless that one is newer. Returns whether it was stored."""
        with self._write() as conn:
            return conn.execute(
                "INSERT INTO offers VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (deployment, task_id) DO UPDATE SET client=excluded.client, "
                "miner=excluded.miner, until=excluded.until, timestamp=excluded.timestamp, "
                "signature=excluded.signature, received_at=excluded.received_at "
                "WHERE excluded.timestamp >= timestamp",
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
            cur = conn.execute(
                "INSERT INTO committee_messages (deployment, author, kind, epoch, topic, body, "
                "signature, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, body, str(msg["signature"]), time.time()))
            return int(cur.lastrowid or 0), True

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

    # ------------------------------------------------------------------ inspection
    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every chain-derived row, table by table (what a rebuild must reproduce)."""
        keys = {"events": "block, log_index", "tasks": "task_id", "shards": "task_id, shard",
                "miners": "address", "disputes": "dispute_id", "challenges": "challenge_id",
                "billing_faults": "task_id, shard"}
        with self._read() as conn:
            return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY {k}")]
                    for t, k in keys.items()}


def _gpu(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"name": value.get("name"), "memoryMiB": int(value.get("memoryMiB", 0)),
                "count": int(value.get("count", 0))}
    name, memory, count = value
    return {"name": name, "memoryMiB": int(memory), "count": int(count)}


def _range(task: sqlite3.Row, shard: int) -> tuple[int, int]:
    start = shard * task["shard_size"]
    return start, min(start + task["shard_size"], task["num_requests"])


def _task_json(t: sqlite3.Row, shards: list[sqlite3.Row]) -> dict[str, Any]:
    counts = dict.fromkeys(STATE_NAMES, 0)
    for s in shards:
        counts[STATE_NAMES[s["state"]]] += 1
    return {
        "taskId": t["task_id"], "client": t["client"],
        "arbiter": None if t["arbiter"] == ZERO_ADDRESS else t["arbiter"],
        "modelId": t["model_id"], "inputRoot": t["input_root"], "inputUri": t["input_uri"],
        "numRequests": t["num_requests"], "shardSize": t["shard_size"],
        "numShards": t["num_shards"], "maxTokensPerRequest": t["max_tokens"],
        "pricePerToken": int(t["price"]), "minReputationBps": t["min_rep"],
        "allowProbation": bool(t["allow_probation"]), "payment": int(t["payment"]),
        "deadline": t["deadline"], "createdAt": t["created_at"],
        "cancelled": bool(t["cancelled"]), "createdBlock": t["created_block"],
        "shardStates": counts,
        "tokensUsed": sum(int(s["tokens_used"]) for s in shards
                          if s["state"] in (SUBMITTED, DISPUTED, FINALIZED)),
        "paid": sum(int(s["payment"]) for s in shards),
        "refunded": sum(int(s["refund"]) for s in shards),
        "done": bool(shards) and all(s["state"] in (FINALIZED, REFUNDED) for s in shards),
    }


def _shard_json(t: sqlite3.Row, s: sqlite3.Row) -> dict[str, Any]:
    start, end = _range(t, s["shard"])
    return {
        "shard": s["shard"], "start": start, "end": end, "state": STATE_NAMES[s["state"]],
        "miner": s["miner"], "claimExpiry": s["claim_expiry"], "windowEnd": s["window_end"],
        "collateral": int(s["collateral"]), "tokensUsed": int(s["tokens_used"]),
        "resultRoot": s["result_root"], "resultUri": s["result_uri"],
        "payment": int(s["payment"]), "refund": int(s["refund"]),
        "budget": (end - start) * t["max_tokens"] * int(t["price"]),
        "reclaims": s["reclaims"], "penalty": int(s["penalty"]),
    }


def _dispute_json(d: sqlite3.Row) -> dict[str, Any]:
    """A dispute: judged by epoch `epoch`'s committee, whose weight is `totalWeight`; a
    verdict needs more than 2/3 of it. `votes` recorded so far (by weight per side), and after
    an expiry the members reported `absent` and what their stakes paid the opener."""
    return {
        "disputeId": d["dispute_id"], "shard": d["shard"], "index": d["request_index"],
        "opener": d["opener"], "miner": d["miner"], "bond": int(d["bond"]),
        "deadline": d["deadline"], "evidenceUri": d["evidence_uri"],
        "status": DISPUTE_STATUS[d["status"]], "slashed": int(d["slashed"]),
        "openedBlock": d["opened_block"], "epoch": d["epoch"],
        "totalWeight": int(d["total_weight"]), "faultWeight": int(d["fault_weight"]),
        "noFaultWeight": int(d["no_fault_weight"]), "votes": d["votes"],
        "absent": d["absent"], "absentSlashed": int(d["absent_slashed"]),
    }


def _challenge_json(c: sqlite3.Row) -> dict[str, Any]:
    """An availability challenge: Open until the miner answers (then the shard's window ends
    at `windowEnd`) or `deadline` passes (Unanswered once settled: the miner lost
    `slashed`)."""
    return {
        "challengeId": c["challenge_id"], "shard": c["shard"], "index": c["request_index"],
        "challenger": c["challenger"], "miner": c["miner"], "bond": int(c["bond"]),
        "deadline": c["deadline"], "status": CHALLENGE_STATUS[c["status"]],
        "windowEnd": c["window_end"], "slashed": int(c["slashed"]),
        "openedBlock": c["opened_block"],
    }


def _billing_json(f: sqlite3.Row) -> dict[str, Any]:
    return {"shard": f["shard"], "index": f["request_index"], "prover": f["prover"],
            "slashed": int(f["slashed"]), "provenBlock": f["proven_block"]}
