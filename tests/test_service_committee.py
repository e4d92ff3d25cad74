"""The verifier committee's message relay (`/committee/messages`) on a real uvicorn app over
the session Anvil, whose VerifierCommittee has the four conftest verifiers as members: members
post and read; so do a verifier joining at the next epoch boundary and a member whose seat
ended while the disputes it judges are open (it still posts its votes, which the chain still
takes); strangers, and a verifier that withdrew its stake, are refused both (read live from
the chain); forged, tampered or stale signatures are 401; a conflicting repost is 409 and an
identical one 200 with the first id; filters and paging; over 1 MiB is 413; messages survive a
board reset and stay with the deployment they were posted on."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from market import marketapi as api_module
from market.chain.devnet import free_port
from market.marketapi import MarketAPI, MarketError
from market.protocol.messages import committee_message, reader_headers, recover_committee_message
from market.service.app import serve_in_thread
from market.service.board import Board, MessageConflict, deployment_identity
from market.service.routers.committee import MAX_MESSAGE_BYTES
from market.service.settings import MarketSettings

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]


@dataclass
class Relay:
    api: MarketAPI
    url: str
    board: Board
    http: httpx.Client


@pytest.fixture
def relay(devnet: Devnet, deployment_file: Path, tmp_path: Path) -> Iterator[Relay]:
    settings = MarketSettings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", deployment=deployment_file,
        store_dir=tmp_path / "store", db_path=tmp_path / "board.sqlite", port=free_port())
    with serve_in_thread(settings) as url, MarketAPI(url, timeout=10) as api, \
            httpx.Client(base_url=url, timeout=10) as http:
        yield Relay(api, url, Board(settings.db_path), http)


def refused(call: Any, status: int, match: str | None = None) -> str:
    """Run `call`, which must fail with a MarketError of `status` whose message contains
    `match`; returns the message."""
    with pytest.raises(MarketError, match=None if match is None else re.escape(match)) as info:
        call()
    assert info.value.status == status, str(info.value)
    return str(info.value)


def post_status(relay: Relay, msg: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = relay.http.post("/committee/messages", json=msg)
    return response.status_code, response.json()


def test_members_post_and_read_in_order(relay: Relay, devnet: Devnet) -> None:
    v0, v1, v2, _ = devnet.verifiers
    proposal = committee_message(v0, "set-proposal", 3, "", {"hash": "0x" + "ab" * 32,
                                                              "miners": ["0x01", "0x02"]})
    first = relay.api.post_message(proposal)
    second = relay.api.post_message(committee_message(v1, "set-signature", 3, "",
                                                      {"signature": "0x1234"}))
    vote = committee_message(v2, "vote", 0, "7", {"minerAtFault": True, "signature": "0xab",
                                                  "reason": "score 0.12 below 0.5"})
    third = relay.api.post_message(vote)
    assert first < second < third

    got = relay.api.messages(v1)
    assert [m["id"] for m in got] == [first, second, third]
    assert {k: v for k, v in got[0].items() if k not in ("id", "receivedAt")} == proposal
    assert got[2]["body"] == vote["body"] and got[2]["author"] == v2.address
    assert all(abs(m["receivedAt"] - time.time()) < 60 for m in got)
    # The relay is not trusted: every message carries its author's signature.
    assert [recover_committee_message(m) for m in got] == [v0.address, v1.address, v2.address]

    def ids(**filters: Any) -> list[int]:
        return [m["id"] for m in relay.api.messages(v0, **filters)]

    assert ids(epoch=3) == [first, second]
    assert ids(epoch=0) == [third]
    assert ids(epoch=4) == []
    assert ids(kind="vote") == [third]
    assert ids(epoch=3, kind="set-signature") == [second]
    assert ids(topic="7") == [third] and ids(topic="") == [first, second]
    assert ids(after_id=first) == [second, third]
    assert ids(after_id=third) == []
    assert ids(epoch=3, after_id=first) == [second]


def test_identical_repost_is_200_and_a_changed_one_409(relay: Relay, devnet: Devnet) -> None:
    v0, v1 = devnet.verifiers[:2]
    msg = committee_message(v0, "epoch-proposal", 5, "", {"scores": {"0xabc": 9000}})
    status, body = post_status(relay, msg)
    assert status == 201
    again, same = post_status(relay, msg)
    assert (again, same) == (200, body)
    assert relay.api.post_message(msg) == body["id"]
    changed = committee_message(v0, "epoch-proposal", 5, "", {"scores": {"0xabc": 100}})
    detail = refused(lambda: relay.api.post_message(changed), 409, "a message cannot be changed")
    assert v0.address in detail and f"id {body['id']}" in detail
    # The key is (author, kind, epoch, topic): any other part of it is a new message.
    for other in (committee_message(v1, "epoch-proposal", 5, "", changed["body"]),
                  committee_message(v0, "observation", 5, "", changed["body"]),
                  committee_message(v0, "epoch-proposal", 6, "", changed["body"]),
                  committee_message(v0, "epoch-proposal", 5, "x", changed["body"])):
        assert relay.api.post_message(other) > body["id"]
    assert [m["body"] for m in relay.api.messages(v1, epoch=5, kind="epoch-proposal")] == [
        {"scores": {"0xabc": 9000}}, {"scores": {"0xabc": 100}},
        {"scores": {"0xabc": 100}}]


def test_strangers_may_neither_post_nor_read(relay: Relay, devnet: Devnet) -> None:
    v0 = devnet.verifiers[0]
    q, outsider = devnet.q, devnet.outsider
    relay.api.post_message(committee_message(v0, "observation", 1, "", {"seen": 1}))
    detail = refused(lambda: relay.api.post_message(
        committee_message(outsider, "observation", 1, "", {"seen": 2})), 403,
        "is not a verifier of VerifierCommittee")
    assert outsider.address in detail and q.committee.address in detail
    refused(lambda: relay.api.messages(outsider), 403, "may not read committee messages")
    refused(lambda: relay.api.messages(devnet.miner), 403)

    # A verifier joining at the next boundary reads (and posts) ahead of its first epoch.
    q.committee.register(outsider, devnet.VERIFIER_STAKE)
    assert not q.committee.is_member(outsider.address)
    relay.api.post_message(committee_message(outsider, "observation", 1, "", {"seen": 2}))
    assert [m["author"] for m in relay.api.messages(outsider)] == [v0.address,
                                                                   outsider.address]
    # A join withdrawn before it took effect never sits: a stranger again, though its stake
    # stays bonded; once withdrawn, no record is left.
    q.committee.request_exit(outsider)
    info = q.committee.verifier_info(outsider.address)
    assert info.registered and not info.sits
    refused(lambda: relay.api.messages(outsider), 403)
    refused(lambda: relay.api.post_message(
        committee_message(outsider, "observation", 1, "x", {})), 403)
    q.chain.advance_time(info.withdrawable_at - q.chain.timestamp())
    q.committee.withdraw_stake(outsider)
    assert not q.committee.verifier_info(outsider.address).registered


def _open_dispute(devnet: Devnet) -> int:
    """A dispute on a one-shard task the conftest miner submitted; returns its id."""
    from market.protocol import Receipt, keccak, output_hash, receipts_tree

    net, q = devnet, devnet.q
    task_id, _ = q.tasks.create_task(
        net.client, model_id=net.MODEL_ID, input_root=b"\x01" * 32,
        input_uri="sha256:" + "01" * 32, num_requests=2, shard_size=2,
        max_tokens_per_request=4, price_per_token=net.PRICE,
        deadline=net.chain.timestamp() + 3600)
    q.tasks.claim_shard(net.miner, task_id, 0)
    receipts = [Receipt(task_id, 0, i, keccak(b"%d" % i), output_hash("a", [1]), 1,
                        net.MODEL_ID) for i in range(2)]
    tree = receipts_tree(receipts)
    q.tasks.submit_result(net.miner, task_id, 0, tree.root, "sha256:" + "02" * 32, tree.total)
    dispute_id, _ = q.arbitration.open_dispute(net.client, task_id, 0, receipts[1],
                                               tree.proof(1), "e", q.arbitration.min_bond())
    return dispute_id


def test_a_member_whose_seat_ended_still_posts_its_votes(relay: Relay,
                                                         devnet: Devnet) -> None:
    """A dispute is judged by the committee of the epoch it was opened in. A member of that
    committee that left at the next boundary must still get its vote out (or be reported
    absent): the relay takes and serves its messages until it withdraws its stake."""
    from conftest import until_seated

    from market.chain.contracts import Ballot, DisputeStatus
    from market.protocol import Vote

    net, q = devnet, devnet.q
    leaver, other = net.verifiers[0], net.verifiers[1]
    dispute_id = _open_dispute(net)
    epoch = q.arbitration.get_dispute(dispute_id).epoch
    q.committee.request_exit(leaver)
    until_seated(q)
    assert not q.committee.is_member(leaver.address)
    assert q.committee.current_epoch() > epoch
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.OPEN

    signature = Vote(dispute_id, True).sign(leaver.key, net.chain.chain_id,
                                             q.arbitration.address)
    vote = committee_message(leaver, "vote", epoch, str(dispute_id),
                             {"minerAtFault": True, "signature": "0x" + signature.hex()})
    vote_id = relay.api.post_message(vote)
    got = relay.api.messages(other, kind="vote", topic=str(dispute_id))
    assert [m["id"] for m in got] == [vote_id]
    assert [m["id"] for m in relay.api.messages(leaver, topic=str(dispute_id))] == [vote_id]
    # What it relayed is a vote the chain still counts: it sat in the dispute's epoch.
    relayed = bytes.fromhex(got[0]["body"]["signature"].removeprefix("0x"))
    q.arbitration.cast_votes(net.anyone, dispute_id, True, [relayed])
    assert q.arbitration.ballot_of(dispute_id, leaver.address) == Ballot.FAULT

    # Once its stake is withdrawn (after every dispute its seat judged) it is a stranger.
    info = q.committee.verifier_info(leaver.address)
    net.chain.advance_time(info.withdrawable_at - net.chain.timestamp())
    q.committee.withdraw_stake(leaver)
    refused(lambda: relay.api.messages(leaver), 403, "is not a verifier")
    refused(lambda: relay.api.post_message(
        committee_message(leaver, "observation", epoch, "late", {})), 403)


def test_bad_signatures_are_401(relay: Relay, devnet: Devnet) -> None:
    v0, v1 = devnet.verifiers[:2]
    forged = {**committee_message(v1, "vote", 0, "1", {"minerAtFault": False}),
              "author": v0.address}  # v1 speaking for v0
    # The signature covers the author, so the one recovered is neither v0 nor v1.
    refused(lambda: relay.api.post_message(forged), 401,
            f"committee message from {v0.address} is signed by 0x")
    honest = committee_message(v0, "vote", 0, "1", {"minerAtFault": False})
    for bad in ({**honest, "body": {"minerAtFault": True}},  # tampered after signing
                {**honest, "epoch": 1},
                {**honest, "signature": "0x" + "11" * 65},
                {**honest, "signature": "not hex"},
                {**honest, "signature": 12}):
        refused(lambda b=bad: relay.api.post_message(b), 401)  # type: ignore[misc]
    assert relay.api.messages(v1) == []

    # Reader headers: missing, forged, stale or from the future.
    assert relay.http.get("/committee/messages").status_code == 401
    headers = reader_headers(v0)
    forged_reader = {**reader_headers(v1), "X-Quarry-Reader": v0.address}
    missing = {k: v for k, v in headers.items() if k != "X-Quarry-Signature"}
    stale = reader_headers(v0, int(time.time()) - 300)
    future = reader_headers(v0, int(time.time()) + 300)
    for bad_headers, match in ((forged_reader, "are signed by"), (missing, "needs the headers"),
                               (stale, "off the market's clock"),
                               (future, "off the market's clock"),
                               ({**headers, "X-Quarry-Timestamp": "soon"}, "not an integer"),
                               ({**headers, "X-Quarry-Signature": "0x00"}, "malformed")):
        response = relay.http.get("/committee/messages", headers=bad_headers)
        assert response.status_code == 401 and match in response.json()["detail"]
    assert relay.http.get("/committee/messages", headers=headers).json() == []


def test_malformed_and_oversized_messages(relay: Relay, devnet: Devnet) -> None:
    v0 = devnet.verifiers[0]
    good = committee_message(v0, "observation", 1, "t", {"x": 1})
    lower = committee_message(v0, "observation", 1, "t", {"x": 1})
    lower["author"] = v0.address.lower()
    for bad, match in (({k: v for k, v in good.items() if k != "topic"}, "missing topic"),
                       ({**good, "extra": 1}, "unknown field(s) extra"),
                       (lower, "checksummed"),
                       ({**good, "author": "0x12"}, "is not an address"),
                       ({**good, "kind": "Set Proposal"}, "kind 'Set Proposal'"),
                       ({**good, "kind": ""}, "kind ''"),
                       ({**good, "epoch": -1}, "epoch -1"),
                       ({**good, "epoch": "1"}, "epoch '1'"),
                       ({**good, "epoch": True}, "epoch True"),
                       ({**good, "topic": "t" * 257}, "topic must be"),
                       ({**good, "body": [1]}, "body must be a JSON object")):
        refused(lambda b=bad: relay.api.post_message(b), 400, match)  # type: ignore[misc]
    not_json = relay.http.post("/committee/messages", content=b"{nope",
                               headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["detail"]

    big = committee_message(v0, "observation", 1, "big", {"blob": "x" * MAX_MESSAGE_BYTES})
    refused(lambda: relay.api.post_message(big), 413, f"limit of {MAX_MESSAGE_BYTES} bytes")
    chunked = relay.http.post("/committee/messages",
                              content=iter([b"{" + b" " * 700_000, b" " * 700_000 + b"}"]))
    assert chunked.status_code == 413 and "(so far)" in chunked.json()["detail"]
    # Just under the limit passes.
    fits = committee_message(v0, "observation", 1, "fits",
                             {"blob": "x" * (MAX_MESSAGE_BYTES - 1000)})
    relay.api.post_message(fits)
    assert relay.api.messages(v0, topic="fits")[0]["body"] == fits["body"]
    assert relay.http.get("/committee/messages", params={"epoch": -1},
                          headers=reader_headers(v0)).status_code == 422


def test_paging_returns_every_message(relay: Relay, devnet: Devnet,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    v0 = devnet.verifiers[0]
    posted = [relay.api.post_message(committee_message(v0, "observation", e, "", {"e": e}))
              for e in range(5)]
    monkeypatch.setattr(api_module, "MESSAGE_PAGE", 2)
    assert [m["id"] for m in relay.api.messages(v0)] == posted
    assert [m["id"] for m in relay.api.messages(v0, after_id=posted[1])] == posted[2:]
    page = relay.http.get("/committee/messages", params={"limit": 3},
                          headers=reader_headers(v0)).json()
    assert [m["id"] for m in page] == posted[:3]


def test_messages_survive_a_reset_and_stay_with_their_deployment(relay: Relay,
                                                                 devnet: Devnet) -> None:
    v0, v1 = devnet.verifiers[:2]
    msg = committee_message(v0, "set-proposal", 2, "", {"hash": "0x01"})
    first = relay.api.post_message(msg)
    relay.board.index(devnet.q)
    relay.board.reset()  # the chain-derived tables go; the relay's messages stay
    assert [m["id"] for m in relay.api.messages(v1)] == [first]

    # The same key on another deployment (a redeployed devnet restarts its epochs) neither
    # conflicts with this one's nor shows here.
    other = deployment_identity(devnet.q) + ":elsewhere"
    elsewhere = dict(msg, body={"hash": "0x02"})
    other_id, created = relay.board.put_message(other, elsewhere)
    assert created and other_id > first
    assert [m["body"] for m in relay.board.messages(other)] == [{"hash": "0x02"}]
    assert [m["id"] for m in relay.api.messages(v1)] == [first]
    with pytest.raises(MessageConflict):
        relay.board.put_message(other, msg)
