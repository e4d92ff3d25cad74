"""`miner status`, `miner withdraw` and `miner exit`: the miner's on-chain account.

Everything is read from the chain (GPURegistry for stake, collateral, reputation, probation
and exit; TaskRegistry events for shards and earnings; Arbitration for availability
challenges; PaymentEscrow for what can be withdrawn), so the figures hold whether or not a
market is running.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from market.errors import QuarryError
from market.standing import miner_standing

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.deploy import Quarry


class MinerStateError(QuarryError):
    """The miner's on-chain state does not allow the command (names what is missing)."""


def format_time(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def unbonding_period(q: Quarry) -> int:
    return int(q.chain.call(q.gpu.contract.functions.unbondingPeriod()))


def verdict_note(epoch: int, until: int, now: int) -> str:
    """Why an exiting miner's settled stake still waits, and until when at the latest."""
    return (f"waiting for the committee's report of epoch {epoch}, which carries any fault "
            "found on this miner's last settled shards; the stake can be withdrawn once it is "
            f"in, and at the latest at {format_time(until)} ({until - now} s from now) if the "
            "committee stays silent")


def probation_note(passed_epochs: int, epochs: int, pass_bps: int) -> str:
    """What probation means for a miner on it, and what ends it (`probation_params()`)."""
    return (f"this miner is on probation ({passed_epochs} of {epochs} passing epochs): it may "
            "claim only tasks that allow miners on probation (the committee's challenge tasks, "
            "clients that opt in, and by default every client while no established miner "
            f"serves the model) until {epochs} consecutive committee reports score it at or "
            f"above {pass_bps} bps")


def challenges_of(q: Quarry, address: str) -> list[dict[str, Any]]:
    """Every availability challenge naming `address`, with its current status."""
    from eth_utils import to_checksum_address

    out = []
    for ev in q.arbitration.events("AvailabilityChallenged", q.deployment.deploy_block):
        if to_checksum_address(ev["miner"]) != address:
            continue
        c = q.arbitration.get_challenge(int(ev["challengeId"]))
        out.append({"challengeId": int(ev["challengeId"]), "taskId": c.task_id,
                    "shard": c.shard, "index": c.index, "status": c.status.name,
                    "challenger": c.challenger, "bond": c.bond, "deadline": c.deadline})
    return out


@dataclass
class MinerStatus:
    address: str
    registered: bool
    eligible_state: str  # "active", "exiting", "not registered"
    stake: int
    locked: int
    reputation_bps: int
    price_per_token: int
    endpoint: str
    gpu: dict[str, Any]
    models: list[str]
    exit_requested_at: int
    withdrawable_at: int | None  # when the unbonding ends (after an exit request)
    shards_claimed: int
    shards_submitted: int
    shards_finalized: int
    claims_reclaimed: int
    earnings_wei: int  # sum of ShardFinalized payments
    penalties_wei: int  # sum of reclaim penalties
    withdrawable_wei: int  # escrowed for this miner now
    open_claims: list[dict[str, int]] = field(default_factory=list)
    chain_time: int = 0
    on_probation: bool = False
    passed_epochs: int = 0
    probation_epochs: int = 0  # GPURegistry.probation_params()
    probation_pass_bps: int = 0
    challenges_answered: int = 0
    challenges_unanswered: int = 0  # each one slashed the shard's collateral
    open_challenges: list[dict[str, Any]] = field(default_factory=list)
    # each served model's declared precision (fp32 ... int8): its shards are judged at it
    precisions: dict[str, str] = field(default_factory=dict)
    standing: str = ""  # market.standing.miner_standing
    untrusted_below_bps: int = 0
    rechallenge_pending: bool = False
    missed_reports: int = 0  # committee reports in a row that found its challenge unanswered
    missed_reports_allowed: int = 0
    # the committee report an exiting miner's withdrawal still waits for, and the latest time
    # it waits (GPURegistry.verdictWait); None when it waits for none
    verdict_epoch: int | None = None
    verdict_until: int = 0
    # what claims can never lock: the untrusted burn's share of the stake, or the reserve held
    # while a dispute against the miner awaits its verdict report if larger (GPURegistry)
    untrusted_slash_bps: int = 0
    reserve: int = 0

    @property
    def kept_back(self) -> int:
        """Wei of the stake no claim may lock (GPURegistry's `_burnDue`)."""
        return max(self.stake * self.untrusted_slash_bps // 10_000, self.reserve)

    @property
    def claimable(self) -> int:
        """Wei of collateral new claims can still lock."""
        return max(0, self.stake - self.locked - self.kept_back)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"miner      {self.address} ({self.eligible_state})"]
        if self.registered:
            lines += [
                f"stake      {self.stake} wei ({self.locked} wei locked as collateral, "
                f"{self.claimable} wei free for claims, {self.kept_back} wei kept back for "
                f"an untrusted verdict's burn"
                + (", held as the reserve of an open dispute)" if self.reserve else ")"),
                f"reputation {self.reputation_bps} bps",
                "standing   " + self._standing(),
                f"price      {self.price_per_token} wei/token",
                f"endpoint   {self.endpoint}",
                f"gpu        {self.gpu['count']} x {self.gpu['name']} "
                f"({self.gpu['memory_mib']} MiB)",
                *[f"model      {m} in {self.precisions.get(m, 'undeclared')}"
                  for m in self.models],
            ]
        if self.withdrawable_at is not None:
            left = self.withdrawable_at - self.chain_time
            lines.append(f"exit       requested at {format_time(self.exit_requested_at)}; "
                         f"stake withdrawable at {format_time(self.withdrawable_at)}"
                         + (f" (in {left} s)" if left > 0 else " (now)"))
            if self.verdict_epoch is not None:
                lines.append("verdict    " + verdict_note(self.verdict_epoch, self.verdict_until,
                                                         self.chain_time))
        lines += [
            f"shards     {self.shards_claimed} claimed, {self.shards_submitted} submitted, "
            f"{self.shards_finalized} finalized, {self.claims_reclaimed} reclaimed (expired)",
            f"earnings   {self.earnings_wei} wei paid in total"
            + (f"; {self.penalties_wei} wei lost to reclaim penalties"
               if self.penalties_wei else ""),
            f"escrow     {self.withdrawable_wei} wei withdrawable (`miner withdraw`)",
        ]
        for c in self.open_claims:
            lines.append(f"claimed    task {c['taskId']} shard {c['shard']}, expires "
                         f"{format_time(c['claimExpiry'])}, {c['collateral']} wei "
                         "collateral")
        if self.challenges_answered or self.challenges_unanswered:
            lines.append(f"challenges {self.challenges_answered} answered, "
                         f"{self.challenges_unanswered} unanswered (slashed)")
        lines += [self._challenge_line(c) for c in self.open_challenges]
        return "\n".join(lines)

    def _standing(self) -> str:
        """The standing in a word, what it may claim, and what changes it."""
        missed = ""
        if self.missed_reports:
            missed = (f"; {self.missed_reports} challenge report(s) in a row found it "
                      "unavailable (missed, not failed: no reputation or stake lost"
                      + (f"; probation again after {self.missed_reports_allowed}"
                         if not self.on_probation else "") + ")")
        if self.standing == "untrusted":
            return (f"UNTRUSTED: reputation {self.reputation_bps} bps is under "
                    f"{self.untrusted_below_bps}; it may claim nothing, not even the "
                    "committee's challenges, until it pays to be challenged again "
                    "(`miner rechallenge`: the fee, and after a first untrusted report 10% of "
                    "its stake; leaving untrusted burns that 10% too)" + missed)
        if self.standing == "re-challenged":
            return ("RE-CHALLENGED: untrusted, with a paid re-challenge pending: until the "
                    "committee's next report it may claim only tasks that allow probation and "
                    "set no reputation floor (the challenges)" + missed)
        if self.standing == "on probation":
            return (f"ON PROBATION: {self.passed_epochs} of {self.probation_epochs} passing "
                    "epochs; may claim only tasks that allow miners on probation until "
                    f"{self.probation_epochs} consecutive committee reports score it at or "
                    f"above {self.probation_pass_bps} bps" + missed)
        if self.standing == "exiting":
            return "EXITING: claims nothing new" + missed
        return "trusted (may claim every task its reputation allows)" + missed

    def _challenge_line(self, c: dict[str, Any]) -> str:
        left = c["deadline"] - self.chain_time
        when = f"in {left} s" if left > 0 else "deadline passed: the miner is at fault"
        return (f"CHALLENGE  #{c['challengeId']} task {c['taskId']} shard {c['shard']} request "
                f"{c['index']} (bond {c['bond']} wei): answer by {format_time(c['deadline'])} "
                f"({when}; `miner run` answers it)")


def miner_status(q: Quarry, address: str) -> MinerStatus:
    """The miner's account and history, from the chain."""
    from eth_utils import to_checksum_address

    from market.chain.contracts import ShardState

    address = to_checksum_address(address)
    gpu, tasks, since = q.gpu, q.tasks, q.deployment.deploy_block
    registered = gpu.is_registered(address)
    info = gpu.miner_info(address)
    claimed = tasks.events("ShardClaimed", since, miner=address)
    submitted = tasks.events("ResultSubmitted", since, miner=address)
    finalized = tasks.events("ShardFinalized", since, miner=address)
    reclaimed = tasks.events("ClaimReclaimed", since, miner=address)
    probation = gpu.probation_params()
    untrusted, pending = gpu.untrusted_below_bps(), gpu.rechallenge_pending(address)
    withdrawable_at, verdict_epoch, verdict_until = None, None, 0
    if registered and info.exit_requested_at:
        withdrawable_at = info.exit_requested_at + unbonding_period(q)
        epoch, verdict_until = gpu.verdict_wait(address)
        verdict_epoch = epoch if verdict_until else None
    challenges = challenges_of(q, address)
    models = gpu.models_of(address)
    precisions = {"0x" + m.hex(): p.label for m in models
                  if (p := gpu.precision_of(address, m)) is not None}
    open_claims: list[dict[str, Any]] = []
    for ev in claimed:
        t, s = int(ev["taskId"]), int(ev["shard"])
        sh = tasks.get_shard(t, s)
        if sh.state == ShardState.CLAIMED and sh.miner == address and \
                (t, s) not in {(c["taskId"], c["shard"]) for c in open_claims}:
            open_claims.append({"taskId": t, "shard": s, "claimExpiry": sh.claim_expiry,
                                "collateral": sh.collateral})
    return MinerStatus(
        address=address,
        registered=registered,
        eligible_state=("not registered" if not registered
                        else "exiting" if info.exit_requested_at else "active"),
        stake=info.stake, locked=info.locked, reputation_bps=info.reputation_bps,
        price_per_token=info.price_per_token, endpoint=info.endpoint,
        gpu={"name": info.gpu.name, "memory_mib": info.gpu.memory_mi_b, "count": info.gpu.count},
        models=["0x" + m.hex() for m in models], precisions=precisions,
        exit_requested_at=info.exit_requested_at, withdrawable_at=withdrawable_at,
        shards_claimed=len(claimed), shards_submitted=len(submitted),
        shards_finalized=len(finalized), claims_reclaimed=len(reclaimed),
        earnings_wei=sum(int(e["payment"]) for e in finalized),
        penalties_wei=sum(int(e["penalty"]) for e in reclaimed),
        withdrawable_wei=q.escrow.withdrawable(address),
        open_claims=open_claims,
        chain_time=q.chain.timestamp(),
        on_probation=info.on_probation, passed_epochs=info.passed_epochs,
        probation_epochs=probation[0], probation_pass_bps=probation[1],
        challenges_answered=sum(c["status"] == "ANSWERED" for c in challenges),
        challenges_unanswered=sum(c["status"] == "UNANSWERED" for c in challenges),
        open_challenges=[c for c in challenges if c["status"] == "OPEN"],
        standing=miner_standing(reputation_bps=info.reputation_bps,
                                untrusted_below_bps=untrusted, on_probation=info.on_probation,
                                rechallenge_pending=pending,
                                exiting=bool(info.exit_requested_at)) if registered else "",
        untrusted_below_bps=untrusted, rechallenge_pending=pending,
        missed_reports=gpu.missed_reports_of(address),
        missed_reports_allowed=gpu.missed_reports_allowed(),
        verdict_epoch=verdict_epoch, verdict_until=verdict_until,
        untrusted_slash_bps=gpu.untrusted_slash_bps(), reserve=gpu.reserve_of(address),
    )


def withdraw_earnings(q: Quarry, account: LocalAccount) -> int:
    """Pull the miner's escrowed payments; returns the wei sent."""
    amount = q.escrow.withdrawable(account.address)
    if amount == 0:
        raise MinerStateError(f"nothing to withdraw: escrow holds 0 wei for {account.address} "
                              "(shards pay once finalized after their challenge window)")
    q.escrow.withdraw(account)
    return amount


def withdraw_stake(q: Quarry, account: LocalAccount) -> tuple[int, int]:
    """Take the stake back after `miner exit`, the unbonding period, the settlement of every
    shard and the committee's verdict on the last ones; returns (wei sent, wei burned: the
    untrusted burn of a miner that leaves untrusted, see GPURegistry.withdrawStake)."""
    address = account.address
    if not q.gpu.is_registered(address):
        raise MinerStateError(f"{address} is not a registered miner: no stake to withdraw")
    info = q.gpu.miner_info(address)
    if not info.exit_requested_at:
        raise MinerStateError("the stake is bonded: run `miner exit` first, then withdraw it "
                              "after the unbonding period")
    at = info.exit_requested_at + unbonding_period(q)
    now = q.chain.timestamp()
    if now < at:
        raise MinerStateError(f"unbonding is not over: the stake can be withdrawn at "
                              f"{format_time(at)}, {at - now} s from now")
    if info.locked:
        raise MinerStateError(f"{info.locked} wei of the stake is still locked as collateral by "
                              "claimed or submitted shards; wait until they are finalized")
    epoch, until = q.gpu.verdict_wait(address)
    if until:
        raise MinerStateError(verdict_note(epoch, until, now))
    tx = q.gpu.withdraw_stake(account)
    burned = sum(int(ev["amount"]) for ev in tx.all("Slashed"))
    return int(tx.event("StakeWithdrawn")["amount"]), burned


def request_rechallenge(q: Quarry, account: LocalAccount) -> tuple[int, int]:
    """Pay the re-challenge fee (burned) so the committee challenges this untrusted miner
    again; returns (the fee, the stake burned: after a single untrusted report, the burn it
    spared is due now, GPURegistry.requestRechallenge). MinerStateError names why it cannot,
    before any transaction."""
    from market.jobs import check_funds

    address = account.address
    if not q.gpu.is_registered(address):
        raise MinerStateError(f"{address} is not a registered miner: nothing to re-challenge")
    info = q.gpu.miner_info(address)
    untrusted = q.gpu.untrusted_below_bps()
    if info.reputation_bps >= untrusted:
        raise MinerStateError(f"reputation {info.reputation_bps} bps is not untrusted (below "
                              f"{untrusted}): the committee already challenges this miner")
    if info.exit_requested_at:
        raise MinerStateError("exit requested: an exiting miner is not challenged again")
    if q.gpu.rechallenge_pending(address):
        raise MinerStateError("a re-challenge is already pending: the committee's next "
                              "report on this miner decides it")
    fee = q.gpu.rechallenge_fee()
    check_funds(q, account, fee, q.gpu.contract.functions.requestRechallenge(),
                "GPURegistry.requestRechallenge", "re-challenge fee")
    tx = q.gpu.request_rechallenge(account, fee)
    return fee, sum(int(ev["amount"]) for ev in tx.all("Slashed"))


def request_exit(q: Quarry, account: LocalAccount) -> int:
    """Start unbonding; returns when the stake can be withdrawn (chain time)."""
    address = account.address
    if not q.gpu.is_registered(address):
        raise MinerStateError(f"{address} is not a registered miner: nothing to exit")
    info = q.gpu.miner_info(address)
    if info.exit_requested_at:
        at = info.exit_requested_at + unbonding_period(q)
        raise MinerStateError(f"exit already requested; the stake can be withdrawn at "
                              f"{format_time(at)}")
    tx = q.gpu.request_exit(account)
    return int(tx.event("ExitRequested")["withdrawableAt"])
