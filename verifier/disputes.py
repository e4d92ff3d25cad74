"""Dispute votes: a committee member's side of Arbitration.

`DisputeDesk.step()` is one pass of the loop `verifier run` drives:

1. find new `DisputeOpened` events (from the deployment block, each dispute once);
2. a dispute is judged by the committee of the epoch it was opened in (`Dispute.epoch`): a
   member votes only if it has weight in that snapshot (one that joined later does not; one
   that left since still does). For every dispute still open and inside its deadline that
   this member has not voted on, `judge` it, sign `Vote(disputeId, minerAtFault)` in
   Arbitration's EIP-712 domain and post it to the market's committee relay (kind "vote",
   epoch 0, topic = the dispute id);
3. read every member's vote on it from the relay, keep only valid ones of the snapshot, and
   as soon as one verdict's signatures weigh the dispute's quorum (more than 2/3 of its
   total weight: by stake, never by head count), send `Arbitration.castVotes` with those
   whose signers have no ballot yet;
4. when no quorum comes, record this member's own vote on-chain anyway once a share of the
   dispute's time has passed (`own_vote_after`, half by default): a member with no ballot on
   a dispute that expires can be reported absent, and loses its seat and part of its stake.

The relay is only a mailbox: every vote read from it is checked here (the signature must
recover to its author, the author must be in the dispute's snapshot, the vote must be for
this dispute), and the contract checks the signatures again. Several members usually reach
the quorum at about the same time; whoever's `castVotes` lands first wins, and the others'
revert with `NoNewVotes` or `DisputeNotOpen`, which is expected and quiet. The relay serves
current members only, so a member that has left since the dispute opened records its vote
on-chain alone, at once.

Judging (`judge`) is `verifier.shards.ShardJudge`'s: the miner is at fault when its own
result document is unavailable or inconsistent (withheld data), or when the shard's outputs,
all of them, fail `verifier.scoring.judge` under the reference model.

Transient trouble on the verifier's side (the market or the scoring workers do not answer)
never becomes a vote: the dispute is retried at the next step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account.signers.local import LocalAccount
from eth_utils import encode_hex, to_checksum_address

from market.chain.contracts import Ballot, Dispute, DisputeStatus
from market.chain.errors import ContractRevert
from market.errors import QuarryError
from market.logs import log_context
from market.marketapi import MarketAPI, MarketError, MarketUnavailable
from market.protocol.eip712 import Vote, sort_signatures
from market.protocol.errors import SignatureError
from market.protocol.messages import committee_message
from verifier import metrics
from verifier.scoring import ChallengeScore
from verifier.shards import DisputeDeferred, ShardJudge

if TYPE_CHECKING:
    from market.chain.deploy import Quarry
    from verifier.scoring_worker import ScoringClient

log = logging.getLogger("verifier.disputes")

VOTE_KIND = "vote"
VOTE_EPOCH = 0  # dispute votes belong to no epoch; the topic (dispute id) keys them


@dataclass(frozen=True)
class Verdict:
    """This verifier's honest judgement of one dispute; `score` is None when the miner is
    judged on its evidence alone (nothing was scored)."""

    dispute_id: int
    miner_at_fault: bool
    reason: str
    score: ChallengeScore | None


@dataclass(frozen=True)
class CastVote:
    """A vote this desk signed (and posted, or found already posted under its name)."""

    dispute_id: int
    miner_at_fault: bool
    signature: bytes
    reason: str


def vote_body(miner_at_fault: bool, signature: bytes, reason: str) -> dict[str, Any]:
    """The relay message body of a dispute vote."""
    return {"minerAtFault": miner_at_fault, "signature": encode_hex(signature),
            "reason": reason}


def valid_votes(messages: Iterable[Mapping[str, Any]], dispute_id: int, members: Iterable[str],
                chain_id: int, arbitration: str) -> dict[bool, dict[str, bytes]]:
    """The valid votes on `dispute_id` among relay messages: verdict -> {signer: signature}.

    A message counts when it is a vote on this dispute's topic, its author is one of
    `members`, and its `signature` is an EIP-712 `Vote(dispute_id, minerAtFault)` in
    Arbitration's domain that recovers to the author. Everything else (malformed bodies,
    votes signed for another dispute or verdict, non-members, a relay that forged the
    author) is dropped, since the contract would reject the whole `castVotes` for one bad
    signature. A signer counts once per verdict. `members` is the dispute's snapshot (an
    iterable of addresses, e.g. its weights mapping).
    """
    member_set = {to_checksum_address(m) for m in members}
    out: dict[bool, dict[str, bytes]] = {True: {}, False: {}}
    for msg in messages:
        try:
            if msg.get("kind") != VOTE_KIND or str(msg.get("topic")) != str(dispute_id):
                continue
            author = to_checksum_address(str(msg["author"]))
            body = msg["body"]
            fault = body["minerAtFault"]
            signature = bytes.fromhex(str(body["signature"]).removeprefix("0x"))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if not isinstance(fault, bool) or author not in member_set:
            continue
        try:
            signer = Vote(dispute_id, fault).recover(signature, chain_id, arbitration)
        except SignatureError:
            continue
        if signer == author:
            out[fault].setdefault(author, signature)
    return out


class DisputeDesk:
    """One committee member's dispute duty: judge, vote once, get the votes recorded.

    `lie=True` is a test mode (a Byzantine member): it votes the opposite of its honest
    verdict. `own_vote_after` is the share of a dispute's time after which this member
    records its own vote even without a quorum. The desk remembers which disputes it has
    seen, voted on, recorded and closed, so each step only reads new events and touches open
    disputes.
    """

    def __init__(self, q: Quarry, account: LocalAccount, market: MarketAPI,
                 scorer: ScoringClient, *,
                 lie: bool = False,
                 model_id: bytes | None = None, own_vote_after: float = 0.5) -> None:
        if not 0 <= own_vote_after < 1:
            raise QuarryError(f"own_vote_after must be in [0, 1), got {own_vote_after}")
        self.q = q
        self.account = account
        self.address = account.address
        self.market = market
        self.shards = ShardJudge(q, market, scorer,
                                 model_id=model_id)
        self.lie = lie
        self.open: set[int] = set()  # disputes seen and not yet closed
        self.votes: dict[int, CastVote] = {}  # what this desk signed, per dispute
        self.verdicts: dict[int, Verdict] = {}  # honest judgements (kept across retries)
        self.closed: dict[int, str] = {}  # dispute id -> how it ended, as far as seen here
        self.resolved_here: set[int] = set()  # disputes this desk's castVotes resolved
        self.recorded: set[int] = set()  # disputes where this member's ballot is on-chain
        self.own_vote_after = own_vote_after
        self._scan_from = q.deployment.deploy_block
        self._said: dict[int, str] = {}  # last deferral logged per dispute (log once)
        self._snapshots: dict[int, dict[str, int]] = {}  # epoch -> member -> weight
        self._shards: dict[int, tuple[int, int]] = {}  # dispute id -> (task, shard), for logs

    # ------------------------------------------------------------------ judging
    def judge(self, dispute_id: int) -> Verdict:
        """This verifier's honest verdict on a dispute (raises DisputeDeferred when it
        cannot judge now): `ShardJudge.judge` of the disputed shard, holding the disputed
        receipt. Without the client's inputs the receipt cannot be shown wrong, so the
        opener (the client, its arbiter or an auditor) carries the burden of proof."""
        d = self.q.arbitration.get_dispute(dispute_id)
        v = self.shards.judge(d.task_id, d.shard, receipt=d.receipt)
        if v.inputs_unusable:
            return Verdict(dispute_id, False, f"{v.reason}, receipt stands", None)
        own = v.scores[d.receipt.index - v.start] if v.scores else None
        reason = v.reason if own is None else (
            f"{v.reason}; request {d.receipt.index}: {own.tokens} tokens"
            + (f", {own.problem}" if own.problem else ""))
        return Verdict(dispute_id, v.fault, reason, own)

    # ------------------------------------------------------------------ the loop
    def step(self) -> None:
        """Vote once on each open dispute this member's seat judges, and get votes recorded
        on-chain: a verdict's signatures as soon as they weigh a quorum, and this member's
        own vote before the deadline when no quorum comes (see `own_vote_after`).

        Errors about one dispute are logged and retried next step; only an unreachable
        chain while looking for new disputes propagates.
        """
        self._discover()
        if not self.open:
            return
        now = self.q.chain.timestamp()
        # The relay serves the current committee only; a member that has left since a
        # dispute opened still judges it, and votes on-chain alone.
        on_relay = self.q.committee.is_member(self.address)
        for dispute_id in sorted(self.open):
            task, shard = self._shards.get(dispute_id, (None, None))
            with log_context(dispute=dispute_id, task=task, shard=shard):
                try:
                    self._handle(dispute_id, now, on_relay)
                except DisputeDeferred as exc:
                    self._note(dispute_id, str(exc) + self._absence_warning(dispute_id, now))
                except QuarryError as exc:
                    self._note(dispute_id, f"dispute {dispute_id}: {exc}")

    def _handle(self, dispute_id: int, now: int, on_relay: bool) -> None:
        d = self.q.arbitration.get_dispute(dispute_id)
        if d.status != DisputeStatus.OPEN:
            self._close(dispute_id, d.status.name.lower())
            return
        if now >= d.deadline:
            self._close(dispute_id, "deadline passed unresolved")
            return
        weights = self.snapshot(d.epoch)
        if weights.get(self.address, 0) == 0:
            self._close(dispute_id, f"judged by epoch {d.epoch}'s committee, which this "
                        "verifier is not in: not voting")
            return
        if dispute_id not in self.votes:
            self._vote(dispute_id, on_relay)
        if self._cast_quorum(dispute_id, d, weights, on_relay):
            return
        if on_relay and now < self._own_vote_time(d):
            return
        self._cast_own(dispute_id, d, weights, on_relay)

    def try_resolve(self, dispute_id: int) -> bool:
        """Record the votes of one verdict now if the relay holds enough of them to weigh a
        quorum of the dispute's committee; True when this call's transaction resolved it.
        Quiet (False) when another member was first."""
        d = self.q.arbitration.get_dispute(dispute_id)
        if d.status != DisputeStatus.OPEN:
            return False
        return self._cast_quorum(dispute_id, d, self.snapshot(d.epoch),
                                 self.q.committee.is_member(self.address))

    def snapshot(self, epoch: int) -> dict[str, int]:
        """The weights of `epoch`'s committee, the one that judges disputes opened in it
        (cached; a revert naming a signer as no member drops the entry: slashed since)."""
        if epoch not in self._snapshots:
            c = self.q.committee
            weights = c.weights_at(epoch)
            # membersAt can miss members that have left since; this one's own weight counts.
            weights.setdefault(self.address, c.weight_at(self.address, epoch))
            self._snapshots[epoch] = {m: w for m, w in weights.items() if w > 0}
        return self._snapshots[epoch]

    def _own_vote_time(self, d: Dispute) -> int:
        """When this member records its own vote if no quorum has come: a share
        (`own_vote_after`) of the dispute's time, so it is never reported absent."""
        return d.opened_at + int((d.deadline - d.opened_at) * self.own_vote_after)

    def _absence_warning(self, dispute_id: int, now: int) -> str:
        try:
            d = self.q.arbitration.get_dispute(dispute_id)
        except QuarryError:
            return ""
        if d.status != DisputeStatus.OPEN or now < self._own_vote_time(d):
            return ""
        return (f" (WARNING: with no vote recorded by chain time {d.deadline}, this member "
                "can be reported absent: it loses its seat and part of its stake)")

    def _discover(self) -> None:
        head = self.q.chain.block_number()
        if head < self._scan_from:  # no new block (nodes refuse a range past the head)
            return
        for event in self.q.arbitration.events("DisputeOpened", self._scan_from):
            dispute_id = int(event["disputeId"])
            self._shards[dispute_id] = (int(event["taskId"]), int(event["shard"]))
            if dispute_id not in self.closed and dispute_id not in self.open:
                self.open.add(dispute_id)
                log.info("dispute %d opened on task %s shard %s (miner %s)", dispute_id,
                         event["taskId"], event["shard"], event["miner"],
                         extra={"dispute": dispute_id, "task": int(event["taskId"]),
                                "shard": int(event["shard"]), "miner": event["miner"]})
        # Events mined after `head` may come again next time; the id sets dedupe them.
        self._scan_from = head + 1

    def _close(self, dispute_id: int, how: str) -> None:
        self.open.discard(dispute_id)
        self.closed[dispute_id] = how
        self._said.pop(dispute_id, None)
        log.info("dispute %d closed: %s", dispute_id, how)

    def _note(self, dispute_id: int, message: str) -> None:
        """Log a reason for not acting, once until it changes."""
        if self._said.get(dispute_id) != message:
            self._said[dispute_id] = message
            log.warning("%s", message)

    def _arbitration_domain(self) -> tuple[int, str]:
        return self.q.chain_id, self.q.arbitration.address

    # ------------------------------------------------------------------ voting
    def _vote(self, dispute_id: int, on_relay: bool) -> None:
        """Judge (unless already judged), sign and post this member's one vote (off the
        relay, it is only signed: `_cast_own` records it on-chain)."""
        if on_relay:
            mine = self._own_posted_vote(dispute_id)
            if mine is not None:  # posted before a restart: never sign a second, other vote
                self.votes[dispute_id] = mine
                return
        verdict = self.verdicts.get(dispute_id)
        if verdict is None:
            verdict = self.judge(dispute_id)
            self.verdicts[dispute_id] = verdict
            log.info("dispute %d: miner %s (%s)", dispute_id,
                     "at fault" if verdict.miner_at_fault else "not at fault", verdict.reason)
        fault, reason = verdict.miner_at_fault, verdict.reason
        if self.lie:
            fault, reason = not fault, f"test-mode lie; honest verdict: {reason}"
        chain_id, arbitration = self._arbitration_domain()
        signature = Vote(dispute_id, fault).sign(self.account.key, chain_id, arbitration)
        if on_relay:
            self._post_vote(dispute_id, fault, signature, reason)
            if dispute_id in self.votes:  # an earlier vote of ours was there: kept
                return
        self.votes[dispute_id] = CastVote(dispute_id, fault, signature, reason)
        metrics.DISPUTES_VOTED.labels("fault" if fault else "no_fault").inc()

    def _post_vote(self, dispute_id: int, fault: bool, signature: bytes, reason: str) -> None:
        msg = committee_message(self.account, VOTE_KIND, VOTE_EPOCH, str(dispute_id),
                                vote_body(fault, signature, reason))
        try:
            self.market.post_message(msg)
        except MarketUnavailable as exc:
            raise DisputeDeferred(f"dispute {dispute_id}: cannot post the vote: {exc}") from exc
        except MarketError as exc:
            if exc.status == 409:  # an earlier vote of ours is there: keep that one
                mine = self._own_posted_vote(dispute_id)
                if mine is not None:
                    self.votes[dispute_id] = mine
                    return
            raise

    def _votes_on(self, dispute_id: int) -> list[dict[str, Any]]:
        try:
            return self.market.messages(self.account, epoch=VOTE_EPOCH, kind=VOTE_KIND,
                                        topic=str(dispute_id))
        except MarketUnavailable as exc:
            raise DisputeDeferred(f"dispute {dispute_id}: cannot read votes: {exc}") from exc

    def _own_posted_vote(self, dispute_id: int) -> CastVote | None:
        chain_id, arbitration = self._arbitration_domain()
        mine = [m for m in self._votes_on(dispute_id)
                if str(m.get("author", "")).lower() == self.address.lower()]
        valid = valid_votes(mine, dispute_id, [self.address], chain_id, arbitration)
        for fault in (True, False):
            if self.address in valid[fault]:
                reason = str(mine[0].get("body", {}).get("reason", ""))
                return CastVote(dispute_id, fault, valid[fault][self.address], reason)
        return None

    def _tally(self, dispute_id: int, weights: Mapping[str, int],
               on_relay: bool) -> dict[bool, dict[str, bytes]]:
        """Valid votes of the dispute's committee, from the relay and this desk's own."""
        chain_id, arbitration = self._arbitration_domain()
        tally: dict[bool, dict[str, bytes]] = {True: {}, False: {}}
        if on_relay:
            tally = valid_votes(self._votes_on(dispute_id), dispute_id, weights, chain_id,
                                arbitration)
        own = self.votes.get(dispute_id)
        if own is not None:
            tally[own.miner_at_fault].setdefault(self.address, own.signature)
        return tally

    def _cast_quorum(self, dispute_id: int, d: Dispute, weights: Mapping[str, int],
                     on_relay: bool) -> bool:
        """Once one verdict's collected signatures weigh the dispute's quorum, record those
        not yet recorded; True when that resolved the dispute here."""
        quorum = d.total_weight * 2 // 3 + 1
        tally = self._tally(dispute_id, weights, on_relay)
        for fault in (True, False):
            if sum(weights[s] for s in tally[fault]) >= quorum:
                return self._send(dispute_id, d, fault, tally[fault], "a quorum")
        return False

    def _cast_own(self, dispute_id: int, d: Dispute, weights: Mapping[str, int],
                  on_relay: bool) -> None:
        """Record this member's own vote (with the other collected ones of its verdict that
        have no ballot yet), so the dispute cannot expire with it absent."""
        own = self.votes.get(dispute_id)
        if own is None or dispute_id in self.recorded:
            return
        tally = self._tally(dispute_id, weights, on_relay)
        self._send(dispute_id, d, own.miner_at_fault, tally[own.miner_at_fault],
                   "its own vote before the deadline")

    def _send(self, dispute_id: int, d: Dispute, fault: bool, sigs: Mapping[str, bytes],
              why: str) -> bool:
        """`castVotes` with the signatures in `sigs` whose signers have no ballot yet;
        True when it resolved the dispute. Races (NoNewVotes, DisputeNotOpen) are quiet."""
        arb = self.q.arbitration
        fresh = {s: sig for s, sig in sigs.items() if arb.ballot_of(dispute_id, s) == Ballot.NONE}
        if self.address in sigs and self.address not in fresh:
            self.recorded.add(dispute_id)
        if not fresh:
            return False
        chain_id, arbitration = self._arbitration_domain()
        ordered = sort_signatures(Vote(dispute_id, fault), list(fresh.values()), chain_id,
                                  arbitration)
        try:
            tx = arb.cast_votes(self.account, dispute_id, fault, ordered)
        except ContractRevert as exc:
            return self._cast_failed(dispute_id, d, exc)
        if self.address in fresh:
            self.recorded.add(dispute_id)
        verdict = f"miner {'at' if fault else 'not at'} fault"
        if tx.all("DisputeResolved"):
            self.resolved_here.add(dispute_id)
            self._close(dispute_id, f"resolved here: {verdict} ({len(fresh)} new votes, "
                                    f"{why})")
            return True
        log.info("dispute %d: recorded %d vote(s) for %s (%s)", dispute_id, len(fresh),
                 verdict, why)
        return False

    def _cast_failed(self, dispute_id: int, d: Dispute, exc: ContractRevert) -> bool:
        if exc.error == "NoNewVotes":  # another member recorded the same votes first
            return False
        if exc.error in ("DisputeNotOpen", "DisputeDeadlinePassed"):
            self._close(dispute_id, "resolved by another member" if exc.error ==
                        "DisputeNotOpen" else "deadline passed unresolved")
            return False
        if exc.error == "NotCommitteeMember":  # a signer was slashed since: recount
            self._snapshots.pop(d.epoch, None)
        raise exc
