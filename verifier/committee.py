"""One committee member's epoch protocol (PlanetServe section 3.4, on Quarry's contracts).

`CommitteeMember.step()` is called in a loop by `verifier run`; every decision is taken from
the chain and the signed messages on the market's relay, so a restarted verifier picks up
where it was (what it signed is kept in its state file and it never signs two reports for
one epoch). A member acts only in the epochs whose committee snapshot holds it: a verifier
that registered waits for the boundary its seat takes effect at. In epoch e:

1. Challenge set for e+1. The proposer (leader of e, then the next member every quarter
   epoch if no set is committed yet) draws fresh prompts for every eligible miner (miners on
   probation included), each job shaped like a client task on-chain up to a block of epoch e
   (`challenges.draw_shapes`), and posts them; each member checks the set (every eligible
   miner, distinct prompts, the shapes its seed gives over the same client tasks) and signs
   `ChallengeSet(e+1, hash)`; any member holding signatures of e's committee that weigh a
   quorum commits it.
2. Challenges of e. The leader (`leaderOf(e)` read at the block that committed set e) posts
   each miner's challenge as a directed paid task (open to a miner on probation) from a fresh
   address, collects the signed answers, scores them and posts a proposal once every answer
   is in or its answer window (`challengeAnswerWindow`, from the task's creation) has passed:
   a challenge posted late in epoch e keeps its whole window, and the report then finishes
   in epoch e+1 (challenges are posted only during e, and the window is shorter than an
   epoch). Each answer is judged pooled with the miner's carried evidence and with its
   client shards submitted during epoch e-1 that the audit rule drew at the chain's base
   rate (`pooled_shards`, named in the proposal); an answer that fails alone is disputed.
   A miner that committed a result root but published no document is challenged to show it
   on-chain (availability challenge): unanswered it is slashed, answered it is disputed.
3. Every member fetches and checks the same answers, re-scores them (pooled with the audited
   shards it finds by the same rule) on its own scorers and posts an observation: its
   scores, and the missing answers it confirms on-chain (not submitted, window over).
4. The leader builds the report: new reputations from the previous evidence and the proposed
   scores; `MISSED` (unavailability, not a score: GPURegistry keeps the reputation and counts
   the miss) for a missing answer that members holding more than a third of the epoch's
   weight confirmed, and for every miner that let an availability challenge go unanswered
   during epoch e-1; a score of 0 for every miner found at fault on-chain during epoch e-1
   (a dispute resolved at fault, whoever opened it: a client, an arbiter or an auditor of
   client traffic; a proven billing fault), read from the chain by every member alike:
   proof, not noise, so its reputation lands under the untrusted line at once.
   Evidence goes to the store (evidenceRoot = its sha256).
5. Members co-sign the report only if every score is within the tolerance of their own, the
   pooled shards and the carried evidence are their own, and the reputations follow from
   the rules; any member holding signatures of e's committee that weigh a quorum submits
   it. Reports go in epoch order: once a newer epoch is
   reported, older ones are closed. Steps 2 to 5 of epoch e may finish early in e+1.

Quorums are by stake: the signers' summed weight in the epoch's snapshot must reach
`quorumWeight(epoch)`, never a head count. A leader that withholds or lies gets no quorum,
so only its epoch fails; the next leader carries on. Two different report signatures of one
verifier for one epoch, seen on the relay, are submitted as an equivocation proof.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eth_account import Account
from eth_utils import encode_hex, to_checksum_address

from market import jsonsafe
from market.chain.contracts import MISSED_BPS, ChallengeStatus, ShardState
from market.chain.errors import ContractRevert
from market.errors import QuarryError
from market.logs import log_context
from market.protocol.canonical import canonical_json_bytes
from market.protocol.eip712 import ChallengeSet as ChallengeSetStruct
from market.protocol.eip712 import Report, SignatureError, sort_signatures
from market.protocol.messages import (
    MalformedMessage,
    committee_message,
    recover_committee_message,
)
from market.protocol.results import ResultCheckFailed
from market.store import ContentNotFound, StoreError
from verifier import metrics
from verifier.challenges import (
    Answer,
    Challenge,
    ChallengeSet,
    ChallengeSetInvalid,
    Claimable,
    PostedChallenge,
    Terms,
    check_challenge_set,
    claimable_at,
    client_jobs,
    collect_answer,
    draw_challenge_set,
    drawable,
    eligible_miners,
    post_challenge,
)
from verifier.reputation import MinerRecord, ReputationParams, update
from verifier.scoring import EVIDENCE_WIDTH, ChallengeScore, judge
from verifier.shards import DisputeDeferred

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.deploy import Quarry
    from market.marketapi import MarketAPI
    from verifier.audits import AuditDesk
    from verifier.scoring_worker import ScoringClient

Pool = dict[str, list[tuple[int, int]]]
"""Per miner, the audited (taskId, shard)s whose outputs join its epoch evidence."""

log = logging.getLogger("verifier")

BPS = 10_000
SET_PROPOSAL, SET_SIGNATURE = "set-proposal", "set-signature"
EPOCH_PROPOSAL, OBSERVATION, REPORT_SIGNATURE = "epoch-proposal", "observation", "report-signature"


@dataclass(frozen=True)
class EpochTiming:
    """Where the leader stops waiting, as shares of the epoch (answers are waited for by
    their own window, `challengeAnswerWindow`)."""

    report_at: float = 0.9   # the report is built even if some observations are missing
    set_slot: float = 0.25   # a set proposer's turn before the next member's


@dataclass
class _State:
    """What this member did, kept on disk so a restart never signs twice."""

    signed_reports: dict[str, str] = field(default_factory=dict)   # epoch -> digest
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # epoch -> set JSON
    proposed_sets: list[str] = field(default_factory=list)          # "epoch:slot"
    posted: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    disputed: list[int] = field(default_factory=list)               # task ids
    # task id -> {"epoch", "challengeId", "index", "status", ["disputeId"]}: availability
    # challenges of withheld answers (status open / unanswered / disputed / published /
    # failed), so a restart never challenges or disputes twice
    availability: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """An epoch's committee as the contract counts it: each member's weight and the least
    summed signer weight that is a quorum (more than 2/3 of the total)."""

    epoch: int
    weights: Mapping[str, int]
    quorum: int

    @property
    def members(self) -> list[str]:
        return sorted(self.weights, key=lambda a: int(a, 16))

    @property
    def total(self) -> int:
        return sum(self.weights.values())

    def weight_of(self, signers: Iterable[str]) -> int:
        return sum(self.weights.get(s, 0) for s in set(signers))

    def reached(self, signers: Iterable[str]) -> bool:
        return self.weight_of(signers) >= self.quorum


ROTATE_ERRORS = ("QuorumNotReached", "NotCommitteeMember")
"""Reverts that mean a cached snapshot overstated someone's weight (slashed since)."""


