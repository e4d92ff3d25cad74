"""Random market histories on Anvil (Hypothesis stateful testing).

The machine drives the real contracts through the Python wrappers:
- tasks: create (with or without an arbiter, open to miners on probation or not, accepting
  every precision or a set of them, requiring commitments or not), claim (the shard records
  the claimant's declared precision; a mask that leaves it out refuses the claim),
  submit a result sum tree (honest, billing more than its receipts sum, holding a padded
  or an over-cap receipt, or lying about one subtree's sum in its parent node), finalize,
  reclaim, refund, cancel, withdraw;
- availability challenges by the client, its arbiter or an auditor (each with its own budget
  of three per shard; an auditor sometimes spends its whole budget before the client
  challenges), answers with a Python-made proof, settlement of unanswered ones; disputes
  opened with a proof, stake-weighted votes of the dispute epoch's committee (partial ones
  leave it open), expiry and absence reports; billing-fault proofs, and sum-lie proofs
  (`proveSumFault`) along a leaf's path;
- the committee: joins with random stakes (into a committee of at most MAX_MEMBERS, so the
  least stake gets displaced), exits, withdrawals at the unbonding bound, reputation reports,
  epoch boundaries; a new miner on probation; miners re-declaring their precision;
- swarms: two swarms of the two established miners (shares 1:3, each headed by one of them)
  claim shards through their head (every member must be eligible, the swarm serves in its
  least exact member's precision, the head alone locks the collateral); such a shard then
  goes through every path above, its pay split over the members by share and its every
  fault (reclaim, unanswered challenge, lost dispute, proven billing fault) slashed from the
  head alone, never from the other member.

A Python model predicts every action's outcome (success, or the custom error it reverts
with, at the chain time it ran) and every wei it moves. After every step: PaymentEscrow
holds totalEscrowed + totalWithdrawable, the task escrows add up to totalEscrowed and each is
its unsettled shard budgets, withdrawable balances are the model's; Arbitration holds the
bonds of the open disputes and challenges; VerifierCommittee holds the stakes of the
verifiers registered and not withdrawn, and its records and snapshots are the model's;
GPURegistry holds the miners' stakes (a slash takes free stake only), and each miner's locked
collateral is that of its Claimed, Submitted and Disputed shards (a swarm's: its head's); the
shards, disputes and challenges the step touched
match the model (all of them at teardown). A Panic or an unknown revert is a bug.

Blocks come exactly a second apart and waits set the next block's time (`fixed_clock`), so
an example's history depends on its drawn steps only and a failure replays and shrinks.
Besides one rule per action, `advance` carries a shard through its life cycle, since swarm
testing disables random subsets of rules in each example.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from web3.types import RPCEndpoint

from market.chain.client import TxResult
from market.chain.contracts import (
    SEATED,
    ZERO_ADDRESS,
    ChallengeStatus,
    DisputeStatus,
    GpuSpec,
    MinerInfo,
    QuarryContract,
    ShardState,
    VerifierInfo,
    as_struct,
)
from market.chain.errors import ChainError, ContractRevert
from market.protocol import (
    Receipt,
    Report,
    SumNode,
    SumStep,
    Vote,
    input_tree,
    keccak,
    output_hash,
    quorum_signatures,
    receipt_leaf,
    receipts_tree,
    verify_sum_proof,
)
from market.protocol.commitments import ZERO_HASH, commitment_hash
from market.protocol.eip712 import SwarmConsent
from market.protocol.precision import Precision, accepts, precision_mask

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain, pytest.mark.timeout(900)]  # room to shrink a failure

S = ShardState
T = TypeVar("T")
ETH = 10**18
BPS = 10_000
MAX_TOKENS = 4
MAX_TASKS = 5
TASK_LIFETIME = 3000  # seconds from create to deadline
MAX_MEMBERS = 7  # lowered from 64 so that joins displace the least stake
INITIAL_STAKES = (2 * ETH, ETH // 2)  # two more members seated before the first step
FRESH_VERIFIERS = 6
OK = "ok"
REACHED: Counter[str] = Counter()
"""How often the run reached the paths issue 29 asks for (checked at the end of the test)."""
BUG_ERRORS = ("Panic", "Unknown", "", "Error")
LIVE = (S.CLAIMED, S.SUBMITTED, S.DISPUTED)  # shards holding collateral
UNSETTLED = (S.OPEN, *LIVE)  # shards whose budget is still escrowed
MODES = ("honest", "honest", "honest", "overbill", "padded", "padded", "overcap", "lie", "lie",
         "lie")
MASKS = (0, 0, 0, 0, precision_mask(["fp32", "bf16"]), precision_mask(["fp32"]),
         precision_mask(["bf16"]), precision_mask(["fp16", "bf16", "fp8", "int8"]))
"""Tasks' accepted precisions: mostly any, sometimes a set some miners are outside of."""


def view(contract: QuarryContract, name: str) -> int:
    """A public uint getter the wrapper does not expose."""
    return int(contract.chain.call(contract.contract.functions[name]()))


@dataclass
class Work:
    """A shard's result as its miner built it: receipts in index order, each output's text
    and token ids (what a billing proof shows), the sum tree as committed (its root, every
    leaf's proof and SumStep path), and the tokens billed."""

    start: int
    receipts: list[Receipt]
    texts: list[str]
    ids: list[list[int]]
    root: bytes
    proofs: list[list[SumNode]]
    paths: list[list[SumStep]]
    tokens_used: int
    bad: int | None  # the padded or over-cap receipt's index, if any
    lied: set[int] = field(default_factory=set)  # requests whose path crosses a false sum

    def receipt(self, index: int) -> Receipt:
        return self.receipts[index - self.start]

    def proof(self, index: int) -> list[SumNode]:
        return self.proofs[index - self.start]

    def path(self, index: int) -> list[SumStep]:
        return self.paths[index - self.start]

    def proven(self, receipt: Receipt, proof: Sequence[SumNode]) -> bool:
        """What Arbitration checks: the proof leads to (resultRoot, tokensUsed) as submitted."""
        return verify_sum_proof(self.root, self.tokens_used, receipt.index - self.start,
                                len(self.receipts), receipt_leaf(receipt), proof)


def build_work(task_id: int, shard: int, start: int, end: int, hashes: Sequence[bytes],
               model_id: bytes, seed: int, mode: str) -> Work:
    """Outputs and receipts for requests [start, end). `overbill` submits more tokens than the
    tree sums (no receipt can then be proven); `padded` bills one receipt for more tokens than
    its output holds; `overcap` bills one receipt for more than maxTokensPerRequest; `lie`
    records a false sum for one subtree in its parent (issue 29: only the receipts under it
    fail to prove)."""
    bad = start + seed % (end - start) if mode in ("padded", "overcap") else None
    receipts, texts, ids_all = [], [], []
    for i in range(start, end):
        ids = [(seed * 31 + i * 7 + k) % 50_000 for k in range(1 + (seed + i) % MAX_TOKENS)]
        text = f"answer {task_id}/{i}/{seed}"
        count = len(ids)
        if i == bad:
            count = count + 1 + seed % 2 if mode == "padded" else MAX_TOKENS + 1 + seed % 3
        commitment = commitment_hash(text.encode()) if (seed + i) % 3 else ZERO_HASH
        receipts.append(Receipt(task_id, shard, i, hashes[i], output_hash(text, ids), count,
                                model_id, commitment))
        texts.append(text)
        ids_all.append(ids)
    tree = receipts_tree(receipts)
    from conftest import lying_result_tree, subtree_spans

    n, lies, lied = end - start, {}, set()
    if mode == "overbill":
        lies["root"] = min(tree.total + 1 + seed % 3, n * MAX_TOKENS)
        lied = set(range(start, end)) if lies["root"] != tree.total else set()
    elif mode == "lie" and n > 1:
        # the parent of subtree [lo, hi) records `extra` tokens more (within the shard's cap),
        # or fewer, than the subtree holds
        spans = sorted(x for x in subtree_spans(n) if x != (0, n))
        lo, hi = spans[seed % len(spans)]
        truth = sum(r.output_tokens for r in receipts[lo:hi])
        room = n * MAX_TOKENS - tree.total
        extra = 1 + seed % room if room and (seed & 8 or not truth) else -(1 + seed % truth)
        lies[f"{lo}:{hi}"] = truth + extra
        lied = set(range(start + lo, start + hi))
    root, tokens, proofs, paths = lying_result_tree([receipt_leaf(r) for r in receipts], lies)
    assert root == tree.root or mode == "lie"
    return Work(start, receipts, texts, ids_all, root, proofs, paths, tokens, bad, lied)


@dataclass
class TaskM:
    client: LocalAccount
    arbiter: LocalAccount | None
    deadline: int
    allow_probation: bool
    hashes: list[bytes]
    precisions: int = 0  # accepted-precision mask (0: any)
    cancelled: bool = False

    def may_challenge(self, who: str) -> bool:
        return who == self.client.address or (self.arbiter is not None
                                              and who == self.arbiter.address)


@dataclass
class ShardM:
    task_id: int
    shard: int
    start: int
    end: int
    budget: int
    state: ShardState = S.OPEN
    miner: str = ZERO_ADDRESS
    collateral: int = 0
    claim_expiry: int = 0
    window_end: int = 0
    work: Work | None = None
    challenges: dict[str, int] = field(default_factory=dict)  # per challenger
    precision: int = 0  # the claimant's declaration at the claim (0 while open)
    swarm: SwarmM | None = None  # the swarm whose head holds the claim

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_id, self.shard)

    def other(self, index: int) -> int:
        """Another request of the shard (the same one for a shard of one)."""
        return self.start + (index - self.start + 1) % (self.end - self.start)


