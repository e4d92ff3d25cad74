"""The job board against a real Anvil: every life cycle the contracts allow (finalize,
reclaim, cancel, refund after the deadline, disputes both ways with stake-weighted votes,
availability challenges answered and unanswered, billing faults, expired disputes with
absences reported, miners on probation) indexed into SQLite and into PostgreSQL (`board_at`)
and checked field by field against the contracts' views; rebuilds from scratch and in
one-block chunks give the same rows; racing indexers never double-apply; a chain reset is
detected; an older board file is migrated. Plus the board's market-only tables and the
matching order."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from market.chain.contracts import Ballot, ShardState
from market.chain.deploy import Quarry
from market.protocol import (
    Receipt,
    Vote,
    input_tree,
    output_hash,
    quorum_signatures,
    receipts_tree,
    request_hash,
)
from market.protocol.precision import Precision, mask_labels, precision_mask
from market.service.board import (
    CHAIN_LAYOUT,
    CHALLENGE_STATUS,
    DISPUTE_STATUS,
    STATE_NAMES,
    STATE_VERSION,
    Board,
    BoardError,
    checksum,
)
from market.service.matching import rank_open_shards, rendezvous_score

if TYPE_CHECKING:
    from boardplaces import BoardPlaces
    from conftest import Devnet
    from eth_account.signers.local import LocalAccount

    from market.local.postgres import PostgresServer

MAX_TOKENS = 8
MODEL_HEX = "0x" + "11" * 32


# -- helpers ------------------------------------------------------------------------------


def assert_has(row: dict, expected: dict) -> None:
    assert {k: row.get(k) for k in expected} == expected


def post(net: Devnet, n: int, shard_size: int, *, deadline_s: int = 3600,
         client: LocalAccount | None = None, arbiter: str | None = None,
         tag: str = "t", allow_probation: bool = False, precisions: int = 0,
         require_commitments: bool = False) -> tuple[int, list[bytes]]:
    hashes = [request_hash({"custom_id": f"{tag}-{i}", "body": {"prompt": f"p{i}"}})
              for i in range(n)]
    root = input_tree(hashes).root
    kwargs = {"arbiter": arbiter} if arbiter else {}
    task_id, _ = net.q.tasks.create_task(
        client or net.client, model_id=net.MODEL_ID, input_root=root,
        input_uri="sha256:" + root.hex(), num_requests=n, shard_size=shard_size,
        max_tokens_per_request=MAX_TOKENS, price_per_token=net.PRICE,
        deadline=net.chain.timestamp() + deadline_s, allow_probation=allow_probation,
        precisions=precisions, require_commitments=require_commitments, **kwargs)
    return task_id, hashes


def submit(net: Devnet, task_id: int, hashes: list[bytes], shard: int,
           miner: LocalAccount, billed: dict[int, int] | None = None,
           ) -> tuple[list[Receipt], list[bytes], int]:
    """Claim and submit with real signed receipts; returns them, their sigs and the tokens.
    `billed` maps request indices to a token count the receipt claims instead."""
    q = net.q
    q.tasks.claim_shard(miner, task_id, shard)
    start, end = q.tasks.shard_range(task_id, shard)
    receipts = [Receipt(task_id, shard, i, hashes[i], output_hash(f"a{i}", [1] * (1 + i % 5)),
                        (billed or {}).get(i, 1 + i % 5), net.MODEL_ID)
                for i in range(start, end)]
    sigs = [r.sign(miner.key, net.chain.chain_id, q.tasks.address) for r in receipts]
    tokens = sum(r.output_tokens for r in receipts)
    q.tasks.submit_result(miner, task_id, shard, receipts_tree(receipts).root,
                          f"sha256:{task_id:04x}{shard:060x}", tokens)
    return receipts, sigs, tokens


def assert_matches_chain(board: Board, q: Quarry, task_id: int) -> dict:
    """The board's job equals what TaskRegistry's views say, field by field."""
    job = board.job(task_id)
    assert job is not None
    t = q.tasks.get_task(task_id)
    assert (job["client"], job["modelId"], job["inputRoot"], job["inputUri"]) == (
        t.client, "0x" + t.model_id.hex(), "0x" + t.input_root.hex(), t.input_uri)
    assert (job["numRequests"], job["shardSize"], job["numShards"], job["deadline"]) == (
        t.num_requests, t.shard_size, t.num_shards, t.deadline)
    assert (job["maxTokensPerRequest"], job["pricePerToken"], job["minReputationBps"]) == (
        t.max_tokens_per_request, t.price_per_token, t.min_reputation_bps)
    assert job["allowProbation"] == t.allow_probation
    assert (job["precisions"], job["requireCommitments"]) == (t.precisions,
                                                              t.require_commitments)
    assert job["acceptedPrecisions"] == mask_labels(t.precisions)
    assert (job["cancelled"], job["createdAt"]) == (t.cancelled, t.created_at)
    assert len(job["shards"]) == t.num_shards
    for row in job["shards"]:
        s = q.tasks.get_shard(task_id, row["shard"])
        assert row["state"] == STATE_NAMES[s.state], row
        assert row["miner"] == (None if int(s.miner, 16) == 0 else s.miner)
        assert (row["claimExpiry"], row["windowEnd"], row["tokensUsed"], row["collateral"]) == (
            s.claim_expiry, s.window_end, s.tokens_used, s.collateral)
        assert row["resultUri"] == (s.result_uri or None)
        assert (row["start"], row["end"]) == q.tasks.shard_range(task_id, row["shard"])
        assert row["budget"] == q.tasks.shard_budget(task_id, row["shard"])
        assert row["precision"] == (Precision(s.precision).label if s.precision else None)
    return job


def assert_miners_match_chain(board: Board, q: Quarry) -> None:
    for m in board.miners():
        info = q.gpu.miner_info(m["address"])
        assert (m["stake"], m["locked"], m["reputationBps"], m["pricePerToken"]) == (
            info.stake, info.locked, info.reputation_bps, info.price_per_token)
        assert m["models"] == ["0x" + x.hex() for x in q.gpu.models_of(m["address"])]
        assert m["precisions"] == {
            "0x" + x.hex(): precision.label for x in q.gpu.models_of(m["address"])
            if (precision := q.gpu.precision_of(m["address"], x)) is not None}
        assert m["exiting"] == (info.exit_requested_at != 0)
        assert m["onProbation"] == info.on_probation == q.gpu.on_probation(m["address"])
        for model in q.gpu.models_of(m["address"]):
            assert m["eligible"] == q.gpu.is_eligible(m["address"], model)
            assert m["eligibleAllowingProbation"] == q.gpu.is_eligible(m["address"], model,
                                                                       0, True)


def assert_disputes_match_chain(board: Board, q: Quarry, task_id: int) -> None:
    """The board's disputes and challenges of a task equal Arbitration's views."""
    job = board.job(task_id)
    assert job is not None
    for row in job["disputes"]:
        d = q.arbitration.get_dispute(row["disputeId"])
        assert (row["status"], row["opener"], row["miner"], row["bond"], row["deadline"]) == (
            DISPUTE_STATUS[d.status], d.opener, d.miner, d.bond, d.deadline)
        assert (row["epoch"], row["totalWeight"], row["faultWeight"], row["noFaultWeight"]) == (
            d.epoch, d.total_weight, d.fault_weight, d.no_fault_weight)
        assert (row["shard"], row["index"], row["evidenceUri"]) == (
            d.shard, d.receipt.index, d.evidence_uri)
        ballots = [q.arbitration.ballot_of(row["disputeId"], m)
                   for m in q.committee.members_at(d.epoch)]
        assert row["votes"] == sum(b in (Ballot.FAULT, Ballot.NO_FAULT) for b in ballots)
        assert row["absent"] == sum(b == Ballot.ABSENT for b in ballots)
    for row in job["challenges"]:
        c = q.arbitration.get_challenge(row["challengeId"])
        assert (row["status"], row["shard"], row["index"], row["challenger"], row["miner"],
                row["bond"], row["deadline"]) == (
            CHALLENGE_STATUS[c.status], c.shard, c.index, c.challenger, c.miner, c.bond,
            c.deadline)


# -- chain-indexed life cycles ------------------------------------------------------------


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_claim_submit_finalize_indexed(devnet: Devnet, board_at: BoardPlaces) -> None:
    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    assert board.cursor() == -1 and board.job(1) is None
    task_id, hashes = post(net, 5, 2)
    assert board.index(q) == net.chain.block_number() == board.cursor()
    job = assert_matches_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"]] == ["Open"] * 3
    assert [(s["start"], s["end"]) for s in job["shards"]] == [(0, 2), (2, 4), (4, 5)]
    assert job["arbiter"] is None and job["createdBlock"] == board.cursor()
    assert job["payment"] == 5 * MAX_TOKENS * net.PRICE
    now = net.chain.timestamp()
    opened = board.open_shards(net.MODEL_ID, now)
    assert [(o["taskId"], o["shard"]) for o in opened] == [(task_id, k) for k in range(3)]
    assert_has(opened[2], {"modelId": MODEL_HEX, "start": 4, "end": 5,
                           "maxTokensPerRequest": MAX_TOKENS, "pricePerToken": net.PRICE,
                           "inputUri": job["inputUri"], "minReputationBps": 0})
    assert board.open_shards(net.OTHER_MODEL_ID, now) == []
    assert board.open_shards(None, now) == opened
    assert board.open_shards(net.MODEL_ID, job["deadline"]) == []  # deadline passed

    _, _, tokens = submit(net, task_id, hashes, 0, net.miner)
    q.tasks.claim_shard(net.miner2, task_id, 1)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"]] == ["Submitted", "Claimed", "Open"]
    assert job["shardStates"]["Submitted"] == 1 and job["tokensUsed"] == tokens
    assert_miners_match_chain(board, q)
    assert [(o["taskId"], o["shard"]) for o in board.open_shards(net.MODEL_ID, now)] == [
        (task_id, 2)]
    window_end = job["shards"][0]["windowEnd"]
    assert board.due_finalize(window_end - 1) == []
    assert board.due_finalize(window_end) == [(task_id, 0)]
    assert board.expired_claims(job["shards"][1]["claimExpiry"]) == [(task_id, 1)]

    net.chain.advance_time(q.tasks.params()["challenge_window"])
    q.tasks.finalize_shard(net.anyone, task_id, 0)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    budget = 2 * MAX_TOKENS * net.PRICE
    assert_has(job["shards"][0], {"state": "Finalized", "payment": tokens * net.PRICE,
                                  "refund": budget - tokens * net.PRICE})
    assert job["paid"] == tokens * net.PRICE and not job["done"]
    assert board.due_finalize(net.chain.timestamp()) == []
    assert_miners_match_chain(board, q)
    assert [j["taskId"] for j in board.jobs(net.client.address.lower())] == [task_id]
    assert board.jobs(net.client2.address) == []
    assert "shards" not in board.jobs()[0]
    assert board.index(q) == board.cursor()  # nothing new: idempotent


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_reclaim_cancel_and_refund_indexed(devnet: Devnet, board_at: BoardPlaces) -> None:
    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    reclaimed, hashes = post(net, 4, 2)
    cancelled, _ = post(net, 6, 2, tag="c")
    short, _ = post(net, 2, 1, deadline_s=300, tag="s")
    q.tasks.claim_shard(net.miner, reclaimed, 1)
    q.tasks.claim_shard(net.miner2, cancelled, 0)
    q.tasks.cancel_task(net.client, cancelled)
    board.index(q)
    job = assert_matches_chain(board, q, cancelled)
    assert job["cancelled"] and [s["state"] for s in job["shards"]] == [
        "Claimed", "Refunded", "Refunded"]
    budget = 2 * MAX_TOKENS * net.PRICE
    assert [s["refund"] for s in job["shards"]] == [0, budget, budget]
    assert all(o["taskId"] != cancelled for o in board.open_shards(net.MODEL_ID, 0))

    claim_expiry = board.job(reclaimed)["shards"][1]["claimExpiry"]
    net.chain.advance_time(q.tasks.params()["claim_timeout"])
    now = net.chain.timestamp()
    assert now >= claim_expiry
    assert board.expired_claims(now) == [(reclaimed, 1), (cancelled, 0)]
    assert board.refundable(now) == [(short, 0), (short, 1)]  # past its deadline
    q.tasks.reclaim_expired(net.anyone, reclaimed, 1)
    q.tasks.reclaim_expired(net.anyone, cancelled, 0)
    q.tasks.refund_unfinished(net.anyone, short, 0)
    board.index(q)
    job = assert_matches_chain(board, q, reclaimed)
    collateral = budget * 2000 // 10_000
    assert_has(job["shards"][1], {"state": "Open", "miner": None, "reclaims": 1,
                                  "penalty": collateral // 2})
    job = assert_matches_chain(board, q, cancelled)
    assert job["done"] and job["shards"][0]["state"] == "Refunded"
    assert job["shards"][0]["refund"] == budget and job["refunded"] == 3 * budget
    job = assert_matches_chain(board, q, short)
    assert [s["state"] for s in job["shards"]] == ["Refunded", "Open"]
    assert board.refundable(now) == [(short, 1)]
    assert board.expired_claims(now) == []
    assert_miners_match_chain(board, q)
    slashed = {m["address"]: m["slashed"] for m in board.miners()}
    assert slashed == {net.miner.address: collateral // 2, net.miner2.address: collateral // 2}

    # The reopened shard goes to the other miner and finishes.
    submit(net, task_id=reclaimed, hashes=hashes, shard=1, miner=net.miner2)
    board.index(q)
    assert_matches_chain(board, q, reclaimed)


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_disputes_and_registry_changes_indexed(devnet: Devnet,
                                               board_at: BoardPlaces) -> None:
    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    task_id, hashes = post(net, 8, 4, arbiter=net.client2.address)
    bond = q.arbitration.min_bond()
    opened = []
    for shard in (0, 1):
        receipts, _, _ = submit(net, task_id, hashes, shard, net.miner)
        dispute_id, _ = q.arbitration.open_dispute(
            net.client, task_id, shard, receipts[1], receipts_tree(receipts).proof(1),
            "sha256:" + "ee" * 32, bond)
        opened.append(dispute_id)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert_disputes_match_chain(board, q, task_id)
    assert job["arbiter"] == net.client2.address
    assert [s["state"] for s in job["shards"]] == ["Disputed", "Disputed"]
    assert [(d["disputeId"], d["shard"], d["index"], d["status"], d["opener"], d["bond"])
            for d in job["disputes"]] == [(opened[0], 0, 1, "Open", net.client.address, bond),
                                          (opened[1], 1, 5, "Open", net.client.address, bond)]
    assert_has(job["disputes"][0], {"epoch": q.committee.current_epoch(), "votes": 0,
                                    "totalWeight": 4 * net.VERIFIER_STAKE, "faultWeight": 0})
    assert board.due_finalize(2**40) == []
    assert board.due_expire(job["disputes"][0]["deadline"] - 1) == []
    assert board.due_expire(2**40) == [(opened[0], task_id, 0), (opened[1], task_id, 1)]

    def votes(dispute_id: int, at_fault: bool, keys: list[bytes]) -> list[bytes]:
        return quorum_signatures(Vote(dispute_id, at_fault), keys, net.chain.chain_id,
                                 q.arbitration.address)

    # Votes are recorded by stake until more than two thirds of it agree.
    q.arbitration.cast_votes(net.anyone, opened[0], True, votes(opened[0], True,
                                                                net.verifier_keys[:2]))
    board.index(q)
    assert_disputes_match_chain(board, q, task_id)
    assert_has(board.job(task_id)["disputes"][0], {
        "status": "Open", "votes": 2, "faultWeight": 2 * net.VERIFIER_STAKE})
    q.arbitration.cast_votes(net.anyone, opened[0], True, votes(opened[0], True,
                                                                net.verifier_keys[:3]))
    tx = q.arbitration.cast_votes(net.anyone, opened[1], False,
                                  votes(opened[1], False, net.verifier_keys[1:]))
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert_disputes_match_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"]] == ["Refunded", "Submitted"]
    assert [d["status"] for d in job["disputes"]] == ["MinerAtFault", "MinerNotAtFault"]
    assert job["disputes"][0]["slashed"] > 0 and job["disputes"][1]["slashed"] == 0
    assert [(d["votes"], d["faultWeight"], d["noFaultWeight"]) for d in job["disputes"]] == [
        (3, 3 * net.VERIFIER_STAKE, 0), (3, 0, 3 * net.VERIFIER_STAKE)]
    # No fault closes the window at the resolving block: finalizable at once.
    resolved_at = net.chain.w3.eth.get_block(tx.block_number)["timestamp"]
    assert job["shards"][1]["windowEnd"] == resolved_at
    assert board.due_finalize(resolved_at) == [(task_id, 1)]
    assert board.due_expire(2**40) == [] and board.due_report(2**40) == []
    assert_miners_match_chain(board, q)

    # Registry changes: update, add stake, exit (no longer eligible anywhere).
    from market.chain.contracts import GpuSpec

    q.gpu.update(net.miner2, [net.MODEL_ID, net.OTHER_MODEL_ID], GpuSpec("A100", 40960, 2),
                 "http://m2", net.PRICE // 2)
    q.gpu.add_stake(net.miner2, 10**17)
    q.gpu.request_exit(net.miner)
    board.index(q)
    assert_miners_match_chain(board, q)
    rows = {m["address"]: m for m in board.miners()}
    assert rows[net.miner2.address]["gpu"] == {"name": "A100", "memoryMiB": 40960, "count": 2}
    assert rows[net.miner2.address]["endpoint"] == "http://m2"
    assert rows[net.miner.address]["exiting"] and not rows[net.miner.address]["eligible"]
    models = {m["modelId"]: m for m in board.models()}
    assert_has(models[MODEL_HEX], {"miners": 1, "minPricePerToken": net.PRICE // 2,
                                   "hasManifest": False})
    assert models["0x" + "22" * 32]["miners"] == 1


@pytest.mark.chain
@pytest.mark.timeout(180)
def test_challenges_billing_faults_and_absences_indexed(devnet: Devnet,
                                                       board_at: BoardPlaces) -> None:
    from market.jobs import report_absent

    net, q = devnet, devnet.q
    arb = q.arbitration
    board = Board(board_at("board"))
    task_id, hashes = post(net, 12, 4)
    c_bond = arb.min_availability_bond()

    # Shard 0: a root for results never published; nobody can answer the challenge.
    q.tasks.claim_shard(net.miner, task_id, 0)
    q.tasks.submit_result(net.miner, task_id, 0, b"\x09" * 32, "sha256:" + "00" * 32, 4)
    collateral = q.tasks.get_shard(task_id, 0).collateral
    lost, _ = arb.challenge_availability(net.client, task_id, 0, 2, c_bond)
    # Shard 1: the miner answers; the answered receipt is then disputed and nobody votes.
    receipts, _, _ = submit(net, task_id, hashes, 1, net.miner2)
    answered, _ = arb.challenge_availability(net.client, task_id, 1, 5, c_bond)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert_disputes_match_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"][:2]] == ["Disputed", "Disputed"]
    assert [(c["challengeId"], c["shard"], c["index"], c["status"], c["bond"])
            for c in job["challenges"]] == [(lost, 0, 2, "Open", c_bond),
                                            (answered, 1, 5, "Open", c_bond)]
    deadline = job["challenges"][0]["deadline"]
    assert deadline == arb.get_challenge(lost).deadline
    assert board.due_settle(deadline - 1) == []

    # The miner answers late, yet in time; the other challenge's deadline passes unanswered.
    tree = receipts_tree(receipts)
    net.chain.advance_time(deadline - 10 - net.chain.timestamp())
    arb.answer_availability(net.miner2, answered, receipts[1], tree.proof(1))
    # The board has not seen the answer yet, so both are due once both deadlines passed (the
    # second challenge was opened a few transactions later: its deadline may be a second on).
    net.chain.advance_time(max(deadline, job["challenges"][1]["deadline"])
                           - net.chain.timestamp())
    assert board.due_settle(net.chain.timestamp()) == [(lost, task_id, 0), (answered, task_id, 1)]
    arb.settle_unanswered(net.anyone, lost)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)  # the answer's window is the chain's
    assert_disputes_match_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"][:2]] == ["Refunded", "Submitted"]
    assert_has(job["challenges"][0], {"status": "Unanswered", "slashed": collateral})
    assert_has(job["challenges"][1], {"status": "Answered", "slashed": 0,
                                      "windowEnd": q.tasks.get_shard(task_id, 1).window_end})
    assert board.due_settle(2**40) == []

    dispute_id, _ = arb.open_dispute(net.client, task_id, 1, receipts[1], tree.proof(1), "e",
                                     arb.min_bond())
    # Shard 2: a receipt billing more tokens than a request may have, proven on-chain.
    over, _, _ = submit(net, task_id, hashes, 2, net.miner, billed={9: MAX_TOKENS + 5})
    over_collateral = q.tasks.get_shard(task_id, 2).collateral
    arb.prove_billing_fault(net.client, task_id, 2, over[1], receipts_tree(over).proof(1),
                            bytes(32), [])
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"]] == ["Refunded", "Disputed", "Refunded"]
    assert job["billingFaults"] == [{"shard": 2, "index": 9, "prover": net.client.address,
                                     "slashed": over_collateral, "provenBlock": board.cursor()}]

    # Nobody votes: past the deadline the dispute expires and the whole committee is absent.
    net.chain.advance_time(arb.get_dispute(dispute_id).deadline - net.chain.timestamp())
    board.index(q)
    assert board.due_expire(net.chain.timestamp()) == [(dispute_id, task_id, 1)]
    assert board.due_report(net.chain.timestamp()) == []
    tx = arb.expire_dispute(net.anyone, dispute_id)
    board.index(q)
    now = net.chain.timestamp()
    assert board.due_expire(now) == [] and board.due_report(now) == [(dispute_id, task_id, 1)]
    # Only while the members can still be reported: the committee's unbonding period.
    horizon = board.report_horizon()
    assert horizon == net.deployment.params["verifier_unbonding_period"]
    deadline = arb.get_dispute(dispute_id).deadline
    assert board.due_report(deadline + horizon) == []
    absent = report_absent(q, net.anyone, dispute_id)
    assert sorted(absent) == sorted(v.address for v in net.verifiers)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)  # window closed at the expiring block
    assert job["shards"][1]["windowEnd"] == net.chain.w3.eth.get_block(
        tx.block_number)["timestamp"]
    assert_disputes_match_chain(board, q, task_id)
    assert_has(job["disputes"][0], {"status": "Expired", "votes": 0, "absent": 4,
                                    "absentSlashed": 4 * (net.VERIFIER_STAKE // 10)})
    assert board.due_report(now) == []
    assert_miners_match_chain(board, q)

    rebuilt = Board(board_at("rebuilt"))
    rebuilt.index(q, max_blocks=3)
    assert rebuilt.dump() == board.dump()


@pytest.mark.chain
@pytest.mark.timeout(180)
def test_probation_indexed_and_recommended(devnet: Devnet, board_at: BoardPlaces) -> None:
    """A miner registered here starts on probation: the board says so, counts it apart in the
    model listing and recommends it only tasks that allow probation; passing the committee's
    reports ends it (ProbationEnded), a re-registration starts it again."""
    from market.chain.contracts import GpuSpec
    from market.protocol import Report, keccak

    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    newcomer = net.outsider
    q.gpu.register(newcomer, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://new",
                   net.PRICE // 2, net.MINER_STAKE)
    ordinary, _ = post(net, 2, 1)
    opted_in, _ = post(net, 2, 1, tag="p", allow_probation=True)
    board.index(q)
    assert_miners_match_chain(board, q)
    assert_matches_chain(board, q, opted_in)
    assert [board.job(t)["allowProbation"] for t in (ordinary, opted_in)] == [False, True]
    rows = {m["address"]: m for m in board.miners()}
    assert_has(rows[newcomer.address], {"onProbation": True, "eligible": False,
                                        "eligibleAllowingProbation": True})
    assert_has(rows[net.miner.address], {"onProbation": False, "eligible": True})
    # The newcomer's lower ask is not a price an ordinary task can get.
    assert_has({m["modelId"]: m for m in board.models()}[MODEL_HEX], {
        "miners": 2, "minPricePerToken": net.PRICE, "probationMiners": 1})

    now = net.chain.timestamp()
    opened = board.open_shards(net.MODEL_ID, now)
    assert {(o["taskId"], o["allowProbation"]) for o in opened} == {
        (ordinary, False), (opted_in, True)}
    ranked = rank_open_shards(opened, rows[newcomer.address], now, 10)
    assert sorted((s["taskId"], s["shard"]) for s in ranked) == [(opted_in, 0), (opted_in, 1)]
    assert {s["taskId"] for s in rank_open_shards(opened, rows[net.miner.address], now, 10)} \
        == {ordinary, opted_in}
    q.tasks.claim_shard(newcomer, opted_in, 0)  # what the chain allows, too

    # Two consecutive passing reports of epochs after its registration end probation.
    c = q.committee
    for _ in range(q.gpu.probation_params()[0]):
        net.chain.advance_time(c.epoch_start(c.current_epoch() + 1) - net.chain.timestamp())
        epoch = c.current_epoch()
        report = Report(epoch, (newcomer.address,), (9000,), keccak(b"ev%d" % epoch))
        c.submit_reputation(net.anyone, report, quorum_signatures(
            report, net.verifier_keys[:3], net.chain.chain_id, c.address))
    assert not q.gpu.on_probation(newcomer.address)
    board.index(q)
    assert_miners_match_chain(board, q)
    row = board.miner(newcomer.address)
    assert row is not None and (row["onProbation"], row["eligible"]) == (False, True)
    assert {s["taskId"] for s in rank_open_shards(board.open_shards(None, 0), row, 0, 10)} \
        == {ordinary, opted_in}
    assert_has({m["modelId"]: m for m in board.models()}[MODEL_HEX], {
        "miners": 3, "minPricePerToken": net.PRICE // 2, "probationMiners": 0})

    # A new identity for the same key: leave, withdraw, register again, on probation again.
    q.gpu.request_exit(newcomer)
    # (its claim must go first: a claimed shard locks collateral)
    net.chain.advance_time(q.tasks.params()["claim_timeout"])
    q.tasks.reclaim_expired(net.anyone, opted_in, 0)
    net.chain.advance_time(int(net.deployment.params["miner_unbonding_period"]))
    _, until = q.gpu.verdict_wait(newcomer.address)  # no report of the reclaim's next epoch
    net.chain.advance_time(max(0, until - net.chain.timestamp()))  # comes: the bounded wait
    q.gpu.withdraw_stake(newcomer)
    board.index(q)
    assert board.miner(newcomer.address) is None
    q.gpu.register(newcomer, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://new",
                   net.PRICE, net.MINER_STAKE)
    board.index(q)
    assert_miners_match_chain(board, q)
    assert board.miner(newcomer.address)["onProbation"] is True  # type: ignore[index]

    rebuilt = Board(board_at("rebuilt"))
    rebuilt.index(q)
    assert rebuilt.dump() == board.dump()


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_precisions_and_commitments_indexed_and_recommended(devnet: Devnet,
                                                            board_at: BoardPlaces) -> None:
    """Each miner's declared precisions, a task's accepted mask and requireCommitments, and
    each claimed shard's recorded precision reach the board; the recommendations leave out a
    task whose mask refuses the miner's declaration, or that needs commitments from a miner
    whose heartbeat says its engine makes none."""
    from market.chain.contracts import GpuSpec

    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    q.gpu.update(net.miner2, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://m2", net.PRICE,
                 ["bf16"])
    exact, _ = post(net, 2, 1, tag="exact", precisions=precision_mask(["fp32"]),
                    require_commitments=True)
    either, _ = post(net, 2, 1, tag="either", precisions=precision_mask(["fp32", "bf16"]))
    board.index(q)
    assert_miners_match_chain(board, q)
    rows = {m["address"]: m for m in board.miners()}
    assert rows[net.miner2.address]["precisions"] == {MODEL_HEX: "bf16"}
    assert rows[net.miner.address]["precisions"] == {MODEL_HEX: "fp32"}
    job = assert_matches_chain(board, q, exact)
    assert_has(job, {"precisions": 2, "acceptedPrecisions": ["fp32"],
                     "requireCommitments": True})
    assert_has(board.job(either) or {}, {"acceptedPrecisions": ["fp32", "bf16"],
                                         "requireCommitments": False})
    now = net.chain.timestamp()
    opened = board.open_shards(net.MODEL_ID, now)
    assert {(o["taskId"], o["precisions"], o["requireCommitments"]) for o in opened} == {
        (exact, 2, True), (either, 10, False)}

    def tasks_for(row: dict) -> set[int]:
        return {s["taskId"] for s in rank_open_shards(opened, row, now, 10)}

    assert tasks_for(rows[net.miner.address]) == {exact, either}
    assert tasks_for(rows[net.miner2.address]) == {either}  # bf16: not in exact's mask
    board.record_heartbeat(net.miner.address, now, {"commitments": False})
    no_commit = board.miner(net.miner.address)
    assert no_commit is not None and tasks_for(no_commit) == {either}

    q.tasks.claim_shard(net.miner2, either, 0)
    q.tasks.claim_shard(net.miner, exact, 1)
    board.index(q)
    assert [s["precision"] for s in assert_matches_chain(board, q, either)["shards"]] == [
        "bf16", None]
    assert [s["precision"] for s in assert_matches_chain(board, q, exact)["shards"]] == [
        None, "fp32"]
    # a reclaim forgets the claim's precision, as the contract does
    net.chain.advance_time(q.tasks.params()["claim_timeout"])
    q.tasks.reclaim_expired(net.anyone, either, 0)
    board.index(q)
    assert assert_matches_chain(board, q, either)["shards"][0]["precision"] is None
    rebuilt = Board(board_at("rebuilt"))
    rebuilt.index(q)
    assert rebuilt.dump() == board.dump()


@pytest.mark.chain
@pytest.mark.timeout(180)
def test_rebuild_chunked_and_racing_indexers_agree(devnet: Devnet,
                                                   board_at: BoardPlaces) -> None:
    net, q = devnet, devnet.q
    task_id, hashes = post(net, 6, 2)
    submit(net, task_id, hashes, 0, net.miner)
    q.tasks.claim_shard(net.miner2, task_id, 1)
    post(net, 3, 3, client=net.client2, tag="b")
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    q.tasks.finalize_shard(net.anyone, task_id, 0)

    board = Board(board_at("board"))
    board.index(q)
    reference = board.dump()
    job = board.job(task_id)
    assert len(reference["tasks"]) == 2 and reference["events"]

    board_at.drop("board")  # delete the database: rebuilt from the chain alone
    rebuilt = Board(board_at("board"))
    assert rebuilt.cursor() == -1
    rebuilt.index(q)
    assert rebuilt.dump() == reference and rebuilt.job(task_id) == job

    chunked = Board(board_at("chunked"))
    head = chunked.index(q, max_blocks=1)
    assert head == rebuilt.cursor() and chunked.dump() == reference

    reset = Board(board_at("reset"))
    reset.index(q)
    reset.put_model(tiny_manifest())
    reset.reset()
    assert reset.cursor() == -1 and reset.jobs() == [] and len(reset.models()) >= 1
    reset.index(q)
    assert reset.dump() == reference

    # Three indexers (threads, each its own Board on one database) racing from scratch, a
    # block per chunk so that one reads the cursor while another commits (PostgreSQL once
    # read a cursor and the hash of a later one, outside one snapshot).
    shared = board_at("shared")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Board(shared).index(Quarry(net.deployment), max_blocks=1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert Board(shared).dump() == reference


class _InterruptedBoard(Board):
    """A board whose next read of its cursor lets `interrupt` run first, as when another
    indexer's chunk commits between two of this one's reads."""

    interrupt: Callable[[], object] | None = None

    def _meta(self, conn: Any, key: str) -> str | None:  # type: ignore[override]
        value = Board._meta(conn, key)
        if key == "cursor" and self.interrupt is not None:
            interrupt, self.interrupt = self.interrupt, None
            interrupt()
        return value


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_an_indexer_reads_its_cursor_and_hash_in_one_snapshot(devnet: Devnet,
                                                              board_at: BoardPlaces) -> None:
    """Another indexer advancing the cursor between this one's reads of the cursor and of
    its block hash is not a chain reset (it once was, on PostgreSQL: CI's racing test)."""
    net, q = devnet, devnet.q
    post(net, 2, 1)
    shared = board_at("shared")
    mine = _InterruptedBoard(shared)
    mine.index(q)
    post(net, 3, 1, tag="later")
    other = Board(shared)
    mine.interrupt = lambda: other.index(Quarry(net.deployment))
    assert mine.index(q) == other.cursor() == q.chain.w3.eth.block_number
    assert mine.interrupt is None  # it ran
    reference = Board(board_at("reference"))
    reference.index(q)
    assert mine.dump() == reference.dump()


class _StraddledBoard(Board):
    """A board whose next read runs `interrupt` right after its first statement, as when an
    indexer's chunk commits between two statements of one answer."""

    interrupt: Callable[[], object] | None = None

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with super()._read() as conn:
            board = self

            class AfterFirst:
                def execute(self, *args: Any) -> Any:
                    result = conn.execute(*args)
                    if board.interrupt is not None:
                        interrupt, board.interrupt = board.interrupt, None
                        interrupt()
                    return result

            yield AfterFirst() if self.interrupt is not None else conn


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_a_job_is_read_from_one_state_of_the_board(devnet: Devnet,
                                                    board_at: BoardPlaces) -> None:
    """A task cancelled and indexed between reading its row and its shards is answered
    as it was before (cancelled False, shards Open) or after, never half of each."""
    net, q = devnet, devnet.q
    task_id, _ = post(net, 4, 2)
    shared = board_at("shared")
    board = _StraddledBoard(shared)
    board.index(q)
    other = Board(shared)

    def cancel() -> None:
        q.tasks.cancel_task(net.client, task_id)
        other.index(q)

    board.interrupt = cancel
    job = board.job(task_id)
    assert board.interrupt is None  # it ran
    assert job is not None and not job["cancelled"]
    assert [s["state"] for s in job["shards"]] == ["Open", "Open"]
    after = board.job(task_id)
    assert after is not None and after["cancelled"]
    assert [s["state"] for s in after["shards"]] == ["Refunded", "Refunded"]


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_chain_reset_and_other_deployment_are_detected(devnet: Devnet,
                                                       board_at: BoardPlaces) -> None:
    net, q = devnet, devnet.q
    board = Board(board_at("board"))
    board.index(q)
    snapshot = net.chain.snapshot()
    post(net, 2, 1)
    cursor = board.index(q)
    net.chain.revert_to(snapshot)  # the head falls below the cursor
    with pytest.raises(BoardError, match="chain reset: the head is block"):
        board.index(q)
    net.chain.mine(cursor - net.chain.block_number() + 1)  # past it, with other blocks
    with pytest.raises(BoardError, match=f"chain reset: block {cursor} is now"):
        board.index(q)
    assert board.cursor() == cursor  # nothing applied
    board.reset()
    board.index(q)
    assert board.jobs() == []

    other = Quarry(replace(net.deployment, deploy_block=net.deployment.deploy_block + 1),
                   net.chain)
    with pytest.raises(BoardError, match="built for another deployment"):
        board.index(other)
    gone = dict(net.deployment.addresses, TaskRegistry="0x" + "ab" * 20)
    with pytest.raises(BoardError, match="no TaskRegistry code"):
        Board(board_at("gone")).index(
            Quarry(replace(net.deployment, addresses=gone), net.chain))
    with pytest.raises(BoardError, match="max_blocks"):
        board.index(q, max_blocks=0)


# -- market-only tables (no chain) --------------------------------------------------------


def tiny_manifest(name: str = "tiny") -> dict:
    return {"format": "quarry-manifest/1", "name": name,
            "architecture": {"hidden_size": 8, "layer_norm_eps": 1e-5},
            "files": {"model.safetensors": "ab" * 32}}


def test_models_heartbeats_recommendations(board_at: BoardPlaces) -> None:
    from market.model.manifest import Manifest

    board = Board(board_at("b"))
    manifest = tiny_manifest()
    model_id = board.put_model(manifest)
    assert model_id == Manifest.from_dict(manifest).model_id_hex
    assert board.put_model({**manifest, "modelId": model_id.upper().replace("0X", "0x")}) \
        == model_id  # idempotent; a matching modelId field is accepted
    assert board.model(model_id) == Manifest.from_dict(manifest).to_dict()
    assert board.model("0x" + "00" * 32) is None
    assert board.models() == [{"modelId": model_id, "name": "tiny", "miners": 0,
                               "minPricePerToken": None, "probationMiners": 0,
                               "hasManifest": True}]
    with pytest.raises(BoardError, match="hashes to"):
        board.put_model({**manifest, "modelId": "0x" + "00" * 32})
    with pytest.raises(BoardError, match="'name' must be a non-empty string"):
        board.put_model({**manifest, "name": ""})
    with pytest.raises(BoardError, match="not 32 bytes"):
        board.model("0x1234")

    miner = "0x" + "aB" * 20
    board.record_heartbeat(miner, 100, {"shard": [1, 0]})
    board.record_heartbeat(miner.lower(), 90, {"stale": True})  # older: ignored
    board.record_heartbeat(miner, 100, {"shard": None})  # same time: replaces
    with pytest.raises(BoardError, match="miner 'nope' is not an address"):
        board.record_heartbeat("nope", 1, {})
    assert board.miners() == []  # heartbeats alone do not register a miner

    assert board.recommendations(miner) is None
    rows = [{"taskId": 1, "shard": 0}]
    board.set_recommendations(miner, rows, 1234)
    assert board.recommendations(miner.lower()) == (rows, 1234)
    assert board.fresh_recommendations(miner, 60.0) == rows  # stored now (computed_at aside)
    assert board.fresh_recommendations(miner, 0.0) is None
    assert board.fresh_recommendations("0x" + "cd" * 20, 60.0) is None
    with pytest.raises(BoardError, match="client"):
        board.jobs("0x12")

    again = Board(board_at("b"))  # reopening keeps everything
    assert again.models()[0]["modelId"] == model_id


def test_a_snapshot_reads_one_state_of_the_board(board_at: BoardPlaces) -> None:
    board = Board(board_at("b"))
    board.put_model(tiny_manifest("one"))
    with board.snapshot():
        assert [m["name"] for m in board.models()] == ["one"]
        board.put_model(tiny_manifest("two"))  # the indexer or a request, meanwhile
        with board.snapshot():  # nested: the same read transaction
            assert [m["name"] for m in board.models()] == ["one"]
        assert [m["name"] for m in board.models()] == ["one"]
    assert sorted(m["name"] for m in board.models()) == ["one", "two"]


def test_schema_mismatch_and_bad_file(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "b.sqlite"
    Board(path)
    newer = str(int(CHAIN_LAYOUT) + 1)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (newer,))
    with pytest.raises(BoardError, match=f"has chain layout {newer}, newer than this "
                       f"market's {CHAIN_LAYOUT}"):
        Board(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (CHAIN_LAYOUT,))
        conn.execute(f"PRAGMA user_version = {STATE_VERSION + 1}")
    with pytest.raises(BoardError, match=f"market state of version {STATE_VERSION + 1}, "
                       "newer than"):
        Board(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(BoardError, match="unusable"):
        Board(junk)


def test_an_older_board_is_rebuilt_keeping_what_only_the_market_knows(
        tmp_path: Path) -> None:
    """A schema-1 file (before probation, challenges and vote tallies): its chain tables are
    dropped and rebuilt on the next index; manifests, relayed messages and offers stay."""
    import sqlite3

    path = tmp_path / "b.sqlite"
    board = Board(path)
    model_id = board.put_model(tiny_manifest())
    author = "0x" + "aB" * 20
    board.put_message("dep", {"author": author, "kind": "vote", "epoch": 1, "topic": "7",
                              "body": {"x": 1}, "signature": "0x00"})
    board.put_offer("dep", 3, author, author, 99, 1, "0x00")
    with sqlite3.connect(path) as conn:  # the version 1 layout of two chain tables
        conn.execute("DROP TABLE tasks")
        conn.execute("CREATE TABLE tasks (task_id INTEGER PRIMARY KEY, client TEXT)")
        conn.execute("DROP TABLE challenges")
        conn.execute("INSERT INTO events VALUES (1, 0, '0x', 'TaskRegistry', 'X', '{}')")
        conn.execute("INSERT INTO meta VALUES ('cursor', '5')")
        conn.execute("UPDATE meta SET value='1' WHERE key='schema'")
    migrated = Board(path)
    assert migrated.cursor() == -1 and migrated.dump()["events"] == []
    assert migrated.jobs() == [] and migrated.job(1) is None  # the new layout answers
    assert migrated.due_settle(2**40) == []
    assert [m["modelId"] for m in migrated.models()] == [model_id]
    assert [m["body"] for m in migrated.messages("dep")] == [{"x": 1}]
    assert migrated.offer("dep", 3) is not None
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == \
            CHAIN_LAYOUT
    Board(path)  # opening it again changes nothing
    assert Board(path).messages("dep")[0]["body"] == {"x": 1}


# The market's state as the last market without migrations wrote it (user_version 0).
LEGACY_STATE = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '2');
CREATE TABLE models (model_id TEXT PRIMARY KEY, name TEXT NOT NULL, manifest TEXT NOT NULL,
    added_at REAL NOT NULL);
CREATE TABLE heartbeats (miner TEXT PRIMARY KEY, timestamp INTEGER NOT NULL,
    status TEXT NOT NULL, received_at REAL NOT NULL);
CREATE TABLE committee_messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment TEXT NOT NULL, author TEXT NOT NULL, kind TEXT NOT NULL,
    epoch INTEGER NOT NULL, topic TEXT NOT NULL, body TEXT NOT NULL, signature TEXT NOT NULL,
    received_at REAL NOT NULL, UNIQUE (deployment, author, kind, epoch, topic));