class CommitteeMember:
    """A verifier's part in the committee; see the module docstring."""

    def __init__(
        self,
        q: Quarry,
        account: LocalAccount,
        market: MarketAPI,
        scorer: ScoringClient,
        *,
        model_id: bytes,
        model_name: str,
        params: ReputationParams,
        state_path: Path,
        requests: int = 16,
        max_tokens: int = 64,
        tolerance_bps: int = 500,
        test_mode: str = "",
        timing: EpochTiming | None = None,
        on_event: Callable[[str], None] | None = None,
        audits: AuditDesk | None = None,
    ) -> None:
        """`audits`: this verifier's audit desk, whose draw (and cached verdicts) give the
        audited shards pooled into each miner's epoch evidence (`pooled_shards`; None: none,
        and members that pool refuse this member's reports)."""
        self.q, self.account, self.market, self.scorer = q, account, market, scorer
        self.me = to_checksum_address(account.address)
        self.model_id, self.model_name, self.params = model_id, model_name, params
        self.requests, self.max_tokens = requests, max_tokens
        self.tolerance_bps = tolerance_bps
        self.test_mode = test_mode
        self.timing = timing or EpochTiming()
        self.audits = audits
        self._pools: dict[int, Pool] = {}  # epoch -> its pooled shards (a closed window)
        self.on_event = on_event or (lambda line: log.info("%s", line))
        self.chain_id = q.chain.chain_id
        self.committee_address = q.committee.address
        self.state_path = Path(state_path)
        self.state = self._load_state()
        self._inbox: list[dict[str, Any]] = []
        self._last_id = 0
        self._leaders: dict[int, str] = {}
        self._observed: dict[int, dict[str, Any]] = {}
        self._proposed_epochs: set[int] = set()
        self._reported_epochs: set[int] = set()
        self._signed_sets: set[tuple[int, str]] = set()
        self._slashed: set[str] = set()
        self._scored: dict[int, list[ChallengeScore]] = {}  # task id -> per-request scores
        self._snapshots: dict[int, Snapshot] = {}
        self._fault_cache: dict[int, tuple[list[str], list[str]]] = {}
        self._carry_in: dict[int, dict[str, tuple[float, ...]]] = {}  # epoch -> prior
        self._carry_out: dict[int, dict[str, tuple[float, ...]]] = {}  # epoch -> to carry
        self._block_times: dict[int, int] = {}
        self._said = ""  # the last membership note (logged once until it changes)
        self._clock: tuple[int, int] | None = None  # (genesis, epoch duration)
        # (block, miners) -> what a set drawn there copies (`standing`; the last read)
        self._standings: dict[tuple[int, tuple[str, ...]],
                              tuple[list[Terms], frozenset[str], Claimable]] = {}

    # ------------------------------------------------------------------ state
    def _load_state(self) -> _State:
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _State()
        except (OSError, json.JSONDecodeError) as exc:
            raise QuarryError(f"verifier state file {self.state_path} is unreadable ({exc}); "
                              "move it away only if this verifier signed nothing since") from exc
        return _State(**raw)

    def _save_state(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state.__dict__, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.state_path)

    # ------------------------------------------------------------------ relay
    def _post(self, kind: str, epoch: int, topic: str, body: dict[str, Any]) -> None:
        self.market.post_message(committee_message(self.account, kind, epoch, topic, body))

    def _read_inbox(self) -> None:
        for msg in self.market.messages(self.account, after_id=self._last_id):
            self._last_id = max(self._last_id, int(msg["id"]))
            try:  # the relay is not trusted: every message is checked against its author
                if recover_committee_message(msg) != to_checksum_address(msg["author"]):
                    continue
            except (MalformedMessage, KeyError):
                continue
            msg["author"] = to_checksum_address(msg["author"])
            self._inbox.append(msg)

    def _messages(self, kind: str, epoch: int, topic: str | None = None,
                  authors: Iterable[str] | None = None) -> list[dict[str, Any]]:
        wanted = None if authors is None else set(authors)
        return [m for m in self._inbox
                if m["kind"] == kind and int(m["epoch"]) == epoch
                and (topic is None or m["topic"] == topic)
                and (wanted is None or m["author"] in wanted)]

    # ------------------------------------------------------------------ loop
    def step(self) -> None:
        """One pass: follow this member's availability challenges, then, if it sits in the
        current epoch's committee, read the relay and do whatever its role asks now."""
        self.follow_availability()
        genesis, duration = self._epoch_clock()
        now = self.q.chain.timestamp()
        epoch = (now - genesis) // duration
        metrics.EPOCH.set(epoch)
        with log_context(epoch=epoch):  # what this pass logs names the epoch it concerns
            if not self._seated(epoch):
                return
            into = (now - genesis) % duration / duration
            self._read_inbox()
            snap = self.snapshot(epoch)
            open_from = self.q.committee.next_report_epoch()  # older epochs are closed
            self._next_set(epoch, into, snap)
            if epoch - 1 >= max(open_from, 0):  # finish the last epoch's report
                with log_context(epoch=epoch - 1):
                    self._try_epoch(epoch - 1, into + 1, self.snapshot(epoch - 1),
                                    deadline=genesis + epoch * duration)
            if epoch >= open_from:
                self._try_epoch(epoch, into, snap, deadline=genesis + (epoch + 1) * duration)
            for e in (epoch - 1, epoch):
                if e >= max(open_from, 0):
                    with log_context(epoch=e):
                        self._submit_if_quorum(e)
            self._watch_equivocation()

    def _epoch_clock(self) -> tuple[int, int]:
        if self._clock is None:
            c = self.q.committee
            self._clock = (c.genesis_time(), c.epoch_duration())
        return self._clock

    def _seated(self, epoch: int) -> bool:
        """Whether this verifier is in `epoch`'s committee; if not, say why once."""
        committee = self.q.committee
        if committee.weight_at(self.me, epoch) > 0:
            self._said = ""
            return True
        info = committee.verifier_info(self.me)
        if info.seated and info.active_from > epoch:
            note = (f"{self.me} joins the committee at epoch {info.active_from} (chain time "
                    f"{committee.epoch_start(info.active_from)}); waiting for it")
        elif info.registered and info.active_until <= epoch:
            note = (f"{self.me} left the committee at epoch {info.active_until}; its stake can "
                    f"be withdrawn from chain time {info.withdrawable_at} (`verifier withdraw`)")
        else:
            note = f"{self.me} is not a committee member (`verifier register`): waiting"
        if note != self._said:
            self._said = note
            self.on_event(note)
        return False

    def snapshot(self, epoch: int) -> Snapshot:
        """`epoch`'s committee with its weights (cached: fixed once the epoch has started,
        except that slashing can lower a weight, which drops the cache entry)."""
        if epoch not in self._snapshots:
            c = self.q.committee
            self._snapshots[epoch] = Snapshot(epoch, c.weights_at(epoch), c.quorum_weight(epoch))
        return self._snapshots[epoch]

    # ------------------------------------------------------------------ 1. challenge sets
    def _next_set(self, epoch: int, into: float, snap: Snapshot) -> None:
        """Propose, check, sign and commit the challenge set of epoch + 1 (signed by the
        current committee, `snap`)."""
        nxt = epoch + 1
        members = snap.members
        committed = self.q.committee.challenge_set_of(nxt)
        proposals = self._messages(SET_PROPOSAL, nxt, authors=members)
        if committed != bytes(32):
            self._remember_set(nxt, committed, proposals)
            return
        eligible = eligible_miners(self.q, self.model_id)
        if not eligible:
            return
        base = members.index(self.q.committee.leader_of(epoch))
        slot = int(into / self.timing.set_slot)
        key = f"{nxt}:{slot}"
        if members[(base + slot) % len(members)] == self.me and self.test_mode != "withhold" \
                and key not in self.state.proposed_sets:
            block = self.q.chain.block_number()
            jobs, probation, claimable = self.standing(block, eligible)
            cs = draw_challenge_set(nxt, self.model_id, self.model_name, eligible,
                                    requests=self.requests, max_tokens=self.max_tokens,
                                    jobs=jobs, on_probation=probation, claimable=claimable,
                                    block=block)
            self.state.proposed_sets.append(key)
            self._save_state()
            self._post(SET_PROPOSAL, nxt, encode_hex(cs.digest()), cs.to_json())
            self.on_event(f"epoch {epoch}: proposed the challenge set of epoch {nxt} "
                          f"({len(eligible)} miners)")
            return
        for msg in proposals:
            digest = msg["topic"]
            if (nxt, digest) not in self._signed_sets:
                try:
                    cs = ChallengeSet.from_json(msg["body"])
                    if encode_hex(cs.digest()) != digest:
                        raise ChallengeSetInvalid("its topic is not its hash")
                    self._check_block(cs.block, epoch)
                    jobs, probation, claimable = self.standing(cs.block, eligible)
                    check_challenge_set(cs, epoch=nxt, model_id=self.model_id,
                                        eligible=eligible, requests=self.requests,
                                        max_tokens=self.max_tokens, jobs=jobs,
                                        on_probation=probation, claimable=claimable)
                except ChallengeSetInvalid as exc:
                    log.warning("not signing %s's set for epoch %d: %s", msg["author"], nxt, exc)
                    self._signed_sets.add((nxt, digest))
                    continue
                sig = ChallengeSetStruct(nxt, cs.digest()).sign(
                    self.account.key, self.chain_id, self.committee_address)
                self._post(SET_SIGNATURE, nxt, digest, {"signature": encode_hex(sig)})
                self._signed_sets.add((nxt, digest))
            struct = ChallengeSetStruct(nxt, bytes.fromhex(digest[2:]))
            sigs = self._signatures(struct, SET_SIGNATURE, nxt, digest, snap)
            if snap.reached(sigs):
                try:
                    self.q.committee.commit_challenge_set(
                        self.account, nxt, struct.challenge_set_hash, self._sorted(struct, sigs))
                    self.on_event(f"epoch {epoch}: committed the challenge set of epoch {nxt} "
                                  f"({len(sigs)} signatures, weight {snap.weight_of(sigs)})")
                except ContractRevert as exc:  # another member was first, or a stale weight
                    self._forget_snapshot(exc, epoch)
                    log.info("commit of epoch %d's set: %s", nxt, exc)
                return

    def standing(self, block: int, miners: list[str]
                  ) -> tuple[list[Terms], frozenset[str], Claimable]:
        """What a set drawn at `block` takes its terms from, all read at that block so every
        member reads the same: the client tasks (without the committee's own challenges,
        those of every set this member holds), the miners then on probation, and which
        tasks each miner could then claim."""
        key = (block, tuple(miners))
        if key not in self._standings:
            jobs = client_jobs(self.q, self.model_id, block, self._challenge_roots())
            probation = frozenset(m for m in miners if self.q.chain.call(
                self.q.gpu.fn("onProbation", m), block=block))
            pool = drawable(jobs, requests=self.requests, max_tokens=self.max_tokens)
            self._standings = {key: (jobs, probation, claimable_at(
                self.q, self.model_id, block, miners, pool))}
        return self._standings[key]

    def _challenge_roots(self) -> frozenset[bytes]:
        """The input roots of the committee's own challenges, those of every set this
        member holds (an ordinary task's shape, known for a challenge only by its root)."""
        return frozenset(Challenge(c["miner"], tuple(c["requests"])).input_root
                         for raw in self.state.sets.values() for c in raw["challenges"])

    def _check_block(self, block: int, epoch: int) -> None:
        """A set's shapes come from the chain as it stood in the epoch it was proposed in
        (`epoch`): a proposer cannot pick an old window, nor a block members cannot read."""
        head = self.q.chain.block_number()
        if not 0 < block <= head:
            raise ChallengeSetInvalid(f"the set's block {block} is not on the chain (head "
                                      f"{head})")
        stamp = int(self.q.chain.w3.eth.get_block(block)["timestamp"])
        if stamp < self.q.committee.epoch_start(epoch):
            raise ChallengeSetInvalid(f"the set's block {block} (time {stamp}) is older than "
                                      f"epoch {epoch}")

    def _remember_set(self, epoch: int, committed: bytes, proposals: list[dict[str, Any]]) -> None:
        if str(epoch) in self.state.sets:
            return
        for msg in proposals:
            if msg["topic"] == encode_hex(committed):
                try:
                    cs = ChallengeSet.from_json(msg["body"])
                except ChallengeSetInvalid:
                    continue
                if cs.digest() == committed:
                    self.state.sets[str(epoch)] = cs.to_json()
                    self._save_state()
                    return

    def _signatures(self, struct: Any, kind: str, epoch: int, topic: str,
                    snap: Snapshot) -> dict[str, bytes]:
        """Valid signatures over `struct` on the relay from members of `snap`, by signer."""
        by_signer: dict[str, bytes] = {}
        for msg in self._messages(kind, epoch, topic, snap.weights):
            try:
                sig = bytes.fromhex(str(msg["body"]["signature"]).removeprefix("0x"))
                if struct.recover(sig, self.chain_id, self.committee_address) == msg["author"]:
                    by_signer[msg["author"]] = sig
            except (SignatureError, KeyError, ValueError):
                continue
        return by_signer

    def _sorted(self, struct: Any, sigs: Mapping[str, bytes]) -> list[bytes]:
        """Every signature, ascending by signer (what the contract takes)."""
        return sort_signatures(struct, list(sigs.values()), self.chain_id,
                               self.committee_address)

    def _forget_snapshot(self, exc: ContractRevert, epoch: int) -> None:
        if exc.error in ROTATE_ERRORS:
            self._snapshots.pop(epoch, None)

    # ------------------------------------------------------------------ 2-5. the epoch
    def leader(self, epoch: int) -> str | None:
        """The leader of `epoch`: `leaderOf(epoch)` at the block that committed its set."""
        if epoch not in self._leaders:
            events = self.q.committee.events("ChallengeSetCommitted",
                                             self.q.deployment.deploy_block, epoch=epoch)
            if not events:
                return None
            self._leaders[epoch] = self.q.committee.leader_of(epoch, events[0]["blockNumber"])
        return self._leaders[epoch]

    def _try_epoch(self, epoch: int, into: float, snap: Snapshot, deadline: int) -> None:
        """`_run_epoch`, put off to the next pass while a pooled shard cannot be judged on
        this verifier's side (scorers or market down): the other epoch still goes on."""
        try:
            self._run_epoch(epoch, into, snap, deadline)
        except DisputeDeferred as exc:
            log.warning("epoch %d: a pooled audited shard cannot be judged now: %s", epoch,
                        exc)

    def _run_epoch(self, epoch: int, into: float, snap: Snapshot, deadline: int) -> None:
        """Lead, observe, propose and co-sign `epoch`'s report, `into` epochs after its start
        (above 1 while it finishes in the next epoch)."""
        raw = self.state.sets.get(str(epoch))
        leader = self.leader(epoch)
        if raw is None or leader is None or self.me not in snap.weights:
            return
        cs = ChallengeSet.from_json(raw)
        if leader == self.me and self.test_mode != "withhold":
            self._lead(epoch, into, cs, deadline)
        proposal = next(iter(self._messages(EPOCH_PROPOSAL, epoch, authors={leader})), None)
        if proposal is None:
            return
        if epoch not in self._observed:
            self._observe(epoch, cs, proposal)
        if leader == self.me and epoch not in self._proposed_epochs and \
                self.test_mode != "withhold":
            observers = {m["author"] for m in self._messages(OBSERVATION, epoch,
                                                             authors=snap.weights)}
            if observers >= set(snap.weights) or into >= self.timing.report_at:
                self._propose_report(epoch, cs, proposal, snap)
        own = next(iter(self._messages(REPORT_SIGNATURE, epoch, authors={leader})), None)
        if own is not None and str(epoch) not in self.state.signed_reports:
            self._cosign(epoch, cs, proposal, own, snap)

    def _lead(self, epoch: int, into: float, cs: ChallengeSet, deadline: int) -> None:
        key = str(epoch)
        if key not in self.state.posted:
            if into >= 1:  # the epoch is over: too late to challenge anyone in it
                return
            sent: list[dict[str, Any]] = []
            duration = self.q.committee.epoch_duration()
            for c in cs.challenges:
                # A deadline of its own, past the epoch's end by up to two epochs: answers
                # still count only until the committee collects them, but the task does not
                # end on the epoch boundary, which would set it apart from clients' tasks.
                own = deadline + secrets.randbelow(2 * duration + 1)
                try:
                    made = post_challenge(self.q, self.account, self.market, c,
                                          self.model_id, own)
                except QuarryError as exc:
                    log.warning("epoch %d: could not post %s's challenge: %s", epoch,
                                c.miner, exc, extra={"miner": c.miner})
                    continue
                sent.append(made.to_json())
                log.info("epoch %d: posted %s's challenge as task %d", epoch, c.miner,
                         made.task_id, extra={"task": made.task_id, "shard": 0,
                                              "miner": c.miner})
            self.state.posted[key] = sent
            self._save_state()
            self.on_event(f"epoch {epoch}: leader, sent {len(sent)} challenges")
            return
        if self._messages(EPOCH_PROPOSAL, epoch, authors={self.me}):
            return
        posted = [PostedChallenge.from_json(p) for p in self.state.posted[key]]
        answers = []
        window, now = self.q.committee.challenge_answer_window(), self.q.chain.timestamp()
        for p in posted:
            challenge = cs.challenge_for(p.miner)
            if challenge is None:  # posted from this very set: the state file is not ours
                raise ChallengeSetInvalid(f"epoch {epoch}: posted a challenge to {p.miner}, "
                                          "who is not in the epoch's challenge set")
            answers.append(collect_answer(self.q, self.market, challenge, p.task_id,
                                          answer_window=window, now=now))
        self.challenge_withheld(epoch, posted, answers)
        if any(a.status == "pending" for a in answers):
            return  # a miner's window is still open (it closes before epoch + 2): it may answer
        scores = self._score(cs, answers)
        if self.test_mode == "lie":
            scores = {m: BPS - s for m, s in scores.items()}
        body = {"setDigest": encode_hex(cs.digest()),
                "challenges": [{"miner": a.miner, "taskId": a.task_id, "status": a.status}
                               for a in answers],
                "pooled": _pool_json(self.pooled_shards(epoch)),
                "scores": scores}
        self._post(EPOCH_PROPOSAL, epoch, "", body)
        self.on_event(f"epoch {epoch}: proposed scores {scores}")
        self._dispute_faults(posted, cs, answers, scores)

    def _score(self, cs: ChallengeSet, answers: list[Answer]) -> dict[str, int]:
        """Epoch score (bps) per answered challenge: 10000 when its outputs, pooled with the
        miner's audited shards of the epoch before (`pooled_shards`) and its carried
        evidence, pass `verifier.scoring.judge`, 0 when they fail or the answer fails its
        checks. A miner with pooled shards but no answer gets no score (a miss is not a
        verdict) and carries their judged evidence, passed or failed, to its next answer.
        Each task's answers are scored once (the leader re-reads them as a member and to
        pick the request it disputes), and each audited shard once (the audit desk's
        verdict)."""
        scores: dict[str, int] = {}
        prior = self._carried(cs.epoch)
        pooled = self._pooled_scores(cs.epoch)
        carry = self._carry_out.setdefault(cs.epoch, {})
        unscored = []
        for a in answers:
            if a.status == "invalid":
                scores[a.miner] = 0
            elif a.status == "answered":
                verdict = judge(self._request_scores(cs, a), prior=prior.get(a.miner, ()),
                                joined=pooled.get(a.miner, []))
                scores[a.miner] = verdict.score_bps
                if verdict.passed and any(verdict.carry):
                    carry[a.miner] = verdict.carry
            else:
                unscored.append(a.miner)
        for miner in sorted(set(unscored) | set(pooled) - {a.miner for a in answers}):
            if miner in pooled:  # evidence is evidence: it waits for the next answer
                verdict = judge([], prior=prior.get(miner, ()), joined=pooled[miner])
                if any(verdict.carry):
                    carry[miner] = verdict.carry
            elif miner in prior:  # missing: what it had gathered waits for its next answer
                carry[miner] = prior[miner]
        return scores

    def pooled_shards(self, epoch: int) -> Pool:
        """The audited shards whose outputs join each miner's evidence in `epoch`'s report:
        client shards of this member's model whose `ResultSubmitted` block is stamped in
        epoch - 1 (a window closed before any of `epoch`'s challenges is posted, as the
        chain's record of faults) and that the audit rule draws at the chain's base rate
        (`AuditDesk.audited`: public chain data, so every member finds the same whatever
        rate its own desk audits at), less the committee's own challenges
        (judged as such, never twice). Passed and failed audits both join: a failing one
        fails its own dispute as well, and an honest miner's pooled evidence keeps the 1e-6
        bound. The leader's proposal names them; a member refuses a report whose set is not
        its own (`_check_pool`)."""
        if self.audits is None or epoch <= 0:
            return {}
        if epoch not in self._pools:
            c = self.q.committee
            roots = self._challenge_roots()
            pool: Pool = {}
            for drawn in self.audits.audited(c.epoch_start(epoch - 1), c.epoch_start(epoch)):
                task = self.q.tasks.get_task(drawn.task_id)
                if task.model_id == self.model_id and task.input_root not in roots:
                    pool.setdefault(drawn.miner, []).append((drawn.task_id, drawn.shard))
            self._pools[epoch] = pool
        return self._pools[epoch]

    def _pooled_scores(self, epoch: int) -> dict[str, list[list[ChallengeScore]]]:
        """Per miner, the per-request scores of its pooled shards (`pooled_shards`) from the
        audit desk's verdicts (scored once, kept). A shard whose document cannot be read or
        whose inputs are unusable has none and is left out: the desk challenges its
        availability, punished on its own path. DisputeDeferred when one cannot be judged
        on this verifier's side now."""
        if self.audits is None:
            return {}
        out: dict[str, list[list[ChallengeScore]]] = {}
        for miner, shards in self.pooled_shards(epoch).items():
            for task_id, shard in shards:
                with log_context(task=task_id, shard=shard, miner=miner):
                    try:
                        verdict = self.audits.judge.judge(task_id, shard)
                    except DisputeDeferred:
                        raise
                    except QuarryError as exc:  # from the chain: the same for every member
                        log.warning("pooled shard left out: %s", exc)
                        continue
                if verdict.scores:
                    out.setdefault(miner, []).append(verdict.scores)
        return out

    def _request_scores(self, cs: ChallengeSet, a: Answer) -> list[ChallengeScore]:
        if a.task_id not in self._scored:
            challenge = cs.challenge_for(a.miner)
            assert challenge is not None
            by_index = {it.index: it for it in a.items}
            items = [by_index[i] for i in range(len(challenge.lines))]
            with log_context(task=a.task_id, shard=0, miner=a.miner):
                self._scored[a.task_id] = self.scorer.score(
                    challenge.lines, [list(it.token_ids) for it in items],
                    [it.finish_reason for it in items], [it.text for it in items],
                    precision=a.precision, commitments=[it.commitment for it in items])
                log.info("epoch %d: scored %s's answer to its challenge (task %d, %d "
                         "outputs)", cs.epoch, a.miner, a.task_id, len(items))
        return self._scored[a.task_id]

    def _observe(self, epoch: int, cs: ChallengeSet, proposal: dict[str, Any]) -> None:
        body = proposal["body"]
        scores: dict[str, int] = {}
        missing: list[str] = []
        problems: list[str] = []
        if body.get("setDigest") != encode_hex(cs.digest()):
            problems.append("the proposal is for another challenge set")
        else:
            answers = []
            for entry in body.get("challenges", []):
                challenge = cs.challenge_for(str(entry.get("miner")))
                if challenge is None:
                    problems.append(f"{entry.get('miner')} is not in the challenge set")
                    continue
                try:
                    answers.append(collect_answer(
                        self.q, self.market, challenge, int(entry["taskId"]),
                        answer_window=self.q.committee.challenge_answer_window(),
                        now=self.q.chain.timestamp()))
                except (ChallengeSetInvalid, StoreError, KeyError, ValueError) as exc:
                    problems.append(str(exc))
            scores = self._score(cs, answers)
            try:
                _check_pool(body.get("pooled", {}), self.pooled_shards(epoch))
            except QuarryError as exc:
                problems.append(str(exc))
            missing = [a.miner for a in answers if a.status == "missing"]
            for s in scores.values():  # this member's honest scores, once per epoch
                metrics.CHALLENGE_SCORE.observe(s)
        if self.test_mode == "lie":  # a Byzantine member: inverted scores, frames everyone
            scores = {m: BPS - s for m, s in scores.items()}
            missing = list(cs.miners)
        self._observed[epoch] = {"scores": scores, "missing": missing, "problems": problems}
        self._post(OBSERVATION, epoch, "", self._observed[epoch])
        self.on_event(f"epoch {epoch}: re-scored {scores}" +
                      (f", confirms missing {missing}" if missing else ""))

    # ------------------------------------------------------------------ reputation
    def _last_report(self, epoch: int) -> tuple[int, dict[str, Any]]:
        """The last reported epoch before `epoch` and its evidence document (-1, {})."""
        events = [ev for ev in self.q.committee.events("ReputationSubmitted",
                                                       self.q.deployment.deploy_block)
                  if int(ev["epoch"]) < epoch]
        if not events:
            return -1, {}
        last = max(events, key=lambda ev: int(ev["epoch"]))
        return int(last["epoch"]), self._evidence(bytes(last["evidenceRoot"]))

    def _previous(self, epoch: int) -> tuple[int, dict[str, MinerRecord]]:
        """The last reported epoch before `epoch` and the records its evidence holds; the
        reputations themselves are read from GPURegistry (the chain is the truth)."""
        prev, doc = self._last_report(epoch)
        records: dict[str, MinerRecord] = {
            to_checksum_address(m): MinerRecord(int(r["reputationBps"]),
                                                tuple(int(x) for x in r["window"]))
            for m, r in doc.get("records", {}).items()}
        return prev, records

    def _carried(self, epoch: int) -> dict[str, tuple[float, ...]]:
        """Each miner's evidence carried by epoch - 1's report (log ratios per alternative,
        floored at 0: `Judgement.carry`, in micro-nats), pooled into this epoch's test.
        Nothing is carried across a gap: only a report of exactly epoch - 1 counts, and only
        evidence over this test's alternatives (a report by an older verifier, whose test had
        other alternatives, carries nothing)."""
        if epoch not in self._carry_in:
            prev, doc = self._last_report(epoch)
            carry = doc.get("carry", {}) if prev == epoch - 1 else {}
            self._carry_in[epoch] = {to_checksum_address(m): tuple(int(x) / 1e6 for x in v)
                                     for m, v in carry.items() if len(v) == EVIDENCE_WIDTH}
        return self._carry_in[epoch]

    def _evidence(self, root: bytes) -> dict[str, Any]:
        data = self.market.get("sha256:" + root.hex())
        if hashlib.sha256(data).digest() != root:
            raise StoreError(f"evidence {encode_hex(root)} does not hash to its root")
        return jsonsafe.loads(data, what="the evidence document")

    def _next_records(self, epoch: int, scores: Mapping[str, int | None],
                      faults: Iterable[str] = ()
                      ) -> tuple[int, dict[str, MinerRecord], dict[str, int]]:
        """(previous epoch, every tracked miner's record after this epoch, what the report
        says of each miner it names: its new reputation, or `MISSED_BPS` for a miner that was
        unavailable, whose record stays as it was); miners in `faults` were found at fault
        on-chain (`reputation.update(fault=True)`)."""
        faulty = set(faults)
        prev_epoch, records = self._previous(epoch)
        out = dict(records)
        reported: dict[str, int] = {}
        for miner, s in sorted(scores.items()):
            if s is None:
                continue
            if s == MISSED_BPS:
                reported[miner] = MISSED_BPS
                continue
            chain_rep = self.q.gpu.miner_info(miner).reputation_bps
            before = records.get(miner, MinerRecord(chain_rep, ()))
            before = MinerRecord(chain_rep, before.window)
            out[miner] = update(before, s, self.params, fault=miner in faulty)
            reported[miner] = out[miner].reputation_bps
        return prev_epoch, out, reported

    def _propose_report(self, epoch: int, cs: ChallengeSet, proposal: dict[str, Any],
                        snap: Snapshot) -> None:
        self._proposed_epochs.add(epoch)
        observations = self._messages(OBSERVATION, epoch, authors=snap.weights)
        faults = self._faults(epoch) | dict.fromkeys(failed_challenges(proposal), 0)
        scores = epoch_scores(proposal, observations, snap.weights) | self._misses(epoch) \
            | faults
        prev_epoch, records, reported = self._next_records(epoch, scores, faults)
        carry = {m: [round(x * 1e6) for x in v]
                 for m, v in sorted(self._carry_out.get(epoch, {}).items())}
        doc = {"epoch": epoch, "previousEpoch": prev_epoch, "setDigest": encode_hex(cs.digest()),
               "proposal": proposal, "observations": observations,
               "members": snap.members, "scores": scores, "carry": carry,
               "records": {m: {"reputationBps": r.reputation_bps, "window": list(r.window)}
                           for m, r in sorted(records.items())}}
        data = canonical_json_bytes(doc)
        uri = self.market.put(data)
        miners = sorted(reported, key=lambda a: int(a, 16))
        report = Report(epoch, tuple(miners), tuple(reported[m] for m in miners),
                        hashlib.sha256(data).digest())
        self._sign_report(report, uri)
        metrics.EPOCHS_REPORTED.labels("led").inc()
        self.on_event(f"epoch {epoch}: leader, reported reputations "
                      f"{dict(zip(miners, report.scores_bps, strict=True))}")

    def _sign_report(self, report: Report, uri: str) -> None:
        digest = encode_hex(report.digest(self.chain_id, self.committee_address))
        if self.state.signed_reports.get(str(report.epoch), digest) != digest:
            raise QuarryError(f"refusing to sign a second report for epoch {report.epoch}")
        self.state.signed_reports[str(report.epoch)] = digest
        self._save_state()
        sig = report.sign(self.account.key, self.chain_id, self.committee_address)
        self._post(REPORT_SIGNATURE, report.epoch, digest,
                   {"report": _report_json(report), "evidenceUri": uri,
                    "signature": encode_hex(sig)})

    def _cosign(self, epoch: int, cs: ChallengeSet, proposal: dict[str, Any],
                leader_msg: dict[str, Any], snap: Snapshot) -> None:
        """Co-sign the leader's report only if it is what this member would have built."""
        if self.test_mode == "lie" or epoch not in self._observed:
            return
        try:
            report = _report_from_json(leader_msg["body"]["report"])
            doc = self._evidence(report.evidence_root)
            if doc.get("proposal", {}).get("signature") != proposal["signature"]:
                raise QuarryError("the evidence holds another proposal")
            observations = [o for o in doc.get("observations", [])
                            if o.get("kind") == OBSERVATION and int(o.get("epoch", -1)) == epoch
                            and to_checksum_address(o["author"]) in snap.weights
                            and recover_committee_message(o) == to_checksum_address(o["author"])]
            for o in observations:
                o["author"] = to_checksum_address(o["author"])
            scores = epoch_scores(proposal, observations, snap.weights)
            mine = self._observed[epoch]["scores"]
            for miner, s in scores.items():
                if s is None or s == MISSED_BPS:
                    continue  # a confirmed missing answer needs no score of mine
                own = mine.get(miner)
                if own is None or abs(own - s) > self.tolerance_bps:
                    raise QuarryError(f"{miner}: the leader's score {s} bps is not within "
                                      f"{self.tolerance_bps} bps of mine ({own})")
            faults = self._faults(epoch) | dict.fromkeys(failed_challenges(proposal), 0)
            _, _, reported = self._next_records(
                epoch, scores | self._misses(epoch) | faults, faults)
            _check_pool(proposal["body"].get("pooled", {}), self.pooled_shards(epoch))
            _check_carry(doc.get("carry", {}), self._carry_out.get(epoch, {}))
            miners = sorted(reported, key=lambda a: int(a, 16))
            expected = (tuple(miners), tuple(reported[m] for m in miners))
            if (report.miners, report.scores_bps) != expected or report.epoch != epoch:
                raise QuarryError(f"the reputations {report.scores_bps} do not follow from "
                                  f"the scores (expected {expected[1]})")
        except (QuarryError, KeyError, ValueError, TypeError) as exc:
            log.warning("epoch %d: not co-signing the leader's report: %s", epoch, exc)
            self.state.signed_reports.setdefault(str(epoch), "refused")
            self._save_state()
            metrics.EPOCHS_REPORTED.labels("refused").inc()
            return
        self._sign_report(report, str(leader_msg["body"]["evidenceUri"]))
        metrics.EPOCHS_REPORTED.labels("cosigned").inc()
        self.on_event(f"epoch {epoch}: co-signed the report")

    def _submit_if_quorum(self, epoch: int) -> None:
        """Submit the leader's report of `epoch` (not yet closed) with every valid signature
        of `epoch`'s committee once they weigh a quorum of it."""
        if epoch in self._reported_epochs:
            return
        leader = self.leader(epoch)
        if leader is None:
            return
        own = next(iter(self._messages(REPORT_SIGNATURE, epoch, authors={leader})), None)
        if own is None:
            return
        report = _report_from_json(own["body"]["report"])
        snap = self.snapshot(epoch)
        sigs = self._signatures(report, REPORT_SIGNATURE, epoch, own["topic"], snap)
        if not snap.reached(sigs):
            return
        try:
            self.q.committee.submit_reputation(self.account, report, self._sorted(report, sigs))
            metrics.EPOCHS_REPORTED.labels("submitted").inc()
            self.on_event(f"epoch {epoch}: submitted the report ({len(sigs)} signatures, "
                          f"weight {snap.weight_of(sigs)} of quorum {snap.quorum})")
        except ContractRevert as exc:
            if exc.error in ROTATE_ERRORS:  # a signer was slashed since: recount and retry
                self._forget_snapshot(exc, epoch)
                log.info("report of epoch %d: %s", epoch, exc)
                return
            log.info("report of epoch %d: %s", epoch, exc)  # another member was first
        self._reported_epochs.add(epoch)

    def _faults(self, epoch: int) -> dict[str, int | None]:
        """Score 0 for every registered miner found at fault on-chain during epoch - 1
        (`chain_faults`); the same for every member, since that epoch is over."""
        return {m: 0 for m in self._chain_record(epoch)[0]}

    def _misses(self, epoch: int) -> dict[str, int | None]:
        """`MISSED_BPS` for every registered miner that let an availability challenge go
        unanswered during epoch - 1 (`unanswered_availability`): its shard was refunded and
        its collateral slashed already; the report counts it unavailable, not dishonest."""
        return {m: MISSED_BPS for m in self._chain_record(epoch)[1]}

    def _chain_record(self, epoch: int) -> tuple[list[str], list[str]]:
        """(miners at fault, miners unavailable) on-chain during epoch - 1, registered ones."""
        if epoch not in self._fault_cache:
            c = self.q.committee
            start, end = c.epoch_start(epoch - 1), c.epoch_start(epoch)
            faults, misses = (set(), set()) if epoch == 0 else (
                chain_faults(self.q, start, end, self._block_times),
                unanswered_availability(self.q, start, end, self._block_times))
            active = {m for m in faults | misses if self.q.gpu.miner_info(m).active}
            self._fault_cache[epoch] = (sorted(faults & active), sorted(misses & active))
        return self._fault_cache[epoch]

    # ------------------------------------------------------------------ disputes, slashing
    def _dispute_faults(self, posted: list[PostedChallenge], cs: ChallengeSet,
                        answers: list[Answer], scores: Mapping[str, int]) -> None:
        """Challenge answers that fail are disputed at once from the fresh client address
        (at their most suspicious output), so cheating found by a challenge is slashed,
        not only down-rated."""
        from market.jobs import open_dispute

        keys = {p.task_id: p.client_key for p in posted}
        for a in answers:
            if a.status != "answered" or scores.get(a.miner, BPS) == BPS \
                    or a.task_id in self.state.disputed or self.test_mode == "lie":
                continue
            per_request = self._request_scores(cs, a)
            if judge(per_request).passed:
                continue  # failed on carried or pooled evidence: a dispute judges it alone
            worst = max(range(len(per_request)),
                        key=lambda i: per_request[i].suspicion())
            try:
                dispute_id = open_dispute(self.q, Account.from_key(keys[a.task_id]),
                                          self.market, a.task_id, worst)
            except QuarryError as exc:
                log.warning("could not dispute %s's challenge answer: %s", a.miner, exc,
                            extra={"task": a.task_id, "shard": 0, "miner": a.miner})
                continue
            self.state.disputed.append(a.task_id)
            self._save_state()
            with log_context(task=a.task_id, shard=0, dispute=dispute_id, miner=a.miner):
                self.on_event(f"disputed {a.miner}'s challenge answer (task {a.task_id}, "
                              f"request {worst}): dispute {dispute_id}")

    # ------------------------------------------------------------------ withheld answers
    def challenge_withheld(self, epoch: int, posted: Iterable[PostedChallenge],
                           answers: Iterable[Answer]) -> None:
        """Challenge, as each task's client, the availability of every answer whose root is
        committed (shard Submitted) but whose document is not published: the miner must show
        a receipt on-chain within Arbitration's response window. Each task once (state file).
        """
        from market.jobs import challenge_availability

        keys = {p.task_id: p.client_key for p in posted}
        for a in answers:
            if not a.withheld or str(a.task_id) in self.state.availability \
                    or self.test_mode == "lie" or a.task_id not in keys:
                continue
            if self.q.tasks.get_shard(a.task_id, 0).state != ShardState.SUBMITTED:
                continue
            index = self.q.tasks.shard_range(a.task_id, 0)[0]
            try:
                challenge_id = challenge_availability(
                    self.q, Account.from_key(keys[a.task_id]), a.task_id, index)
            except QuarryError as exc:
                log.warning("could not challenge the availability of %s's answer (task %d): "
                            "%s", a.miner, a.task_id, exc,
                            extra={"task": a.task_id, "shard": 0, "miner": a.miner})
                continue
            self.state.availability[str(a.task_id)] = {
                "epoch": epoch, "challengeId": challenge_id, "index": index, "status": "open"}
            self._save_state()
            with log_context(task=a.task_id, shard=0, challenge=challenge_id, miner=a.miner):
                self.on_event(f"epoch {epoch}: {a.miner} committed task {a.task_id}'s result "
                              f"but published no document: availability challenge "
                              f"{challenge_id}")

    def follow_availability(self) -> None:
        """Settle this member's unanswered availability challenges once their deadline has
        passed (the miner is slashed), and dispute an answered one whose document is still
        missing (the answered receipt is the disputed one). Never blocks."""
        for task_key, entry in self.state.availability.items():
            if entry["status"] != "open":
                continue
            try:
                with log_context(task=int(task_key), shard=0, epoch=int(entry["epoch"]),
                                 challenge=int(entry["challengeId"])):
                    status = self._settle_or_dispute(int(task_key), entry)
            except QuarryError as exc:  # chain or market briefly down: next step
                log.warning("availability challenge on task %s: %s", task_key, exc,
                            extra={"task": int(task_key), "shard": 0})
                continue
            if status != "open":
                entry["status"] = status
                self._save_state()

    def _settle_or_dispute(self, task_id: int, entry: dict[str, Any]) -> str:
        from market.jobs import DisputeNotPossible, challenge_info, open_dispute, wait_challenge

        client = self._client_of(task_id, int(entry["epoch"]))
        info = challenge_info(self.q, int(entry["challengeId"]))
        if info.status == ChallengeStatus.OPEN:
            if self.q.chain.timestamp() < info.deadline:
                return "open"
            # Past its deadline, wait_challenge settles it at once and returns.
            info = wait_challenge(self.q, info.challenge_id, settle_as=client)
        if info.status == ChallengeStatus.UNANSWERED:
            self.on_event(f"availability challenge {info.challenge_id} (task {task_id}, "
                          f"miner {info.miner}): {info.outcome()}")
            return "unanswered"
        if info.status != ChallengeStatus.ANSWERED:
            return "open"
        if self._published(task_id):
            self.on_event(f"availability challenge {info.challenge_id}: {info.miner} answered "
                          "and has published its document since")
            return "published"
        try:
            dispute_id = open_dispute(self.q, client, self.market, task_id,
                                      int(entry["index"]))
        except DisputeNotPossible as exc:
            log.warning("could not dispute %s's withheld answer (task %d): %s", info.miner,
                        task_id, exc)
            return "failed"
        entry["disputeId"] = dispute_id
        self.on_event(f"{info.miner} answered availability challenge {info.challenge_id} but "
                      f"still withholds task {task_id}'s document: dispute {dispute_id}")
        return "disputed"

    def _client_of(self, task_id: int, epoch: int) -> LocalAccount:
        """The fresh client account this member posted `task_id` from in `epoch`."""
        for p in self.state.posted.get(str(epoch), []):
            if int(p["taskId"]) == task_id:
                return Account.from_key(str(p["clientKey"]))
        raise QuarryError(f"task {task_id} is not one this verifier posted in epoch {epoch}")

    def _published(self, task_id: int) -> bool:
        """Whether the shard's result document is there now (a readable one)."""
        from market.jobs import fetch_result_document

        uri = self.q.tasks.get_shard(task_id, 0).result_uri
        try:
            fetch_result_document(self.market, 0, uri)
        except (ContentNotFound, ResultCheckFailed):
            return False
        return True

    def _watch_equivocation(self) -> None:
        seen: dict[tuple[str, int], tuple[Report, bytes]] = {}
        for msg in self._inbox:
            if msg["kind"] != REPORT_SIGNATURE or msg["author"] in self._slashed:
                continue
            try:
                report = _report_from_json(msg["body"]["report"])
                sig = bytes.fromhex(str(msg["body"]["signature"]).removeprefix("0x"))
                if report.recover(sig, self.chain_id, self.committee_address) != msg["author"]:
                    continue
            except (SignatureError, KeyError, ValueError, TypeError):
                continue
            key = (msg["author"], report.epoch)
            if key not in seen:
                seen[key] = (report, sig)
                continue
            first, first_sig = seen[key]
            if first == report:
                continue
            self._slashed.add(msg["author"])
            if self.q.committee.verifier_info(msg["author"]).stake == 0:
                continue
            try:
                self.q.committee.prove_equivocation(self.account, msg["author"], first,
                                                    first_sig, report, sig)
                self.on_event(f"proved that {msg['author']} signed two reports for epoch "
                              f"{report.epoch}: its stake is slashed")
            except ContractRevert as exc:
                log.info("equivocation proof against %s: %s", msg["author"], exc)


