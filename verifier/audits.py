"""Audits of client traffic: the committee re-scores a random sample of client shards while
their challenge windows are open, so a miner honest only on the committee's challenges is
still caught on the work clients pay for.

`AuditDesk.step()` is one pass of the loop `verifier run` drives. While this verifier sits
in the current committee it:

1. reads the `ResultSubmitted` events since it last looked;
2. draws each submitted shard: audited when `audit_draw(audit_seed(hash of the
   submission's block, taskId, shard)) < audit_rate(...)`, the shard's rate by the rule every
   member computes alike from the chain (the client's paid rate, the miner's history, the
   shard's budget: see `audit_rate`). The block hash is fixed only
   once the submission is mined, so the miner cannot know, when it decides how to serve a
   shard, whether it will be audited (a miner that also produces the block could grind
   it; on a public chain use a later block's RANDAO value);
3. judges every drawn shard of a task over its own model with `verifier.shards.ShardJudge`
   (the miner's own document, all of the shard's outputs, `verifier.scoring.judge`);
4. disputes a failing shard at once, as an auditor (Arbitration lets any sitting member
   dispute, at its own bond), naming its most suspicious output. Every honest member finds
   the same failure; to spare the others' bonds and gas they take turns: members are ranked
   by a hash of the draw and their address, and the member of rank r acts only `r *
   stagger_s` seconds after the submission if the shard is still undisputed. A withheld
   document is challenged for availability first (unanswered: the miner is slashed when
   the challenge is settled; answered but still withheld: disputed).

The committee then judges the dispute like any other, and an at-fault verdict counts in
the miner's reputation (`verifier.committee`). A passing audit costs the miner nothing; a
failing one costs the shard's budget, its collateral and (being a fault) an abnormal epoch.

Every shard the draw picks at the chain's base rate (VerifierCommittee.BASE_AUDIT_RATE_BPS,
whatever rate this desk audits at), passed or failed, also joins its miner's epoch
evidence: the report of the epoch after the submission's pools its outputs with the
miner's challenge answer (`audited`, `verifier.committee.CommitteeMember.pooled_shards`),
so a cheat too subtle for one shard still adds up. The draw is on public chain data, so
every member pools the same shards; an honest miner's pooled evidence keeps the
committee's 1e-6 bound (`verifier.scoring`'s module doc).
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address

from market.chain.contracts import ChallengeStatus, ShardState
from market.errors import QuarryError
from market.jobs import (
    DisputeNotPossible,
    challenge_availability,
    challenge_info,
    open_dispute,
    wait_challenge,
)
from market.logs import log_context
from market.marketapi import MarketAPI
from verifier import metrics
from verifier.shards import DisputeDeferred, ShardJudge, ShardVerdict

if TYPE_CHECKING:
    from market.chain.deploy import Quarry
    from verifier.scoring_worker import ScoringClient

log = logging.getLogger("verifier.audits")

AUDIT_DOMAIN = b"quarry-audit-v1\x00"
BPS = 10_000
DEFAULT_AUDIT_RATE_BPS = 1000
"""One client shard in ten: see the README's audit arithmetic for what that costs a cheat.
VerifierCommittee.BASE_AUDIT_RATE_BPS is the same rate: clients pay only for more."""
YOUNG_EPOCHS = 24
"""A miner registered fewer committee epochs ago than this (public: one day) is audited as if
each of its shards were `YOUNG_WEIGHT`."""
YOUNG_WEIGHT = 4
"""How many shards a young miner's shard counts for: 1 - 0.9^4 = 0.344 at the base rate, so
a fresh identity cheating on 5% of 32 shards an epoch is caught within 3 epochs with
probability 0.81 (0.60 at two shards, 0.38 at the base rate). A fresh identity has the least
reputation and future income to lose; an honest one loses nothing to a passing audit, and
its audited shards, pooled into its epoch evidence, only add evidence that keeps the 1e-6
bound."""
TYPICAL_WINDOW = 256
"""How many of the latest submissions set the typical shard budget (their median)."""
MAX_WEIGHT = 64
"""The most shards one shard counts for (0.9^64: already audited at 99.9%)."""


def compound_rate(rate_bps: int, k: int) -> int:
    """The chance (bps, rounded up) that at least one of `k` shards drawn at `rate_bps` each
    is audited: 1 - (1 - a)^k, in integers so every member gets the same number."""
    k = max(1, min(int(k), MAX_WEIGHT))
    return BPS - (BPS - rate_bps) ** k // BPS ** (k - 1)


def audit_rate(base_bps: int, paid_bps: int, *, epochs_registered: int, budget: int,
               typical_budget: int) -> int:
    """The audit rate (bps) of one submitted shard, which every honest member computes alike
    from public on-chain data:

    1. a = max(the task's paid rate (VerifierCommittee.auditRateOf at the submission's block),
       the base rate): a client buys more scrutiny for its own task, never less;
    2. a miner registered fewer than `YOUNG_EPOCHS` committee epochs before the submission
       counts each shard `YOUNG_WEIGHT` (4) times: a = 1 - (1 - a)^4. A fresh identity has
       the least reputation and future income to lose, and re-registering after capture is
       the cheap way back;
    3. a shard whose budget is k >= 2 times the typical one (the median budget of the
       `TYPICAL_WINDOW` submissions before it) counts as k shards: a = 1 - (1 - a)^k. Detection
       grows with the number of cheated shards, not their value, so without this a cheater
       would put its cheating into a few large shards; with it, each wei cheated is about as
       likely to be audited in one large shard as spread over k typical ones;
    4. capped at 100% (by construction).

    An audit of an honest shard passes and costs its miner nothing, so raising the rate never
    hurts an honest miner, however young or large its shards."""
    rate = max(int(paid_bps), int(base_bps))
    if epochs_registered < YOUNG_EPOCHS:
        rate = compound_rate(rate, YOUNG_WEIGHT)
    if typical_budget > 0 and budget >= 2 * typical_budget:
        rate = compound_rate(rate, budget // typical_budget)
    return min(rate, BPS)


def audit_seed(block_hash: bytes, task_id: int, shard: int) -> bytes:
    """The draw's randomness for one submitted shard: fixed once its block is mined."""
    return keccak(AUDIT_DOMAIN + bytes(block_hash) + int(task_id).to_bytes(32, "big")
                  + int(shard).to_bytes(4, "big"))