CREATE TABLE offers (deployment TEXT NOT NULL, task_id INTEGER NOT NULL, client TEXT NOT NULL,
    miner TEXT NOT NULL, until INTEGER NOT NULL, timestamp INTEGER NOT NULL,
    signature TEXT NOT NULL, received_at REAL NOT NULL, PRIMARY KEY (deployment, task_id));
"""


def test_market_state_of_an_older_version_is_migrated_with_no_data_lost(
        tmp_path: Path) -> None:
    """A file at market-state version 0 (written before migrations), holding a manifest, a
    heartbeat, a committee message and an offer, opens at the current version with every
    row intact and the later migrations' indexes present; the file is never deleted."""
    import sqlite3

    from market.service.state import MIGRATIONS

    path = tmp_path / "old.sqlite"
    manifest = tiny_manifest()
    author = "0x" + "aB" * 20
    with sqlite3.connect(path) as conn:
        conn.executescript(LEGACY_STATE)
        scratch = Board(tmp_path / "scratch.sqlite")
        model_id = scratch.put_model(manifest)
        stored = scratch.model(model_id)
        conn.execute("INSERT INTO models VALUES (?, ?, ?, 1.0)",
                     (model_id, manifest["name"], json.dumps(stored, sort_keys=True)))
        conn.execute("INSERT INTO heartbeats VALUES (?, 7, '{\"load\": 1}', 2.0)", (author,))
        conn.execute("INSERT INTO committee_messages (deployment, author, kind, epoch, topic, "
                     "body, signature, received_at) VALUES ('dep', ?, 'vote', 1, '7', "
                     "'{\"x\":1}', '0x00', 3.0)", (author,))
        conn.execute("INSERT INTO offers VALUES ('dep', 3, ?, ?, 99, 1, '0x00', 4.0)",
                     (author, author))
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    inode = path.stat().st_ino

    board = Board(path)
    assert path.stat().st_ino == inode
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == \
            STATE_VERSION
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                              "WHERE type='index'")}
        assert {"offers_until", "committee_messages_topic"} <= indexes
        assert conn.execute("SELECT miner, timestamp, status FROM heartbeats").fetchall() == [
            (author, 7, '{"load": 1}')]
    assert stored is not None and board.model(model_id) == stored
    assert [m["modelId"] for m in board.models()] == [model_id]
    assert [(m["id"], m["body"]) for m in board.messages("dep")] == [(1, {"x": 1})]
    assert board.offer("dep", 3) == {"taskId": 3, "client": author, "miner": author,
                                     "until": 99, "timestamp": 1, "signature": "0x00",
                                     "receivedAt": 4.0}
    # The chain tables of the old file were created empty; the next index fills them.
    assert board.cursor() == -1 and board.jobs() == []
    Board(path)  # opening it again changes nothing
    assert Board(path).messages("dep")[0]["body"] == {"x": 1}