def _stamped(q: Quarry, start: int, end: int, block_times: dict[int, int] | None
             ) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an event's block is stamped in [start, end); `block_times` caches stamps."""
    times = {} if block_times is None else block_times

    def inside(ev: Mapping[str, Any]) -> bool:
        n = int(ev["blockNumber"])
        if n not in times:
            times[n] = int(q.chain.w3.eth.get_block(n)["timestamp"])
        return start <= times[n] < end

    return inside


def chain_faults(q: Quarry, start: int, end: int, block_times: dict[int, int] | None = None
                 ) -> set[str]:
    """Miners found at fault by the chain in blocks stamped [start, end): disputes resolved
    at fault, billing faults proven. `block_times` caches block timestamps across calls."""
    inside = _stamped(q, start, end, block_times)
    arb, since = q.arbitration, q.deployment.deploy_block
    found = {q.arbitration.get_dispute(int(ev["disputeId"])).miner
             for ev in arb.events("DisputeResolved", since)
             if ev["minerAtFault"] and inside(ev)}
    found |= {q.tasks.get_shard(int(ev["taskId"]), int(ev["shard"])).miner
              for ev in arb.events("BillingFaultProven", since) if inside(ev)}
    return {to_checksum_address(m) for m in found}


def unanswered_availability(q: Quarry, start: int, end: int,
                            block_times: dict[int, int] | None = None) -> set[str]:
    """Miners whose availability challenge was settled unanswered in blocks stamped
    [start, end): they lost that shard's budget and collateral; an offline honest miner looks
    the same as a withholding one, so the committee counts it as unavailability."""
    inside = _stamped(q, start, end, block_times)
    arb = q.arbitration
    return {to_checksum_address(arb.get_challenge(int(ev["challengeId"])).miner)
            for ev in arb.events("AvailabilityUnanswered", q.deployment.deploy_block)
            if inside(ev)}


