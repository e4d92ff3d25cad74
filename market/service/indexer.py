"""The chain indexer: TaskRegistry, GPURegistry, VerifierCommittee and Arbitration events
applied in (block, logIndex) order to the board's chain tables (tasks, shards, miners,
disputes, challenges, billing faults).

The chain stays the source of truth, so these tables can always be rebuilt: deleting them
and indexing again from the deploy block gives the same rows. Their layout is versioned by
`CHAIN_LAYOUT` (meta key `schema`): a file of an older layout has them dropped and rebuilt
from the events on the next `index`, instead of being migrated (the market's own state, in
`market.service.state`, is migrated and never dropped). Each event is applied once: its
(block, logIndex) is recorded in the same transaction that applies it and moves the cursor,
so a crash or two indexers racing never double-apply one. The few fields no event carries
are read from the chain as the event is indexed (a task's parameters, a dispute's committee
epoch and weight, which never change, and a registered miner's probation, which
ProbationEnded later clears), so a board rebuilt later ends in the same state.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from market.service.boarddb import (
    C_ANSWERED,
    C_OPEN,
    C_UNANSWERED,
    CLAIMED,
    D_EXPIRED,
    D_OPEN,
    DISPUTED,
    FINALIZED,
    KEPT_META,
    OPEN,
    REFUNDED,
    SUBMITTED,
    ZERO_ADDRESS,
    BoardBase,
    BoardError,
    _addr,
    _hex,
    _i64,
    _jsonable,
    _range,
    deployment_identity,
)
from market.service.boardsql import Conn, upsert

if TYPE_CHECKING:
    from market.chain.deploy import Quarry

CHAIN_LAYOUT = "5"
"""The chain tables' layout; bump it when they change (they are then rebuilt, not migrated)."""

# The events the board applies, by contract (Quarry attribute, contract name).
INDEXED_EVENTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("tasks", "TaskRegistry"): (
        "TaskCreated", "ShardClaimed", "ResultSubmitted", "ClaimReclaimed", "ShardFinalized",
        "ShardRefunded", "TaskCancelled", "ShardDisputed", "ShardDisputeResolved",
    ),
    ("gpu", "GPURegistry"): (
        "MinerRegistered", "MinerUpdated", "StakeAdded", "ExitRequested", "StakeWithdrawn",
        "CollateralLocked", "CollateralUnlocked", "Slashed", "ReputationSet", "MinStakeSet",
        "UntrustedBelowSet", "InitialReputationSet", "ProbationEnded", "RechallengeRequested",
        "ReportMissed",
    ),
    ("committee", "VerifierCommittee"): (
        "UnbondingPeriodSet", "VerifierRegistered", "VerifierDisplaced",
        "VerifierExitRequested", "VerifierStakeWithdrawn", "AbsencePenalized",
        "ChallengeSetCommitted", "ReputationSubmitted", "ReputationSkipped",
    ),
    ("arbitration", "Arbitration"): (
        "DisputeOpened", "VoteCast", "DisputeResolved", "DisputeExpired", "AbsenceReported",
        "AvailabilityChallenged", "AvailabilityAnswered", "AvailabilityUnanswered",
        "BillingFaultProven",
    ),
}

RECORDED_ONLY = frozenset({
    "VerifierRegistered", "VerifierDisplaced", "VerifierExitRequested",
    "VerifierStakeWithdrawn", "AbsencePenalized", "ChallengeSetCommitted",
    "ReputationSubmitted", "ReputationSkipped",
})
"""Events kept only in the `events` table, for the history views (committee membership,
reported epochs, reputation over epochs): no chain table follows them."""

log = logging.getLogger("quarry.index")


CHAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    block INTEGER NOT NULL, log_index INTEGER NOT NULL, tx_hash TEXT NOT NULL,
    contract TEXT NOT NULL, name TEXT NOT NULL, args TEXT NOT NULL,
    PRIMARY KEY (block, log_index));
