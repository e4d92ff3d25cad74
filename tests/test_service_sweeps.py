"""Settlement sweep logic (against an in-memory fake of the contracts' states), the same
sweeps on the session Anvil with a real board (an unanswered availability challenge settled
to the wei, overdue disputes expired and their silent committee members reported), the Redis
guard on a real redis-server, and the `market serve` ticker's outage handling."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from market.chain.contracts import (
    Ballot,
    ChallengeStatus,
    DisputeStatus,
    Shard,
    ShardState,
)
from market.chain.errors import ChainError, revert_class
from market.protocol import Receipt
from market.service.cli import Ticker, tick_schedule
from market.service.sweeps import (
    EXPIRE,
    FINALIZE,
    RECLAIM,
    REFUND,
    REPORT,
    SETTLE,
    Item,
    MemoryGuard,
    RedisGuard,
    due_items,
    sweep_once,
)

if TYPE_CHECKING:
    from conftest import Devnet
    from eth_account.signers.local import LocalAccount

SETTLER: Any = object()  # the fake contract does not sign


def _revert(name: str) -> Exception:
    return revert_class(name)(f"TaskRegistry reverted: {name}()", error=name, args={},
                              data=b"")


def _shard(state: ShardState, miner: str = "0xM", expiry: int = 100) -> Shard:
    return Shard(state=state, miner=miner, precision=0, claim_expiry=expiry, submitted_at=0,
                 window_end=0, tokens_used=0, collateral=0, result_root=b"", result_uri="")


@dataclass
class FakeTx:
    tx_hash: str
    gas_cost: int = 21_000


class FakeTasks:
    """TaskRegistry's settlement calls over a dict of shard states; counts every send."""

    address = "0x" + "ab" * 20

    def __init__(self, shards: dict[tuple[int, int], Shard], delay: float = 0.0) -> None:
        self.shards = shards
        self.sends: list[tuple[str, int, int]] = []
        self.fail: dict[tuple[str, int, int], Exception] = {}
        self.delay = delay
        self.down = False
        self._lock = threading.Lock()

    def get_shard(self, task_id: int, shard: int) -> Shard:
        if self.down:
            raise ChainError("chain at http://x did not answer")
        return self.shards[(task_id, shard)]

    def _act(self, action: str, task_id: int, shard: int, to: ShardState) -> FakeTx:
        with self._lock:
            self.sends.append((action, task_id, shard))
            n = len(self.sends)
        time.sleep(self.delay)  # widen the race between two sweeps
        failure = self.fail.get((action, task_id, shard))
        if failure is not None:
            raise failure
        self.shards[(task_id, shard)] = replace(self.shards[(task_id, shard)], state=to)
        return FakeTx(f"0x{n:064x}")

    def finalize_shard(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(FINALIZE, task_id, shard, ShardState.FINALIZED)

    def reclaim_expired(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(RECLAIM, task_id, shard, ShardState.OPEN)

    def refund_unfinished(self, _s: Any, task_id: int, shard: int) -> FakeTx:
        return self._act(REFUND, task_id, shard, ShardState.REFUNDED)


@dataclass
class FakeChallenge:
    status: ChallengeStatus


@dataclass
class FakeDispute:
    status: DisputeStatus
    deadline: int = 500
    epoch: int = 3


class FakeArbitration:
    """Arbitration's settle, expire and absence calls over dicts of statuses and ballots;
    counts every send as (action, id)."""

    address = "0x" + "cd" * 20

    def __init__(self, challenges: dict[int, ChallengeStatus],
                 disputes: dict[int, DisputeStatus], delay: float = 0.0) -> None:
        self.challenges = {k: FakeChallenge(v) for k, v in challenges.items()}
        self.disputes = {k: FakeDispute(v) for k, v in disputes.items()}
        self.ballots: dict[tuple[int, str], Ballot] = {}
        self.sends: list[tuple[str, int]] = []
        self.fail: dict[tuple[str, int], Exception] = {}
        self.delay = delay
        self._lock = threading.Lock()

    def get_challenge(self, challenge_id: int) -> FakeChallenge:
        return self.challenges[challenge_id]

    def get_dispute(self, dispute_id: int) -> FakeDispute:
        return self.disputes[dispute_id]

    def ballot_of(self, dispute_id: int, member: str) -> Ballot:
        return self.ballots.get((dispute_id, member), Ballot.NONE)

    def _act(self, action: str, ref: int) -> FakeTx:
        with self._lock:
            self.sends.append((action, ref))
            n = len(self.sends)
        time.sleep(self.delay)
        failure = self.fail.get((action, ref))
        if failure is not None:
            raise failure
        return FakeTx(f"0x{1000 + n:064x}")

    def settle_unanswered(self, _s: Any, challenge_id: int) -> FakeTx:
        tx = self._act(SETTLE, challenge_id)
        self.challenges[challenge_id].status = ChallengeStatus.UNANSWERED
        return tx

    def expire_dispute(self, _s: Any, dispute_id: int) -> FakeTx:
        tx = self._act(EXPIRE, dispute_id)
        self.disputes[dispute_id].status = DisputeStatus.EXPIRED
        return tx

    def report_absence(self, _s: Any, dispute_id: int, absent: list[str]) -> FakeTx:
        tx = self._act(REPORT, dispute_id)
        for member in absent:
            self.ballots[(dispute_id, member)] = Ballot.ABSENT
        return tx


MEMBERS = ["0x" + "a1" * 20, "0x" + "a2" * 20, "0x" + "a3" * 20]


class FakeCommittee:
    def members_at(self, epoch: int) -> list[str]:
        return list(MEMBERS)

    def events(self, name: str, from_block: int = 0) -> list[dict[str, Any]]:
        return []  # every member is still in members_at

    def weight_at(self, member: str, epoch: int) -> int:
        return 1


class FakeChain:
    def __init__(self, tasks: FakeTasks) -> None:
        self.tasks = tasks

    def is_up(self) -> bool:
        return not self.tasks.down


class FakeQuarry:
    def __init__(self, tasks: FakeTasks, arbitration: FakeArbitration | None = None) -> None:
        self.tasks = tasks
        self.arbitration = arbitration or FakeArbitration({}, {})
        self.committee = FakeCommittee()
        self.chain = FakeChain(tasks)
        self.deployment = SimpleNamespace(deploy_block=0)


@dataclass
class FakeBoard:
    """What an indexed board would list (it lags the chain: it never updates here)."""

    finalize: list[tuple[int, int]]
    expired: list[tuple[int, int]]
    refund: list[tuple[int, int]]
    settle: list[tuple[int, int, int]] = field(default_factory=list)
    expire: list[tuple[int, int, int]] = field(default_factory=list)
    report: list[tuple[int, int, int]] = field(default_factory=list)

    def due_finalize(self, now: int) -> list[tuple[int, int]]:
        return list(self.finalize)

    def expired_claims(self, now: int) -> list[tuple[int, int]]:
        return list(self.expired)

    def refundable(self, now: int) -> list[tuple[int, int]]:
        return list(self.refund)

    def due_settle(self, now: int) -> list[tuple[int, int, int]]:
        return list(self.settle)

    def due_expire(self, now: int) -> list[tuple[int, int, int]]:
        return list(self.expire)

    def due_report(self, now: int) -> list[tuple[int, int, int]]:
        return list(self.report)

    def report_horizon(self) -> int:
        return 900


def _world(delay: float = 0.0) -> tuple[FakeBoard, FakeQuarry]:
    """Five shard actions due, plus challenge 7 unanswered, dispute 8 overdue (one member of
    three voted) and dispute 9 expired by someone else (nobody voted, nobody reported)."""
    shards = {
        (1, 0): _shard(ShardState.SUBMITTED), (1, 1): _shard(ShardState.SUBMITTED),
        (2, 0): _shard(ShardState.CLAIMED, "0xA", 50), (3, 0): _shard(ShardState.OPEN),
        (3, 1): _shard(ShardState.OPEN),
    }
    arbitration = FakeArbitration({7: ChallengeStatus.OPEN},
                                  {8: DisputeStatus.OPEN, 9: DisputeStatus.EXPIRED}, delay)
    arbitration.ballots[(8, MEMBERS[0])] = Ballot.FAULT
    board = FakeBoard(finalize=[(1, 1), (1, 0)], expired=[(2, 0)], refund=[(3, 0), (3, 1)],
                      settle=[(7, 4, 0)], expire=[(8, 5, 0)], report=[(9, 6, 0)])
    return board, FakeQuarry(FakeTasks(shards, delay), arbitration)


SHARD_SENDS = 5
ARBITRATION_SENDS = [(EXPIRE, 8), (REPORT, 8), (REPORT, 9), (SETTLE, 7)]


def test_due_items_stable_order_without_repeats() -> None:
    board = FakeBoard(finalize=[(1, 1), (1, 0), (1, 1)], expired=[(2, 0)], refund=[(3, 0)],
                      settle=[(9, 4, 0), (7, 4, 1)], expire=[(8, 5, 0), (8, 5, 0)],
                      report=[(2, 6, 1)])
    assert due_items(board, 0) == [
        (FINALIZE, 1, 0, 0), (FINALIZE, 1, 1, 0), (RECLAIM, 2, 0, 0), (REFUND, 3, 0, 0),
        (SETTLE, 4, 1, 7), (SETTLE, 4, 0, 9), (EXPIRE, 5, 0, 8), (REPORT, 6, 1, 2)]
    assert due_items(board, 0)[0] == Item(FINALIZE, 1, 0)


def test_without_settler_only_reports() -> None:
    board, q = _world()
    report = sweep_once(board, q, None, 1000)  # type: ignore[arg-type]
    assert q.tasks.sends == [] and q.arbitration.sends == []
    assert len(report.pending) == 8 and not report.sent
    assert "8 pending (no settler key)" in report.summary()


def test_sends_each_due_action_once() -> None:
    board, q = _world()
    guard = MemoryGuard()
    report = sweep_once(board, q, SETTLER, 1000, guard=guard)  # type: ignore[arg-type]
    assert report.finalized == [(1, 0), (1, 1)]
    assert report.reclaimed == [(2, 0)]
    assert report.refunded == [(3, 0), (3, 1)]
    assert report.settled == [7] and report.expired == [8]
    # The expired dispute's silent members are reported at once, and so are those of the one
    # someone else expired.
    assert report.refs(REPORT) == [8, 9]
    assert report.absent_reported == [(8, MEMBERS[1]), (8, MEMBERS[2])] + [
        (9, m) for m in MEMBERS]
    assert sorted(q.arbitration.sends) == ARBITRATION_SENDS
    # jobs.report_absent sends the reports: they carry no hash here.
    assert len(report.tx_hashes) == 7 and report.gas_cost == 7 * 21_000
    assert report.errors == []
    assert "1 settle, 1 expire, 2 report, 5 absent member(s) reported" in report.summary()
    # The board has not caught up: a second sweep sees the chain's new states and sends
    # nothing (the reclaimed shard is Open again: no longer a reclaim). The reported dispute
    # stays taken while its members could still be reported.
    again = sweep_once(board, q, SETTLER, 1001, guard=guard)  # type: ignore[arg-type]
    assert again.sent == [] and len(q.tasks.sends) == SHARD_SENDS
    assert len(q.arbitration.sends) == len(ARBITRATION_SENDS)
    assert len(again.already_done) == 7
    assert again.taken_elsewhere == [(REPORT, 6, 0, 9)]
    assert report.as_dict()["finalized"] == [[1, 0], [1, 1]]
    assert report.as_dict()["settled"] == [[7, 4, 0]]
    assert report.as_dict()["expired"] == [[8, 5, 0]]
    assert report.as_dict()["absentReported"][0] == [8, MEMBERS[1]]


def test_reverts_classified() -> None:
    board, q = _world()
    q.tasks.fail = {
        (FINALIZE, 1, 0): _revert("AlreadyFinalized"),  # another sender was first
        (FINALIZE, 1, 1): _revert("WindowNotClosed"),  # the chain's clock is behind
        (RECLAIM, 2, 0): _revert("BadShard"),  # a real error: reported, sweep goes on
    }
    guard = MemoryGuard()
    report = sweep_once(board, q, SETTLER, 1000, guard=guard)  # type: ignore[arg-type]
    assert report.already_done == [(FINALIZE, 1, 0, 0)]
    assert report.not_yet == [(FINALIZE, 1, 1, 0)]
    assert len(report.errors) == 1 and "BadShard" in report.errors[0]
    assert report.refunded == [(3, 0), (3, 1)]
    # "Not yet" frees the action for the next sweep; "already done" and errors keep it taken.
    del q.tasks.fail[(FINALIZE, 1, 1)]
    later = sweep_once(board, q, SETTLER, 1030, guard=guard)  # type: ignore[arg-type]
    assert later.finalized == [(1, 1)]
    assert (RECLAIM, 2, 0, 0) in later.taken_elsewhere


def test_challenge_and_dispute_reverts_classified() -> None:
    board, q = _world()
    arb = q.arbitration
    arb.fail = {
        (SETTLE, 7): _revert("ResponseWindowOpen"),  # the chain's clock is behind
        (EXPIRE, 8): _revert("DisputeNotOpen"),  # resolved or expired by another sender
        (REPORT, 9): _revert("NotCommitteeMember"),  # a real error: reported, sweep goes on
    }
    guard = MemoryGuard()
    report = sweep_once(board, q, SETTLER, 1000, guard=guard)  # type: ignore[arg-type]
    assert report.not_yet == [(SETTLE, 4, 0, 7)]
    assert report.already_done == [(EXPIRE, 5, 0, 8)]
    assert len(report.errors) == 1 and "dispute 9 (task 6 shard 0)" in report.errors[0]
    assert "NotCommitteeMember" in report.errors[0]
    assert report.settled == report.expired == [] and report.absent_reported == []
    # Not yet: settled by the next sweep. A dispute someone else expired is reported once
    # the board lists it as expired.
    arb.fail.clear()
    arb.disputes[8].status = DisputeStatus.EXPIRED
    board.expire, board.report = [], [(8, 5, 0)]
    later = sweep_once(board, q, SETTLER, 1030, guard=guard)  # type: ignore[arg-type]
    assert later.settled == [7]
    assert later.absent_reported == [(8, MEMBERS[1]), (8, MEMBERS[2])]
    # A resolved dispute leaves nobody to report; a report finding everyone voted is done.
    arb.disputes[8].status = DisputeStatus.MINER_AT_FAULT
    resolved = sweep_once(board, q, SETTLER, 1060, guard=MemoryGuard())  # type: ignore[arg-type]
    assert [i for i in resolved.already_done if i.action == REPORT] == [(REPORT, 5, 0, 8)]
    board.settle, board.report = [], [(10, 7, 0)]
    arb.disputes[10] = FakeDispute(DisputeStatus.EXPIRED)
    for m in MEMBERS:
        arb.ballots[(10, m)] = Ballot.NO_FAULT
    quiet = sweep_once(board, q, SETTLER, 1060, guard=MemoryGuard())  # type: ignore[arg-type]
    assert [i for i in quiet.already_done if i.action == REPORT] == [(REPORT, 7, 0, 10)]
    assert (REPORT, 10) not in arb.sends


def test_new_claim_is_reclaimed_again() -> None:
    """The reclaim key names the claim: a shard claimed again after a reclaim and expired
    again is reclaimed again, even within the guard's TTL."""
    board = FakeBoard(finalize=[], expired=[(2, 0)], refund=[])
    q = FakeQuarry(FakeTasks({(2, 0): _shard(ShardState.CLAIMED, "0xA", 50)}))
    guard = MemoryGuard()
    assert sweep_once(board, q, SETTLER, 100, guard=guard).reclaimed == [(2, 0)]  # type: ignore[arg-type]
    q.tasks.shards[(2, 0)] = _shard(ShardState.CLAIMED, "0xB", 90)
    assert sweep_once(board, q, SETTLER, 200, guard=guard).reclaimed == [(2, 0)]  # type: ignore[arg-type]
    assert q.tasks.sends == [(RECLAIM, 2, 0), (RECLAIM, 2, 0)]


def test_chain_down_stops_the_sweep() -> None:
    board, q = _world()
    q.tasks.down = True
    report = sweep_once(board, q, SETTLER, 1000, guard=MemoryGuard())  # type: ignore[arg-type]
    assert report.sent == [] and len(report.errors) == 1
    assert "chain unavailable" in report.errors[0]


def _shard_sends(board: FakeBoard) -> list[tuple[str, int, int]]:
    return sorted(i[:3] for i in due_items(board, 1000) if i.ref == 0)


@pytest.mark.timeout(30)
def test_concurrent_sweeps_send_each_action_once() -> None:
    """Four sweeps at once (no sweep lock), sharing one guard: every action is sent exactly
    once in total, even though each sweep sees every action as due."""
    board, q = _world(delay=0.02)
    guard = MemoryGuard()
    reports: list[Any] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        reports.append(sweep_once(board, q, SETTLER, 1000, guard=guard))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(q.tasks.sends) == _shard_sends(board)
    assert sorted(q.arbitration.sends) == ARBITRATION_SENDS
    assert sum(len(r.sent) for r in reports) == SHARD_SENDS + len(ARBITRATION_SENDS)
    assert all(not r.errors for r in reports)


# -- on the session Anvil, with a real board --------------------------------------------------

MAX_TOKENS = 8


def _post(net: Devnet, client: LocalAccount, tag: str, n: int = 4) -> int:
    """A one-shard task of `n` requests."""
    from market.protocol import input_tree, request_hash

    hashes = [request_hash({"custom_id": f"{tag}-{i}"}) for i in range(n)]
    root = input_tree(hashes).root
    task_id, _ = net.q.tasks.create_task(
        client, model_id=net.MODEL_ID, input_root=root, input_uri="sha256:" + root.hex(),
        num_requests=n, shard_size=n, max_tokens_per_request=MAX_TOKENS,
        price_per_token=net.PRICE, deadline=net.chain.timestamp() + 3600)
    return task_id


def _work(net: Devnet, task_id: int, miner: LocalAccount, n: int = 4) -> list[Receipt]:
    """Claim the task's shard and submit its result tree; returns the receipts."""
    from market.protocol import keccak, output_hash, receipts_tree

    net.q.tasks.claim_shard(miner, task_id, 0)
    receipts = [Receipt(task_id, 0, i, keccak(b"%d" % i), output_hash(f"a{i}", [1, 2]), 2,
                        net.MODEL_ID) for i in range(n)]
    tree = receipts_tree(receipts)
    net.q.tasks.submit_result(miner, task_id, 0, tree.root, "sha256:" + "ee" * 32, tree.total)
    return receipts


def _idle_slash(stake: int) -> int:
    return stake * 1000 // 10_000  # DeployParams.idle_slash_bps


@pytest.mark.chain
@pytest.mark.timeout(180)
def test_silence_never_pays_on_chain(devnet: Devnet, tmp_path: Path) -> None:
    """With every client offline: a miner that never answers an availability challenge is
    settled at fault (the client gets the shard's budget, the slash and its bond back, to the
    wei); an overdue dispute is expired and the members that cast no vote are reported (each
    pays the opener a tenth of its stake), also on a dispute its miner expired itself; each
    action is sent once, and the chain's "not yet" frees an action the board thought due."""
    from market.protocol import Vote, keccak, receipts_tree
    from market.service.board import Board
    from market.service.sweeps import chain_now

    net, q = devnet, devnet.q
    arb, escrow = q.arbitration, q.escrow
    # Five minutes to answer (devnet: one), so a loaded machine cannot pass the deadline before
    # the first sweep; still before the disputes' 600 s. The test moves the chain's clock.
    arb._tx(net.deployer, "setAvailabilityParams", arb.min_availability_bond(), 300)
    board = Board(tmp_path / "board.sqlite")
    guard = MemoryGuard()

    def sweep() -> Any:
        board.index(q)
        return sweep_once(board, q, net.anyone, chain_now(q), guard=guard)

    # A: a root and a full bill for results never published; the client challenges one.
    a = _post(net, net.client, "a")
    q.tasks.claim_shard(net.miner, a, 0)
    q.tasks.submit_result(net.miner, a, 0, keccak(b"nothing"), "sha256:" + "00" * 32,
                          4 * MAX_TOKENS)
    budget = q.tasks.shard_budget(a, 0)
    collateral = q.tasks.get_shard(a, 0).collateral
    challenge_bond = arb.min_availability_bond()
    challenge_id, _ = arb.challenge_availability(net.client, a, 0, 2, challenge_bond)
    # B and C: disputes for the four-member committee; one member votes on B, none on C.
    b, c = _post(net, net.client2, "b"), _post(net, net.client, "c")
    rb, rc = _work(net, b, net.miner2), _work(net, c, net.miner2)
    bond = arb.min_bond()
    db, _ = arb.open_dispute(net.client2, b, 0, rb[1], receipts_tree(rb).proof(1), "e", bond)
    dc, _ = arb.open_dispute(net.client, c, 0, rc[1], receipts_tree(rc).proof(1), "e", bond)
    voter, silent = net.verifiers[0], sorted(v.address for v in net.verifiers[1:])
    arb.cast_votes(net.anyone, db, True,
                   [Vote(db, True).sign(voter.key, net.chain.chain_id, arb.address)])

    first = sweep()
    assert first.sent == [] and first.errors == [] and first.not_yet == []
    # The chain's clock decides: swept as if the deadlines had passed, all three are "not
    # yet" and stay free for a later sweep.
    early = sweep_once(board, q, net.anyone, 2**40, guard=guard)
    assert sorted((i.action, i.ref) for i in early.not_yet) == [
        (EXPIRE, db), (EXPIRE, dc), (SETTLE, challenge_id)]
    assert early.sent == [] and early.errors == []

    before = escrow.withdrawable(net.client.address)
    net.chain.advance_time(arb.response_window())
    settled = sweep()
    assert settled.settled == [challenge_id] and settled.expired == [], settled.summary()
    assert arb.get_challenge(challenge_id).status == ChallengeStatus.UNANSWERED
    assert q.tasks.get_shard(a, 0).state == ShardState.REFUNDED
    # the client gets back what it put in; the miner's slashed collateral is burned (an
    # honest miner's outage pays no one: issue 29, gap 6)
    assert escrow.withdrawable(net.client.address) - before == budget + challenge_bond
    assert q.gpu.miner_info(net.miner.address).stake == net.MINER_STAKE - collateral

    # Past the disputes' deadline C's miner expires its own dispute (it wants its shard back)
    # and reports nobody; the sweep expires B and reports the silent members of both.
    deadline = max(arb.get_dispute(d).deadline for d in (db, dc))
    net.chain.advance_time(deadline - net.chain.timestamp())
    arb.expire_dispute(net.miner2, dc)
    stakes = {v.address: q.committee.verifier_info(v.address).stake for v in net.verifiers}
    before_b = escrow.withdrawable(net.client2.address)
    before_c = escrow.withdrawable(net.client.address)  # C's bond is back already
    burn = q.chain.call(q.arbitration.contract.functions.BURN())
    burned = escrow.withdrawable(burn)
    expired = sweep()
    assert expired.errors == [], expired.errors
    assert expired.expired == [db] and expired.refs(REPORT) == [db, dc]
    # C's shard, unfrozen with its window closed, is finalized too: the client gets the rest
    # of its budget back.
    assert expired.finalized == [(c, 0)]
    c_refund = q.tasks.shard_budget(c, 0) - sum(r.output_tokens for r in rc) * net.PRICE
    assert sorted(m for d, m in expired.absent_reported if d == db) == silent
    assert sorted(m for d, m in expired.absent_reported if d == dc) == sorted(stakes)
    # The openers get their bonds (and C's client its refund), never the absences: burned.
    assert escrow.withdrawable(net.client2.address) - before_b == bond
    assert escrow.withdrawable(net.client.address) - before_c == c_refund
    # On C the voter of B pays its first tenth, the others a tenth of what B left them.
    assert escrow.withdrawable(burn) - burned == sum(_idle_slash(stakes[m]) for m in silent) \
        + _idle_slash(stakes[voter.address]) + sum(
            _idle_slash(stakes[m] - _idle_slash(stakes[m])) for m in silent)
    assert arb.ballot_of(db, voter.address) == Ballot.FAULT
    assert {arb.ballot_of(db, m) for m in silent} == {Ballot.ABSENT}
    assert {q.committee.strikes_of(m) for m in silent} == {2}
    assert q.committee.strikes_of(voter.address) == 1

    # The board follows; the unfrozen shards are finalized, and nothing is sent twice, even
    # by a sweeper with a fresh guard.
    after = sweep()
    assert after.finalized == [(b, 0)]
    assert [i for i in after.sent if i.action not in (FINALIZE,)] == []
    job = board.job(b)
    assert job is not None
    assert {k: job["disputes"][0][k] for k in ("status", "votes", "absent", "absentSlashed")} \
        == {"status": "Expired", "votes": 1, "absent": 3,
            "absentSlashed": sum(_idle_slash(stakes[m]) for m in silent)}
    assert board.job(a)["challenges"][0]["status"] == "Unanswered"  # type: ignore[index]
    assert board.due_report(chain_now(q)) == [] and board.due_expire(2**40) == []
    board.index(q)
    again = sweep_once(board, q, net.anyone, chain_now(q), guard=MemoryGuard())
    assert again.sent == [] and again.errors == []


# -- the Redis guard on a real redis-server -------------------------------------------------


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from market.local.processes import start_redis

    proc = start_redis(Path(tmp_path_factory.mktemp("redis")))
    try:
        yield proc.extra["url"]
    finally:
        proc.stop()


@pytest.mark.timeout(30)
def test_redis_guard(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    a, b = RedisGuard(client), RedisGuard(client)
    assert a.take("finalize:x:1:0", 60)
    assert not b.take("finalize:x:1:0", 60)
    assert 0 < client.ttl("quarry:once:finalize:x:1:0") <= 60
    a.release("finalize:x:1:0")
    assert b.take("finalize:x:1:0", 60)
    assert a.take("finalize:x:1:1", 1)
    client.pexpire("quarry:once:finalize:x:1:1", 1)  # let it lapse now
    time.sleep(0.05)
    assert b.take("finalize:x:1:1", 60)


@pytest.mark.timeout(30)
def test_concurrent_sweeps_with_redis_guard(redis_url: str) -> None:
    import redis

    board, q = _world(delay=0.02)
    reports: list[Any] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        guard = RedisGuard(redis.Redis.from_url(redis_url), prefix="quarry:test-once:")
        barrier.wait()
        reports.append(sweep_once(board, q, SETTLER, 1000, guard=guard))  # type: ignore[arg-type]

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(q.tasks.sends) == _shard_sends(board)
    assert sorted(q.arbitration.sends) == ARBITRATION_SENDS
    assert sum(len(r.sent) for r in reports) == SHARD_SENDS + len(ARBITRATION_SENDS)


# -- the ticker ---------------------------------------------------------------------------


def test_ticker_survives_an_outage() -> None:
    now = [0.0]
    sent: list[str] = []
    warnings: list[str] = []
    broker_up = [True]

    def send(name: str, expires: float) -> None:
        if not broker_up[0]:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        assert expires >= 10
        sent.append(name)

    ticker = Ticker([("index", 1.0), ("sweep", 2.0)], send, warn=warnings.append,
                    clock=lambda: now[0])
    due: dict[str, float] = {}
    ticker.tick(due)
    assert sent == ["index", "sweep"]
    now[0] = 1.0
    ticker.tick(due)
    assert sent == ["index", "sweep", "index"]  # sweep is not due before t=2
    broker_up[0] = False
    for t in (2.0, 3.0, 4.0):
        now[0] = t
        ticker.tick(due)
    assert len(warnings) == 1 and "cannot reach Redis" in warnings[0]
    assert "Connection refused" in warnings[0]
    broker_up[0] = True
    now[0] = 5.0
    ticker.tick(due)
    assert sent[-2:] == ["index", "sweep"]
    assert len(warnings) == 2 and "back" in warnings[1]


def test_each_tick_sends_the_index_task_last() -> None:
    """The index task follows the chain until a task is queued behind it: one sent after it
    in the same tick would end its following at once."""
    from market.service import worker
    from market.service.settings import MarketSettings

    names = [name for name, _ in tick_schedule(MarketSettings())]
    assert names[-1] == worker.TASK_INDEX
    assert set(names) == {worker.TASK_INDEX, worker.TASK_RECOMMEND, worker.TASK_SWEEP}


def test_ticker_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval for sweep must be positive"):
        Ticker([("sweep", 0.0)], lambda name, expires: None)


# -- task failure reporting ---------------------------------------------------------------


def test_task_failures_logged_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    from market.errors import QuarryError
    from market.service.matching import miner_alive
    from market.service.worker import reported

    def run(fail: str | None) -> dict[str, Any]:
        with reported("index") as out:
            if fail:
                raise QuarryError(fail)
            out["cursor"] = 7
        return out

    with caplog.at_level("WARNING", logger="quarry.worker"):
        assert run("chain at http://x did not answer") == {
            "error": "QuarryError: chain at http://x did not answer"}
        run("chain at http://x did not answer")
        run("chain reset: no TaskRegistry code")
        assert run(None) == {"cursor": 7}
        run(None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "did not answer" in lines[0] and "chain reset" in lines[1]
    assert lines[2] == "index recovered"
    with pytest.raises(ValueError):  # a bug is not swallowed
        with reported("index"):
            raise ValueError("bug")
    assert miner_alive({"alive": False, "lastSeen": 100}, 101, 30) is False
    assert miner_alive({"lastSeen": 100}, 129, 30) and not miner_alive({"lastSeen": 100}, 131, 30)
    assert not miner_alive({"lastSeen": None}, 0, 30)