@dataclass(frozen=True)
class SwarmM:
    id: int
    head: str
    members: tuple[str, ...]  # ascending
    shares: tuple[int, ...]

    def split(self, amount: int) -> list[int]:
        """GPURegistry.swarmSplit: floor(amount * share / total) each, the rest to the head."""
        parts = [amount * s // sum(self.shares) for s in self.shares]
        parts[self.members.index(self.head)] += amount - sum(parts)
        return parts


@dataclass
class ChallengeM:
    id: int
    key: tuple[int, int]
    index: int
    challenger: str
    bond: int
    opened_at: int
    deadline: int
    status: ChallengeStatus = ChallengeStatus.OPEN


@dataclass
class DisputeM:
    id: int
    key: tuple[int, int]
    opener: str
    bond: int
    epoch: int
    total_weight: int
    deadline: int
    status: DisputeStatus = DisputeStatus.OPEN
    ballots: dict[str, str] = field(default_factory=dict)  # member -> fault/nofault/absent
    voters: dict[bool, list[tuple[str, int]]] = field(
        default_factory=lambda: {True: [], False: []})

    def tally(self, fault: bool) -> int:
        return sum(w for _, w in self.voters[fault])


@dataclass
class SeatM:
    """A verifier's record (VerifierInfo); kept in the history after withdrawal, since the
    snapshots it sat in keep its weight."""

    address: str
    stake: int
    weight: int
    active_from: int
    active_until: int = SEATED
    withdrawable_at: int = 0


@dataclass
class MinerM:
    stake: int
    rep: int
    on_probation: bool
    passed: int
    registered_at: int  # probation counts only reports of epochs starting then or later
    untrusted: int = 0  # consecutive reports below the untrusted line (GPURegistry's streak)
    precision: int = int(Precision.FP32)  # declared for the model


def make_machine(net: Devnet, reached: Counter[str] | None = None) -> type[RuleBasedStateMachine]:
    """The machine class; `reached` counts the swarm paths the examples took (claims,
    payments, faults, reclaims), so the test can show it reached them."""
    q, chain = net.q, net.chain
    seen: Counter[str] = Counter() if reached is None else reached
    cid = chain.chain_id
    clients = [net.client, net.client2]
    miner_accounts = [net.miner, net.miner2, net.outsider]  # the outsider may register later
    fresh = [Account.from_key(keccak(f"quarry stateful verifier {i}".encode()))
             for i in range(FRESH_VERIFIERS)]
    verifier_accounts: list[LocalAccount] = [*net.verifiers, *fresh]
    everyone: list[LocalAccount] = [*clients, net.miner, net.miner2, net.outsider, net.anyone,
                                    *verifier_accounts]
    account_of = {a.address: a for a in everyone}
    keys = {a.address: a.key for a in verifier_accounts}

    tp, ap = q.tasks.params(), q.arbitration.params()
    collateral_bps, claim_timeout = tp["collateral_bps"], tp["claim_timeout"]
    challenge_window, reclaim_bps = tp["challenge_window"], tp["reclaim_penalty_bps"]
    min_bond, dispute_timeout = ap["min_bond"], ap["dispute_timeout"]
    fault_bps, reward_bps = ap["fault_slash_bps"], ap["verifier_reward_bps"]
    miner_share_bps = ap["miner_bond_share_bps"]
    min_av_bond, response_window = ap["min_availability_bond"], ap["response_window"]
    vc = q.committee
    genesis, epoch_len, delay = vc.genesis_time(), vc.epoch_duration(), vc.activation_delay()
    unbonding, churn = view(vc, "unbondingPeriod"), view(vc, "churnLimit")
    strikes_allowed, idle_bps = view(vc, "idleStrikesAllowed"), view(vc, "idleSlashBps")
    min_vstake = view(vc, "minVerifierStake")
    min_stake, (probation_epochs, pass_bps) = q.gpu.min_stake(), q.gpu.probation_params()
    untrusted_bps, initial_rep = view(q.gpu, "untrustedBelowBps"), view(q.gpu,
                                                                          "initialReputationBps")
    untrusted_slash_bps = view(q.gpu, "untrustedSlashBps")
    burn = to_checksum_address(q.chain.call(q.gpu.contract.functions.BURN()))
    stakes = (min_vstake // 2, min_vstake, ETH // 2, ETH, 2 * ETH, 3 * ETH)

    def epoch_of(t: int) -> int:
        return (t - genesis) // epoch_len

    def epoch_start(e: int) -> int:
        return genesis + e * epoch_len

    def choose(items: Sequence[T], i: int, prefer: Callable[[T], bool]) -> T:
        """Item `i` among those `prefer` holds for (among all on every fourth draw, or when
        none qualifies): mostly the interesting case, sometimes the one that must revert."""
        good = [x for x in items if prefer(x)]
        pool = good if good and i % 4 else list(items)
        return pool[i % len(pool)]

    class MarketMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.snapshot = chain.snapshot()
            for a in fresh:
                chain.set_balance(a.address, 100 * ETH)
            chain.send(vc.contract.functions.setMaxMembers(MAX_MEMBERS), net.deployer)
            # Two swarms of the established miners, shares 1:3 and each headed by one of them
            # (registered after the snapshot, so every example starts from none).
            pair = sorted((net.miner, net.miner2), key=lambda a: int(a.address, 16))
            self.swarms: list[SwarmM] = []
            for head in pair:
                consent = SwarmConsent.for_plan(
                    net.MODEL_ID, head.address, {pair[0].address: 1, pair[1].address: 3},
                    net.PRICE, chain.timestamp() + 600)
                swarm_id, _ = q.gpu.register_swarm(
                    net.anyone, consent, [q.gpu.sign_swarm_consent(consent, m) for m in pair])
                self.swarms.append(SwarmM(swarm_id, head.address, consent.members,
                                          consent.shares))
            # Unequal stakes from the start, so that quorums and rewards go by weight, not
            # by head count (the fixture's four members bond 1 ETH each). The clock then
            # starts on the boundary where they sit, so every example sees the same epochs.
            for account, stake in zip(fresh, INITIAL_STAKES, strict=False):
                vc.register(account, stake)
            seated_at = max(vc.verifier_info(a.address).active_from
                            for a in fresh[:len(INITIAL_STAKES)])
            self._jump(epoch_start(seated_at))
            self.tasks: dict[int, TaskM] = {}
            self.shards: dict[tuple[int, int], ShardM] = {}
            self.challenges: dict[int, ChallengeM] = {}
            self.disputes: dict[int, DisputeM] = {}
            self.records: dict[str, SeatM] = {}
            self.history: list[SeatM] = []
            self.activations: dict[int, int] = {}
            for v in verifier_accounts:
                info = vc.verifier_info(v.address)
                if info.registered:
                    seat = SeatM(v.address, info.stake, info.weight, info.active_from,
                                 info.active_until, info.withdrawable_at)
                    self.records[v.address] = seat
                    self.history.append(seat)
            # Every join so far (the fixture's and the two above) has taken effect, so no
            # boundary a change can still be scheduled at has an activation yet.
            self.last_key = max(s.active_from for s in self.history)
            assert self.last_key <= vc.current_epoch()
            self.strikes = {v.address: vc.strikes_of(v.address) for v in verifier_accounts}
            self.miners: dict[str, MinerM] = {}
            for m in miner_accounts:
                mi = q.gpu.miner_info(m.address)
                if mi.active:
                    declared = q.gpu.precision_of(m.address, net.MODEL_ID)
                    assert declared is not None
                    self.miners[m.address] = MinerM(mi.stake, mi.reputation_bps,
                                                    mi.on_probation, mi.passed_epochs,
                                                    mi.registered_at,
                                                    q.gpu.untrusted_reports_of(m.address),
                                                    int(declared))
            self.owed = {a.address: q.escrow.withdrawable(a.address) for a in everyone}
            self.owed[burn] = q.escrow.withdrawable(burn)  # burned stake lands here
            self.owed_base = q.escrow.total_withdrawable() - sum(self.owed.values())
            self.next_report = vc.next_report_epoch()
            self.now = chain.timestamp()  # the chain time last seen (for cheap target picks)
            self.touched: set[tuple[int, int]] = set()  # shards the last step may have changed
            self.touched_accounts: set[str] = set()
            self.touched_disputes: set[int] = set()
            self.touched_challenges: set[int] = set()
            self.touched_verifiers: set[str] = set()

        def teardown(self) -> None:
            try:
                self.touched = set(self.shards)
                self.touched_accounts = set(self.owed)
                self.touched_disputes = set(self.disputes)
                self.touched_challenges = set(self.challenges)
                self.touched_verifiers = {a.address for a in verifier_accounts}
                self.committee_holds_the_stakes()
                self.mirror_matches_chain()
                self.withdrawable_is_the_model()
                self.disputes_and_challenges_match()
            finally:
                chain.revert_to(self.snapshot)

        # -- the clock and the outcome check -----------------------------------------------

        def _ts(self, tx: TxResult) -> int:
            return int(chain.w3.eth.get_block(tx.block_number)["timestamp"])

        def _run(self, outcome: Callable[[int], str],
                 action: Callable[[], TxResult]) -> TxResult | None:
            """Run `action`, which must end as `outcome` predicts. Blocks come exactly a
            second apart (see `fixed_clock`): Chain.send estimates gas on the latest block, at
            time t - 1, and the transaction lands in the next, at t. So it reverts with
            outcome(t - 1) when that is an error; else it succeeds at t when outcome(t) is OK;
            else (a deadline falls at t) it is mined and reverts there, changing nothing.
            Anvil sometimes estimates on the pending block, at t (a challenge opened the
            second before its shard's window closed reverted OutsideWindow in the estimate, on
            main's contracts too): a revert in the estimate may then be outcome(t), and it
            changes nothing either. Panics and unknown reverts are bugs."""
            t = chain.timestamp() + 1
            before, at = outcome(t - 1), outcome(t)
            try:
                tx = action()
            except ContractRevert as exc:
                if exc.error in BUG_ERRORS:
                    raise
                assert exc.error in (before, at), f"reverted {exc}, expected {before} or {at}"
                self.now = t - 1
                return None
            except ChainError as exc:
                assert before == OK and at != OK, f"{exc}, expected {before} then {at}"
                assert "reverted (no reason)" in str(exc), exc
                self.now = t
                return None
            assert (before, at) == (OK, OK), f"succeeded, expected {before} then {at}"
            assert self._ts(tx) == t
            self.now = t
            return tx

        def _jump(self, to: int) -> None:
            """Mine the next block at time `to` (chain.advance_time's evm_increaseTime does
            nothing under a fixed block interval)."""
            chain.rpc("evm_setNextBlockTimestamp", [to])
            chain.mine()
            self.now = to

        # -- model helpers -----------------------------------------------------------------

        def _touch(self, sh: ShardM) -> None:
            self.touched.add(sh.key)

        def _credit(self, who: str, amount: int) -> None:
            self.owed[who] += amount
            self.touched_accounts.add(who)

        def _slash(self, miner: str, amount: int, beneficiary: str) -> int:
            """GPURegistry.slash: free stake only (the slashed shard is no longer live)."""
            m = self.miners[miner]
            locked = sum(sh.collateral for sh in self._in(*LIVE) if sh.miner == miner)
            taken = min(amount, m.stake - locked)
            m.stake -= taken
            self._credit(beneficiary, taken)
            return taken

        def _in(self, *states: ShardState) -> list[ShardM]:
            return [self.shards[k] for k in sorted(self.shards) if self.shards[k].state in states]

        def _pick(self, i: int, *states: ShardState) -> ShardM:
            found = self._in(*states)
            return found[i % len(found)]

        def _eligible(self, miner: str, task: TaskM, collateral: int) -> str:
            m = self.miners.get(miner)
            if m is None or m.stake < min_stake or m.rep < untrusted_bps:
                return "NotEligible"
            if m.on_probation and not task.allow_probation:
                return "NotEligible"
            if not accepts(task.precisions, m.precision):
                return "PrecisionNotAccepted"
            return OK if self._lockable(miner) >= collateral else "InsufficientFreeStake"

        def _lockable(self, miner: str) -> int:
            """GPURegistry._lock: the free stake less untrustedSlashBps of the stake, or less the
            reserve held for the untrusted burn while a dispute is open, when that is larger."""
            m = self.miners[miner]
            locked = sum(sh.collateral for sh in self._in(*LIVE) if sh.miner == miner)
            floor = max(m.stake * untrusted_slash_bps // BPS, q.gpu.reserve_of(miner))
            return max(m.stake - locked - floor, 0)

        def _challenger_check(self, sh: ShardM, who: str, t: int) -> str:
            """Arbitration._checkChallenger: the client, its arbiter, or an auditor (weight in
            the current epoch's committee)."""
            if not (self.tasks[sh.task_id].may_challenge(who)
                    or self._weight_at(who, epoch_of(t)) > 0):
                return "NotClientArbiterOrAuditor"
            if sh.state != S.SUBMITTED:
                return "ShardNotSubmitted"
            return "OutsideWindow" if t >= sh.window_end else OK

        def _receipt_check(self, sh: ShardM, receipt: Receipt, proof: Sequence[SumNode],
                           cap: bool) -> str:
            """Arbitration._checkReceipt."""
            assert sh.work is not None
            if cap and receipt.output_tokens > MAX_TOKENS:
                return "TooManyOutputTokens"
            return OK if sh.work.proven(receipt, proof) else "InvalidProof"

        def _settle_fault(self, sh: ShardM, voters: list[tuple[str, int]], total: int,
                          rest: str | None = None) -> int:
            """Arbitration._settleFault: budget back to the client, collateral slashed, the
            voters' reward split by recorded weight, the rest to `rest` (an unanswered
            availability challenge: burned) or the client; returns the stake taken."""
            client = self.tasks[sh.task_id].client.address
            if sh.swarm is not None:
                seen["swarm fault"] += 1
            sh.state = S.REFUNDED
            self._touch(sh)
            self._credit(client, sh.budget)
            amount = sh.collateral * fault_bps // BPS
            reward = amount * reward_bps // BPS if voters else 0
            paid = slashed = 0
            for voter, w in voters:
                share = reward * w // total
                paid += share
                slashed += self._slash(sh.miner, share, voter)
            return slashed + self._slash(sh.miner, amount - paid, rest or client)

        def _reclaim(self, sh: ShardM, reopen: bool) -> None:
            client = self.tasks[sh.task_id].client.address
            miner, penalty = sh.miner, sh.collateral * reclaim_bps // BPS
            if sh.swarm is not None:
                seen["swarm reclaim"] += 1
            if reopen:
                sh.state, sh.miner, sh.collateral, sh.claim_expiry = S.OPEN, ZERO_ADDRESS, 0, 0
                sh.precision, sh.swarm = 0, None  # the contract deletes the claim
            else:
                sh.state = S.REFUNDED
                self._credit(client, sh.budget)
            self._touch(sh)
            self._slash(miner, penalty, client)

        def _weight_at(self, who: str, epoch: int) -> int:
            r = self.records.get(who)
            if r is None or not r.active_from <= epoch < r.active_until:
                return 0
            return min(r.weight, r.stake)

        def _total_at(self, epoch: int) -> int:
            return sum(s.weight for s in self.history if s.active_from <= epoch < s.active_until)

        def _members_at(self, epoch: int) -> list[str]:
            found = [a for a in self.records if self._weight_at(a, epoch) > 0]
            return sorted(found, key=lambda a: int(a, 16))

        def _change_epoch(self, t: int) -> int:
            return max(epoch_of(t) + delay, self.last_key)

        def _unseat(self, seat: SeatM, at: int) -> None:
            self.touched_verifiers.add(seat.address)
            seat.active_until = at
            if seat.active_from == at:  # never took effect: slot back now, stake bonded from now
                self.activations[at] -= 1
                seat.withdrawable_at = self.now + unbonding
            else:  # bonded until every dispute its seat could judge has expired
                seat.withdrawable_at = epoch_start(at) + dispute_timeout + unbonding
            self.last_key = at

        def _escrow_of(self, task_id: int) -> int:
            return sum(sh.budget for sh in self.shards.values()
                       if sh.task_id == task_id and sh.state in UNSETTLED)

        # -- actions: each predicts its outcome, runs, and updates the model ---------------

        def _do_create(self, n: int, size: int, client: LocalAccount, arbiter: bool,
                       probation: bool, mask: int = 0, commitments: bool = False) -> None:
            hashes = [keccak(f"{len(self.tasks)}-{i}".encode()) for i in range(n)]
            deadline = chain.timestamp() + TASK_LIFETIME
            tx = self._run(lambda t: OK, lambda: q.tasks.create_task(
                client, model_id=net.MODEL_ID, input_root=input_tree(hashes).root,
                input_uri="store://in", num_requests=n, shard_size=size,
                max_tokens_per_request=MAX_TOKENS, price_per_token=net.PRICE,
                deadline=deadline, arbiter=net.anyone.address if arbiter else ZERO_ADDRESS,
                allow_probation=probation, precisions=mask,
                require_commitments=commitments)[1])
            assert tx is not None
            created = tx.event("TaskCreated")
            assert (created["precisions"], created["requireCommitments"]) == (mask, commitments)
            task_id = int(created["taskId"])
            self.tasks[task_id] = TaskM(client, net.anyone if arbiter else None, deadline,
                                        probation, hashes, mask)
            for s in range(-(-n // size)):
                start, end = s * size, min(n, (s + 1) * size)
                sh = ShardM(task_id, s, start, end, (end - start) * MAX_TOKENS * net.PRICE)
                self.shards[sh.key] = sh
                self._touch(sh)

        def _do_claim(self, sh: ShardM, miner: LocalAccount) -> None:
            task = self.tasks[sh.task_id]
            collateral = sh.budget * collateral_bps // BPS

            def outcome(t: int) -> str:
                if sh.state != S.OPEN:
                    return "ShardNotOpen"
                if t >= task.deadline:
                    return "DeadlinePassed"
                return self._eligible(miner.address, task, collateral)

            tx = self._run(outcome, lambda: q.tasks.claim_shard(miner, *sh.key))
            if tx:
                ev = tx.event("ShardClaimed")
                precision = self.miners[miner.address].precision
                assert (ev["collateral"], ev["precision"]) == (collateral, precision)
                sh.state, sh.miner, sh.collateral = S.CLAIMED, miner.address, collateral
                sh.claim_expiry, sh.precision = self.now + claim_timeout, precision
                self._touch(sh)

        def _do_claim_swarm(self, sh: ShardM, sw: SwarmM) -> None:
            """`claimShardForSwarm` by the swarm's head: every member eligible (in member
            order), the swarm's precision (its least exact member's) accepted, and the head's
            free stake covering the whole collateral."""
            task = self.tasks[sh.task_id]
            collateral = sh.budget * collateral_bps // BPS
            precision = max(self.miners[a].precision for a in sw.members)

            def outcome(t: int) -> str:
                if sh.state != S.OPEN:
                    return "ShardNotOpen"
                if t >= task.deadline:
                    return "DeadlinePassed"
                for a in sw.members:
                    m = self.miners[a]
                    if (m.stake < min_stake or m.rep < untrusted_bps
                            or (m.on_probation and not task.allow_probation)):
                        return "MemberNotEligible"
                if not accepts(task.precisions, precision):
                    return "PrecisionNotAccepted"
                return OK if self._lockable(sw.head) >= collateral else "InsufficientFreeStake"

            tx = self._run(outcome, lambda: q.tasks.claim_shard_for_swarm(
                account_of[sw.head], *sh.key, sw.id))
            if tx:
                ev = tx.event("ShardClaimed")
                assert (ev["miner"], ev["collateral"], ev["precision"]) == (
                    sw.head, collateral, precision)
                assert tx.event("SwarmShardClaimed")["swarmId"] == sw.id
                sh.state, sh.miner, sh.collateral = S.CLAIMED, sw.head, collateral
                sh.claim_expiry, sh.precision, sh.swarm = self.now + claim_timeout, precision, sw
                self._touch(sh)
                seen["swarm claim"] += 1

        def _do_claim_many(self, shards: list[ShardM], miner: LocalAccount) -> None:
            """`claimShards`: all or none, each shard checked as `claimShard` checks it, in
            order, with the collateral of those before it already locked."""
            task = self.tasks[shards[0].task_id]
            collaterals = [sh.budget * collateral_bps // BPS for sh in shards]

            def outcome(t: int) -> str:
                locking, seen = 0, set()
                for sh, collateral in zip(shards, collaterals, strict=True):
                    if sh.state != S.OPEN or sh.key in seen:
                        return "ShardNotOpen"
                    if t >= task.deadline:
                        return "DeadlinePassed"
                    verdict = self._eligible(miner.address, task, locking + collateral)
                    if verdict != OK:
                        return verdict
                    locking += collateral
                    seen.add(sh.key)
                return OK

            tx = self._run(outcome, lambda: q.tasks.claim_shards(
                miner, shards[0].task_id, [sh.shard for sh in shards]))
            if tx:
                claimed = tx.all("ShardClaimed")
                precision = self.miners[miner.address].precision
                assert [(e["shard"], e["collateral"], e["precision"]) for e in claimed] == [
                    (sh.shard, c, precision) for sh, c in zip(shards, collaterals, strict=True)]
                for sh, collateral in zip(shards, collaterals, strict=True):
                    sh.state, sh.miner, sh.collateral = S.CLAIMED, miner.address, collateral
                    sh.claim_expiry, sh.precision = self.now + claim_timeout, precision
                    self._touch(sh)

        def _do_submit(self, sh: ShardM, sender: LocalAccount, seed: int, mode: str) -> None:
            task = self.tasks[sh.task_id]
            work = build_work(sh.task_id, sh.shard, sh.start, sh.end, task.hashes,
                              net.MODEL_ID, seed, mode)

            def outcome(t: int) -> str:
                if sh.state != S.CLAIMED:
                    return "ShardNotClaimed"
                if sender.address != sh.miner:
                    return "NotShardMiner"
                if t >= sh.claim_expiry:
                    return "ClaimExpired"
                if work.tokens_used > (sh.end - sh.start) * MAX_TOKENS:
                    return "TooManyTokens"
                return OK

            tx = self._run(outcome, lambda: q.tasks.submit_result(
                sender, *sh.key, work.root, f"store://out/{seed}", work.tokens_used))
            if tx:
                sh.state, sh.work = S.SUBMITTED, work
                sh.window_end = self.now + challenge_window
                assert tx.event("ResultSubmitted")["windowEnd"] == sh.window_end
                self._touch(sh)

        def _do_finalize(self, sh: ShardM) -> None:
            def outcome(t: int) -> str:
                if sh.state == S.DISPUTED:
                    return "DisputeOpen"
                if sh.state != S.SUBMITTED:
                    return "AlreadyFinalized" if sh.state == S.FINALIZED else "ShardNotSubmitted"
                return "WindowNotClosed" if t < sh.window_end else OK

            tx = self._run(outcome, lambda: q.tasks.finalize_shard(net.anyone, *sh.key))
            if tx:
                assert sh.work is not None
                pay = sh.work.tokens_used * net.PRICE
                if sh.swarm is None:
                    self._credit(sh.miner, pay)
                else:
                    parts = sh.swarm.split(pay)
                    assert tx.event("SwarmPaid")["amounts"] == parts
                    seen["swarm pay"] += 1
                    for member, part in zip(sh.swarm.members, parts, strict=True):
                        self._credit(member, part)
                self._credit(self.tasks[sh.task_id].client.address, sh.budget - pay)
                sh.state = S.FINALIZED
                self._touch(sh)

        def _do_reclaim(self, sh: ShardM) -> None:
            task = self.tasks[sh.task_id]
            tx = self._run(lambda t: "ClaimNotExpired" if t < sh.claim_expiry else OK,
                           lambda: q.tasks.reclaim_expired(net.anyone, *sh.key))
            if tx:
                reopen = not task.cancelled and self.now < task.deadline
                assert tx.event("ClaimReclaimed")["reopened"] == reopen
                self._reclaim(sh, reopen)

        def _do_refund(self, sh: ShardM) -> None:
            task, state = self.tasks[sh.task_id], sh.state

            def outcome(t: int) -> str:
                if t < task.deadline:
                    return "DeadlineNotPassed"
                return "ClaimNotExpired" if state == S.CLAIMED and t < sh.claim_expiry else OK

            tx = self._run(outcome, lambda: q.tasks.refund_unfinished(net.anyone, *sh.key))
            if tx and state == S.OPEN:
                sh.state = S.REFUNDED
                self._credit(task.client.address, sh.budget)
                self._touch(sh)
            elif tx:
                self._reclaim(sh, reopen=False)

        def _do_cancel(self, task_id: int) -> None:
            task = self.tasks[task_id]
            tx = self._run(lambda t: "AlreadyCancelled" if task.cancelled else OK,
                           lambda: q.tasks.cancel_task(task.client, task_id))
            if not tx:
                return
            task.cancelled = True
            refund = 0
            for sh in self._in(S.OPEN):
                if sh.task_id == task_id:
                    refund += sh.budget
                    sh.state = S.REFUNDED
                    self._touch(sh)
            assert tx.event("TaskCancelled")["refund"] == refund
            self._credit(task.client.address, refund)

        def _do_withdraw(self, account: LocalAccount) -> None:
            owed = self.owed[account.address]
            before = chain.balance(account.address)
            tx = self._run(lambda t: OK if owed else "NothingToWithdraw",
                           lambda: q.escrow.withdraw(account))
            if tx:
                assert chain.balance(account.address) == before + owed - tx.gas_cost
                self.owed[account.address] = 0
                self.touched_accounts.add(account.address)

        def _do_challenge(self, sh: ShardM, who: LocalAccount, index: int, value: int) -> None:
            def outcome(t: int) -> str:
                if value < min_av_bond:
                    return "InsufficientBond"
                check = self._challenger_check(sh, who.address, t)
                if check != OK:
                    return check
                if not sh.start <= index < sh.end:
                    return "IndexNotInShard"
                return "TooManyChallenges" if sh.challenges.get(who.address, 0) >= 3 else OK

            verdict = outcome(chain.timestamp())
            others = sum(n for a, n in sh.challenges.items() if a != who.address)
            REACHED[f"challenge:{verdict}"] += 1
            if verdict == OK and others >= 3:
                REACHED["challenge after another spent its budget"] += 1
            tx = self._run(outcome, lambda: q.arbitration.challenge_availability(
                who, *sh.key, index, value)[1])
            if tx:
                ts = self.now
                c_id = int(tx.event("AvailabilityChallenged")["challengeId"])
                self.challenges[c_id] = ChallengeM(c_id, sh.key, index, who.address, value, ts,
                                                   ts + response_window)
                sh.challenges[who.address] = sh.challenges.get(who.address, 0) + 1
                assert q.arbitration.availability_challenges_of(
                    *sh.key, who.address) == sh.challenges[who.address]
                sh.state = S.DISPUTED
                self._touch(sh)
                self.touched_challenges.add(c_id)

        def _do_answer(self, c: ChallengeM, tamper: int) -> None:
            """The miner shows the challenged receipt with its proof (`tamper` 1: another
            request's receipt, 2: another request's proof)."""
            sh = self.shards[c.key]
            assert sh.work is not None
            shown = sh.other(c.index) if tamper == 1 else c.index
            receipt = sh.work.receipt(shown)
            proof = sh.work.proof(sh.other(c.index) if tamper == 2 else shown)

            def outcome(t: int) -> str:
                if c.status != ChallengeStatus.OPEN:
                    return "ChallengeNotOpen"
                if t >= c.deadline:
                    return "ResponseWindowClosed"
                if receipt.index != c.index:
                    return "ReceiptMismatch"
                return self._receipt_check(sh, receipt, proof, cap=True)

            REACHED[f"answer:{outcome(chain.timestamp())}"] += 1
            if c.index in sh.work.lied:
                REACHED["answer under a lie"] += 1
            tx = self._run(outcome, lambda: q.arbitration.answer_availability(
                account_of[sh.miner], c.id, receipt, proof))
            if tx:
                ts = self.now
                window_end = max(sh.window_end + (ts - c.opened_at), ts + response_window)
                ev = tx.event("AvailabilityAnswered")
                assert ev["windowEnd"] == window_end
                assert Receipt.from_message(ev["receipt"]) == receipt
                c.status = ChallengeStatus.ANSWERED
                sh.state, sh.window_end = S.SUBMITTED, window_end
                self._credit(sh.miner, c.bond)
                self._touch(sh)
                self.touched_challenges.add(c.id)

        def _do_settle(self, c: ChallengeM) -> None:
            sh = self.shards[c.key]

            def outcome(t: int) -> str:
                if c.status != ChallengeStatus.OPEN:
                    return "ChallengeNotOpen"
                return "ResponseWindowOpen" if t < c.deadline else OK

            tx = self._run(outcome, lambda: q.arbitration.settle_unanswered(net.anyone, c.id))
            if tx:
                c.status = ChallengeStatus.UNANSWERED
                slashed = self._settle_fault(sh, [], 0, burn)  # an outage pays no one
                assert tx.event("AvailabilityUnanswered")["slashed"] == slashed
                self._credit(c.challenger, c.bond)
                self.touched_challenges.add(c.id)

        def _do_open_dispute(self, sh: ShardM, who: LocalAccount, index: int, tamper: bool,
                             value: int) -> None:
            assert sh.work is not None
            receipt = sh.work.receipt(index)
            proof = sh.work.proof(sh.other(index) if tamper else index)

            def outcome(t: int) -> str:
                if value < min_bond or value == 0:
                    return "InsufficientBond"
                for check in (self._challenger_check(sh, who.address, t),
                              self._receipt_check(sh, receipt, proof, cap=True)):
                    if check != OK:
                        return check
                return "NoCommittee" if self._total_at(epoch_of(t)) == 0 else OK

            tx = self._run(outcome, lambda: q.arbitration.open_dispute(
                who, *sh.key, receipt, proof, "store://evidence", value)[1])
            if tx:
                ts = self.now
                did = int(tx.event("DisputeOpened")["disputeId"])
                d = DisputeM(did, sh.key, who.address, value, epoch_of(ts),
                             self._total_at(epoch_of(ts)), ts + dispute_timeout)
                self.disputes[did] = d
                chain_d = q.arbitration.get_dispute(did)
                assert (chain_d.epoch, chain_d.total_weight, chain_d.deadline, chain_d.receipt) \
                    == (d.epoch, d.total_weight, d.deadline, receipt)
                sh.state = S.DISPUTED
                self._touch(sh)
                self.touched_disputes.add(did)

        def _do_vote(self, d: DisputeM, mask: int, fault: bool, stranger: bool) -> None:
            """Members of the dispute's committee picked by `mask` (-1: all of them) sign one
            verdict; a stranger's signature makes the call revert."""
            members = self._members_at(d.epoch)
            signers = [m for k, m in enumerate(members) if mask >> k & 1] or members[:1]
            signer_keys = [keys[m] for m in signers] + ([net.outsider.key] if stranger else [])
            sigs = quorum_signatures(Vote(d.id, fault), signer_keys, cid,
                                     q.arbitration.address)
            fresh_votes = [m for m in signers if m not in d.ballots]

            def outcome(t: int) -> str:
                if d.status != DisputeStatus.OPEN:
                    return "DisputeNotOpen"
                if t >= d.deadline:
                    return "DisputeDeadlinePassed"
                if stranger or any(self._weight_at(m, d.epoch) == 0 for m in signers):
                    return "NotCommitteeMember"
                return OK if fresh_votes else "NoNewVotes"

            tx = self._run(outcome, lambda: q.arbitration.cast_votes(net.anyone, d.id, fault,
                                                                     sigs))
            if not tx:
                return
            self.touched_disputes.add(d.id)
            for m in fresh_votes:
                d.ballots[m] = "fault" if fault else "nofault"
                d.voters[fault].append((m, self._weight_at(m, d.epoch)))
            assert [(e["voter"], e["weight"]) for e in tx.all("VoteCast")] \
                == d.voters[fault][-len(fresh_votes):]
            tally = d.tally(fault)
            resolved = tally * 3 > d.total_weight * 2
            assert bool(tx.all("DisputeResolved")) == resolved
            if not resolved:
                return
            sh = self.shards[d.key]
            if fault:
                d.status = DisputeStatus.MINER_AT_FAULT
                slashed = self._settle_fault(sh, d.voters[True], tally)
                assert tx.event("DisputeResolved")["slashed"] == slashed
                self._credit(d.opener, d.bond)
            else:
                d.status = DisputeStatus.MINER_NOT_AT_FAULT
                pool, paid = d.bond - d.bond * miner_share_bps // BPS, 0
                for voter, w in d.voters[False]:
                    share = pool * w // tally
                    paid += share
                    self._credit(voter, share)
                self._credit(sh.miner, d.bond - paid)
                sh.state, sh.window_end = S.SUBMITTED, self.now
                self._touch(sh)

        def _do_expire(self, d: DisputeM) -> None:
            def outcome(t: int) -> str:
                if d.status != DisputeStatus.OPEN:
                    return "DisputeNotOpen"
                return "DisputeNotExpired" if t < d.deadline else OK

            tx = self._run(outcome, lambda: q.arbitration.expire_dispute(net.anyone, d.id))
            if tx:
                sh = self.shards[d.key]
                d.status = DisputeStatus.EXPIRED
                sh.state, sh.window_end = S.SUBMITTED, self.now
                self._credit(d.opener, d.bond)
                self._touch(sh)
                self.touched_disputes.add(d.id)

        def _silent(self, d: DisputeM) -> list[str]:
            """Members of the dispute's committee without a ballot."""
            return [m for m in self._members_at(d.epoch) if m not in d.ballots]

        def _do_report_absence(self, d: DisputeM, absent: list[str]) -> None:
            def outcome(t: int) -> str:
                if d.status != DisputeStatus.EXPIRED:
                    return "DisputeNotExpiredStatus"
                seen: set[str] = set()
                for m in absent:
                    if self._weight_at(m, d.epoch) == 0:
                        return "NotCommitteeMember"
                    if m in d.ballots or m in seen:
                        return "NotAbsent"
                    seen.add(m)
                return OK

            tx = self._run(outcome, lambda: q.arbitration.report_absence(net.anyone, d.id,
                                                                         absent))
            if not tx:
                return
            at = self._change_epoch(self.now)
            slashed = []
            for m in absent:
                d.ballots[m] = "absent"
                self.strikes[m] += 1
                seat = self.records[m]
                if seat.active_until == SEATED:
                    self._unseat(seat, at)
                cut = seat.stake * idle_bps // BPS if self.strikes[m] > strikes_allowed else 0
                seat.stake -= cut
                self.touched_verifiers.add(m)
                self._credit(burn, cut)  # burned: no opener gains from an absence
                slashed.append((m, cut))
            assert [(e["member"], e["slashed"]) for e in tx.all("AbsenceReported")] == slashed
            self.touched_disputes.add(d.id)

        def _do_prove_billing(self, sh: ShardM, who: LocalAccount, index: int,
                              wrong_ids: bool) -> None:
            """A billing proof with the receipt's output (or a tampered token list)."""
            work = sh.work
            assert work is not None
            receipt, proof = work.receipt(index), work.proof(index)
            ids = work.ids[index - work.start] + ([7] if wrong_ids else [])
            text_hash = keccak(work.texts[index - work.start].encode())

            def outcome(t: int) -> str:
                for check in (self._challenger_check(sh, who.address, t),
                              self._receipt_check(sh, receipt, proof, cap=False)):
                    if check != OK:
                        return check
                if receipt.output_tokens > MAX_TOKENS:
                    return OK
                if wrong_ids:
                    return "OutputHashMismatch"
                return OK if receipt.output_tokens > len(ids) else "NoBillingFault"

            tx = self._run(outcome, lambda: q.arbitration.prove_billing_fault(
                who, *sh.key, receipt, proof, text_hash, ids))
            if tx:
                slashed = self._settle_fault(sh, [], 0)
                assert tx.event("BillingFaultProven")["slashed"] == slashed

        def _do_prove_sum(self, sh: ShardM, who: LocalAccount, index: int, forge: bool) -> None:
            """A sum-lie proof along request `index`'s path as the miner committed it (`forge`:
            one recorded sum raised, so the path no longer hashes to resultRoot)."""
            work = sh.work
            assert work is not None
            receipt, path = work.receipt(index), list(work.path(index))
            if forge and path:
                p = path[index % len(path)]
                path[index % len(path)] = SumStep(p.sum + 1, p.sibling, p.sibling_sum)

            def outcome(t: int) -> str:
                check = self._challenger_check(sh, who.address, t)
                if check != OK:
                    return check
                if forge and path:
                    return "InvalidProof"
                return OK if index in work.lied else "NoBillingFault"

            REACHED[f"prove_sum:{outcome(chain.timestamp())}"] += 1
            tx = self._run(outcome, lambda: q.arbitration.prove_sum_fault(
                who, *sh.key, receipt, path))
            if tx:
                slashed = self._settle_fault(sh, [], 0)
                ev = tx.event("BillingFaultProven")
                assert (ev["index"], ev["slashed"]) == (index, slashed)

        def _do_spend_budget(self, sh: ShardM, spender: LocalAccount, seed: int) -> None:
            """Issue 29's attack: `spender` (an auditor: the miner's friend on the committee)
            challenges the shard until its own budget is spent, the miner answering each;
            then the client challenges, which its own budget always allows."""
            for j in range(4):
                if sh.state != S.SUBMITTED or self.now >= sh.window_end:
                    return
                before = len(self.challenges)
                self._do_challenge(sh, spender, sh.start + (seed + j) % (sh.end - sh.start),
                                   min_av_bond)
                if len(self.challenges) == before:
                    break
                self._do_answer(self.challenges[max(self.challenges)], 0)
            client = self.tasks[sh.task_id].client
            if sh.state == S.SUBMITTED and self.now < sh.window_end:
                assert sh.work is not None
                lied = sorted(sh.work.lied)
                index = lied[seed % len(lied)] if lied else sh.start + seed % (sh.end - sh.start)
                before = len(self.challenges)
                self._do_challenge(sh, client, index, min_av_bond)
                if len(self.challenges) > before:  # the miner answers (under a lie, it cannot)
                    self._do_answer(self.challenges[max(self.challenges)], 0)

        def _full_lowest(self, but: SeatM | None = None) -> SeatM | None:
            """With every seat taken (`but` aside), the member a newcomer would displace."""
            seated = [r for r in self.records.values()
                      if r.active_until == SEATED and r is not but]
            if len(seated) < MAX_MEMBERS:
                return None
            return min(seated, key=lambda r: (r.weight, -r.active_from, -int(r.address, 16)))

        def _churn_smallest(self, at: int) -> SeatM | None:
            """With `at`'s activation slots all taken, the pending join a newcomer with more
            stake would displace (least stake, then highest address)."""
            if self.activations.get(at, 0) < churn:
                return None
            pending = [r for r in self.records.values()
                       if r.active_until == SEATED and r.active_from == at]
            return min(pending, key=lambda r: (r.weight, -int(r.address, 16)), default=None)

        def _do_join(self, account: LocalAccount, stake: int) -> None:
            def outcome(t: int) -> str:
                if account.address in self.records:
                    return "AlreadyRegistered"
                if stake == 0 or stake < min_vstake:
                    return "InsufficientStake"
                at = self._change_epoch(t)
                bumped = self._churn_smallest(at)
                if self.activations.get(at, 0) >= churn and (bumped is None
                                                             or stake <= bumped.weight):
                    return "ChurnLimitReached"
                lowest = self._full_lowest(bumped)
                return "CommitteeFull" if lowest and stake <= lowest.weight else OK

            tx = self._run(outcome, lambda: vc.register(account, stake))
            if not tx:
                return
            at = self._change_epoch(self.now)
            bumped = self._churn_smallest(at)
            lowest = self._full_lowest(bumped)
            displaced = [r for r in (bumped, lowest) if r is not None]
            assert tx.all("VerifierDisplaced") == [
                {"verifier": r.address, "by": account.address, "activeUntil": at}
                for r in displaced]
            for r in displaced:
                pending = r.active_from == at
                self._unseat(r, at)
                if pending:  # a displaced join took no effect: its stake is free at once
                    r.withdrawable_at = self.now
            assert tx.event("VerifierRegistered")["activeFrom"] == at
            self.activations[at] = self.activations.get(at, 0) + 1
            seat = SeatM(account.address, stake, stake, at)
            self.touched_verifiers.add(account.address)
            self.records[account.address] = seat
            self.history.append(seat)
            self.last_key = at

        def _do_exit(self, account: LocalAccount) -> None:
            seat = self.records.get(account.address)
            before = chain.balance(account.address)
            tx = self._run(
                lambda t: OK if seat is not None and seat.active_until == SEATED else "NotMember",
                lambda: vc.request_exit(account))
            if not tx:
                return
            assert seat is not None
            at = self._change_epoch(self.now)
            self._unseat(seat, at)
            assert tx.event("VerifierExitRequested") == {
                "verifier": account.address, "activeUntil": at,
                "withdrawableAt": seat.withdrawable_at}
            assert chain.balance(account.address) == before - tx.gas_cost

        def _do_unbond(self, account: LocalAccount) -> None:
            seat = self.records.get(account.address)
            before = chain.balance(account.address)

            def outcome(t: int) -> str:
                if seat is None or seat.withdrawable_at == 0:
                    return "NotExiting"
                return "UnbondingNotOver" if t < seat.withdrawable_at else OK

            tx = self._run(outcome, lambda: vc.withdraw_stake(account))
            if tx:
                assert seat is not None
                assert chain.balance(account.address) == before + seat.stake - tx.gas_cost
                del self.records[account.address]
                self.touched_verifiers.add(account.address)

        # -- rules: the single actions, on a drawn target ----------------------------------

        @initialize(n=st.integers(1, 5), size=st.integers(1, 3))
        def first_task(self, n: int, size: int) -> None:
            self._do_create(n, size, net.client, False, False)

        @precondition(lambda self: len(self.tasks) < MAX_TASKS)
        @rule(n=st.integers(1, 5), size=st.integers(1, 3), who=st.integers(0, 1),
              arbiter=st.booleans(), probation=st.booleans(), mask=st.sampled_from(MASKS),
              commitments=st.booleans())
        def create(self, n: int, size: int, who: int, arbiter: bool, probation: bool,
                   mask: int, commitments: bool) -> None:
            self._do_create(n, size, clients[who], arbiter, probation, mask, commitments)

        @precondition(lambda self: self._in(S.OPEN))
        @rule(i=st.integers(0, 50), who=st.sampled_from([0, 0, 1, 1, 2]))
        def claim(self, i: int, who: int) -> None:
            sh = choose(self._in(S.OPEN), i, lambda s: self.now < self.tasks[s.task_id].deadline)
            self._do_claim(sh, miner_accounts[who])

        @precondition(lambda self: self._in(S.OPEN))
        @rule(i=st.integers(0, 50), which=st.integers(0, 1))
        def claim_swarm(self, i: int, which: int) -> None:
            sh = choose(self._in(S.OPEN), i, lambda s: self.now < self.tasks[s.task_id].deadline)
            self._do_claim_swarm(sh, self.swarms[which])

        @precondition(lambda self: self._in(S.OPEN))
        @rule(i=st.integers(0, 50), n=st.integers(2, 3), who=st.sampled_from([0, 0, 1, 2]),
              repeat=st.sampled_from([False] * 7 + [True]))
        def claim_many(self, i: int, n: int, who: int, repeat: bool) -> None:
            """Several shards of one task in one transaction; sometimes one listed twice."""
            first = choose(self._in(S.OPEN), i,
                           lambda s: self.now < self.tasks[s.task_id].deadline)
            same = [sh for key, sh in sorted(self.shards.items()) if key[0] == first.task_id]
            picked = [first] + [sh for sh in same if sh is not first][:n - 1]
            if repeat:
                picked.append(first)
            self._do_claim_many(picked, miner_accounts[who])

        @precondition(lambda self: self._in(S.CLAIMED))
        @rule(i=st.integers(0, 50), seed=st.integers(0, 999), mode=st.sampled_from(MODES),
              impostor=st.sampled_from([False] * 7 + [True]))
        def submit(self, i: int, seed: int, mode: str, impostor: bool) -> None:
            sh = choose(self._in(S.CLAIMED), i, lambda s: self.now < s.claim_expiry)
            sender = account_of[sh.miner]
            if impostor:
                sender = next(m for m in miner_accounts if m.address != sh.miner)
            self._do_submit(sh, sender, seed, mode)

        @rule(seconds=st.sampled_from([1, 1, 5, 5, 31, 61, 121, 601, 3001]))
        def wait(self, seconds: int) -> None:
            self._jump(chain.timestamp() + seconds)

        @rule()
        def next_epoch(self) -> None:
            """Jump to the next epoch boundary (where scheduled joins and exits act): the
            next action is checked at its first second."""
            self._jump(epoch_start(epoch_of(chain.timestamp()) + 1))

        @precondition(lambda self: self._in(S.SUBMITTED, S.DISPUTED))
        @rule(i=st.integers(0, 50))
        def finalize(self, i: int) -> None:
            self._do_finalize(self._pick(i, S.SUBMITTED, S.DISPUTED))

        @precondition(lambda self: self._in(S.CLAIMED))
        @rule(i=st.integers(0, 50))
        def reclaim(self, i: int) -> None:
            self._do_reclaim(self._pick(i, S.CLAIMED))

        def _overdue(self) -> list[ShardM]:
            return [s for s in self._in(S.OPEN, S.CLAIMED)
                    if self.tasks[s.task_id].deadline <= self.now]

        @precondition(lambda self: self._overdue())
        @rule(i=st.integers(0, 50))
        def refund(self, i: int) -> None:
            self._do_refund(choose(self._in(S.OPEN, S.CLAIMED), i,
                                   lambda s: self.tasks[s.task_id].deadline <= self.now))

        def _cancellable(self) -> list[int]:
            """Tasks not cancelled with work in flight: the interesting (and rarer) case."""
            busy = {sh.task_id for sh in self._in(*LIVE)}
            return sorted(busy - {t for t, m in self.tasks.items() if m.cancelled})

        @precondition(lambda self: self._cancellable())
        @rule(i=st.integers(0, 50))
        def cancel(self, i: int) -> None:
            live = self._cancellable()
            self._do_cancel(live[i % len(live)])

        @precondition(lambda self: any(self.owed.values()))
        @rule(i=st.integers(0, 50))
        def withdraw(self, i: int) -> None:
            self._do_withdraw(choose(everyone, i, lambda a: self.owed[a.address] > 0))

        def _challenger(self, sh: ShardM, by: int) -> LocalAccount:
            """The client, its arbiter, an outsider, or a verifier (an auditor while it sits)."""
            task = self.tasks[sh.task_id]
            return [task.client, task.arbiter or task.client, net.outsider,
                    verifier_accounts[sh.start % len(verifier_accounts)]][by]

        def _challengeable(self, i: int) -> ShardM:
            """A Submitted or Disputed shard, mostly one still inside its window."""
            return choose(self._in(S.SUBMITTED, S.DISPUTED), i,
                          lambda s: s.state == S.SUBMITTED and self.now < s.window_end)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50), offset=st.integers(0, 3),
              by=st.sampled_from([0, 0, 0, 1, 1, 2, 3]), bond=st.sampled_from([0, 0, 0, 1, 2]))
        def challenge(self, i: int, offset: int, by: int, bond: int) -> None:
            sh = self._challengeable(i)
            self._do_challenge(sh, self._challenger(sh, by), sh.start + offset,
                               [min_av_bond, 2 * min_av_bond, min_av_bond - 1][bond])

        def _pick_challenge(self, i: int) -> ChallengeM:
            return choose([self.challenges[k] for k in sorted(self.challenges)], i,
                          lambda c: c.status == ChallengeStatus.OPEN)

        def _has_challenge(self, status: ChallengeStatus) -> bool:
            return any(c.status == status for c in self.challenges.values())

        def _has_dispute(self, status: DisputeStatus) -> bool:
            return any(d.status == status for d in self.disputes.values())

        @precondition(lambda self: self._has_challenge(ChallengeStatus.OPEN))
        @rule(i=st.integers(0, 50), tamper=st.sampled_from([0, 0, 0, 0, 1, 2]))
        def answer(self, i: int, tamper: int) -> None:
            self._do_answer(self._pick_challenge(i), tamper)

        @precondition(lambda self: self._has_challenge(ChallengeStatus.OPEN))
        @rule(i=st.integers(0, 50))
        def settle(self, i: int) -> None:
            self._do_settle(self._pick_challenge(i))

        def _target(self, sh: ShardM, j: int) -> int:
            """Request j of the shard; j == 0 aims at the bad receipt when there is one."""
            assert sh.work is not None
            if j == 0 and sh.work.bad is not None:
                return sh.work.bad
            return sh.start + j % (sh.end - sh.start)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50), j=st.integers(0, 3), by=st.sampled_from([0, 0, 0, 1, 1, 2, 3]),
              tamper=st.sampled_from([False] * 5 + [True]), bond=st.sampled_from([0, 0, 0, 1, 2]))
        def open_dispute(self, i: int, j: int, by: int, tamper: bool, bond: int) -> None:
            sh = self._challengeable(i)
            self._do_open_dispute(sh, self._challenger(sh, by), self._target(sh, j), tamper,
                                  [min_bond, 2 * min_bond, min_bond - 1][bond])

        def _pick_dispute(self, i: int, status: DisputeStatus) -> DisputeM:
            return choose([self.disputes[k] for k in sorted(self.disputes)], i,
                          lambda d: d.status == status)

        @precondition(lambda self: self._has_dispute(DisputeStatus.OPEN))
        @rule(i=st.integers(0, 50), mask=st.one_of(st.just(-1), st.integers(0, 1023)),
              fault=st.booleans(), stranger=st.sampled_from([False] * 7 + [True]))
        def vote(self, i: int, mask: int, fault: bool, stranger: bool) -> None:
            self._do_vote(self._pick_dispute(i, DisputeStatus.OPEN), mask, fault, stranger)

        @precondition(lambda self: self._has_dispute(DisputeStatus.OPEN))
        @rule(i=st.integers(0, 50))
        def expire(self, i: int) -> None:
            self._do_expire(self._pick_dispute(i, DisputeStatus.OPEN))

        @precondition(lambda self: self._has_dispute(DisputeStatus.EXPIRED))
        @rule(i=st.integers(0, 50), mask=st.one_of(st.just(-1), st.integers(0, 1023)),
              voter=st.sampled_from([False] * 5 + [True]))
        def report_absence(self, i: int, mask: int, voter: bool) -> None:
            """Report silent members of an expired dispute's committee (`voter`: also one
            that did vote, which must revert)."""
            d = self._pick_dispute(i, DisputeStatus.EXPIRED)
            absent = [m for k, m in enumerate(self._silent(d)) if mask >> k & 1]
            if voter and d.ballots:
                absent.append(sorted(d.ballots)[0])
            self._do_report_absence(d, absent)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50), j=st.integers(0, 3), by=st.sampled_from([0, 0, 0, 1, 2, 3]),
              wrong_ids=st.sampled_from([False, False, True]))
        def prove_billing(self, i: int, j: int, by: int, wrong_ids: bool) -> None:
            sh = self._challengeable(i)
            self._do_prove_billing(sh, self._challenger(sh, by), self._target(sh, j), wrong_ids)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50), j=st.integers(0, 3), by=st.sampled_from([0, 0, 0, 1, 2, 3]),
              forge=st.sampled_from([False, False, False, True]))
        def prove_sum(self, i: int, j: int, by: int, forge: bool) -> None:
            sh = self._challengeable(i)
            assert sh.work is not None
            lied = sorted(sh.work.lied)
            index = lied[j % len(lied)] if lied and j else sh.start + j % (sh.end - sh.start)
            self._do_prove_sum(sh, self._challenger(sh, by), index, forge)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50), seed=st.integers(0, 1023))
        def spend_challenge_budget(self, i: int, seed: int) -> None:
            sh = self._challengeable(i)
            self._do_spend_budget(sh, self._challenger(sh, 3 if seed % 4 else 1), seed)

        @rule(i=st.integers(0, 50), stake=st.sampled_from(stakes))
        def verifier_join(self, i: int, stake: int) -> None:
            self._do_join(choose(verifier_accounts, i, lambda a: a.address not in self.records),
                          stake)

        @precondition(lambda self: any(r.active_until == SEATED for r in self.records.values()))
        @rule(i=st.integers(0, 50))
        def verifier_exit(self, i: int) -> None:
            self._do_exit(choose(verifier_accounts, i, lambda a: a.address in self.records
                                 and self.records[a.address].active_until == SEATED))

        @precondition(lambda self: any(r.withdrawable_at for r in self.records.values()))
        @rule(i=st.integers(0, 50), patient=st.sampled_from([False, False, True]))
        def verifier_withdraw(self, i: int, patient: bool) -> None:
            """A leaving verifier takes its stake back; a `patient` one first waits for the
            bound verifier_info gives."""
            account = choose(verifier_accounts, i, lambda a: a.address in self.records
                             and self.records[a.address].withdrawable_at > 0)
            bound = vc.verifier_info(account.address).withdrawable_at
            if patient and bound > chain.timestamp():
                self._jump(bound)  # the withdrawal is checked at the bound itself
            self._do_unbond(account)

        @precondition(lambda self: net.outsider.address not in self.miners)
        @rule(precision=st.sampled_from(list(Precision)))
        def outsider_registers_as_miner(self, precision: Precision) -> None:
            """A fresh miner starts on probation: it may claim only tasks that allow it."""
            tx = self._run(lambda t: OK, lambda: q.gpu.register(
                net.outsider, [net.MODEL_ID], GpuSpec("g", 1, 1), "http://x", net.PRICE,
                net.MINER_STAKE, [precision]))
            assert tx is not None
            self.miners[net.outsider.address] = MinerM(net.MINER_STAKE, initial_rep,
                                                       probation_epochs > 0, 0, self.now,
                                                       precision=int(precision))

        @precondition(lambda self: self.miners)
        @rule(i=st.integers(0, 50), precision=st.sampled_from(list(Precision)))
        def declare_precision(self, i: int, precision: Precision) -> None:
            """A miner re-declares its precision: shards it holds keep the one they
            recorded, its next claims are made in the new one."""
            address = sorted(self.miners)[i % len(self.miners)]
            tx = self._run(lambda t: OK, lambda: q.gpu.update(
                account_of[address], [net.MODEL_ID], GpuSpec("g", 1, 1), "http://x",
                net.PRICE, [precision]))
            assert tx is not None
            assert tx.event("MinerUpdated")["precisions"] == [int(precision)]
            self.miners[address].precision = int(precision)
            self.touched |= {sh.key for sh in self._in(*LIVE) if sh.miner == address}

        @precondition(lambda self: epoch_of(self.now) >= self.next_report)
        @rule(back=st.integers(0, 1), mask=st.one_of(st.just(-1), st.integers(0, 1023)),
              scores=st.tuples(*[st.sampled_from([3000, 6000, 9000, 9000])] * 3))
        def report(self, back: int, mask: int, scores: tuple[int, int, int]) -> None:
            """A reputation report for this or the last epoch, signed by some of that epoch's
            committee: a quorum needs more than two thirds of its stake."""
            epoch = epoch_of(chain.timestamp() + 1) - back
            if epoch < 0:
                return
            addresses = tuple(sorted((m.address for m in miner_accounts),
                                     key=lambda a: int(a, 16)))  # ascending, each once
            rep = Report(epoch, addresses, scores, keccak(f"evidence {epoch}".encode()))
            signers = [m for k, m in enumerate(self._members_at(epoch)) if mask >> k & 1]
            sigs = quorum_signatures(rep, [keys[m] for m in signers], cid, vc.address)

            def outcome(t: int) -> str:
                if epoch > epoch_of(t):
                    return "WrongEpoch"
                if epoch < self.next_report:
                    return "ReportOutOfOrder"
                got = sum(self._weight_at(m, epoch) for m in signers)
                return OK if got >= self._total_at(epoch) * 2 // 3 + 1 else "QuorumNotReached"

            held = {a: q.gpu.reserve_of(a) for a in addresses}  # the reserves before the report
            tx = self._run(outcome, lambda: vc.submit_reputation(net.anyone, rep, sigs))
            if not tx:
                return
            self.next_report = epoch + 1
            for address, score in zip(addresses, scores, strict=True):
                m = self.miners.get(address)
                if m is None:
                    continue
                m.rep = score
                m.untrusted = m.untrusted + 1 if score < untrusted_bps else 0
                if m.untrusted > 1:  # a repeated untrusted report burns free stake, the reserve too
                    locked = sum(sh.collateral for sh in self._in(*LIVE) if sh.miner == address)
                    due = max(m.stake * untrusted_slash_bps // BPS, held[address])
                    self._slash(address, min(due, m.stake - locked), burn)
                if not m.on_probation or epoch_start(epoch) < m.registered_at:
                    continue
                if score < pass_bps:
                    m.passed = 0
                else:
                    m.passed += 1
                    m.on_probation = m.passed < probation_epochs

        # -- a rule that carries one shard along its life cycle ----------------------------

        def _open_challenge(self, key: tuple[int, int]) -> ChallengeM | None:
            return next((c for c in self.challenges.values()
                         if c.key == key and c.status == ChallengeStatus.OPEN), None)

        def _open_dispute(self, key: tuple[int, int]) -> DisputeM:
            return next(d for d in self.disputes.values()
                        if d.key == key and d.status == DisputeStatus.OPEN)

        @rule(i=st.integers(0, 50), k=st.integers(0, 11), seed=st.integers(0, 1023))
        def advance(self, i: int, k: int, seed: int) -> None:
            self._advance(i, k, seed)

        def _advance(self, i: int, k: int, seed: int) -> None:
            """Move one unfinished shard along its life cycle: claim (or refund when overdue);
            submit (or reclaim when expired) and go on at once, inside the short window, to a
            challenge, a dispute or a billing proof (or finalize after the window); answer or
            settle a challenge; vote on a dispute, or let it expire and report the absent.
            Windows are waited out where the step needs it. Swarm testing turns random subsets
            of rules off per example, so flows made only of single-action rules would rarely
            complete."""
            live = self._in(*UNSETTLED)
            if not live:
                if len(self.tasks) < MAX_TASKS:
                    self._do_create(1 + seed % 5, 1 + k % 3, clients[k % 2], bool(seed & 1),
                                    bool(seed & 2))
                return
            sh = live[i % len(live)]
            for j in range(1 + seed % 3):  # up to three steps in a row
                if sh.state not in UNSETTLED:
                    break
                self._step(sh, (k + 5 * j) % 12, seed >> j)

        # The life cycles are what the invariants are mostly about: under three names the
        # rule is enabled in most examples and drawn about as often as the others together.
        @rule(i=st.integers(0, 50), k=st.integers(0, 11), seed=st.integers(0, 1023))
        def advance_more(self, i: int, k: int, seed: int) -> None:
            self._advance(i, k, seed)

        @rule(i=st.integers(0, 50), k=st.integers(0, 11), seed=st.integers(0, 1023))
        def advance_again(self, i: int, k: int, seed: int) -> None:
            self._advance(i, k, seed)

        def _until(self, t: int) -> None:
            """Let the next action be checked at time `t` exactly (at once when that is past)."""
            if t > chain.timestamp():
                self._jump(t)

        def _step(self, sh: ShardM, k: int, seed: int) -> None:
            task = self.tasks[sh.task_id]
            if sh.state == S.OPEN and self.now >= task.deadline:
                self._do_refund(sh)
            elif sh.state == S.OPEN and k % 3 == 1:  # a third of the claims by a swarm
                self._do_claim_swarm(sh, self.swarms[(k // 3) % 2])
            elif sh.state == S.OPEN:
                outsider = task.allow_probation and k % 3 == 2
                self._do_claim(sh, net.outsider if outsider else [net.miner, net.miner2][k % 2])
            elif sh.state == S.CLAIMED and (self.now >= sh.claim_expiry
                                            or (sh.swarm is not None and k % 4 == 0)):
                self._until(sh.claim_expiry)  # a head that lets its swarm's claim expire
                self._do_reclaim(sh)
            elif sh.state == S.CLAIMED:
                self._do_submit(sh, account_of[sh.miner], seed, MODES[k % len(MODES)])
            elif sh.state == S.SUBMITTED and (k % 4 == 3 or self.now >= sh.window_end):
                self._until(sh.window_end)
                self._do_finalize(sh)
            elif sh.state == S.SUBMITTED:
                who = self._challenger(sh, k % 2)
                assert sh.work is not None
                if sh.work.bad is not None and seed % 2 == 0:
                    self._do_prove_billing(sh, who, sh.work.bad, False)
                elif sh.work.lied and seed % 4 < 3:
                    lied = sorted(sh.work.lied)
                    self._do_prove_sum(sh, who, lied[seed % len(lied)], False)
                elif k % 4 == 0 and seed % 4 == 2:
                    self._do_spend_budget(sh, self._challenger(sh, 3), seed)
                elif k % 4 == 0:
                    self._do_challenge(sh, who, sh.start + seed % (sh.end - sh.start),
                                       min_av_bond)
                elif k % 4 == 1:
                    self._do_open_dispute(sh, who, self._target(sh, seed % 4), False, min_bond)
                else:
                    self._do_prove_billing(sh, who, self._target(sh, 0), False)
            elif (c := self._open_challenge(sh.key)) is not None:
                if k % 3 < 2 and self.now < c.deadline:
                    self._do_answer(c, 0)
                else:
                    self._until(c.deadline)
                    self._do_settle(c)
            else:
                d = self._open_dispute(sh.key)
                if k % 3 < 2 and self.now < d.deadline:
                    self._do_vote(d, -1 if k % 3 == 0 else seed, bool(seed & 1), False)
                else:
                    self._until(d.deadline)
                    self._do_expire(d)
                    self._do_report_absence(d, self._silent(d))

        # -- invariants --------------------------------------------------------------------

        # Each invariant asks for its reads in one JSON-RPC batch (`Chain.read`): they run
        # after every step, and one round trip each instead of dozens took the test's CPU
        # time from 133 to 81 s.

        @invariant()
        def escrow_balance_is_escrowed_plus_withdrawable(self) -> None:
            total_escrowed, total_withdrawable, balance, *escrowed = chain.read([
                q.escrow.fn("totalEscrowed"), q.escrow.fn("totalWithdrawable"),
                lambda eth: eth.get_balance(q.escrow.address),
                *(q.escrow.fn("escrowed", t) for t in self.tasks)])
            assert balance == total_escrowed + total_withdrawable
            per_task = dict(zip(self.tasks, escrowed, strict=True))
            assert sum(per_task.values()) == total_escrowed
            for task_id, amount in per_task.items():
                assert amount == self._escrow_of(task_id), task_id

        @invariant()
        def withdrawable_is_the_model(self) -> None:
            """Every credit of the step went to whom the model says, to the wei."""
            touched = sorted(self.touched_accounts)
            total, *each = chain.read([q.escrow.fn("totalWithdrawable"), *(
                q.escrow.fn("withdrawable", to_checksum_address(who)) for who in touched)])
            assert total == self.owed_base + sum(self.owed.values())
            for who, amount in zip(touched, each, strict=True):
                assert amount == self.owed[who], who
            self.touched_accounts = set()

        @invariant()
        def arbitration_holds_the_open_bonds(self) -> None:
            bonds = sum(d.bond for d in self.disputes.values() if d.status == DisputeStatus.OPEN)
            bonds += sum(c.bond for c in self.challenges.values()
                         if c.status == ChallengeStatus.OPEN)
            assert chain.balance(q.arbitration.address) == bonds

        @invariant()
        def committee_holds_the_stakes(self) -> None:
            """Its balance is the stakes of the verifiers registered and not withdrawn; their
            records (and those of any verifier the step touched: every one at teardown) and the
            snapshots (members and total weight now and at the next boundary) are the model's."""
            seen = sorted(set(self.records) | self.touched_verifiers)
            balance, epoch, members, *raw = chain.read([
                lambda eth: eth.get_balance(vc.address), vc.fn("currentEpoch"), vc.fn("members"),
                *(vc.fn("verifierInfo", to_checksum_address(who)) for who in seen)])
            infos = {who: as_struct(VerifierInfo, r) for who, r in zip(seen, raw, strict=True)}
            assert balance == sum(infos[who].stake for who in self.records)
            for who, info in infos.items():
                seat = self.records.get(who)
                expected = (0, 0, 0, 0, 0) if seat is None else (
                    seat.stake, seat.weight, seat.active_from, seat.active_until,
                    seat.withdrawable_at)
                got = (info.stake, info.weight, info.active_from, info.active_until,
                       info.withdrawable_at)
                assert got == expected, who
            self.touched_verifiers = set()
            assert [to_checksum_address(m) for m in members] == self._members_at(epoch)
            totals = chain.read([vc.fn("totalWeightAt", e) for e in (epoch, epoch + 1)])
            for e, total in zip((epoch, epoch + 1), totals, strict=True):
                assert total == self._total_at(e), e

        @invariant()
        def registry_holds_the_miner_stakes(self) -> None:
            """Its balance is the miners' stakes; each miner's locked collateral is exactly
            that of its Claimed, Submitted and Disputed shards."""
            n = len(miner_accounts)
            balance, *raw = chain.read([
                lambda eth: eth.get_balance(q.gpu.address),
                *(q.gpu.fn("minerInfo", m.address) for m in miner_accounts),
                *(q.gpu.fn("reserveOf", m.address) for m in miner_accounts)])
            infos = {m.address: as_struct(MinerInfo, r)
                     for m, r in zip(miner_accounts, raw[:n], strict=True)}
            reserves = dict(zip(infos, raw[n:], strict=True))
            assert balance == sum(i.stake for i in infos.values())
            for who, info in infos.items():
                locked = sum(sh.collateral for sh in self._in(*LIVE) if sh.miner == who)
                assert info.locked == locked, who
                # the reserve fits in the free stake: no slash to a client or voter is cut short
                assert reserves[who] <= info.stake - info.locked, who
                m = self.miners.get(who)
                if m is None:
                    assert not info.active
                else:
                    assert (info.stake, info.reputation_bps, info.on_probation,
                            info.passed_epochs, info.registered_at) == (
                        m.stake, m.rep, m.on_probation, m.passed, m.registered_at), who

        @invariant()
        def mirror_matches_chain(self) -> None:
            """The shards the last step touched (every shard at teardown)."""
            for key in sorted(self.touched):
                sh, got = self.shards[key], q.tasks.get_shard(*key)
                assert got.state == sh.state, key
                if sh.state in (*LIVE, S.FINALIZED):
                    assert (got.miner, got.collateral, got.claim_expiry, got.precision) == (
                        sh.miner, sh.collateral, sh.claim_expiry, sh.precision), key
                if sh.state == S.OPEN:
                    assert got.precision == 0, key
                if sh.state in (S.SUBMITTED, S.DISPUTED, S.FINALIZED):
                    assert sh.work is not None
                    assert (got.window_end, got.tokens_used, got.result_root) == (
                        sh.window_end, sh.work.tokens_used, sh.work.root), key
            self.touched = set()

        @invariant()
        def disputes_and_challenges_match(self) -> None:
            for did in sorted(self.touched_disputes):
                d, got = self.disputes[did], q.arbitration.get_dispute(did)
                assert (got.status, got.fault_weight, got.no_fault_weight) == (
                    d.status, d.tally(True), d.tally(False)), did
                for fault in (True, False):
                    assert q.arbitration.voters_of(did, fault) == [v for v, _ in d.voters[fault]]
            for c_id in sorted(self.touched_challenges):
                assert q.arbitration.get_challenge(c_id).status == self.challenges[c_id].status
            self.touched_disputes = set()
            self.touched_challenges = set()

    # A pinned seed, not derandomize's digest of the machine's source: otherwise every edit of
    # a rule reshuffles the fixed examples and with them the paths asserted as reached below.
    return seed(1)(MarketMachine)


@contextmanager
def fixed_clock(net: Devnet) -> Iterator[None]:
    """The session's Anvil as the machine needs it, restored afterwards: blocks exactly a
    second apart (Anvil's block timestamp interval; waits set the next block's time), so
    chain time follows from the actions alone, not the wall clock, and a failing example
    replays and shrinks to the same history; and eth_chainId cached, which web3's validation
    middleware asks before every call (each of the machine's thousands of reads is then one
    round trip)."""
    provider = net.chain.w3.provider
    saved = provider.cache_allowed_requests, provider.cacheable_requests
    provider.cache_allowed_requests = True
    provider.cacheable_requests = {RPCEndpoint("eth_chainId")}
    net.chain.rpc("anvil_setBlockTimestampInterval", [1])
    try:
        yield
    finally:
        net.chain.rpc("anvil_removeBlockTimestampInterval")
        provider.cache_allowed_requests, provider.cacheable_requests = saved


def test_market_invariants_under_random_histories(devnet: Devnet) -> None:
    REACHED.clear()
    with fixed_clock(devnet):
        run_state_machine_as_test(make_machine(devnet, REACHED), settings=settings(
            max_examples=14, stateful_step_count=60, deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ))
    print(dict(sorted(REACHED.items())))
    # issue 29: availability challenges, sum-lie proofs and swarm shards (faults included)
    # are reached (derandomized: fixed; the rarer outcomes printed above vary with the rules)
    for path in ("prove_sum:ok", "challenge:ok", "challenge:TooManyChallenges",
                 "challenge after another spent its budget", "answer:ok", "swarm claim",
                 "swarm pay", "swarm fault", "swarm reclaim"):
        assert REACHED[path] > 0, (path, REACHED)
