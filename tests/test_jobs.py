"""market.jobs (the one way to post a batch, read verified results and dispute, shared by the
client SDK and the verifiers) against a real Anvil and a real market app (uvicorn in a thread).

The test plays the miners (claim, sign, upload, submit with the devnet's miner accounts) and
the committee (Vote signatures from three of the devnet's four equal-stake verifiers: more than
two thirds of the dispute's committee weight, recorded with `castVotes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from market.chain.contracts import DisputeStatus, ShardState
from market.chain.errors import revert_class
from market.jobs import (
    DeadlineExpired,
    DisputeNotPossible,
    InsufficientFunds,
    JobError,
    JobTimeout,
    MinerNotEligible,
    PaymentTooLow,
    ResultsNotReady,
    dispute_info,
    fetch_shard_result,
    open_dispute,
    post_batch,
    task_disputes,
    wait_dispute,
)
from market.marketapi import MarketAPI
from market.protocol.eip712 import Vote, quorum_signatures
from market.protocol.merkle import input_tree
from market.protocol.requests import (
    BatchError,
    RequestTooLarge,
    encode_jsonl,
    parse_jsonl,
    prompt_lines,
)
from market.protocol.results import (
    Completion,
    ResultCheckFailed,
    ShardResult,
    build_shard_result,
)
from market.store import content_uri

pytestmark = pytest.mark.chain

MAX_REQUEST_BYTES = 2048


@dataclasses.dataclass
class Market:
    url: str
    api: MarketAPI
    db_path: Path


@pytest.fixture(scope="module")
def market(devnet_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """A market app on a free port over the session chain, its board indexed once; every
    chain change is rolled back afterwards."""
    from market.chain.devnet import free_port
    from market.service.app import serve_in_thread
    from market.service.board import Board
    from market.service.settings import MarketSettings

    net = devnet_session
    snapshot = net.chain.snapshot()
    root = tmp_path_factory.mktemp("market")
    settings = MarketSettings(deployment=net.deployment.save(root / "deployment.json"),
                              store_dir=root / "store", db_path=root / "board.sqlite",
                              port=free_port(), max_request_bytes=MAX_REQUEST_BYTES)
    Board(settings.db_path).index(net.q)
    api = MarketAPI(settings.url)
    try:
        with serve_in_thread(settings):
            yield Market(settings.url, api, settings.db_path)
    finally:
        api.close()
        net.chain.revert_to(snapshot)


def batch(n: int, max_tokens: int = 4) -> tuple[bytes, list[bytes]]:
    data = encode_jsonl(prompt_lines([f"prompt {i}" for i in range(n)],
                                     model="0x" + "11" * 32, max_tokens=max_tokens))
    return data, [r.request_hash for r in parse_jsonl(data)]


def post(net: Any, market: Market, n: int = 4, *, account: Any = None,
         **kw: Any) -> tuple[int, list[bytes]]:
    data, hashes = batch(n)
    args: dict[str, Any] = dict(model_id=net.MODEL_ID, shard_size=2, max_tokens=4,
                                price=net.PRICE, deadline=net.chain.timestamp() + 600)
    task_id, _ = post_batch(net.q, account or net.client, market.api, data, hashes,
                            **(args | kw))
    return task_id, hashes


def serve(net: Any, market: Market, task_id: int, shard: int, miner: Any,
          tamper: Any = None) -> ShardResult:
    """A miner's part for one shard: claim, answer, sign, upload, submit."""
    q = net.q
    q.tasks.claim_shard(miner, task_id, shard)
    task = q.tasks.get_task(task_id)
    start, end = q.tasks.shard_range(task_id, shard)
    requests = parse_jsonl(market.api.get(task.input_uri))[start:end]
    doc = build_shard_result(
        task_id=task_id, shard=shard, model_id=task.model_id,
        completions=[Completion(r.index, r.custom_id, r.request_hash, f"out {r.index}",
                                (7, 8 + r.index), "length", 2) for r in requests],
        private_key=miner.key, miner=miner.address, chain_id=net.chain.chain_id,
        task_registry=q.tasks.address)
    if tamper is not None:
        doc = tamper(doc)
    q.tasks.submit_result(miner, task_id, shard, doc.result_root,
                          market.api.put(doc.to_bytes()), doc.tokens_used)
    return doc


