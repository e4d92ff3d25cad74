"""The job board against a real Anvil: every life cycle the contracts allow (finalize,
reclaim, cancel, refund after the deadline, disputes both ways) indexed into SQLite and
checked field by field against the contracts' views; rebuilds from scratch and in one-block
chunks give the same rows; racing indexers never double-apply; a chain reset is detected.
Plus the board's market-only tables and the matching order."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from market.chain.contracts import ShardState
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
from market.service.board import STATE_NAMES, Board, BoardError
from market.service.matching import rank_open_shards, rendezvous_score

if TYPE_CHECKING:
    from conftest import Devnet
    from eth_account.signers.local import LocalAccount

MAX_TOKENS = 8
MODEL_HEX = "0x" + "11" * 32


# -- helpers ------------------------------------------------------------------------------


def assert_has(row: dict, expected: dict) -> None:
    assert {k: row.get(k) for k in expected} == expected


def post(net: Devnet, n: int, shard_size: int, *, deadline_s: int = 3600,
         client: LocalAccount | None = None, arbiter: str | None = None,
         tag: str = "t") -> tuple[int, list[bytes]]:
    hashes = [request_hash({"custom_id": f"{tag}-{i}", "body": {"prompt": f"p{i}"}})
              for i in range(n)]
    root = input_tree(hashes).root
    kwargs = {"arbiter": arbiter} if arbiter else {}
    task_id, _ = net.q.tasks.create_task(
        client or net.client, model_id=net.MODEL_ID, input_root=root,
        input_uri="sha256:" + root.hex(), num_requests=n, shard_size=shard_size,
        max_tokens_per_request=MAX_TOKENS, price_per_token=net.PRICE,
        deadline=net.chain.timestamp() + deadline_s, **kwargs)
    return task_id, hashes


def submit(net: Devnet, task_id: int, hashes: list[bytes], shard: int,
           miner: LocalAccount) -> tuple[list[Receipt], list[bytes], int]:
    """Claim and submit with real signed receipts; returns them, their sigs and the tokens."""
    q = net.q
    q.tasks.claim_shard(miner, task_id, shard)
    start, end = q.tasks.shard_range(task_id, shard)
    receipts = [Receipt(task_id, shard, i, hashes[i], output_hash(f"a{i}", [1] * (1 + i % 5)),
                        1 + i % 5, net.MODEL_ID) for i in range(start, end)]
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
    return job


def assert_miners_match_chain(board: Board, q: Quarry) -> None:
    for m in board.miners():
        info = q.gpu.miner_info(m["address"])
        assert (m["stake"], m["locked"], m["reputationBps"], m["pricePerToken"]) == (
            info.stake, info.locked, info.reputation_bps, info.price_per_token)
        assert m["models"] == ["0x" + x.hex() for x in q.gpu.models_of(m["address"])]
        assert m["exiting"] == (info.exit_requested_at != 0)


# -- chain-indexed life cycles ------------------------------------------------------------


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_claim_submit_finalize_indexed(devnet: Devnet, tmp_path: Path) -> None:
    net, q = devnet, devnet.q
    board = Board(tmp_path / "board.sqlite")
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
def test_reclaim_cancel_and_refund_indexed(devnet: Devnet, tmp_path: Path) -> None:
    net, q = devnet, devnet.q
    board = Board(tmp_path / "board.sqlite")
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
def test_disputes_and_registry_changes_indexed(devnet: Devnet, tmp_path: Path) -> None:
    net, q = devnet, devnet.q
    board = Board(tmp_path / "board.sqlite")
    task_id, hashes = post(net, 8, 4, arbiter=net.client2.address)
    bond = q.arbitration.min_bond()
    opened = []
    for shard in (0, 1):
        receipts, sigs, _ = submit(net, task_id, hashes, shard, net.miner)
        dispute_id, _ = q.arbitration.open_dispute(
            net.client, task_id, shard, receipts[1], sigs[1], receipts_tree(receipts).proof(1),
            "sha256:" + "ee" * 32, bond)
        opened.append(dispute_id)
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert job["arbiter"] == net.client2.address
    assert [s["state"] for s in job["shards"]] == ["Disputed", "Disputed"]
    assert [(d["disputeId"], d["shard"], d["index"], d["status"], d["opener"], d["bond"])
            for d in job["disputes"]] == [(opened[0], 0, 1, "Open", net.client.address, bond),
                                          (opened[1], 1, 5, "Open", net.client.address, bond)]
    assert board.due_finalize(2**40) == []

    def votes(dispute_id: int, at_fault: bool) -> list[bytes]:
        return quorum_signatures(Vote(dispute_id, at_fault), net.verifier_keys[:3],
                                 net.chain.chain_id, q.arbitration.address)

    q.arbitration.resolve(net.anyone, opened[0], True, votes(opened[0], True))
    tx = q.arbitration.resolve(net.anyone, opened[1], False, votes(opened[1], False))
    board.index(q)
    job = assert_matches_chain(board, q, task_id)
    assert [s["state"] for s in job["shards"]] == ["Refunded", "Submitted"]
    assert [d["status"] for d in job["disputes"]] == ["MinerAtFault", "MinerNotAtFault"]
    assert job["disputes"][0]["slashed"] > 0 and job["disputes"][1]["slashed"] == 0
    # No fault closes the window at the resolving block: finalizable at once.
    resolved_at = net.chain.w3.eth.get_block(tx.block_number)["timestamp"]
    assert job["shards"][1]["windowEnd"] == resolved_at
    assert board.due_finalize(resolved_at) == [(task_id, 1)]
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
def test_rebuild_chunked_and_racing_indexers_agree(devnet: Devnet, tmp_path: Path) -> None:
    net, q = devnet, devnet.q
    task_id, hashes = post(net, 6, 2)
    submit(net, task_id, hashes, 0, net.miner)
    q.tasks.claim_shard(net.miner2, task_id, 1)
    post(net, 3, 3, client=net.client2, tag="b")
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    q.tasks.finalize_shard(net.anyone, task_id, 0)

    path = tmp_path / "board.sqlite"
    board = Board(path)
    board.index(q)
    reference = board.dump()
    job = board.job(task_id)
    assert len(reference["tasks"]) == 2 and reference["events"]

    for suffix in ("", "-wal", "-shm"):  # delete the file: rebuilt from the chain alone
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    rebuilt = Board(path)
    assert rebuilt.cursor() == -1
    rebuilt.index(q)
    assert rebuilt.dump() == reference and rebuilt.job(task_id) == job

    chunked = Board(tmp_path / "chunked.sqlite")
    head = chunked.index(q, max_blocks=1)
    assert head == board.cursor() and chunked.dump() == reference

    reset = Board(tmp_path / "reset.sqlite")
    reset.index(q)
    reset.put_model(tiny_manifest())
    reset.reset()
    assert reset.cursor() == -1 and reset.jobs() == [] and len(reset.models()) >= 1
    reset.index(q)
    assert reset.dump() == reference

    # Two indexers (threads, each its own Board on one file) racing from scratch.
    shared = tmp_path / "shared.sqlite"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Board(shared).index(Quarry(net.deployment), max_blocks=3)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert Board(shared).dump() == reference


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_chain_reset_and_other_deployment_are_detected(devnet: Devnet, tmp_path: Path) -> None:
    net, q = devnet, devnet.q
    board = Board(tmp_path / "board.sqlite")
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
        Board(tmp_path / "gone.sqlite").index(
            Quarry(replace(net.deployment, addresses=gone), net.chain))
    with pytest.raises(BoardError, match="max_blocks"):
        board.index(q, max_blocks=0)


# -- market-only tables (no chain) --------------------------------------------------------


def tiny_manifest(name: str = "tiny") -> dict:
    return {"format": "quarry-manifest/1", "name": name,
            "architecture": {"hidden_size": 8, "layer_norm_eps": 1e-5},
            "files": {"model.safetensors": "ab" * 32}}


def test_models_heartbeats_recommendations(tmp_path: Path) -> None:
    from market.model.manifest import Manifest

    board = Board(tmp_path / "b.sqlite")
    manifest = tiny_manifest()
    model_id = board.put_model(manifest)
    assert model_id == Manifest.from_dict(manifest).model_id_hex
    assert board.put_model({**manifest, "modelId": model_id.upper().replace("0X", "0x")}) \
        == model_id  # idempotent; a matching modelId field is accepted
    assert board.model(model_id) == Manifest.from_dict(manifest).to_dict()
    assert board.model("0x" + "00" * 32) is None
    assert board.models() == [{"modelId": model_id, "name": "tiny", "miners": 0,
                               "minPricePerToken": None, "hasManifest": True}]
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

    again = Board(tmp_path / "b.sqlite")  # reopening keeps everything
    assert again.models()[0]["modelId"] == model_id


def test_schema_mismatch_and_bad_file(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "b.sqlite"
    Board(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='0' WHERE key='schema'")
    with pytest.raises(BoardError, match="has schema 0.*delete it"):
        Board(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(BoardError, match="unusable"):
        Board(junk)


def test_state_names_follow_the_contract() -> None:
    assert STATE_NAMES == tuple(s.name.capitalize() for s in ShardState)


# -- matching -----------------------------------------------------------------------------


def shard_row(task_id: int, shard: int, *, price: int = 10, deadline: int = 1000,
              model: str = MODEL_HEX, min_rep: int = 0) -> dict:
    return {"taskId": task_id, "shard": shard, "modelId": model, "pricePerToken": price,
            "deadline": deadline, "minReputationBps": min_rep}


def miner_row(address: str, *, price: int = 5, rep: int = 5000, eligible: bool = True,
              models: tuple[str, ...] = (MODEL_HEX,)) -> dict:
    return {"address": address, "models": list(models), "pricePerToken": price,
            "reputationBps": rep, "eligible": eligible, "exiting": False}


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
