"""The contracts through the Python wrappers on a real Anvil: the task life cycle with exact
balances, disputes both ways with stake-weighted votes, availability challenges and billing
proofs, probation, Python-made signatures, result-tree proofs and output hashes accepted
on-chain, and bad inputs raising the exception named after the custom error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from market.chain.contracts import (
    MAX_CLAIM_BATCH,
    ZERO_ADDRESS,
    Ballot,
    ChallengeStatus,
    DisputeStatus,
    GpuSpec,
    ShardState,
)
from market.chain.errors import ContractRevert, revert_class
from market.protocol import (
    ChallengeSet,
    Receipt,
    Report,
    Vote,
    input_tree,
    keccak,
    output_hash,
    quorum_signatures,
    receipts_tree,
    request_hash,
)
from market.protocol.commitments import ZERO_HASH as ZERO
from market.protocol.commitments import commitment_hash
from market.protocol.eip712 import TYPEHASHES, domain_separator
from market.protocol.merkle import INDEX_HASH_TYPES, SumNode, leaf_hash
from market.protocol.precision import Precision, PrecisionError, precision_mask
from market.protocol.results import receipt_proven

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]

MAX_TOKENS = 8
MODEL_ID = bytes.fromhex("11" * 32)  # what the conftest miners serve (Devnet.MODEL_ID)
PRICE = 10**9
MINER_STAKE = 10**18


@pytest.fixture(autouse=True)
def _constants_match(devnet_session: Devnet) -> None:
    assert (MODEL_ID, PRICE, MINER_STAKE) == (
        devnet_session.MODEL_ID, devnet_session.PRICE, devnet_session.MINER_STAKE)


def reverts(name: str):
    return pytest.raises(revert_class(name))


def requests(n: int, tag: str = "t") -> list[dict]:
    return [
        {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "prompt": f"Say {i}", "max_tokens": MAX_TOKENS, "seed": i}}
        for i in range(n)
    ]


@dataclass
class Posted:
    task_id: int
    payment: int
    gas_cost: int
    hashes: list[bytes]


def post_task(net: Devnet, n: int, shard_size: int, *, client: LocalAccount | None = None,
              arbiter: str = ZERO_ADDRESS, tag: str = "t", allow_probation: bool = False
              ) -> Posted:
    client = client or net.client
    hashes = [request_hash(r) for r in requests(n, tag)]
    root = input_tree(hashes).root
    deadline = net.chain.timestamp() + 3600
    task_id, tx = net.q.tasks.create_task(
        client, model_id=MODEL_ID, input_root=root, input_uri=f"store://{root.hex()}",
        num_requests=n, shard_size=shard_size, max_tokens_per_request=MAX_TOKENS,
        price_per_token=PRICE, deadline=deadline, arbiter=arbiter,
        allow_probation=allow_probation,
    )
    return Posted(task_id, n * MAX_TOKENS * PRICE, tx.gas_cost, hashes)


def answer_ids(i: int) -> list[int]:
    """Request i's output token ids (1..8 tokens)."""
    return list(range(1, 1 + (i % MAX_TOKENS) + 1))


@dataclass
class Work:
    receipts: list[Receipt]
    sigs: list[bytes]
    root: bytes
    tokens: int

    def proof(self, j: int) -> list[SumNode]:
        return receipts_tree(self.receipts).proof(j)


def do_work(net: Devnet, posted: Posted, shard: int, miner: LocalAccount,
            billed: dict[int, int] | None = None) -> Work:
    """What a miner does off-chain: outputs, signed receipts, the result tree. `billed` maps
    request indices to a token count the receipt claims instead of the output's."""
    start, end = net.q.tasks.shard_range(posted.task_id, shard)
    receipts = []
    for i in range(start, end):
        ids = answer_ids(i)
        count = (billed or {}).get(i, len(ids))
        receipts.append(Receipt(posted.task_id, shard, i, posted.hashes[i],
                                output_hash(f"answer {i}", ids), count, MODEL_ID,
                                commitment_hash(b"activations of %d" % i) if i % 2 else ZERO))
    sigs = [r.sign(miner.key, net.chain.chain_id, net.q.tasks.address) for r in receipts]
    tree = receipts_tree(receipts)
    assert tree.total == sum(r.output_tokens for r in receipts)
    return Work(receipts, sigs, tree.root, tree.total)


def claim_and_submit(net: Devnet, posted: Posted, shard: int,
                     miner: LocalAccount | None = None,
                     billed: dict[int, int] | None = None) -> Work:
    miner = miner or net.miner
    net.q.tasks.claim_shard(miner, posted.task_id, shard)
    work = do_work(net, posted, shard, miner, billed)
    net.q.tasks.submit_result(miner, posted.task_id, shard, work.root, "store://out", work.tokens)
    return work


def assert_escrow_invariant(net: Devnet) -> None:
    e = net.q.escrow
    assert e.balance() == e.total_escrowed() + e.total_withdrawable()


def withdraw_exact(net: Devnet, account: LocalAccount, expected: int) -> None:
    """Withdraw and check the account's balance grew by exactly `expected` minus gas."""
    assert net.q.escrow.withdrawable(account.address) == expected
    before = net.chain.balance(account.address)
    tx = net.q.escrow.withdraw(account)
    assert net.chain.balance(account.address) == before + expected - tx.gas_cost
    assert net.q.escrow.withdrawable(account.address) == 0


# -- life cycle ---------------------------------------------------------------------------


