"""Matching: which open shards a miner should claim, best first.

A recommendation only saves the miner a search; the contract's `claimShard` decides (it
checks `isEligible` again). The ranking mirrors the contract's eligibility (the model is
served in a precision the task accepts, the task pays at least the miner's price, the
reputation floor is met, and a miner on probation gets only tasks that allow probation), leaves
out a task that requires activation commitments from a miner whose heartbeat says its engine
makes none, leaves out a
task its client offered to another miner (`offeredTo`, see `POST /tasks/{id}/offer`), and then
prefers the best paid work, sooner deadlines first. Shards that tie (typically the shards of
one task) are ordered by rendezvous hashing on (miner, taskId, shard): every miner gets its
own stable order, so two miners polling at once go for different shards instead of racing
for the same claim. Shards offered to the miner come before everything else.
"""

from __future__ import annotations

import hashlib
from typing import Any

from market.protocol.precision import accepts, parse_precision


def rendezvous_score(miner: str, task_id: int, shard: int) -> int:
    """A stable pseudo-random weight of (miner, shard); the highest goes first on a tie."""
    key = f"{miner.lower()}:{int(task_id)}:{int(shard)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def miner_alive(miner: dict[str, Any], wall: float, ttl_s: float) -> bool:
    """Whether a `Board.miners()` row's miner is alive at wall-clock `wall`: its own `alive`
    when already computed, else a heartbeat within `ttl_s` (the market's
    `heartbeat_ttl_s`)."""
    if miner.get("alive") is not None:
        return bool(miner["alive"])
    last = miner.get("lastSeen")
    return last is not None and wall - float(last) < ttl_s


def eligible(shard: dict[str, Any], miner: dict[str, Any], now: int) -> bool:
    """Whether `miner` (a `Board.miners()` row) may claim `shard` (a `Board.open_shards()`
    row) at chain time `now`, as far as the board knows, and is the one it is offered to when
    its client offered it to one. A miner on probation may claim only a task that allows
    probation (`isEligible(..., task.allowProbation)`); an untrusted miner with a paid
    re-challenge pending, only one that allows probation and sets no reputation floor (the
    committee's challenges), whatever its reputation. The miner's declared precision for
    the model must be in the task's accepted mask (TaskRegistry's `PrecisionNotAccepted`),
    and a task requiring commitments is not shown to a miner whose last heartbeat says its
    engine makes none (`status.commitments`; unknown counts as able: the miner checks)."""
    if miner.get("exiting", False):
        return False
    rechallenge = bool(miner.get("rechallengePending", False)
                       and shard.get("allowProbation", False)
                       and int(shard.get("minReputationBps", 0)) == 0)
    if miner.get("onProbation", False) or rechallenge:
        if not (shard.get("allowProbation", False)
                and miner.get("eligibleAllowingProbation", False)):
            return False
    elif not miner.get("eligible", True):
        return False
    offered_to = shard.get("offeredTo")
    if offered_to is not None and str(offered_to).lower() != str(miner["address"]).lower():
        return False
    model = str(shard["modelId"]).lower()
    served = {str(m).lower() for m in miner.get("models", ())}
    declared = {str(m).lower(): p for m, p in (miner.get("precisions") or {}).items()}
    if model in declared and not accepts(int(shard.get("precisions", 0)),
                                         parse_precision(declared[model])):
        return False
    status = miner.get("status") or {}
    if shard.get("requireCommitments", False) and status.get("commitments") is False:
        return False
    return (model in served
            and int(miner["pricePerToken"]) <= int(shard["pricePerToken"])
            and (rechallenge
                 or int(miner["reputationBps"]) >= int(shard.get("minReputationBps", 0)))
            and int(shard["deadline"]) > now)


def rank_open_shards(open_shards: list[dict[str, Any]], miner: dict[str, Any], now: int,
                     limit: int) -> list[dict[str, Any]]:
    """The shards `miner` may claim, best first (those offered to it first: a client chose
    it, and the committee's challenges come that way and wait on an answer window; then
    price desc, deadline asc, then the miner's rendezvous order), at most `limit` of them."""
    if limit <= 0:
        return []
    address = str(miner["address"])
    candidates = [s for s in open_shards if eligible(s, miner, now)]
    candidates.sort(key=lambda s: (s.get("offeredTo") is None, -int(s["pricePerToken"]),
                                   int(s["deadline"]),
                                   -rendezvous_score(address, s["taskId"], s["shard"])))
    return candidates[:limit]