def audit_draw(seed: bytes) -> int:
    """A number in [0, 10000) from an `audit_seed`: the shard is audited when it is below
    the audit rate (bps)."""
    return int.from_bytes(seed[:8], "big") % BPS


def audit_rank(seed: bytes, member: str, members: list[str]) -> int:
    """This member's turn among `members` for acting on a failed audit (0 acts first)."""
    order = sorted(members, key=lambda m: keccak(seed + bytes.fromhex(m[2:].lower())))
    return order.index(member) if member in order else len(order)


@dataclass
class AuditCase:
    """One drawn shard: where its audit stands (`status`: pending, passed, failed, disputed,
    challenged, settled, closed) and what this member did."""

    task_id: int
    shard: int
    seed: bytes
    submitted_at: int
    status: str = "pending"
    reason: str = ""
    dispute_id: int | None = None
    challenge_id: int | None = None
    answered: bool = False  # an availability challenge of ours was answered
    verdict: ShardVerdict | None = None  # the failed judgement, kept to act on it


@dataclass(frozen=True)
class Pooled:
    """A submitted shard the audit rule draws at the chain's base rate: its outputs join
    its miner's evidence in the report of the epoch after its submission."""

    task_id: int
    shard: int
    miner: str
    submitted_at: int  # its block's timestamp