def failed_challenges(proposal: Mapping[str, Any]) -> set[str]:
    """Miners whose answered challenge the leader scored 0: their outputs failed the
    statistical test (members co-sign only scores they reproduce), which is proof, not
    noise, so the report treats it as a fault (the dispute it triggers is counted too)."""
    scores = {to_checksum_address(m): int(s) for m, s in proposal["body"]["scores"].items()}
    return {to_checksum_address(c["miner"]) for c in proposal["body"]["challenges"]
            if c["status"] == "answered" and scores.get(to_checksum_address(c["miner"])) == 0}


def _check_carry(theirs: Mapping[str, Any], mine: Mapping[str, tuple[float, ...]]) -> None:
    """Raise QuarryError unless the leader's carried evidence (micro-nats) matches this
    member's own within rounding across hardware (1e-3 nats plus 1e-4 of the value)."""
    theirs = {to_checksum_address(m): v for m, v in theirs.items()}
    if set(theirs) != set(mine):
        raise QuarryError(f"the carried evidence names {sorted(theirs)}, expected "
                          f"{sorted(mine)}")
    for miner, values in mine.items():
        got = [int(x) / 1e6 for x in theirs[miner]]
        if len(got) != len(values) or any(abs(a - b) > 1e-3 + 1e-4 * abs(b)
                                           for a, b in zip(got, values, strict=False)):
            raise QuarryError(f"{miner}: the carried evidence {got} is not this member's "
                              f"{list(values)}")