def test_state_names_follow_the_contract() -> None:
    assert STATE_NAMES == tuple(s.name.capitalize() for s in ShardState)


# -- matching -----------------------------------------------------------------------------


def shard_row(task_id: int, shard: int, *, price: int = 10, deadline: int = 1000,
              model: str = MODEL_HEX, min_rep: int = 0, allow_probation: bool = False) -> dict:
    return {"taskId": task_id, "shard": shard, "modelId": model, "pricePerToken": price,
            "deadline": deadline, "minReputationBps": min_rep,
            "allowProbation": allow_probation}


def miner_row(address: str, *, price: int = 5, rep: int = 5000, eligible: bool = True,
              models: tuple[str, ...] = (MODEL_HEX,), on_probation: bool = False) -> dict:
    return {"address": address, "models": list(models), "pricePerToken": price,
            "reputationBps": rep, "eligible": eligible and not on_probation,
            "eligibleAllowingProbation": eligible, "onProbation": on_probation,
            "exiting": False}


def test_ranking_filters_like_the_contract_and_orders_best_first() -> None:
    m = miner_row("0x" + "01" * 20)
    shards = [
        shard_row(1, 0, price=10, deadline=900),
        shard_row(2, 0, price=20, deadline=2000),
        shard_row(3, 0, price=20, deadline=1500),
        shard_row(4, 0, price=4),  # pays less than the miner asks
        shard_row(5, 0, model="0x" + "22" * 32),  # another model
        shard_row(6, 0, min_rep=6000),  # needs more reputation
        shard_row(7, 0, deadline=100),  # already past at now=100
        shard_row(8, 0, price=5),  # exactly the miner's price: fine
    ]
    ranked = rank_open_shards(shards, m, now=100, limit=10)
    assert [s["taskId"] for s in ranked] == [3, 2, 1, 8]
    assert [s["taskId"] for s in rank_open_shards(shards, m, 100, 2)] == [3, 2]
    assert rank_open_shards(shards, m, 100, 0) == []
    assert rank_open_shards(shards, {**m, "eligible": False}, 100, 10) == []
    assert rank_open_shards(shards, {**m, "exiting": True}, 100, 10) == []
    assert [s["taskId"] for s in rank_open_shards(shards, {**m, "reputationBps": 6000},
                                                  100, 10)] == [3, 2, 1, 6, 8]
    upper = {**m, "models": [MODEL_HEX.upper().replace("0X", "0x")]}
    assert rank_open_shards(shards, upper, 100, 10) == ranked


