"""The board's read queries: jobs with their shards, disputes and challenges, the open
shards miners may claim, what the settlement sweeps find due, the miner directory and the
known models, plus the per-miner recommendations the workers store (derived data, dropped
with the chain tables)."""

from __future__ import annotations

import json
import time
from typing import Any

from market.protocol.precision import Precision, mask_labels
from market.service.boarddb import (
    C_OPEN,
    CHALLENGE_STATUS,
    CLAIMED,
    D_EXPIRED,
    D_OPEN,
    DISPUTE_STATUS,
    DISPUTED,
    FINALIZED,
    OPEN,
    REFUNDED,
    STATE_NAMES,
    SUBMITTED,
    ZERO_ADDRESS,
    BoardBase,
    _hex,
    _range,
    checksum,
    model_id_bytes,
)
from market.service.boardsql import upsert
from market.standing import miner_standing


class BoardQueries(BoardBase):
    """Reads over the chain tables and the market's state (see the module doc)."""

    # ------------------------------------------------------------------ jobs
    def job(self, task_id: int) -> dict[str, Any] | None:
        """The task with every shard, dispute, availability challenge and proven billing
        fault, or None when the board has no such task. Shard k covers requests
        [k*shardSize, min((k+1)*shardSize, numRequests)). One snapshot: a task row and its
        shards are never from either side of an indexed chunk."""
        with self.snapshot(), self._read() as conn:
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
        """Every task (of `client` when given), oldest first, without its shard list (its
        shard counts, read in the tasks' snapshot)."""
        with self.snapshot(), self._read() as conn:
            if client is None:
                tasks = conn.execute("SELECT * FROM tasks ORDER BY task_id").fetchall()
            else:
                tasks = conn.execute("SELECT * FROM tasks WHERE client=? ORDER BY task_id",
                                     (checksum(client, "client"),)).fetchall()
            shards: dict[int, list[Any]] = {}
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
                "precisions": r["precisions"],
                "requireCommitments": bool(r["require_commitments"]),
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
        untrusted floor, or a re-challenge pending (then only for a task with no reputation
        floor, as the committee's challenges are); `eligible` is the same for an ordinary
        task, so also not `onProbation` (a new or re-registered miner that has not yet passed
        the committee's challenges, or one that missed too many in a row, may claim only
        tasks that allow it). `standing` says it in a word (`market.standing`)."""
        with self.snapshot(), self._read() as conn:
            rows = conn.execute(
                "SELECT m.*, h.timestamp AS hb_time, h.status AS hb_status FROM miners m "
                "LEFT JOIN heartbeats h ON h.miner = m.address WHERE m.active=1 "
                "ORDER BY m.registered_block, m.address").fetchall()
            min_stake = int(self._meta(conn, "min_stake") or 0)
            floor = int(self._meta(conn, "untrusted_below_bps") or 0)
        out = []
        for r in rows:
            stake, rep = int(r["stake"]), r["reputation_bps"]
            staked = bool(not r["exit_requested"] and stake >= min_stake)
            base = staked and rep >= floor
            pending = bool(r["rechallenge_pending"])
            models = json.loads(r["models"])
            out.append({
                "address": r["address"], "endpoint": r["endpoint"],
                "models": models,
                "precisions": {m: Precision(p).label for m, p in
                               zip(models, json.loads(r["precisions"]), strict=True)},
                "gpu": json.loads(r["gpu"]),
                "pricePerToken": int(r["price"]), "stake": stake, "locked": int(r["locked"]),
                "slashed": int(r["slashed"]), "reputationBps": rep,
                "exiting": bool(r["exit_requested"]), "withdrawableAt": r["withdrawable_at"],
                "onProbation": bool(r["on_probation"]),
                "untrusted": rep < floor,
                "rechallengePending": pending,
                "missedReports": int(r["missed_reports"]),
                "standing": miner_standing(
                    reputation_bps=rep, untrusted_below_bps=floor,
                    on_probation=bool(r["on_probation"]), rechallenge_pending=pending,
                    exiting=bool(r["exit_requested"])),
                "eligible": base and not r["on_probation"],
                "eligibleAllowingProbation": base or (staked and pending),
                "registeredBlock": r["registered_block"],
                "lastSeen": r["hb_time"],
                "status": None if r["hb_status"] is None else json.loads(r["hb_status"]),
            })
        return out

    def miner(self, address: str) -> dict[str, Any] | None:
        """One registered miner's `miners()` row, or None."""
        address = checksum(address, "miner")
        return next((m for m in self.miners() if m["address"] == address), None)

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

    # ------------------------------------------------------------------ recommendations
    def set_recommendations(self, miner: str, rows: list[dict[str, Any]],
                            computed_at: int) -> None:
        """Replace the ranked open shards stored for `miner`. `computed_at` is the caller's
        clock (chain or wall seconds); freshness is judged on the wall clock at storing."""
        with self._write(alone=False) as conn:
            upsert(conn, "recommendations", ("miner",),
                   ("miner", "rows", "computed_at", "stored_at"),
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

    # ------------------------------------------------------------------ history views
    def recent_jobs(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` tasks, newest first, each with its shards (as `job`)."""
        with self._read() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT task_id FROM tasks ORDER BY task_id DESC LIMIT ?", (limit,))]
        return [job for task_id in ids if (job := self.job(task_id)) is not None]

    def recent_disputes(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` disputes of every task, newest first (`_dispute_json` with
        its `taskId`)."""
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM disputes ORDER BY dispute_id DESC LIMIT ?",
                                (limit,)).fetchall()
        return [{"taskId": d["task_id"], **_dispute_json(d)} for d in rows]

    def recent_challenges(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` availability challenges, newest first, with their `taskId`."""
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM challenges ORDER BY challenge_id DESC LIMIT ?",
                                (limit,)).fetchall()
        return [{"taskId": c["task_id"], **_challenge_json(c)} for c in rows]

    def events(self, names: tuple[str, ...], *, tx: str | None = None,
               limit: int = 10_000) -> list[dict[str, Any]]:
        """Indexed events named in `names` (every name when empty; only transaction `tx`'s
        when given), oldest first: block, logIndex, tx, contract, name and decoded args."""
        where, params = [], []
        if names:
            where.append(f"name IN ({','.join('?' * len(names))})")
            params += list(names)
        if tx is not None:
            where.append("tx_hash = ?")
            params.append(tx.lower())
        sql = ("SELECT * FROM (SELECT * FROM events"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY block DESC, log_index DESC LIMIT ?) AS newest "
               "ORDER BY block, log_index")
        with self._read() as conn:
            rows = conn.execute(sql, (*params, limit)).fetchall()
        return [{"block": r["block"], "logIndex": r["log_index"], "tx": r["tx_hash"],
                 "contract": r["contract"], "name": r["name"], "args": json.loads(r["args"])}
                for r in rows]

    def counts(self) -> dict[str, dict[str, int]]:
        """How many shards are in each state, tasks active / done / cancelled, disputes and
        challenges by status: the market's gauges."""
        out: dict[str, dict[str, int]] = {
            "shards": dict.fromkeys(STATE_NAMES, 0),
            "tasks": {"active": 0, "done": 0, "cancelled": 0},
            "disputes": dict.fromkeys(DISPUTE_STATUS[1:], 0),
            "challenges": dict.fromkeys(CHALLENGE_STATUS[1:], 0),
        }
        with self.snapshot(), self._read() as conn:
            for state, n in conn.execute("SELECT state, COUNT(*) FROM shards GROUP BY state"):
                out["shards"][STATE_NAMES[state]] = n
            for status, n in conn.execute("SELECT status, COUNT(*) FROM disputes GROUP BY "
                                          "status"):
                out["disputes"][DISPUTE_STATUS[status]] = n
            for status, n in conn.execute("SELECT status, COUNT(*) FROM challenges GROUP BY "
                                          "status"):
                out["challenges"][CHALLENGE_STATUS[status]] = n
            row = conn.execute(
                "SELECT SUM(t.cancelled), SUM(CASE WHEN t.cancelled = 0 AND NOT EXISTS (SELECT "
                "1 FROM shards s WHERE s.task_id = t.task_id AND s.state NOT IN (?, ?)) THEN 1 "
                "ELSE 0 END), COUNT(*) FROM tasks t", (FINALIZED, REFUNDED)).fetchone()
        cancelled, done, total = (int(v or 0) for v in row)
        out["tasks"].update(cancelled=cancelled, done=done, active=total - cancelled - done)
        return out

    # ------------------------------------------------------------------ inspection
    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every chain-derived row, table by table (what a rebuild must reproduce)."""
        keys = {"events": "block, log_index", "tasks": "task_id", "shards": "task_id, shard",
                "miners": "address", "disputes": "dispute_id", "challenges": "challenge_id",
                "billing_faults": "task_id, shard"}
        with self.snapshot(), self._read() as conn:
            return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY {k}")]
                    for t, k in keys.items()}


def _task_json(t: Any, shards: list[Any]) -> dict[str, Any]:
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
        "allowProbation": bool(t["allow_probation"]), "precisions": t["precisions"],
        "acceptedPrecisions": mask_labels(t["precisions"]),
        "requireCommitments": bool(t["require_commitments"]), "payment": int(t["payment"]),
        "deadline": t["deadline"], "createdAt": t["created_at"],
        "cancelled": bool(t["cancelled"]), "createdBlock": t["created_block"],
        "shardStates": counts,
        "tokensUsed": sum(int(s["tokens_used"]) for s in shards
                          if s["state"] in (SUBMITTED, DISPUTED, FINALIZED)),
        "paid": sum(int(s["payment"]) for s in shards),
        "refunded": sum(int(s["refund"]) for s in shards),
        "done": bool(shards) and all(s["state"] in (FINALIZED, REFUNDED) for s in shards),
    }


def _shard_json(t: Any, s: Any) -> dict[str, Any]:
    start, end = _range(t, s["shard"])
    return {
        "shard": s["shard"], "start": start, "end": end, "state": STATE_NAMES[s["state"]],
        "miner": s["miner"], "claimExpiry": s["claim_expiry"], "windowEnd": s["window_end"],
        "collateral": int(s["collateral"]), "tokensUsed": int(s["tokens_used"]),
        "resultRoot": s["result_root"], "resultUri": s["result_uri"],
        "payment": int(s["payment"]), "refund": int(s["refund"]),
        "budget": (end - start) * t["max_tokens"] * int(t["price"]),
        "reclaims": s["reclaims"], "penalty": int(s["penalty"]),
        "precision": Precision(s["precision"]).label if s["precision"] else None,
    }


def _dispute_json(d: Any) -> dict[str, Any]:
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


def _challenge_json(c: Any) -> dict[str, Any]:
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


def _billing_json(f: Any) -> dict[str, Any]:
    return {"shard": f["shard"], "index": f["request_index"], "prover": f["prover"],
            "slashed": int(f["slashed"]), "provenBlock": f["proven_block"]}
