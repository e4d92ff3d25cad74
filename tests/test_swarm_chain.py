"""Swarms on a real Anvil through the Python bindings: four miners consent (EIP-712, signed
in Python) to serve the 8-layer model as one swarm, the head claims, signs and submits, and
finalization pays each member its share of the payment to the wei; forged, replayed and
altered consents are refused; a member that leaves stops new claims; the head alone locks
the collateral and a reclaim slashes the head alone (it alone decides what is claimed, billed
and answered), never the other members."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from eth_account.signers.local import LocalAccount
from test_chain import assert_escrow_invariant, do_work, post_task, withdraw_exact

from market.chain.client import anvil_account
from market.chain.contracts import GpuSpec, ShardState
from market.chain.errors import revert_class
from market.protocol.eip712 import SwarmConsent, typed_digest
from market.protocol.errors import SignatureError
from market.protocol.precision import Precision

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]

MODEL_ID = bytes.fromhex("11" * 32)  # the conftest's model (Devnet.MODEL_ID)
PRICE = 10**9
STAKE = 2 * 10**18
BPS = 10_000
# layers of an 8-layer model each member serves, by member (ascending address) position
LAYERS = (3, 2, 2, 1)
HEAD = 2


def reverts(name: str):
    return pytest.raises(revert_class(name))


def split(amount: int, shares: tuple[int, ...], head: int) -> list[int]:
    """The contract's rule: floor(amount * share / total) each, the remainder to the head."""
    parts = [amount * s // sum(shares) for s in shares]
    parts[head] += amount - sum(parts)
    return parts


def members_of(net: Devnet) -> list[LocalAccount]:
    """Four established miners (off probation) from the devnet's spare funded accounts,
    ascending by address as a swarm lists them. Each lists another model too; the first
    serves its layers of MODEL_ID in bf16, the others in fp32 (so the swarm serves it in
    bf16)."""
    four = sorted((anvil_account(i) for i in (12, 13, 14, 15)), key=lambda a: int(a.address, 16))
    q = net.q
    probation = q.gpu.probation_params()
    q.gpu.set_probation(net.deployer, 0, probation[1])
    for i, m in enumerate(four):
        q.gpu.register(m, [bytes.fromhex("22" * 32), MODEL_ID], GpuSpec("RTX 4090", 24576, 1),
                       f"http://127.0.0.1:{9300 + i}", PRICE, STAKE,
                       ["fp32", "bf16" if i == 0 else "fp32"])
    q.gpu.set_probation(net.deployer, *probation)
    return four


def consent_of(net: Devnet, four: list[LocalAccount], shares: tuple[int, ...] = LAYERS,
               head: int = HEAD) -> SwarmConsent:
    return SwarmConsent.for_plan(
        MODEL_ID, four[head].address, {m.address: s for m, s in zip(four, shares, strict=True)},
        PRICE, net.chain.timestamp() + 600)


def form(net: Devnet, four: list[LocalAccount], consent: SwarmConsent) -> int:
    sigs = [net.q.gpu.sign_swarm_consent(consent, m) for m in four]
    swarm_id, _ = net.q.gpu.register_swarm(net.anyone, consent, sigs)
    return swarm_id


def test_four_member_swarm_claims_submits_and_is_paid_to_the_wei(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    four = members_of(net)
    consent = consent_of(net, four)
    # Python's digest is the contract's
    assert q.gpu.hash_swarm_consent(consent) == typed_digest(
        "SwarmConsent", consent.message(), net.chain.chain_id, q.gpu.address)
    swarm_id = form(net, four, consent)
    info = q.gpu.swarm_info(swarm_id)
    assert info.members == tuple(m.address for m in four)
    assert (info.shares, info.head, info.head_index, info.active) == (
        LAYERS, four[HEAD].address, HEAD, True)
    assert [q.gpu.nonces(m.address) for m in four] == [1, 1, 1, 1]

    posted = post_task(net, 8, 4, tag="swarm")
    head = four[HEAD]
    assert q.gpu.swarm_precision(swarm_id) == Precision.BF16  # its least exact member's
    claim = q.tasks.claim_shard_for_swarm(head, posted.task_id, 0, swarm_id)
    collateral = claim.event("ShardClaimed")["collateral"]
    assert claim.event("ShardClaimed")["precision"] == int(Precision.BF16)
    assert q.tasks.get_shard(posted.task_id, 0).precision == Precision.BF16
    assert claim.event("SwarmShardClaimed")["swarmId"] == swarm_id
    assert q.tasks.shard_swarm(posted.task_id, 0) == swarm_id
    assert [q.gpu.miner_info(m.address).locked for m in four] == [
        collateral if i == HEAD else 0 for i in range(len(four))]

    # the head signs the receipts and submits, as a single miner would
    work = do_work(net, posted, 0, head)
    q.tasks.submit_result(head, posted.task_id, 0, work.root, "store://out", work.tokens)
    assert q.tasks.get_shard(posted.task_id, 0).miner == head.address
    net.chain.advance_time(q.tasks.params()["challenge_window"])
    budget = q.tasks.shard_budget(posted.task_id, 0)
    client_before = q.escrow.withdrawable(net.client.address)
    fin = q.tasks.finalize_shard(net.anyone, posted.task_id, 0)
    pay = work.tokens * PRICE
    parts = split(pay, LAYERS, HEAD)
    assert fin.event("SwarmPaid")["amounts"] == parts
    assert sum(parts) == pay
    assert q.gpu.swarm_split(swarm_id, pay) == {m.address: p for m, p in zip(four, parts,
                                                                                strict=True)}
    assert q.escrow.withdrawable(net.client.address) - client_before == budget - pay
    assert q.tasks.get_shard(posted.task_id, 0).state == ShardState.FINALIZED
    assert [q.gpu.miner_info(m.address).locked for m in four] == [0, 0, 0, 0]
    assert_escrow_invariant(net)
    for m, p in zip(four, parts, strict=True):
        withdraw_exact(net, m, p)
    assert_escrow_invariant(net)


def test_forged_replayed_or_altered_consents_are_refused(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    four = members_of(net)
    consent = consent_of(net, four)
    sigs = [q.gpu.sign_swarm_consent(consent, m) for m in four]
    forged = list(sigs)
    forged[1] = consent.with_nonce(0).sign(net.outsider.key, net.chain.chain_id, q.gpu.address)
    with reverts("InvalidConsent") as info:
        q.gpu.register_swarm(net.anyone, consent, forged)
    assert info.value.args_dict == {"member": four[1].address}
    # the head giving itself a bigger share than the members signed
    richer = SwarmConsent(consent.model_id, consent.head, consent.members, (3, 2, 9, 1),
                          consent.price_per_token, 0, consent.deadline)
    with reverts("InvalidConsent"):
        q.gpu.register_swarm(net.anyone, richer, sigs)
    # another chain's domain
    other = [consent.with_nonce(0).sign(m.key, 1, q.gpu.address) for m in four]
    with reverts("InvalidConsent"):
        q.gpu.register_swarm(net.anyone, consent, other)
    swarm_id, _ = q.gpu.register_swarm(net.anyone, consent, sigs)
    # replay after a leave: the nonces are used
    q.gpu.leave_swarm(four[0], swarm_id)
    assert not q.gpu.swarm_info(swarm_id).active
    with reverts("InvalidConsent"):
        q.gpu.register_swarm(net.anyone, consent, sigs)
    posted = post_task(net, 4, 4, tag="left")
    with reverts("SwarmInactive"):
        q.tasks.claim_shard_for_swarm(four[HEAD], posted.task_id, 0, swarm_id)
    # bad terms fail in Python before any transaction, naming the problem
    with pytest.raises(SignatureError, match="ascending"):
        SwarmConsent(MODEL_ID, four[0].address, (four[1].address, four[0].address), (1, 1),
                     PRICE, 0, 1)
    with pytest.raises(SignatureError, match="not one of the members"):
        SwarmConsent(MODEL_ID, net.outsider.address, (four[0].address, four[1].address),
                     (1, 1), PRICE, 0, 1)
    with pytest.raises(SignatureError, match="positive"):
        SwarmConsent(MODEL_ID, four[0].address, (four[0].address, four[1].address), (1, 0),
                     PRICE, 0, 1)


def test_reclaim_slashes_the_head_alone(devnet: Devnet) -> None:
    net, q = devnet, devnet.q
    four = members_of(net)
    swarm_id = form(net, four, consent_of(net, four))
    posted = post_task(net, 4, 4, tag="reclaim")
    claim = q.tasks.claim_shard_for_swarm(four[HEAD], posted.task_id, 0, swarm_id)
    collateral = claim.event("ShardClaimed")["collateral"]
    net.chain.advance_time(q.tasks.params()["claim_timeout"])
    before = [q.gpu.miner_info(m.address).stake for m in four]
    client_before = q.escrow.withdrawable(net.client.address)
    q.tasks.reclaim_expired(net.anyone, posted.task_id, 0)
    penalty = collateral * q.tasks.params()["reclaim_penalty_bps"] // BPS
    lost = [b - q.gpu.miner_info(m.address).stake for m, b in zip(four, before, strict=True)]
    assert lost == [penalty if i == HEAD else 0 for i in range(len(four))]
    assert q.escrow.withdrawable(net.client.address) - client_before == penalty
    assert [q.gpu.miner_info(m.address).locked for m in four] == [0, 0, 0, 0]
    assert q.tasks.shard_swarm(posted.task_id, 0) == 0
    assert_escrow_invariant(net)


def test_a_head_that_is_also_the_client_cannot_rob_its_members(devnet: Devnet) -> None:
    """Issue 29, gap 1, through the Python bindings: the head posts a task with its own key,
    claims it for the swarm, submits, challenges its own shard and never answers. The fault
    is slashed from the head alone and burned (gap 6): its members' stake, locks and escrow
    balances do not move by a wei, and the head loses the slash (gas aside)."""
    net, q = devnet, devnet.q
    four = members_of(net)
    swarm_id = form(net, four, consent_of(net, four))
    head, others = four[HEAD], [m for i, m in enumerate(four) if i != HEAD]
    posted = post_task(net, 4, 4, client=head, tag="robbery")
    claim = q.tasks.claim_shard_for_swarm(head, posted.task_id, 0, swarm_id)
    collateral = claim.event("ShardClaimed")["collateral"]
    assert [q.gpu.miner_info(m.address).locked for m in four] == [
        collateral if i == HEAD else 0 for i in range(len(four))]
    work = do_work(net, posted, 0, head)
    q.tasks.submit_result(head, posted.task_id, 0, work.root, "store://out", work.tokens)
    stakes = {m.address: q.gpu.miner_info(m.address).stake for m in four}
    owed = {m.address: q.escrow.withdrawable(m.address) for m in four}
    bond = q.arbitration.params()["min_availability_bond"]
    challenge_id, _ = q.arbitration.challenge_availability(head, posted.task_id, 0, 0, bond)
    net.chain.advance_time(q.arbitration.params()["response_window"])
    settled = q.arbitration.settle_unanswered(net.anyone, challenge_id)
    slash = collateral * q.arbitration.params()["fault_slash_bps"] // BPS
    assert settled.event("AvailabilityUnanswered")["slashed"] == slash
    for m in others:
        assert q.gpu.miner_info(m.address).stake == stakes[m.address]
        assert q.gpu.miner_info(m.address).locked == 0
        assert q.escrow.withdrawable(m.address) == owed[m.address]
    lost = stakes[head.address] - q.gpu.miner_info(head.address).stake
    got = q.escrow.withdrawable(head.address) - owed[head.address]
    assert lost == slash
    assert got == posted.payment + bond  # the budget and its bond; the slash is burned
    assert got - posted.payment - bond - lost == -slash
    assert_escrow_invariant(net)