def test_a_miner_on_probation_is_matched_only_with_tasks_allowing_it() -> None:
    shards = [shard_row(1, 0, price=20), shard_row(2, 0, allow_probation=True),
              shard_row(3, 0, allow_probation=True, min_rep=6000)]
    new = miner_row("0x" + "0c" * 20, on_probation=True)
    assert [s["taskId"] for s in rank_open_shards(shards, new, 100, 10)] == [2]
    assert [s["taskId"] for s in rank_open_shards(shards, miner_row("0x" + "0d" * 20),
                                                  100, 10)] == [1, 2]
    # Not eligible at all (exiting, low stake): neither kind of task.
    assert rank_open_shards(shards, miner_row("0x" + "0e" * 20, eligible=False,
                                              on_probation=True), 100, 10) == []
    # A row without the probation fields (an older caller) reads as established.
    plain = {k: v for k, v in miner_row("0x" + "0f" * 20).items()
             if k not in ("onProbation", "eligibleAllowingProbation")}
    assert [s["taskId"] for s in rank_open_shards(shards, plain, 100, 10)] == [1, 2]


def test_rendezvous_spreads_two_miners_over_tied_shards() -> None:
    shards = [shard_row(9, k) for k in range(16)]
    a, b = miner_row("0x" + "0a" * 20), miner_row("0x" + "0b" * 20)
    order_a = [s["shard"] for s in rank_open_shards(shards, a, 0, 16)]
    order_b = [s["shard"] for s in rank_open_shards(shards, b, 0, 16)]
    assert sorted(order_a) == sorted(order_b) == list(range(16))
    assert order_a != order_b and order_a[0] != order_b[0]
    assert order_a == [s["shard"] for s in rank_open_shards(list(reversed(shards)), a, 0, 16)]
    assert order_a[0] == max(range(16), key=lambda k: rendezvous_score(a["address"], 9, k))
    # Across many tasks the two first choices collide about 1/16 of the time, not always.
    collisions = sum(
        rank_open_shards([shard_row(t, k) for k in range(16)], a, 0, 1)[0]["shard"]
        == rank_open_shards([shard_row(t, k) for k in range(16)], b, 0, 1)[0]["shard"]
        for t in range(200))
    assert collisions < 40