CREATE INDEX IF NOT EXISTS events_tx ON events (tx_hash);
CREATE TABLE IF NOT EXISTS tasks (
    task_id INTEGER PRIMARY KEY, client TEXT NOT NULL, arbiter TEXT NOT NULL,
    model_id TEXT NOT NULL, input_root TEXT NOT NULL, input_uri TEXT NOT NULL,
    num_requests INTEGER NOT NULL, shard_size INTEGER NOT NULL, num_shards INTEGER NOT NULL,
    max_tokens INTEGER NOT NULL, price TEXT NOT NULL, payment TEXT NOT NULL,
    deadline INTEGER NOT NULL, created_at INTEGER NOT NULL, min_rep INTEGER NOT NULL,
    allow_probation INTEGER NOT NULL DEFAULT 0, precisions INTEGER NOT NULL DEFAULT 0,
    require_commitments INTEGER NOT NULL DEFAULT 0, cancelled INTEGER NOT NULL DEFAULT 0,
    cancel_refund TEXT NOT NULL DEFAULT '0', created_block INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_client ON tasks (client);
CREATE INDEX IF NOT EXISTS tasks_model ON tasks (model_id);
CREATE TABLE IF NOT EXISTS shards (
    task_id INTEGER NOT NULL, shard INTEGER NOT NULL, state INTEGER NOT NULL,
    miner TEXT, claim_expiry INTEGER NOT NULL DEFAULT 0, collateral TEXT NOT NULL DEFAULT '0',
    window_end INTEGER NOT NULL DEFAULT 0, tokens_used TEXT NOT NULL DEFAULT '0',
    result_root TEXT, result_uri TEXT, payment TEXT NOT NULL DEFAULT '0',
    refund TEXT NOT NULL DEFAULT '0', reclaims INTEGER NOT NULL DEFAULT 0,
    penalty TEXT NOT NULL DEFAULT '0', precision INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, shard));