def votes(net: Any, dispute_id: int, at_fault: bool) -> list[bytes]:
    return quorum_signatures(Vote(dispute_id, at_fault), net.verifier_keys[:3],
                             net.chain.chain_id, net.q.arbitration.address)


# ---------------------------------------------------------------------------- post, fetch


def test_post_batch_then_fetch_verified_shard_results(devnet: Any, market: Market) -> None:
    net, q = devnet, devnet.q
    data, hashes = batch(5)
    deadline = net.chain.timestamp() + 600
    task_id, tx = post_batch(q, net.client, market.api, data, hashes, model_id=net.MODEL_ID,
                             shard_size=2, max_tokens=6, price=net.PRICE, deadline=deadline)
    t = q.tasks.get_task(task_id)
    assert (t.client, t.num_requests, t.shard_size, t.num_shards) == \
        (net.client.address, 5, 2, 3)
    assert (t.max_tokens_per_request, t.price_per_token, t.deadline) == (6, net.PRICE, deadline)
    assert t.input_root == input_tree(hashes).root
    assert t.input_uri == content_uri(data) and market.api.get(t.input_uri) == data
    assert q.escrow.escrowed(task_id) == 5 * 6 * net.PRICE
    assert tx.event("TaskCreated")["taskId"] == task_id

    with pytest.raises(ResultsNotReady, match="shard 1 is OPEN"):
        fetch_shard_result(q, market.api, task_id, 1, hashes)
    serve(net, market, task_id, 1, net.miner2)
    items = fetch_shard_result(q, market.api, task_id, 1, hashes)
    assert [(it.index, it.text, it.token_ids) for it in items] == \
        [(2, "out 2", (7, 10)), (3, "out 3", (7, 11))]
    assert [it.receipt.request_hash for it in items] == hashes[2:4]
    # Only the shard's own hashes is as good as the task's; anything else is refused.
    assert fetch_shard_result(q, market.api, task_id, 1, hashes[2:4]) == items
    with pytest.raises(JobError, match="3 request hashes given .* the task's 5 or the "
                       "shard's 2"):
        fetch_shard_result(q, market.api, task_id, 1, hashes[:3])
    with pytest.raises(ResultCheckFailed, match="receipt check failed: request 2"):
        fetch_shard_result(q, market.api, task_id, 1, hashes[1:] + hashes[:1])  # shifted

    # A shard of one request (the last) and a shard whose document was altered.
    serve(net, market, task_id, 2, net.miner)
    assert [it.index for it in fetch_shard_result(q, market.api, task_id, 2, hashes)] == [4]
    altered = serve(net, market, task_id, 0, net.miner, lambda doc: dataclasses.replace(
        doc, items=(dataclasses.replace(doc.items[0], text="never said"), *doc.items[1:])))
    assert altered.items[0].text == "never said"
    with pytest.raises(ResultCheckFailed) as info:
        fetch_shard_result(q, market.api, task_id, 0, hashes)
    assert (info.value.check, info.value.index) == ("output hash", 0)