class AuditDesk:
    """One committee member's audits of client traffic (see the module doc)."""

    def __init__(self, q: Quarry, account: LocalAccount, market: MarketAPI,
                 scorer: ScoringClient, *, rate_bps: int = DEFAULT_AUDIT_RATE_BPS,
                 model_id: bytes | None = None,
                 stagger_s: int = 3, on_event: Callable[[str], None] | None = None) -> None:
        if isinstance(rate_bps, bool) or not isinstance(rate_bps, int) \
                or not 0 <= rate_bps <= BPS:
            raise QuarryError(f"audit rate must be 0..10000 bps, got {rate_bps!r}")
        self.q, self.account, self.market = q, account, market
        self.me = to_checksum_address(account.address)
        self.rate_bps = rate_bps
        self.stagger_s = stagger_s
        self.judge = ShardJudge(q, market, scorer,
                                model_id=model_id)
        self.on_event = on_event or (lambda line: log.info("%s", line))
        self.cases: dict[tuple[int, int], AuditCase] = {}
        self.drawn = 0  # shards this desk has drawn (audited or not)
        self.rates: dict[tuple[int, int], int] = {}  # each drawn shard's rate (bps)
        self.pool: dict[tuple[int, int], Pooled] = {}  # drawn at the chain's base rate
        self._chain_base: int | None = None
        self._budgets: deque[int] = deque(maxlen=TYPICAL_WINDOW)  # latest submissions'
        self._epochs: tuple[int, int] | None = None  # the committee's genesis, epoch length
        self._scan_from = q.deployment.deploy_block

    def step(self) -> None:
        """Draw the new submissions, then move every open audit one step."""
        self._discover()
        epoch = self.q.committee.current_epoch()
        if self.q.committee.weight_at(self.me, epoch) == 0:
            return  # audits are a sitting member's duty (and right)
        now = self.q.chain.timestamp()
        for case in list(self.cases.values()):
            if case.status in ("passed", "disputed", "settled", "closed"):
                continue
            # What the audit logs (its events too, with the default `on_event`) names the
            # shard.
            with log_context(task=case.task_id, shard=case.shard):
                try:
                    self._advance(case, now, epoch)
                except DisputeDeferred as exc:
                    log.info("audit of task %d shard %d deferred: %s", case.task_id,
                             case.shard, exc)
                except QuarryError as exc:
                    log.warning("audit of task %d shard %d: %s", case.task_id, case.shard,
                                exc)

    # ------------------------------------------------------------------ internals
    def _discover(self) -> None:
        head = self.q.chain.block_number()
        if head < self._scan_from:
            return
        w3 = self.q.chain.w3
        for ev in self.q.tasks.events("ResultSubmitted", self._scan_from):
            key = (int(ev["taskId"]), int(ev["shard"]))
            if key in self.rates:  # seen: a block mined after `head` is read again next time,
                continue           # and counting its budget twice would move the rates
            block = w3.eth.get_block(int(ev["blockNumber"]))
            seed = audit_seed(bytes(block["hash"]), *key)
            self.drawn += 1
            rate, base_rate = self._rate(key, ev, block)
            self.rates[key] = rate
            if audit_draw(seed) < base_rate:
                self.pool[key] = Pooled(*key, miner=to_checksum_address(str(ev["miner"])),
                                        submitted_at=int(block["timestamp"]))
            if audit_draw(seed) >= rate:
                continue
            self.cases[key] = AuditCase(*key, seed=seed, submitted_at=int(block["timestamp"]))
        self._scan_from = head + 1

    def audited(self, start: int, end: int) -> list[Pooled]:
        """The shards the audit rule draws at the chain's base rate
        (VerifierCommittee.BASE_AUDIT_RATE_BPS, whatever this desk's own) whose submission's
        block is stamped in [start, end), by (task, shard): what the committee pools into
        its miners' epoch evidence, the same for every member. Read up to the chain's head
        first, so a closed window is complete."""
        self._discover()
        return [p for key, p in sorted(self.pool.items()) if start <= p.submitted_at < end]

    def _rate(self, key: tuple[int, int], ev: dict[str, Any], block: Any) -> tuple[int, int]:
        """`audit_rate` of one submission, from the chain as of its block, at this desk's
        base rate and at the chain's; the events come in chain order from the deployment
        on, so every member sees the same window of budgets before it."""
        q, (task_id, shard) = self.q, key
        budget = q.tasks.shard_budget(task_id, shard)
        typical = int(statistics.median_low(self._budgets)) if self._budgets else budget
        self._budgets.append(budget)
        registered = q.gpu.miner_info(str(ev["miner"]), block=int(block["number"])).registered_at
        if self._epochs is None:  # fixed at deployment
            self._epochs = (q.committee.genesis_time(), q.committee.epoch_duration())
        genesis, length = self._epochs
        epochs = (int(block["timestamp"]) - genesis) // length \
            - (max(registered, genesis) - genesis) // length
        paid = q.committee.audit_rate_of(task_id, block=int(block["number"]))
        if self._chain_base is None:  # a contract constant
            self._chain_base = q.committee.base_audit_rate_bps()

        def at(base: int) -> int:
            return audit_rate(base, paid, epochs_registered=epochs, budget=budget,
                              typical_budget=typical)

        return at(self.rate_bps), at(self._chain_base)

    def _advance(self, case: AuditCase, now: int, epoch: int) -> None:
        if case.challenge_id is not None:
            self._follow_challenge(case)
            return
        shard = self.q.tasks.get_shard(case.task_id, case.shard)
        if shard.state != ShardState.SUBMITTED or now >= shard.window_end:
            case.status, case.reason = "closed", f"shard {shard.state.name.lower()}"
            return
        if case.status == "pending":
            task = self.q.tasks.get_task(case.task_id)
            if task.model_id != self.judge.model_id:
                case.status, case.reason = "closed", "another model"
                return
            verdict = self.judge.judge(case.task_id, case.shard)
            metrics.AUDITS.labels("failed" if verdict.fault else "passed").inc()
            if not verdict.fault:
                case.status, case.reason = "passed", verdict.reason
                self.on_event(f"audit of task {case.task_id} shard {case.shard} "
                              f"(miner {shard.miner}): {verdict.reason}")
                return
            case.status, case.reason, case.verdict = "failed", verdict.reason, verdict
            self.on_event(f"audit of task {case.task_id} shard {case.shard} (miner "
                          f"{shard.miner}) FAILED: {verdict.reason}")
        members = sorted(self.q.committee.weights_at(epoch), key=lambda a: int(a, 16))
        rank = audit_rank(case.seed, self.me, members)
        if now < case.submitted_at + rank * self.stagger_s:
            return  # another member's turn first
        assert case.verdict is not None
        self._act(case, case.verdict)

    def _act(self, case: AuditCase, verdict: ShardVerdict) -> None:
        try:
            if verdict.withheld and not case.answered:
                case.challenge_id = challenge_availability(self.q, self.account, case.task_id,
                                                           verdict.start)
                case.status = "challenged"
                metrics.AUDITS.labels("challenged").inc()
                with log_context(challenge=case.challenge_id):
                    self.on_event(f"audit: challenged the availability of task "
                                  f"{case.task_id} shard {case.shard} (challenge "
                                  f"{case.challenge_id})")
                return
            index = verdict.most_suspicious()
            case.dispute_id = open_dispute(self.q, self.account, self.market, case.task_id,
                                           index)
        except DisputeNotPossible as exc:  # another member was first, or the window closed
            case.status, case.reason = "closed", str(exc)
            return
        case.status = "disputed"
        metrics.AUDITS.labels("disputed").inc()
        with log_context(dispute=case.dispute_id):
            self.on_event(f"audit: disputed task {case.task_id} shard {case.shard} at request "
                          f"{index} (dispute {case.dispute_id})")

    def _follow_challenge(self, case: AuditCase) -> None:
        """Settle this desk's availability challenge once unanswered past its deadline; an
        answered one is judged again (a document still withheld is then disputed)."""
        assert case.challenge_id is not None
        info = challenge_info(self.q, case.challenge_id)
        if info.status == ChallengeStatus.OPEN:
            if self.q.chain.timestamp() < info.deadline:
                return
            info = wait_challenge(self.q, info.challenge_id, settle_as=self.account)
        if info.status == ChallengeStatus.UNANSWERED:
            case.status, case.reason = "settled", info.outcome()
            self.on_event(f"audit: availability challenge {case.challenge_id} unanswered: "
                          f"{info.outcome()}")
        elif info.status == ChallengeStatus.ANSWERED:
            # Judge the shard again: a document still withheld is now disputed, the
            # answered receipt being the disputed one.
            case.challenge_id, case.status, case.answered = None, "pending", True