def test_a_database_url_that_is_unreachable_or_not_postgres_is_refused(tmp_path: Path) -> None:
    from market.local.processes import free_port
    from market.service.settings import MarketSettings

    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(BoardError, match=r"board database postgresql://.*nowhere is unusable"):
        Board(url)
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        MarketSettings(database_url="mysql://db/board")
    secret = MarketSettings(database_url="postgresql://quarry:hunter2@db:5432/board",
                            db_path=tmp_path / "b.sqlite")
    assert secret.board_location == secret.database_url
    assert "hunter2" not in secret.board_name and "hunter2" not in repr(secret)
    assert MarketSettings(db_path=tmp_path / "b.sqlite").board_location == tmp_path / "b.sqlite"


def test_market_migrate_moves_a_sqlite_boards_own_state_into_postgres(
        tmp_path: Path, postgres_server: PostgresServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every market-state table moves with nothing lost (ids included: the next committee
    message continues after them); a second run adds nothing; a target holding another row
    under a copied key is refused in one line and left as it was."""
    from market.cli import main

    source = tmp_path / "old.sqlite"
    old = Board(source)
    model_id = old.put_model(tiny_manifest())
    a, b = "0x" + "aB" * 20, "0x" + "cD" * 20
    old.record_heartbeat(a, 7, {"load": 1})
    old.put_offer("dep", 3, a, b, 99, 1, "0x00")
    for topic in ("1", "2"):
        old.put_message("dep", {"author": a, "kind": "vote", "epoch": 1, "topic": topic,
                                "body": {"t": topic}, "signature": "0x00"})
    old.record_swarm_member("dep", MODEL_HEX, {
        "miner": b, "memory_mib": 2048, "tflops": 1.5, "endpoint": "http://m:1",
        "public_key": "0x02", "rtts": {a: 3.25}, "price_per_token": 10**20, "timestamp": 5})
    old.store_swarm_plan("dep", MODEL_HEX, None, {"stages": [1]}, {"resume": 1})
    old.put_swarm_consent("dep", MODEL_HEX, 1, b, 9, "0xsig")
    old.set_swarm_id("dep", MODEL_HEX, 1, 4)

    url = postgres_server.create_database("moved")
    argv = ["migrate", "--database-url", url, "--from-sqlite", str(source)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "chain layout none" in out and "committee_messages 2" in out
    moved = Board(url)
    assert moved.model(model_id) == old.model(model_id)
    assert moved.offer("dep", 3) == old.offer("dep", 3)
    assert moved.messages("dep") == old.messages("dep")
    assert moved.swarm_members("dep", MODEL_HEX) == old.swarm_members("dep", MODEL_HEX)
    assert moved.swarm_plan("dep", MODEL_HEX) == old.swarm_plan("dep", MODEL_HEX)
    assert moved.swarm_consents("dep", MODEL_HEX, 1) == old.swarm_consents("dep", MODEL_HEX, 1)
    with moved._read() as conn, old._read() as was:
        assert [tuple(r) for r in conn.execute("SELECT * FROM heartbeats")] == \
            [tuple(r) for r in was.execute("SELECT * FROM heartbeats")]
    assert moved.put_message("dep", {"author": a, "kind": "vote", "epoch": 1, "topic": "3",
                                     "body": {}, "signature": "0x00"}) == (3, True)

    assert main(argv) == 0  # again: everything is there already
    assert "offers 0" in capsys.readouterr().out
    moved.put_offer("dep", 3, a, a, 99, 2, "0x01")  # the target moved on
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already holds other rows in offers" in err
    assert moved.offer("dep", 3)["miner"] == checksum(a)  # nothing was copied
    assert main(["migrate", "--database-url", url, "--from-sqlite",
                 str(tmp_path / "none.sqlite")]) == 1
    postgres_server.drop_database(url)


def test_a_postgres_board_written_by_a_newer_market_is_refused(
        postgres_server: PostgresServer) -> None:
    """The layout checks hold on PostgreSQL too, where the state version is a `meta` row
    (a chain reset keeps it, as it keeps the chain layout)."""
    import psycopg

    url = postgres_server.create_database("newer")
    board = Board(url)
    board.reset()
    assert Board(url).upgraded_from == (CHAIN_LAYOUT, STATE_VERSION)
    with pytest.raises(BoardError, match="is not a SQLite file"):
        board.db_path  # noqa: B018 (the property raises)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value=%s WHERE key='state_version'",
                     (str(STATE_VERSION + 1),))
    with pytest.raises(BoardError, match=f"market state of version {STATE_VERSION + 1}, "
                       "newer than"):
        Board(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value=%s WHERE key='state_version'", (str(STATE_VERSION),))
        conn.execute("UPDATE meta SET value=%s WHERE key='schema'", (str(int(CHAIN_LAYOUT) + 1),))
    with pytest.raises(BoardError, match="newer than this market's"):
        Board(url)
    postgres_server.drop_database(url)
    # A board whose database went away answers 503 (DatabaseUnusable), naming why.
    from market.service.boardsql import DatabaseUnusable
    from market.service.http import ERROR_STATUS

    with pytest.raises(DatabaseUnusable, match="does not exist") as gone:
        board.jobs()
    assert next(code for cls, code in ERROR_STATUS if isinstance(gone.value, cls)) == 503


def test_on_postgres_a_heartbeat_never_queues_behind_a_writer_taking_its_turn(
        postgres_server: PostgresServer) -> None:
    """Writers that read before they write (an indexed chunk, a committee message) take
    turns on PostgreSQL as on SQLite; a single upsert (a heartbeat) does not wait for them."""
    url = postgres_server.create_database("turns")
    board = Board(url)
    author = "0x" + "aB" * 20
    holding, release = threading.Event(), threading.Event()

    def indexer() -> None:  # holds the write turn, as an indexed chunk does
        with board._write() as conn:
            conn.execute("INSERT INTO meta VALUES ('held', '1')")
            holding.set()
            release.wait(60)

    turn = threading.Thread(target=indexer)
    turn.start()
    try:
        assert holding.wait(30)
        beat, message = threading.Event(), threading.Event()
        threading.Thread(target=lambda: (board.record_heartbeat(author, 1, {}),
                                         beat.set())).start()
        threading.Thread(target=lambda: (board.put_message("dep", {
            "author": author, "kind": "vote", "epoch": 1, "topic": "1", "body": {},
            "signature": "0x00"}), message.set())).start()
        assert beat.wait(30), "the heartbeat waited for another writer's turn"
        import psycopg

        with psycopg.connect(url) as conn:  # the message's writer is seen waiting its turn
            for _ in range(300):
                if conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                "AND NOT granted").fetchone() == (1,):
                    break
                conn.rollback()
                threading.Event().wait(0.1)
            else:
                raise AssertionError("the committee message never waited for its turn")
        assert not message.is_set()
    finally:
        release.set()
        turn.join(30)
    assert message.wait(30) and board.messages("dep")[0]["topic"] == "1"
    postgres_server.drop_database(url)