CREATE INDEX IF NOT EXISTS shards_state ON shards (state);
CREATE TABLE IF NOT EXISTS miners (
    address TEXT PRIMARY KEY, models TEXT NOT NULL, precisions TEXT NOT NULL DEFAULT '[]',
    gpu TEXT NOT NULL, endpoint TEXT NOT NULL,
    price TEXT NOT NULL, stake TEXT NOT NULL, locked TEXT NOT NULL DEFAULT '0',
    slashed TEXT NOT NULL DEFAULT '0', reputation_bps INTEGER NOT NULL,
    exit_requested INTEGER NOT NULL DEFAULT 0, withdrawable_at INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1, on_probation INTEGER NOT NULL DEFAULT 0,
    rechallenge_pending INTEGER NOT NULL DEFAULT 0, missed_reports INTEGER NOT NULL DEFAULT 0,
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
CREATE TABLE IF NOT EXISTS recommendations (
    miner TEXT PRIMARY KEY, rows TEXT NOT NULL, computed_at REAL NOT NULL,
    stored_at REAL NOT NULL);
"""
CHAIN_TABLES = ("events", "tasks", "shards", "miners", "disputes", "challenges",
                "billing_faults", "recommendations")
"""Everything derived from the chain (and the recommendations computed from it)."""


def _gpu(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"name": value.get("name"), "memoryMiB": int(value.get("memoryMiB", 0)),
                "count": int(value.get("count", 0))}
    name, memory, count = value
    return {"name": name, "memoryMiB": int(memory), "count": int(count)}


def _log_event(event: dict[str, Any]) -> None:
    """One line per indexed event, tagged with the task and shard it concerns (structured
    logs follow one job through the market, its miners and the verifiers)."""
    a = event["args"]
    fields = {"event": event["name"], "block": event["block"], "tx": event["tx"]}
    for key, name in (("taskId", "task"), ("shard", "shard"), ("disputeId", "dispute"),
                      ("challengeId", "challenge"), ("epoch", "epoch"), ("miner", "miner")):
        if key in a:
            fields[name] = a[key]
    where = "".join(f" {k} {fields[k]}" for k in ("task", "shard", "dispute", "challenge",
                                                    "epoch", "miner") if k in fields)
    log.info("indexed %s%s in block %d", event["name"], where, event["block"], extra=fields)


class ChainIndex(BoardBase):
    """The board's chain tables and their cursor (see the module doc)."""

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
            for table in CHAIN_TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute(f"DELETE FROM meta WHERE key NOT IN {KEPT_META}")

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
        # One snapshot: on PostgreSQL each statement outside one sees the latest commit, so
        # a racing indexer's chunk could land between reading the cursor and its hash.
        with self.snapshot(), self._read() as conn:
            stored_identity = self._meta(conn, "deployment")
            cursor_value = self._meta(conn, "cursor")
            cursor_hash = self._meta(conn, "cursor_hash")
        head = int(rpc(lambda: w3.eth.block_number))
        if cursor_value is not None and stored_identity == identity and \
                head == int(cursor_value):
            # Nothing new: one call. A chain restarted to exactly this height is caught by
            # the checks below at its next block.
            return head
        if stored_identity is not None and stored_identity != identity:
            raise BoardError(
                f"board database {self.where} was built for another deployment "
                f"({stored_identity}), not {identity}: delete it (or reset the board) to "
                "index this one")
        if not rpc(lambda: w3.eth.get_code(q.tasks.address)):
            raise BoardError(
                f"chain reset: no TaskRegistry code at {q.tasks.address} on "
                f"{q.deployment.rpc_url}; the chain was restarted without this deployment")
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
                        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (*key, event["tx"], event["contract"], event["name"],
                         json.dumps(_jsonable(event["args"]), sort_keys=True))).rowcount
                    if inserted and event["name"] not in RECORDED_ONLY:
                        getattr(self, f"_on_{event['name']}")(conn, event, extra)
                stored = self._meta(conn, "cursor")
                if stored is None or int(stored) < end:
                    self._set_meta(conn, "cursor", end)
                    self._set_meta(conn, "cursor_hash", _hex(block["hash"]))
                    self._set_meta(conn, "cursor_time", int(block["timestamp"]))
            for event in events:
                _log_event(event)
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
    def _on_TaskCreated(self, conn: Conn, e: dict[str, Any],
                        extra: dict[str, Any]) -> None:
        a = e["args"]
        task_id = int(a["taskId"])
        t = extra["tasks"][task_id]
        upsert(
            conn, "tasks", ("task_id",),
            ("task_id", "client", "arbiter", "model_id", "input_root", "input_uri",
             "num_requests", "shard_size", "num_shards", "max_tokens", "price", "payment",
             "deadline", "created_at", "min_rep", "allow_probation", "precisions",
             "require_commitments", "created_block", "cancelled", "cancel_refund"),

            (task_id, _addr(a["client"]), _addr(t.arbiter) or ZERO_ADDRESS,
             _hex(a["modelId"]), _hex(a["inputRoot"]), a["inputURI"], int(a["numRequests"]),
             int(a["shardSize"]), int(a["numShards"]), int(t.max_tokens_per_request),
             str(t.price_per_token), str(a["payment"]), _i64(a["deadline"]),
             _i64(t.created_at), int(t.min_reputation_bps), int(bool(a["allowProbation"])),
             int(a["precisions"]), int(bool(a["requireCommitments"])), e["block"], 0, "0"))
        conn.execute("DELETE FROM shards WHERE task_id=?", (task_id,))
        conn.executemany("INSERT INTO shards (task_id, shard, state) VALUES (?, ?, ?)",
                         [(task_id, k, OPEN) for k in range(int(a["numShards"]))])

    def _on_ShardClaimed(self, conn: Conn, e: dict[str, Any],
                         extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute(
            "UPDATE shards SET state=?, miner=?, claim_expiry=?, collateral=?, precision=? "
            "WHERE task_id=? AND shard=?",
            (CLAIMED, _addr(a["miner"]), _i64(a["claimExpiry"]), str(a["collateral"]),
             int(a["precision"]), int(a["taskId"]), int(a["shard"])))

    def _on_ResultSubmitted(self, conn: Conn, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute(
            "UPDATE shards SET state=?, result_root=?, result_uri=?, tokens_used=?, "
            "window_end=? WHERE task_id=? AND shard=?",
            (SUBMITTED, _hex(a["resultRoot"]), a["resultURI"], str(a["tokensUsed"]),
             _i64(a["windowEnd"]), int(a["taskId"]), int(a["shard"])))

    def _on_ClaimReclaimed(self, conn: Conn, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        a = e["args"]
        key = (int(a["taskId"]), int(a["shard"]))
        row = conn.execute("SELECT penalty FROM shards WHERE task_id=? AND shard=?",
                           key).fetchone()
        penalty = str(int(row["penalty"]) + int(a["penalty"])) if row else str(a["penalty"])
        # The contract deletes the shard: it reopens, or reads Refunded (ShardRefunded follows).
        conn.execute(
            "UPDATE shards SET state=?, miner=NULL, claim_expiry=0, collateral='0', "
            "window_end=0, tokens_used='0', result_root=NULL, result_uri=NULL, precision=0, "
            "reclaims=reclaims+1, penalty=? WHERE task_id=? AND shard=?",
            (OPEN if a["reopened"] else REFUNDED, penalty, *key))

    def _on_ShardFinalized(self, conn: Conn, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=?, payment=?, refund=? WHERE task_id=? AND shard=?",
                     (FINALIZED, str(a["payment"]), str(a["refund"]), int(a["taskId"]),
                      int(a["shard"])))

    def _on_ShardRefunded(self, conn: Conn, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=?, refund=? WHERE task_id=? AND shard=?",
                     (REFUNDED, str(a["amount"]), int(a["taskId"]), int(a["shard"])))

    def _on_TaskCancelled(self, conn: Conn, e: dict[str, Any],
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

    def _on_ShardDisputed(self, conn: Conn, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE shards SET state=? WHERE task_id=? AND shard=?",
                     (DISPUTED, int(a["taskId"]), int(a["shard"])))

    def _on_ShardDisputeResolved(self, conn: Conn, e: dict[str, Any],
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
    def _on_MinerRegistered(self, conn: Conn, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        rep = int(self._meta(conn, "initial_reputation_bps") or 0)
        miner = _addr(a["miner"])
        upsert(
            conn, "miners", ("address",),
            ("address", "models", "precisions", "gpu", "endpoint", "price", "stake", "locked",
             "slashed", "reputation_bps", "exit_requested", "withdrawable_at", "active",
             "on_probation", "rechallenge_pending", "missed_reports", "registered_block"),
            (miner, json.dumps([_hex(m) for m in a["modelIds"]]),
             json.dumps([int(p) for p in a["precisions"]]),
             json.dumps(_gpu(a["gpu"])), a["endpoint"], str(a["pricePerToken"]),
             str(a["stake"]), "0", "0", rep, 0, 0, 1, int(extra["probation"][miner]), 0, 0,
             e["block"]))

    def _on_MinerUpdated(self, conn: Conn, e: dict[str, Any],
                         extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET models=?, precisions=?, gpu=?, endpoint=?, price=? "
                     "WHERE address=?",
                     (json.dumps([_hex(m) for m in a["modelIds"]]),
                      json.dumps([int(p) for p in a["precisions"]]), json.dumps(_gpu(a["gpu"])),
                      a["endpoint"], str(a["pricePerToken"]), _addr(a["miner"])))

    def _on_StakeAdded(self, conn: Conn, e: dict[str, Any],
                       extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET stake=? WHERE address=?",
                     (str(a["stake"]), _addr(a["miner"])))

    def _on_ExitRequested(self, conn: Conn, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET exit_requested=1, withdrawable_at=? WHERE address=?",
                     (_i64(a["withdrawableAt"]), _addr(a["miner"])))

    def _on_StakeWithdrawn(self, conn: Conn, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE miners SET active=0, stake='0', locked='0', models='[]', "
                     "precisions='[]' WHERE address=?", (_addr(e["args"]["miner"]),))

    def _on_CollateralLocked(self, conn: Conn, e: dict[str, Any],
                             extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET locked=? WHERE address=?",
                     (str(a["locked"]), _addr(a["miner"])))

    _on_CollateralUnlocked = _on_CollateralLocked

    def _on_Slashed(self, conn: Conn, e: dict[str, Any],
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

    def _on_ReputationSet(self, conn: Conn, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        # A report decides a pending re-challenge and ends a run of missed reports.
        a = e["args"]
        conn.execute("UPDATE miners SET reputation_bps=?, rechallenge_pending=0, "
                     "missed_reports=0 WHERE address=?", (int(a["bps"]), _addr(a["miner"])))

    def _on_RechallengeRequested(self, conn: Conn, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        conn.execute("UPDATE miners SET rechallenge_pending=1, on_probation=1 WHERE address=?",
                     (_addr(e["args"]["miner"]),))

    def _on_ReportMissed(self, conn: Conn, e: dict[str, Any],
                         extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE miners SET missed_reports=?, rechallenge_pending=0, "
                     "on_probation=CASE WHEN ? > on_probation THEN 1 ELSE on_probation END "
                     "WHERE address=?",
                     (int(a["missed"]), int(bool(a["probation"])), _addr(a["miner"])))

    def _on_ProbationEnded(self, conn: Conn, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE miners SET on_probation=0 WHERE address=?",
                     (_addr(e["args"]["miner"]),))

    def _on_MinStakeSet(self, conn: Conn, e: dict[str, Any],
                        extra: dict[str, Any]) -> None:
        self._set_meta(conn, "min_stake", int(e["args"]["minStake"]))

    def _on_UntrustedBelowSet(self, conn: Conn, e: dict[str, Any],
                              extra: dict[str, Any]) -> None:
        self._set_meta(conn, "untrusted_below_bps", int(e["args"]["bps"]))

    def _on_InitialReputationSet(self, conn: Conn, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        self._set_meta(conn, "initial_reputation_bps", int(e["args"]["bps"]))

    # -- VerifierCommittee --------------------------------------------------------------
    def _on_UnbondingPeriodSet(self, conn: Conn, e: dict[str, Any],
                               extra: dict[str, Any]) -> None:
        # The longest period seen: a leaving member stays bonded for the later of the period
        # when it left and the current one, so absences stay reportable at least this long.
        seen = int(self._meta(conn, "verifier_unbonding_period") or 0)
        self._set_meta(conn, "verifier_unbonding_period", max(seen, int(e["args"]["v"])))

    # -- Arbitration --------------------------------------------------------------------
    def _on_DisputeOpened(self, conn: Conn, e: dict[str, Any],
                          extra: dict[str, Any]) -> None:
        a = e["args"]
        dispute_id = int(a["disputeId"])
        d = extra["disputes"][dispute_id]
        upsert(
            conn, "disputes", ("dispute_id",),
            ("dispute_id", "task_id", "shard", "request_index", "opener", "miner", "bond",
             "deadline", "evidence_uri", "status", "opened_block", "epoch", "total_weight",
             "slashed", "fault_weight", "no_fault_weight", "votes", "absent",
             "absent_slashed"),
            (dispute_id, int(a["taskId"]), int(a["shard"]),
             int(a["receipt"]["index"]), _addr(a["opener"]), _addr(a["miner"]),
             str(a["bond"]), _i64(a["deadline"]), a["evidenceURI"], D_OPEN, e["block"],
             int(d.epoch), str(d.total_weight), "0", "0", "0", 0, 0, "0"))

    def _on_VoteCast(self, conn: Conn, e: dict[str, Any],
                     extra: dict[str, Any]) -> None:
        a = e["args"]
        column = "fault_weight" if a["minerAtFault"] else "no_fault_weight"
        row = conn.execute(f"SELECT {column} FROM disputes WHERE dispute_id=?",
                           (int(a["disputeId"]),)).fetchone()
        if row is None:
            return
        conn.execute(f"UPDATE disputes SET {column}=?, votes=votes+1 WHERE dispute_id=?",
                     (str(int(row[0]) + int(a["weight"])), int(a["disputeId"])))

    def _on_AbsenceReported(self, conn: Conn, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        row = conn.execute("SELECT absent_slashed FROM disputes WHERE dispute_id=?",
                           (int(a["disputeId"]),)).fetchone()
        if row is None:
            return
        conn.execute("UPDATE disputes SET absent=absent+1, absent_slashed=? WHERE dispute_id=?",
                     (str(int(row[0]) + int(a["slashed"])), int(a["disputeId"])))

    def _on_AvailabilityChallenged(self, conn: Conn, e: dict[str, Any],
                                   extra: dict[str, Any]) -> None:
        a = e["args"]
        upsert(
            conn, "challenges", ("challenge_id",),
            ("challenge_id", "task_id", "shard", "request_index", "challenger", "miner",
             "bond", "deadline", "status", "opened_block", "window_end", "slashed"),
            (int(a["challengeId"]), int(a["taskId"]), int(a["shard"]), int(a["index"]),
             _addr(a["challenger"]), _addr(a["miner"]), str(a["bond"]), _i64(a["deadline"]),
             C_OPEN, e["block"], 0, "0"))

    def _on_AvailabilityAnswered(self, conn: Conn, e: dict[str, Any],
                                 extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE challenges SET status=?, window_end=? WHERE challenge_id=?",
                     (C_ANSWERED, _i64(a["windowEnd"]), int(a["challengeId"])))

    def _on_AvailabilityUnanswered(self, conn: Conn, e: dict[str, Any],
                                   extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE challenges SET status=?, slashed=? WHERE challenge_id=?",
                     (C_UNANSWERED, str(a["slashed"]), int(a["challengeId"])))

    def _on_BillingFaultProven(self, conn: Conn, e: dict[str, Any],
                               extra: dict[str, Any]) -> None:
        a = e["args"]
        upsert(conn, "billing_faults", ("task_id", "shard"),
               ("task_id", "shard", "request_index", "prover", "slashed", "proven_block"),
               (int(a["taskId"]), int(a["shard"]), int(a["index"]), _addr(a["prover"]),
                str(a["slashed"]), e["block"]))

    def _on_DisputeResolved(self, conn: Conn, e: dict[str, Any],
                            extra: dict[str, Any]) -> None:
        a = e["args"]
        conn.execute("UPDATE disputes SET status=?, slashed=? WHERE dispute_id=?",
                     (2 if a["minerAtFault"] else 3, str(a["slashed"]), int(a["disputeId"])))

    def _on_DisputeExpired(self, conn: Conn, e: dict[str, Any],
                           extra: dict[str, Any]) -> None:
        conn.execute("UPDATE disputes SET status=? WHERE dispute_id=?",
                     (D_EXPIRED, int(e["args"]["disputeId"])))