def test_post_batch_checks_everything_before_money_moves(devnet: Any, market: Market) -> None:
    net, q = devnet, devnet.q
    start_block = net.chain.block_number()
    balance = net.chain.balance(net.client.address)
    data, hashes = batch(3)
    now = net.chain.timestamp()
    good: dict[str, Any] = dict(model_id=net.MODEL_ID, shard_size=1, max_tokens=4,
                                price=net.PRICE, deadline=now + 600)

    def refuses(error: type[Exception], match: str, d: bytes = data,
                h: list[bytes] = hashes, account: Any = None, **kw: Any) -> None:
        with pytest.raises(error, match=match):
            post_batch(q, account or net.client, market.api, d, h, **(good | kw))

    refuses(BatchError, "the batch is empty", h=[])
    refuses(BatchError, "3 request lines but 2 request hashes", h=hashes[:2])
    big = encode_jsonl(prompt_lines(["ok", "x" * MAX_REQUEST_BYTES], model="m", max_tokens=4))
    refuses(RequestTooLarge, rf"line 2: request is \d+ bytes, over the market's limit of "
            rf"{MAX_REQUEST_BYTES}", d=big, h=[b"\x00" * 32] * 2)
    refuses(DeadlineExpired, f"deadline {now - 1} has already passed", deadline=now - 1)
    refuses(JobError, "price must be a positive integer", price=0)
    refuses(JobError, "shard_size must be a positive integer", shard_size=0)
    refuses(JobError, "min_reputation_bps must be in", min_reputation_bps=10_001)
    refuses(JobError, "arbiter 'nobody' is not an address", arbiter="nobody")
    refuses(JobError, "model_id must be 32 bytes", model_id=b"short")
    refuses(MinerNotEligible, f"miner {net.outsider.address} is not registered",
            prefer_miner=net.outsider.address)
    refuses(MinerNotEligible, f"does not serve model 0x{'22' * 32} \\(it serves "
            f"0x{'11' * 32};", model_id=net.OTHER_MODEL_ID, prefer_miner=net.miner.address)
    refuses(PaymentTooLow, f"below the ask of the preferred miner {net.miner.address} "
            f"\\({net.PRICE} wei/token\\)", price=net.PRICE - 1, prefer_miner=net.miner.address)
    poor = net.client2
    net.chain.set_balance(poor.address, 10**6)
    refuses(InsufficientFunds, rf"payment is {3 * 4 * net.PRICE} wei but {poor.address} holds "
            "1000000 wei", account=poor)
    refuses(JobError, r"max_tokens must be an integer in \[1, 2\*\*32-1\]", max_tokens=2**32)

    assert net.chain.block_number() == start_block  # not one transaction
    assert net.chain.balance(net.client.address) == balance


def test_prefer_miner_offers_the_task_to_that_miner_only(devnet: Any, market: Market) -> None:
    from market.service.board import Board

    net = devnet
    task_id, _ = post(net, market, prefer_miner=net.miner2.address)
    undirected, _ = post(net, market)
    Board(market.db_path).index(net.q)  # as the market's indexer would
    model = "0x" + net.MODEL_ID.hex()

    def shown(miner: Any) -> set[int]:
        return {s["taskId"] for s in market.api.open_shards(model, miner.address, limit=100)}

    assert {task_id, undirected} <= shown(net.miner2)
    assert task_id not in shown(net.miner) and undirected in shown(net.miner)
    anyone = httpx.get(f"{market.url}/shards/open", params={"modelId": model, "limit": 100})
    assert {s["taskId"] for s in anyone.json()} >= {undirected}
    assert task_id not in {s["taskId"] for s in anyone.json()}


# ---------------------------------------------------------------------------- disputes