def _pool_json(pool: Pool) -> dict[str, list[list[int]]]:
    """A pool as the proposal carries it: miner -> [[taskId, shard], ...], sorted."""
    return {m: [[t, s] for t, s in sorted(shards)] for m, shards in sorted(pool.items())}


def _check_pool(theirs: Any, mine: Pool) -> None:
    """Raise QuarryError unless the leader's pooled shards (`_pool_json`) are exactly this
    member's own (`CommitteeMember.pooled_shards`), naming the first shard added or
    dropped."""
    try:
        got = {(to_checksum_address(m), int(t), int(s))
               for m, shards in dict(theirs).items() for t, s in shards}
    except (TypeError, ValueError) as exc:
        raise QuarryError(f"the proposal's pooled shards are malformed: {exc}") from exc
    want = {(to_checksum_address(m), t, s) for m, shards in mine.items() for t, s in shards}
    for extra, what in ((got - want, "pools"), (want - got, "leaves out")):
        if extra:
            m, t, s = min(extra)
            raise QuarryError(f"the proposal {what} task {t} shard {s} of {m} "
                              f"({len(got)} pooled, this member pools {len(want)})")


def epoch_scores(proposal: Mapping[str, Any], observations: list[dict[str, Any]],
                 weights: Mapping[str, int]) -> dict[str, int | None]:
    """The leader's proposed scores, plus `MISSED_BPS` for each answer it reports missing
    that members holding more than a third of the epoch's weight (`weights`: member ->
    weight) confirmed (less: None, nothing recorded), so a lying leader cannot frame a miner
    as unavailable, nor can lying members without a third of the stake, however many
    identities they use. A missing answer is not a score: the reputation stays."""
    total = sum(weights.values())
    scores: dict[str, int | None] = {
        to_checksum_address(m): int(s) for m, s in proposal["body"]["scores"].items()}
    claimed = [c["miner"] for c in proposal["body"]["challenges"] if c["status"] == "missing"]
    for miner in claimed:
        confirmations = {o["author"] for o in observations
                         if o["author"] in weights and miner in o["body"].get("missing", [])}
        confirmed = sum(weights[a] for a in confirmations)
        scores[to_checksum_address(miner)] = MISSED_BPS if 3 * confirmed > total else None
    return scores


def _report_json(report: Report) -> dict[str, Any]:
    return {"epoch": report.epoch, "miners": list(report.miners),
            "scoresBps": list(report.scores_bps), "evidenceRoot": encode_hex(report.evidence_root)}


def _report_from_json(d: Mapping[str, Any]) -> Report:
    return Report(int(d["epoch"]), tuple(d["miners"]), tuple(int(s) for s in d["scoresBps"]),
                  bytes.fromhex(str(d["evidenceRoot"]).removeprefix("0x")))