def test_create_claim_submit_finalize_to_the_wei(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    before = net.chain.balance(net.client.address)
    posted = post_task(net, 6, 6)
    assert net.chain.balance(net.client.address) == before - posted.payment - posted.gas_cost
    assert q.escrow.escrowed(posted.task_id) == posted.payment
    task = q.tasks.get_task(posted.task_id)
    assert (task.client, task.num_requests, task.num_shards) == (net.client.address, 6, 1)
    assert task.input_root == input_tree(posted.hashes).root

    claim = q.tasks.claim_shard(net.miner, posted.task_id, 0)
    collateral = posted.payment * 2000 // 10_000
    assert claim.event("ShardClaimed")["collateral"] == collateral
    assert q.gpu.miner_info(net.miner.address).locked == collateral

    work = do_work(net, posted, 0, net.miner)
    q.tasks.submit_result(net.miner, posted.task_id, 0, work.root, "store://out", work.tokens)
    shard = q.tasks.get_shard(posted.task_id, 0)
    assert (shard.state, shard.result_root, shard.tokens_used) == (
        ShardState.SUBMITTED, work.root, work.tokens)

    with reverts("WindowNotClosed") as info:
        q.tasks.finalize_shard(net.anyone, posted.task_id, 0)
    assert info.value.args_dict == {"windowEnd": shard.window_end}
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    fin = q.tasks.finalize_shard(net.anyone, posted.task_id, 0)
    pay = work.tokens * PRICE
    assert fin.event("ShardFinalized") == {"taskId": posted.task_id, "shard": 0,
                                           "miner": net.miner.address, "payment": pay,
                                           "refund": posted.payment - pay}
    with reverts("AlreadyFinalized"):
        q.tasks.finalize_shard(net.anyone, posted.task_id, 0)

    assert q.escrow.escrowed(posted.task_id) == 0
    assert q.gpu.miner_info(net.miner.address).locked == 0
    assert_escrow_invariant(net)
    withdraw_exact(net, net.miner, pay)
    withdraw_exact(net, net.client, posted.payment - pay)
    assert_escrow_invariant(net)
    with reverts("NothingToWithdraw"):
        q.escrow.withdraw(net.client)


def test_expired_claim_is_reclaimed_and_reopened(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 4, 2)
    q.tasks.claim_shard(net.miner, posted.task_id, 1)
    collateral = q.tasks.get_shard(posted.task_id, 1).collateral
    assert collateral == q.tasks.shard_budget(posted.task_id, 1) * 2000 // 10_000
    with reverts("ClaimNotExpired"):
        q.tasks.reclaim_expired(net.anyone, posted.task_id, 1)

    net.chain.advance_time(q.tasks.params()["claim_timeout"])
    with reverts("ClaimExpired"):
        q.tasks.submit_result(net.miner, posted.task_id, 1, b"\x01" * 32, "late", 1)
    tx = q.tasks.reclaim_expired(net.anyone, posted.task_id, 1)
    penalty = collateral * 5000 // 10_000
    assert tx.event("ClaimReclaimed")["penalty"] == penalty
    assert tx.event("ClaimReclaimed")["reopened"] is True
    info = q.gpu.miner_info(net.miner.address)
    assert (info.stake, info.locked) == (MINER_STAKE - penalty, 0)
    assert q.tasks.get_shard(posted.task_id, 1).state == ShardState.OPEN
    assert q.escrow.escrowed(posted.task_id) == posted.payment  # the budget stays for the task
    assert_escrow_invariant(net)

    # The reopened shard runs to the end with another miner.
    work = claim_and_submit(net, posted, 1, net.miner2)
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    q.tasks.finalize_shard(net.anyone, posted.task_id, 1)
    budget = q.tasks.shard_budget(posted.task_id, 1)
    withdraw_exact(net, net.client, penalty + budget - work.tokens * PRICE)
    withdraw_exact(net, net.miner2, work.tokens * PRICE)


def test_cancel_refunds_open_shards_only(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 6, 2)
    budget = q.tasks.shard_budget(posted.task_id, 0)
    q.tasks.claim_shard(net.miner, posted.task_id, 0)
    with reverts("NotClient"):
        q.tasks.cancel_task(net.miner, posted.task_id)
    tx = q.tasks.cancel_task(net.client, posted.task_id)
    assert tx.event("TaskCancelled")["refund"] == 2 * budget
    assert q.escrow.withdrawable(net.client.address) == 2 * budget
    assert q.escrow.escrowed(posted.task_id) == budget
    with reverts("AlreadyCancelled"):
        q.tasks.cancel_task(net.client, posted.task_id)
    assert q.tasks.get_shard(posted.task_id, 1).state == ShardState.REFUNDED
    with reverts("ShardNotOpen") as info:
        q.tasks.claim_shard(net.miner2, posted.task_id, 1)
    assert info.value.args_dict == {"state": ShardState.REFUNDED}

    # The claimed shard still finishes normally.
    work = do_work(net, posted, 0, net.miner)
    q.tasks.submit_result(net.miner, posted.task_id, 0, work.root, "store://out", work.tokens)
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    q.tasks.finalize_shard(net.anyone, posted.task_id, 0)
    assert q.escrow.escrowed(posted.task_id) == 0
    withdraw_exact(net, net.client, 2 * budget + budget - work.tokens * PRICE)
    assert_escrow_invariant(net)


# -- disputes -----------------------------------------------------------------------------


def open_dispute(net: Devnet, posted: Posted, work: Work, j: int, shard: int = 1,
                 opener: LocalAccount | None = None) -> tuple[int, int]:
    bond = net.q.arbitration.min_bond()
    dispute_id, _ = net.q.arbitration.open_dispute(
        opener or net.client, posted.task_id, shard, work.receipts[j], work.proof(j),
        "store://evidence", bond)
    return dispute_id, bond


def votes(net: Devnet, dispute_id: int, at_fault: bool, n: int = 3) -> list[bytes]:
    return quorum_signatures(Vote(dispute_id, at_fault), net.verifier_keys[:n],
                             net.chain.chain_id, net.q.arbitration.address)


def test_contracts_agree_with_python_hashes(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    cid = net.chain.chain_id
    for contract in (q.tasks, q.arbitration, q.committee):
        assert contract.domain_separator() == domain_separator(cid, contract.address)
    for commitment in (b"", b"\x07" * 258, b"\x01" * 516):  # none, one chunk, two chunks
        r = Receipt(3, 1, 6, keccak(b"r"), output_hash("x", [1, 2]), 2, MODEL_ID,
                    commitment_hash(commitment))
        assert q.tasks.receipt_struct_hash(r) == r.struct_hash()
        assert q.tasks.hash_receipt(r) == r.digest(cid, q.tasks.address)
        assert q.arbitration.receipt_leaf(r) == leaf_hash(INDEX_HASH_TYPES, (6, r.struct_hash()))
    assert q.tasks.contract.functions.RECEIPT_TYPEHASH().call() == TYPEHASHES["Receipt"]
    assert q.arbitration.hash_vote(9, True) == Vote(9, True).digest(cid, q.arbitration.address)
    rep = Report(4, (net.miner.address, net.miner2.address), (100, 9999), keccak(b"ev"))
    assert q.committee.hash_report(rep) == rep.digest(cid, q.committee.address)
    cs = ChallengeSet(5, keccak(b"cs"))
    assert q.committee.hash_challenge_set(5, cs.challenge_set_hash) == cs.digest(
        cid, q.committee.address)


def test_python_result_tree_proofs_are_what_the_contract_accepts(devnet: Devnet) -> None:
    """Every receipt of shards of 1..9 requests: the Python proof is accepted by
    `Arbitration.proves` and by `receipt_proven`, and both refuse a billed total that is not
    the receipts' sum."""
    net, q = devnet, devnet.q
    for n in range(1, 10):
        posted = post_task(net, n, n, tag=f"s{n}")
        work = claim_and_submit(net, posted, 0)
        for j, r in enumerate(work.receipts):
            proof = work.proof(j)
            assert q.arbitration.proves(posted.task_id, 0, r, proof)
            assert receipt_proven(r, proof, result_root=work.root, tokens_used=work.tokens,
                                  start=0, size=n)
            assert not receipt_proven(r, proof, result_root=work.root,
                                      tokens_used=work.tokens + 1, start=0, size=n)
            if n > 1:
                assert not q.arbitration.proves(posted.task_id, 0, r, work.proof((j + 1) % n))


def test_dispute_miner_at_fault(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 8, 4)
    work = claim_and_submit(net, posted, 1)  # indices 4..7: the leaves use the global index
    collateral = q.tasks.get_shard(posted.task_id, 1).collateral
    budget = q.tasks.shard_budget(posted.task_id, 1)
    dispute_id, bond = open_dispute(net, posted, work, 2)
    d = q.arbitration.get_dispute(dispute_id)
    assert (d.status, d.miner, d.receipt) == (DisputeStatus.OPEN, net.miner.address,
                                              work.receipts[2])
    assert (d.epoch, d.total_weight) == (q.committee.current_epoch(), 4 * 10**18)
    assert q.tasks.get_shard(posted.task_id, 1).state == ShardState.DISPUTED
    with reverts("DisputeOpen"):
        q.tasks.finalize_shard(net.anyone, posted.task_id, 1)

    tx = q.arbitration.cast_votes(net.anyone, dispute_id, True, votes(net, dispute_id, True))
    voters = sorted(net.verifiers[:3], key=lambda a: int(a.address, 16))
    assert tx.event("DisputeResolved")["voters"] == [v.address for v in voters]
    each = collateral * 10_000 // 10_000 * 2000 // 10_000 // 3
    assert tx.event("DisputeResolved")["slashed"] == collateral
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.MINER_AT_FAULT
    assert q.tasks.get_shard(posted.task_id, 1).state == ShardState.REFUNDED
    info = q.gpu.miner_info(net.miner.address)
    assert (info.stake, info.locked) == (MINER_STAKE - collateral, 0)
    for v in voters:
        withdraw_exact(net, v, each)
    withdraw_exact(net, net.client, budget + bond + collateral - 3 * each)
    assert q.escrow.escrowed(posted.task_id) == posted.payment - budget
    assert_escrow_invariant(net)


def test_dispute_no_fault_then_finalize(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    client_arbiter = net.client2
    posted = post_task(net, 8, 4, arbiter=client_arbiter.address)
    work = claim_and_submit(net, posted, 1)
    with reverts("NotClientArbiterOrAuditor"):
        open_dispute(net, posted, work, 0, opener=net.outsider)
    dispute_id, bond = open_dispute(net, posted, work, 0, opener=client_arbiter)
    q.arbitration.cast_votes(net.anyone, dispute_id, False, votes(net, dispute_id, False))
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.MINER_NOT_AT_FAULT
    shard = q.tasks.get_shard(posted.task_id, 1)
    assert shard.state == ShardState.SUBMITTED
    q.tasks.finalize_shard(net.anyone, posted.task_id, 1)  # the window closed at resolve
    to_miner = bond * 5000 // 10_000
    each = (bond - to_miner) // 3
    for v in net.verifiers[:3]:
        withdraw_exact(net, v, each)
    assert q.escrow.withdrawable(net.verifiers[3].address) == 0
    withdraw_exact(net, net.miner, bond - 3 * each + work.tokens * PRICE)
    assert q.escrow.withdrawable(client_arbiter.address) == 0  # the bond is lost
    assert_escrow_invariant(net)


def test_dispute_rejects_bad_evidence(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 8, 4)
    work = claim_and_submit(net, posted, 1)
    bond = q.arbitration.min_bond()
    task_id, r = posted.task_id, work.receipts[1]

    def dispute(receipt: Receipt, proof: list[SumNode], value: int = bond) -> None:
        q.arbitration.open_dispute(net.client, task_id, 1, receipt, proof, "e", value)

    with reverts("InvalidProof"):
        dispute(r, work.proof(2))
    # signed by the miner, but not what its result root commits to
    forged = Receipt(task_id, 1, r.index, r.request_hash, keccak(b"other"), r.output_tokens,
                     MODEL_ID)
    with reverts("InvalidProof"):
        dispute(forged, work.proof(1))
    other = Receipt(task_id, 1, 1, r.request_hash, r.output_hash, 1, MODEL_ID)  # index 1: shard 0
    with reverts("ReceiptMismatch"):
        dispute(other, [])
    over = Receipt(task_id, 1, r.index, r.request_hash, r.output_hash, MAX_TOKENS + 1, MODEL_ID)
    with reverts("TooManyOutputTokens") as info:
        dispute(over, work.proof(1))
    assert info.value.args_dict == {"max": MAX_TOKENS, "got": MAX_TOKENS + 1}
    with reverts("InsufficientBond"):
        dispute(r, work.proof(1), bond - 1)
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    with reverts("OutsideWindow"):
        dispute(r, work.proof(1))


def test_votes_count_by_stake_and_are_recorded_until_a_quorum(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 8, 4)
    work = claim_and_submit(net, posted, 1)
    dispute_id, _ = open_dispute(net, posted, work, 3)
    cid, arb = net.chain.chain_id, q.arbitration.address
    good = votes(net, dispute_id, True)
    signer = Vote(dispute_id, True).recover(good[0], cid, arb)
    with reverts("DuplicateSigner") as info:
        q.arbitration.cast_votes(net.anyone, dispute_id, True, [good[0], good[0], good[1]])
    assert info.value.args_dict == {"signer": signer}
    with reverts("SignersNotSorted"):
        q.arbitration.cast_votes(net.anyone, dispute_id, True, [good[1], good[0], good[2]])
    with reverts("NotCommitteeMember"):
        q.arbitration.cast_votes(net.anyone, dispute_id, True, quorum_signatures(
            Vote(dispute_id, True), [net.outsider.key, *net.verifier_keys[:3]], cid, arb))
    # A vote signed for another chain, or for the other verdict, recovers to a stranger. (One
    # signature each: strangers' random addresses would otherwise trip the sort check first.)
    wrong_chain = Vote(dispute_id, True).sign(net.verifier_keys[0], cid + 1, arb)
    with reverts("NotCommitteeMember") as info:
        q.arbitration.cast_votes(net.anyone, dispute_id, True, [wrong_chain])
    assert info.value.args_dict["signer"] != net.verifiers[0].address
    other_verdict = Vote(dispute_id, False).sign(net.verifier_keys[0], cid, arb)
    with reverts("NotCommitteeMember"):
        q.arbitration.cast_votes(net.anyone, dispute_id, True, [other_verdict])
    # Two of four equal stakes are not more than two thirds: recorded, still open.
    tx = q.arbitration.cast_votes(net.anyone, dispute_id, True, good[:2])
    assert not tx.all("DisputeResolved") and len(tx.all("VoteCast")) == 2
    d = q.arbitration.get_dispute(dispute_id)
    assert (d.status, d.fault_weight) == (DisputeStatus.OPEN, 2 * 10**18)
    assert q.arbitration.ballot_of(dispute_id, signer) == Ballot.FAULT
    with reverts("NoNewVotes"):
        q.arbitration.cast_votes(net.anyone, dispute_id, True, good[:2])
    tx = q.arbitration.cast_votes(net.anyone, dispute_id, True, good)  # the third is new
    assert len(tx.all("VoteCast")) == 1 and tx.event("DisputeResolved")["minerAtFault"]
    with reverts("DisputeNotOpen"):
        q.arbitration.cast_votes(net.anyone, dispute_id, True, good)


def test_unanswered_availability_challenge_is_a_fault(devnet: Devnet) -> None:
    """Gap 1: a root and a full bill for a result never published. The client challenges one
    request; nobody can answer; after the response window the miner is at fault."""
    net, q = devnet, devnet.q
    posted = post_task(net, 4, 4)
    q.tasks.claim_shard(net.miner, posted.task_id, 0)
    q.tasks.submit_result(net.miner, posted.task_id, 0, keccak(b"nothing"), "store://gone",
                          4 * MAX_TOKENS)
    collateral = q.tasks.get_shard(posted.task_id, 0).collateral
    bond = q.arbitration.min_availability_bond()
    challenge_id, _ = q.arbitration.challenge_availability(net.client, posted.task_id, 0, 2,
                                                           bond)
    c = q.arbitration.get_challenge(challenge_id)
    assert (c.status, c.index, c.miner) == (ChallengeStatus.OPEN, 2, net.miner.address)
    with reverts("ResponseWindowOpen"):
        q.arbitration.settle_unanswered(net.anyone, challenge_id)
    net.chain.advance_time(q.arbitration.response_window())
    tx = q.arbitration.settle_unanswered(net.anyone, challenge_id)
    assert tx.event("AvailabilityUnanswered")["slashed"] == collateral
    assert q.tasks.get_shard(posted.task_id, 0).state == ShardState.REFUNDED
    info = q.gpu.miner_info(net.miner.address)
    assert (info.stake, info.locked) == (MINER_STAKE - collateral, 0)
    # the client is made whole (budget and bond); the collateral is burned, so no client
    # profits from an honest miner's outage (issue 29, gap 6)
    withdraw_exact(net, net.client, posted.payment + bond)
    burn = to_checksum_address(q.chain.call(q.arbitration.contract.functions.BURN()))
    assert q.escrow.withdrawable(burn) == collateral
    assert q.escrow.withdrawable(net.miner.address) == 0
    assert_escrow_invariant(net)


def test_answered_challenge_reopens_the_window_for_a_dispute(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    posted = post_task(net, 4, 4)
    work = claim_and_submit(net, posted, 0)
    bond = q.arbitration.min_availability_bond()
    challenge_id, _ = q.arbitration.challenge_availability(net.client, posted.task_id, 0, 1,
                                                           bond)
    with reverts("ReceiptMismatch"):
        q.arbitration.answer_availability(net.miner, challenge_id, work.receipts[0],
                                          work.proof(0))
    tx = q.arbitration.answer_availability(net.miner, challenge_id, work.receipts[1],
                                           work.proof(1))
    ev = tx.event("AvailabilityAnswered")
    assert Receipt.from_message(ev["receipt"]) == work.receipts[1]
    assert ev["windowEnd"] >= net.chain.timestamp() + q.arbitration.response_window()
    assert q.tasks.get_shard(posted.task_id, 0).state == ShardState.SUBMITTED
    withdraw_exact(net, net.miner, bond)  # the bond pays the honest miner's answer
    # the answered receipt and proof are what an ordinary dispute needs
    proof = [SumNode(bytes(p["hash"]), int(p["sum"])) for p in ev["proof"]]
    dispute_id, _ = q.arbitration.open_dispute(
        net.client, posted.task_id, 0, work.receipts[1], proof, "store://e",
        q.arbitration.min_bond())
    assert q.arbitration.get_dispute(dispute_id).receipt == work.receipts[1]


def test_billing_faults_are_proven_on_chain(devnet: Devnet) -> None:
    """Gap 2: a receipt that bills more tokens than its output holds, proven with the output's
    token ids (Python's output_hash encoding, checked by the contract), and one over the
    task's cap, proven by the receipt alone."""
    net, q = devnet, devnet.q
    posted = post_task(net, 8, 4)
    padded = claim_and_submit(net, posted, 0, billed={1: len(answer_ids(1)) + 3})
    ids = answer_ids(1)
    text_hash = keccak(b"answer 1")
    with reverts("NoBillingFault"):
        q.arbitration.prove_billing_fault(net.client, posted.task_id, 0, padded.receipts[0],
                                          padded.proof(0), keccak(b"answer 0"), answer_ids(0))
    with reverts("OutputHashMismatch"):
        q.arbitration.prove_billing_fault(net.client, posted.task_id, 0, padded.receipts[1],
                                          padded.proof(1), text_hash, ids + [9])
    collateral = q.tasks.get_shard(posted.task_id, 0).collateral
    tx = q.arbitration.prove_billing_fault(net.client, posted.task_id, 0, padded.receipts[1],
                                           padded.proof(1), text_hash, ids)
    assert tx.event("BillingFaultProven")["slashed"] == collateral
    assert q.tasks.get_shard(posted.task_id, 0).state == ShardState.REFUNDED

    over = claim_and_submit(net, posted, 1, net.miner2, billed={5: MAX_TOKENS * 3, 6: 0, 7: 0})
    assert over.tokens <= 4 * MAX_TOKENS  # within the shard's maximum, so submit accepted it
    q.arbitration.prove_billing_fault(net.client, posted.task_id, 1, over.receipts[1],
                                      over.proof(1), bytes(32), [])
    assert q.tasks.get_shard(posted.task_id, 1).state == ShardState.REFUNDED
    assert_escrow_invariant(net)


def test_new_miners_start_on_probation(devnet: Devnet) -> None:
    """Gap 6: a fresh key registers on probation: it may claim only tasks that allow it."""
    net, q = devnet, devnet.q
    q.gpu.register(net.outsider, [MODEL_ID], GpuSpec("g", 1, 1), "http://x", PRICE, MINER_STAKE)
    info = q.gpu.miner_info(net.outsider.address)
    assert (info.on_probation, info.passed_epochs) == (True, 0)
    assert not q.gpu.is_eligible(net.outsider.address, MODEL_ID)
    assert q.gpu.is_eligible(net.outsider.address, MODEL_ID, allow_probation=True)
    ordinary = post_task(net, 2, 2, tag="o")
    with reverts("NotEligible"):
        q.tasks.claim_shard(net.outsider, ordinary.task_id, 0)
    opted_in = post_task(net, 2, 2, tag="p", allow_probation=True)
    q.tasks.claim_shard(net.outsider, opted_in.task_id, 0)
    assert q.tasks.get_task(opted_in.task_id).allow_probation


def test_declared_precision_and_task_masks_through_the_wrappers(devnet: Devnet) -> None:
    """A miner declares a precision per model; a task's mask decides who may claim, the
    shard keeps the claimant's declaration, and each bad input reverts a named error."""
    net, q = devnet, devnet.q
    assert q.gpu.precision_of(net.miner.address, MODEL_ID) == Precision.FP32  # the default
    assert q.gpu.precision_of(net.outsider.address, MODEL_ID) is None
    q.gpu.update(net.miner2, [MODEL_ID], GpuSpec("g", 1, 1), "http://m2", PRICE, ["bf16"])
    assert q.gpu.precision_of(net.miner2.address, MODEL_ID) == Precision.BF16
    updated = q.gpu.events("MinerUpdated", miner=net.miner2.address)[-1]
    assert updated["precisions"] == [int(Precision.BF16)]

    hashes = [request_hash(r) for r in requests(4, "mask")]
    root = input_tree(hashes).root
    mask = precision_mask(["fp32"])
    task_id, tx = q.tasks.create_task(
        net.client, model_id=MODEL_ID, input_root=root, input_uri="store://mask",
        num_requests=4, shard_size=2, max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
        deadline=net.chain.timestamp() + 3600, precisions=mask, require_commitments=True)
    created = tx.event("TaskCreated")
    assert (created["precisions"], created["requireCommitments"]) == (mask, True)
    t = q.tasks.get_task(task_id)
    assert (t.precisions, t.require_commitments) == (mask, True)
    locked = q.gpu.miner_info(net.miner2.address).locked
    with reverts("PrecisionNotAccepted") as info:
        q.tasks.claim_shard(net.miner2, task_id, 0)
    assert info.value.args_dict == {"precision": int(Precision.BF16), "mask": mask}
    assert q.gpu.miner_info(net.miner2.address).locked == locked
    claim = q.tasks.claim_shard(net.miner, task_id, 0)
    assert claim.event("ShardClaimed")["precision"] == int(Precision.FP32)
    assert q.tasks.get_shard(task_id, 0).precision == Precision.FP32
    assert q.tasks.get_shard(task_id, 1).precision == 0  # still open

    with reverts("InvalidPrecisionMask") as info:
        q.tasks.create_task(
            net.client, model_id=MODEL_ID, input_root=root, input_uri="u", num_requests=1,
            shard_size=1, max_tokens_per_request=1, price_per_token=PRICE,
            deadline=net.chain.timestamp() + 100, precisions=0x41)
    assert info.value.args_dict == {"mask": 0x41}
    gpu = GpuSpec("g", 1, 1).as_tuple()
    with reverts("InvalidPrecision") as info:
        q.gpu._tx(net.outsider, "register", [MODEL_ID], [6], gpu, "e", 1, value=MINER_STAKE)
    assert info.value.args_dict == {"modelId": MODEL_ID, "precision": 6}
    with reverts("PrecisionsLengthMismatch") as info:
        q.gpu._tx(net.outsider, "register", [MODEL_ID], [], gpu, "e", 1, value=MINER_STAKE)
    assert info.value.args_dict == {"models": 1, "precisions": 0}
    with pytest.raises(PrecisionError, match="unknown precision 'fp4'"):
        q.gpu.register(net.outsider, [MODEL_ID], GpuSpec("g", 1, 1), "e", 1, MINER_STAKE,
                       ["fp4"])
    assert_escrow_invariant(net)


# -- committee ----------------------------------------------------------------------------


def test_reputation_report_and_challenge_set(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    cid, vc = net.chain.chain_id, q.committee.address
    epoch = q.committee.current_epoch()
    unsorted = Report(epoch, (net.miner.address, net.miner2.address), (9000, 1000), keccak(b"u"))
    with reverts("MinersNotSorted"):  # each miner once, ascending: one report, one pass each
        q.committee.submit_reputation(
            net.anyone, unsorted, quorum_signatures(unsorted, net.verifier_keys[:3], cid, vc))
    scores = {net.miner.address: 9000, net.miner2.address: 1000}
    miners = tuple(sorted(scores, key=lambda a: int(a, 16)))
    report = Report(epoch, miners, tuple(scores[m] for m in miners), keccak(b"ev"))
    with reverts("DuplicateSigner"):
        sig = report.sign(net.verifier_keys[0], cid, vc)
        q.committee.submit_reputation(net.anyone, report, [sig, sig, sig])
    with reverts("QuorumNotReached") as info:  # two of four equal stakes
        q.committee.submit_reputation(net.anyone, report,
                                      quorum_signatures(report, net.verifier_keys[:2], cid, vc))
    assert info.value.args_dict == {"required": q.committee.quorum_weight(epoch),
                                    "got": 2 * 10**18}
    q.committee.submit_reputation(net.anyone, report,
                                  quorum_signatures(report, net.verifier_keys[:3], cid, vc))
    assert q.gpu.miner_info(net.miner.address).reputation_bps == 9000
    assert q.gpu.miner_info(net.miner2.address).reputation_bps == 1000
    assert q.committee.reported(epoch) and q.committee.next_report_epoch() == epoch + 1
    # Gap 5: an older report held back can never overwrite a newer one.
    if epoch > 0:
        old = Report(epoch - 1, (net.miner2.address,), (9999,), keccak(b"old"))
        with reverts("ReportOutOfOrder") as info:
            q.committee.submit_reputation(
                net.anyone, old, quorum_signatures(old, net.verifier_keys[:3], cid, vc))
        assert info.value.args_dict == {"epoch": epoch - 1, "next": epoch + 1}
    # Below the untrusted floor the miner can no longer claim.
    posted = post_task(net, 2, 2)
    with reverts("NotEligible") as info:
        q.tasks.claim_shard(net.miner2, posted.task_id, 0)
    assert info.value.args_dict == {"miner": net.miner2.address}

    cs = ChallengeSet(epoch + 1, keccak(b"challenges"))
    with reverts("WrongEpoch"):
        q.committee.commit_challenge_set(net.anyone, epoch, cs.challenge_set_hash, [])
    q.committee.commit_challenge_set(
        net.anyone, cs.epoch, cs.challenge_set_hash,
        quorum_signatures(cs, net.verifier_keys, cid, vc))
    assert q.committee.challenge_set_of(cs.epoch) == cs.challenge_set_hash
    expected = keccak(b"\0" * 32 + cs.epoch.to_bytes(32, "big") + cs.challenge_set_hash)
    assert q.committee.last_commit_hash() == expected
    leader = q.committee.leader_of(cs.epoch + 1)
    members = q.committee.members()
    seed = keccak(expected + (cs.epoch + 1).to_bytes(32, "big"))
    assert leader == members[int.from_bytes(seed, "big") % len(members)]


def test_equivocation_slashes_a_verifier(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    cid, vc = net.chain.chain_id, q.committee.address
    cheat = net.verifiers[0]
    a = Report(0, (net.miner.address,), (100,), keccak(b"a"))
    b = Report(0, (net.miner.address,), (9900,), keccak(b"b"))
    q.committee.prove_equivocation(net.anyone, cheat.address, a, a.sign(cheat.key, cid, vc),
                                   b, b.sign(cheat.key, cid, vc))
    # its seat ends at the next possible boundary; its stake is gone now
    info = q.committee.verifier_info(cheat.address)
    assert (info.stake, info.active_until) == (0, q.committee.current_epoch()
                                               + q.committee.activation_delay())
    stake = 10**18
    withdraw_exact(net, net.anyone, stake // 2)
    withdraw_exact(net, net.deployer, stake - stake // 2)  # the treasury defaults to the owner


# -- bad inputs ---------------------------------------------------------------------------


def test_bad_inputs_name_the_custom_error(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    gpu = GpuSpec("RTX 4090", 24576, 2)
    with reverts("InsufficientStake") as info:
        q.gpu.register(net.outsider, [MODEL_ID], gpu, "http://x", PRICE, 0)
    assert info.value.args_dict == {"required": q.gpu.min_stake(), "got": 0}
    assert "GPURegistry.register reverted: InsufficientStake(required=" in str(info.value)
    assert isinstance(info.value, ContractRevert) and info.value.error == "InsufficientStake"

    with reverts("WrongPayment") as info:
        q.tasks.create_task(net.client, model_id=MODEL_ID, input_root=b"\x01" * 32,
                            input_uri="u", num_requests=3, shard_size=3,
                            max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
                            deadline=net.chain.timestamp() + 100, payment=1)
    assert info.value.args_dict == {"expected": 3 * MAX_TOKENS * PRICE, "got": 1}

    posted = post_task(net, 2, 2)
    with reverts("NotEligible"):
        q.tasks.claim_shard(net.outsider, posted.task_id, 0)
    with reverts("BadShard"):
        q.tasks.claim_shard(net.miner, posted.task_id, 1)
    with reverts("UnknownTask") as info:
        q.tasks.get_task(999)
    assert info.value.args_dict == {"taskId": 999}
    q.tasks.claim_shard(net.miner, posted.task_id, 0)
    with reverts("NotShardMiner"):
        q.tasks.submit_result(net.miner2, posted.task_id, 0, b"\x01" * 32, "u", 1)
    with reverts("TooManyTokens") as info:
        q.tasks.submit_result(net.miner, posted.task_id, 0, b"\x01" * 32, "u", 2 * MAX_TOKENS + 1)
    assert info.value.args_dict == {"max": 2 * MAX_TOKENS, "got": 2 * MAX_TOKENS + 1}
    # OpenZeppelin's own errors decode too.
    with reverts("OwnableUnauthorizedAccount") as info:
        q.tasks._tx(net.outsider, "setParams", 1, 1, 1, 1)
    assert info.value.args_dict == {"account": net.outsider.address}
    assert_escrow_invariant(net)


# -- plumbing -----------------------------------------------------------------------------


def test_events_transfer_and_connect(devnet: Devnet, deployment_file) -> None:
    from market.chain.deploy import Quarry

    net, q = devnet, devnet.q
    first = post_task(net, 2, 1)
    second = post_task(net, 3, 3, client=net.client2)
    created = q.tasks.events("TaskCreated", from_block=net.deployment.deploy_block)
    assert [e["taskId"] for e in created][-2:] == [first.task_id, second.task_id]
    mine = q.tasks.events("TaskCreated", from_block=net.deployment.deploy_block,
                          client=net.client2.address)
    assert [e["taskId"] for e in mine] == [second.task_id]
    assert mine[0]["numShards"] == 1 and mine[0]["payment"] == second.payment

    before = net.chain.balance(net.outsider.address)
    tx = net.chain.transfer(net.anyone, net.outsider.address, 12345)
    assert net.chain.balance(net.outsider.address) == before + 12345 and tx.gas_used == 21000
    net.chain.set_balance(net.outsider.address, 7)
    assert net.chain.balance(net.outsider.address) == 7

    connected = Quarry.connect()  # reads $QUARRY_HOME/deployment.json
    assert connected.tasks.task_count() == q.tasks.task_count()
    assert connected.tasks.address == q.tasks.address


def test_claim_batch_bound_matches_the_contract(devnet: Devnet) -> None:
    assert devnet.q.tasks._call("MAX_CLAIM_BATCH") == MAX_CLAIM_BATCH


def _job_reads(q, task_id: int, since: int) -> list:
    return [q.tasks.fn("getTask", task_id), q.tasks.fn("getShard", task_id, 0),
            q.tasks.fn("getShard", task_id, 2), q.escrow.fn("escrowed", task_id),
            lambda eth: eth.get_block_number(),
            q.tasks.log_query("ShardClaimed", since, taskId=task_id)]


def test_reads_go_in_one_batch_and_answer_as_alone(devnet: Devnet, rpc_front,
                                                   no_batch_node) -> None:
    """`Chain.read` asks a job's state in one JSON-RPC batch and decodes each answer as the
    read alone would; a node that refuses batches gets the same reads one by one, and a
    revert names the read that made it."""
    from market.chain.client import Chain
    from market.chain.deploy import Quarry

    net, since = devnet, devnet.deployment.deploy_block
    posted = post_task(net, 3, 1)
    claim_and_submit(net, posted, 2)
    q = Quarry(net.deployment, Chain(rpc_front.url))
    task, s0, s2, escrowed, head, logs = q.chain.read(_job_reads(q, posted.task_id, since))
    assert rpc_front.batches == [6] and rpc_front.singles == 0
    assert task == net.q.tasks._call("getTask", posted.task_id)
    assert (ShardState(s0.state), ShardState(s2.state)) == (ShardState.OPEN,
                                                            ShardState.SUBMITTED)
    assert escrowed == net.q.escrow.escrowed(posted.task_id)
    assert head == net.chain.block_number()
    claimed = q.tasks.decode_events("ShardClaimed", logs)
    assert claimed == net.q.tasks.events("ShardClaimed", since, taskId=posted.task_id)
    assert [(e["shard"], e["miner"]) for e in claimed] == [(2, net.miner.address)]

    refused = Quarry(net.deployment, Chain(no_batch_node.url))
    again = refused.chain.read(_job_reads(refused, posted.task_id, since))
    assert again == [task, s0, s2, escrowed, head, logs]
    assert no_batch_node.batches == [6] and no_batch_node.singles >= 6  # + eth_chainId

    with pytest.raises(revert_class("BadShard"), match=r"TaskRegistry\.getShard reverted"):
        q.chain.read([q.tasks.fn("getTask", posted.task_id),
                      q.tasks.fn("getShard", posted.task_id, 7)])
    t, shards, (left,) = q.tasks.read_task(posted.task_id, 3, also=[
        q.escrow.fn("escrowed", posted.task_id)])
    assert [s.state for s in shards] == [ShardState.OPEN, ShardState.OPEN,
                                         ShardState.SUBMITTED]
    assert t.num_shards == 3 and left == escrowed


def test_long_reads_go_in_batches_of_read_batch(devnet: Devnet, rpc_front,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import market.chain.client as client_module
    from market.chain.client import Chain
    from market.chain.deploy import Quarry

    monkeypatch.setattr(client_module, "READ_BATCH", 3)
    posted = post_task(devnet, 7, 1)
    q = Quarry(devnet.deployment, Chain(rpc_front.url))
    _, shards, _ = q.tasks.read_task(posted.task_id, 7)
    assert len(shards) == 7 and rpc_front.batches == [3, 3, 2] and rpc_front.singles == 0
    assert q.chain.read([]) == [] and rpc_front.singles == 0


def test_event_filters_are_checked(devnet: Devnet) -> None:
    from market.chain.errors import ChainError

    with pytest.raises(ChainError, match="TaskRegistry.ShardClaimed has no indexed "
                       "argument.* tokens"):
        devnet.q.tasks.log_query("ShardClaimed", 0, tokens=1)
    with pytest.raises(ChainError, match="TaskRegistry has no event 'Nope'"):
        devnet.q.tasks.events("Nope")
    with pytest.raises(ChainError, match=r"bad filter taskId=-1"):
        devnet.q.tasks.events("ShardClaimed", 0, taskId=-1)


def test_offer_terms_read_every_miner_in_one_batch(devnet: Devnet, rpc_front) -> None:
    """A client's offer list: each miner's entry and eligibility per model, one round trip,
    each answer as the single read gives it."""
    from market.chain.client import Chain
    from market.chain.deploy import Quarry

    net = devnet
    q = Quarry(net.deployment, Chain(rpc_front.url))
    other = b"\x07" * 32
    asked = [(net.miner.address, [MODEL_ID, other]), (net.outsider.address, [MODEL_ID])]
    terms = q.gpu.offer_terms(asked, 0, allow_probation=True)
    assert rpc_front.batches == [5] and rpc_front.singles == 0
    assert terms == [(net.q.gpu.miner_info(a), [net.q.gpu.eligible_precision(a, m, 0, True)
                                                 for m in models]) for a, models in asked]
    # the devnet's miner serves MODEL_ID only, declared in fp32
    assert terms[0][1] == [Precision.FP32, None]
    assert [p is not None for p in terms[0][1]] == [net.q.gpu.is_eligible(net.miner.address, m,
                                                                          0, True)
                                                    for m in asked[0][1]]
    assert q.gpu.offer_terms([]) == []


def test_the_stated_public_chain_windows_deploy_and_hold_together() -> None:
    """PUBLIC_CHAIN_PARAMS (README "Windows that fit the network") deploy as stated, and
    their windows nest: a challenge is answered within its epoch, an availability challenge
    within the client's window, a leaving verifier stays slashable past its disputes."""
    from market.chain.client import Chain, anvil_account
    from market.chain.deploy import PUBLIC_CHAIN_PARAMS as P
    from market.chain.deploy import Quarry, deploy
    from market.chain.devnet import start_anvil

    assert 0 < P.answer_window < P.epoch_duration
    assert P.response_window < P.challenge_window
    assert P.verifier_unbonding_period > P.dispute_timeout
    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        deployment, _ = deploy(chain, anvil_account(0), P)
        q = Quarry(deployment, chain)
        assert q.committee.epoch_duration() == 3600
        assert q.committee.challenge_answer_window() == 1800
        assert q.arbitration.response_window() == 4 * 3600
        assert q.tasks.params()["challenge_window"] == 24 * 3600
        assert q.gpu.missed_reports_allowed() == 2
    finally:
        anvil.stop()