def test_open_dispute_refusals_then_each_outcome(devnet: Any, market: Market) -> None:
    net, q = devnet, devnet.q
    arbiter = net.client2
    task_id, _ = post(net, market, n=6, shard_size=2, arbiter=arbiter.address)
    with pytest.raises(DisputeNotPossible, match="shard 0, which is OPEN"):
        open_dispute(q, net.client, market.api, task_id, 1)
    for k in range(3):
        serve(net, market, task_id, k, net.miner)
    api = market.api
    with pytest.raises(DisputeNotPossible, match=r"request index 6 is not in task .* \(0..5\)"):
        open_dispute(q, net.client, api, task_id, 6)
    with pytest.raises(DisputeNotPossible, match="request index True"):
        open_dispute(q, net.client, api, task_id, True)  # type: ignore[arg-type]
    with pytest.raises(DisputeNotPossible, match="neither .* client nor its arbiter"):
        open_dispute(q, net.outsider, api, task_id, 1)
    with pytest.raises(DisputeNotPossible, match="bond must be a positive integer"):
        open_dispute(q, net.client, api, task_id, 1, bond=0)
    with pytest.raises(DisputeNotPossible, match="no task 9999"):
        open_dispute(q, net.client, api, 9999, 0)
    min_bond = q.arbitration.min_bond()
    with pytest.raises(revert_class("InsufficientBond")):  # the contract's own check, named
        open_dispute(q, net.client, api, task_id, 1, bond=min_bond - 1)

    # Miner at fault: the bond comes back, the shard's budget is refunded, the miner slashed.
    collateral = q.tasks.get_shard(task_id, 0).collateral
    at_fault = open_dispute(q, net.client, api, task_id, 1)
    info = dispute_info(q, at_fault)
    assert (info.status, info.task_id, info.shard, info.index, info.opener, info.miner,
            info.bond) == (DisputeStatus.OPEN, task_id, 0, 1, net.client.address,
                           net.miner.address, min_bond)
    assert info.evidence_uri == q.tasks.get_shard(task_id, 0).result_uri
    assert not info.settled and info.outcome() == f"open until chain time {info.deadline}"
    with pytest.raises(DisputeNotPossible, match="shard 0, which is DISPUTED"):
        open_dispute(q, net.client, api, task_id, 0)
    with pytest.raises(JobTimeout, match=f"dispute {at_fault} is still open after 0 s"):
        wait_dispute(q, at_fault, timeout=0)
    q.arbitration.cast_votes(net.anyone, at_fault, True, votes(net, at_fault, True))
    seen: list[DisputeStatus] = []
    info = wait_dispute(q, at_fault, on_poll=lambda d, now: seen.append(d.status))
    budget = q.tasks.shard_budget(task_id, 0)
    assert seen == [DisputeStatus.MINER_AT_FAULT]
    assert (info.status, info.slashed, info.refunded, len(info.voters)) == \
        (DisputeStatus.MINER_AT_FAULT, collateral, budget, 3)
    assert info.outcome() == (f"miner at fault: bond of {min_bond} wei returned, shard budget "
                              f"of {budget} wei refunded, miner slashed {collateral} wei "
                              "(3 votes)")
    assert q.tasks.get_shard(task_id, 0).state == ShardState.REFUNDED

    # Opened by the task's arbiter, with its own evidence; no fault: the bond is forfeited.
    no_fault = open_dispute(q, arbiter, api, task_id, 2, bond=2 * min_bond,
                            evidence_uri="sha256:" + "ab" * 32)
    q.arbitration.cast_votes(net.anyone, no_fault, False, votes(net, no_fault, False))
    info = dispute_info(q, no_fault)
    assert (info.status, info.opener, info.bond, info.evidence_uri, info.slashed) == \
        (DisputeStatus.MINER_NOT_AT_FAULT, arbiter.address, 2 * min_bond,
         "sha256:" + "ab" * 32, 0)
    assert info.outcome().startswith(f"miner not at fault: bond of {2 * min_bond} wei "
                                     "forfeited")
    with pytest.raises(DisputeNotPossible, match="challenge window closed"):
        open_dispute(q, net.client, api, task_id, 3)  # resolving it closed the window

    # No verdict by the deadline: waiting expires it, the bond returns to the opener, and the
    # members that cast no vote (all four) are reported: each loses its seat and
    # idleSlashBps of its stake, burned: the opener gets its bond back and nothing more.
    expiring = open_dispute(q, net.client, api, task_id, 5)
    timeout = q.arbitration.params()["dispute_timeout"]
    net.chain.advance_time(timeout + 1)
    assert wait_dispute(q, expiring).status == DisputeStatus.OPEN  # nobody to expire it
    burn = q.chain.call(q.arbitration.contract.functions.BURN())
    before, burned = q.escrow.withdrawable(net.client.address), q.escrow.withdrawable(burn)
    info = wait_dispute(q, expiring, expire_as=net.anyone)
    members = q.committee.members_at(info.epoch)
    assert info.status == DisputeStatus.EXPIRED and set(info.absent) == set(members)
    assert info.outcome().startswith("expired") and "4 member(s) that cast no vote" in \
        info.outcome()
    penalty = net.VERIFIER_STAKE * int(net.deployment.params["idle_slash_bps"]) // 10_000
    assert q.escrow.withdrawable(net.client.address) == before + min_bond
    assert q.escrow.withdrawable(burn) == burned + 4 * penalty
    assert all(q.committee.verifier_info(m).stake == net.VERIFIER_STAKE - penalty
               for m in members)
    assert q.tasks.get_shard(task_id, 2).state == ShardState.SUBMITTED  # unfrozen

    assert [(d.dispute_id, d.status) for d in task_disputes(q, task_id)] == [
        (at_fault, DisputeStatus.MINER_AT_FAULT), (no_fault, DisputeStatus.MINER_NOT_AT_FAULT),
        (expiring, DisputeStatus.EXPIRED)]
    assert task_disputes(q, task_id)[0].to_json()["outcome"].startswith("miner at fault")
    with pytest.raises(JobError, match="no dispute 9999"):
        dispute_info(q, 9999)
