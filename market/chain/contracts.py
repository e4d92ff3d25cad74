"""Typed wrappers over the five Quarry contracts.

Each wrapper takes the `Chain`, the contract's address, and (for transactions) the local
account that signs. Transactions return a `TxResult` (gas, decoded events); reverts raise
the `ContractRevert` subclass named after the custom error. Struct results come back as the
frozen dataclasses below, with snake_case fields. Amounts are wei, times are chain seconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, ClassVar, TypeVar

from eth_abi import encode
from eth_account.signers.local import LocalAccount
from eth_typing import ABIEvent
from eth_utils import event_abi_to_log_topic, to_checksum_address
from web3.contract import Contract
from web3.exceptions import ABIFunctionNotFound, MismatchedABI, Web3ValidationError
from web3.types import BlockIdentifier

from market.chain.artifacts import load_artifact
from market.chain.client import Chain, Read, TxResult, plain
from market.chain.errors import ChainError
from market.protocol.eip712 import Receipt, Report, SwarmConsent
from market.protocol.merkle import SumNode, SumStep
from market.protocol.precision import Precision, parse_precision

ZERO_ADDRESS = "0x" + "00" * 20
MISSED_BPS = 2**16 - 1
"""VerifierCommittee.MISSED: a report's score for a miner whose challenge went unanswered
within the answer window (unavailability: GPURegistry.recordMissed, reputation kept)."""

T = TypeVar("T")
_ABI_ERRORS = (ABIFunctionNotFound, MismatchedABI, Web3ValidationError)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def as_struct(cls: type[T], value: Any) -> T:
    """A dataclass (`Task`, `Shard`, `MinerInfo`...) from a decoded struct (named tuple or
    dict, as `call` or `Chain.read` answers it), matching camelCase to snake_case."""
    data = plain(value)
    if not isinstance(data, dict):
        raise ChainError(f"expected a struct for {cls.__name__}, got {type(value).__name__}")
    by_snake = {_snake(k): v for k, v in data.items()}
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in by_snake:
            raise ChainError(f"{cls.__name__}: the contract returned no field {f.name!r}")
        kwargs[f.name] = by_snake[f.name]
    hook = getattr(cls, "_convert", None)
    return cls(**(hook(kwargs) if hook else kwargs))


class ShardState(IntEnum):
    OPEN = 0
    CLAIMED = 1
    SUBMITTED = 2
    DISPUTED = 3
    FINALIZED = 4
    REFUNDED = 5


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_mi_b: int
    count: int

    def as_tuple(self) -> tuple[str, int, int]:
        return (self.name, self.memory_mi_b, self.count)


@dataclass(frozen=True)
class MinerInfo:
    stake: int
    locked: int
    settled_at: int  # when its latest shard settled: the verdict report it waits for follows
    reputation_bps: int
    price_per_token: int
    endpoint: str
    gpu: GpuSpec
    exit_requested_at: int
    active: bool
    registered_at: int
    on_probation: bool
    passed_epochs: int

    @staticmethod
    def _convert(kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "gpu": as_struct(GpuSpec, kw["gpu"])}


@dataclass(frozen=True)
class Task:
    client: str
    arbiter: str
    model_id: bytes
    input_root: bytes
    input_uri: str
    num_requests: int
    shard_size: int
    max_tokens_per_request: int
    num_shards: int
    price_per_token: int
    deadline: int
    created_at: int
    min_reputation_bps: int
    allow_probation: bool
    precisions: int  # accepted-precision mask: bit p accepts Precision p; 0 accepts any
    require_commitments: bool
    cancelled: bool
    committed: int


@dataclass(frozen=True)
class Shard:
    state: ShardState
    miner: str
    precision: int  # the claimant's declared Precision at the claim; 0 while open
    claim_expiry: int
    submitted_at: int
    window_end: int
    tokens_used: int
    collateral: int
    result_root: bytes
    result_uri: str

    @staticmethod
    def _convert(kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "state": ShardState(kw["state"])}


@dataclass(frozen=True)
class SwarmInfo:
    """A swarm's fixed terms (GPURegistry.swarmInfo); `active` is False once a member left."""

    model_id: bytes
    head: str
    price_per_token: int
    members: tuple[str, ...]
    shares: tuple[int, ...]
    total_shares: int
    head_index: int
    active: bool

    @staticmethod
    def _convert(kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "model_id": bytes(kw["model_id"]),
                "members": tuple(to_checksum_address(m) for m in kw["members"]),
                "shares": tuple(int(x) for x in kw["shares"])}


SEATED = 2**64 - 1
"""`VerifierInfo.active_until` of a verifier that has not asked to leave."""


@dataclass(frozen=True)
class VerifierInfo:
    stake: int
    weight: int
    active_from: int  # first epoch it votes in (0: not registered)
    active_until: int  # first epoch it no longer votes in (SEATED while seated)
    withdrawable_at: int  # chain time its stake may leave (0 while seated)

    @property
    def registered(self) -> bool:
        return self.active_from != 0

    @property
    def seated(self) -> bool:
        """Registered and not leaving (possibly not active yet)."""
        return self.registered and self.active_until == SEATED

    @property
    def sits(self) -> bool:
        """Holds a seat for at least one epoch, past, present or future (a join withdrawn
        before it took effect never does: its record only waits for its stake to unbond)."""
        return self.registered and self.active_from < self.active_until


class QuarryContract:
    """A thin wrapper: `_tx` sends as a given account, `_call` reads, `fn` binds a function
    for `Chain.read` to batch."""

    NAME: ClassVar[str]

    def __init__(self, chain: Chain, address: str) -> None:
        self.chain = chain
        self.address = to_checksum_address(address)
        abi = load_artifact(self.NAME).abi
        self.contract: Contract = chain.contract(self.NAME, self.address, abi)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address})"

    def fn(self, name: str, *args: Any) -> Any:
        """The contract function `name` bound to `args` (to send, call, or batch in
        `Chain.read`); arguments its ABI refuses raise `ChainError`."""
        try:
            return self.contract.functions[name](*args)
        except _ABI_ERRORS as exc:
            raise ChainError(f"{self.NAME}.{name}: bad arguments {args!r}: {exc}") from exc

    def _tx(self, sender: LocalAccount, name: str, *args: Any, value: int = 0) -> TxResult:
        try:
            return self.chain.send(self.fn(name, *args), sender, value=value,
                                   where=f"{self.NAME}.{name}")
        except _ABI_ERRORS as exc:
            raise ChainError(f"{self.NAME}.{name}: bad arguments {args!r}: {exc}") from exc

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return self.chain.call(self.fn(name, *args))
        except _ABI_ERRORS as exc:
            raise ChainError(f"{self.NAME}.{name}: bad arguments {args!r}: {exc}") from exc

    def owner(self) -> str:
        return str(self._call("owner"))

    def events(self, name: str, from_block: int = 0, **filters: Any) -> list[dict[str, Any]]:
        """Arguments of every `name` event since `from_block`, filtered on indexed args."""
        (logs,) = self.chain.read([self.log_query(name, from_block, **filters)])
        return self.decode_events(name, logs)

    def log_query(self, name: str, from_block: int = 0, **filters: Any) -> Read:
        """The `eth_getLogs` read behind `events(name, from_block, **filters)`, for
        `Chain.read` to batch with others; `decode_events` turns its answer into theirs."""
        abi = self._event_abi(name)
        indexed = [arg for arg in abi["inputs"] if arg.get("indexed")]
        unknown = set(filters) - {arg["name"] for arg in indexed}
        if unknown:
            raise ChainError(f"{self.NAME}.{name} has no indexed argument(s) "
                             f"{', '.join(sorted(unknown))}")
        topics: list[str | None] = ["0x" + event_abi_to_log_topic(abi).hex()]
        for arg in indexed:  # a topic per indexed argument, in order; None matches any
            value = filters.get(arg["name"])
            try:
                topics.append(None if value is None
                              else "0x" + encode([arg["type"]], [value]).hex())
            except Exception as exc:  # eth_abi's encoding errors share no base class
                raise ChainError(f"{self.NAME}.{name}: bad filter {arg['name']}={value!r}: "
                                 f"{exc}") from exc
        while topics[-1] is None:
            topics.pop()
        params = {"address": self.address, "fromBlock": int(from_block), "toBlock": "latest",
                  "topics": topics}
        return lambda eth: eth.get_logs(params)  # type: ignore[arg-type]

    def decode_events(self, name: str, logs: Sequence[Any]) -> list[dict[str, Any]]:
        """`log_query(name, ...)`'s answer as `events` returns it: each log's arguments and
        its block number."""
        event = self.contract.events[name]()
        return [plain(event.process_log(log)["args"]) | {"blockNumber": log["blockNumber"]}
                for log in logs]

    def _event_abi(self, name: str) -> ABIEvent:
        for item in self.contract.abi:
            if item.get("type") == "event" and item.get("name") == name:
                return item  # type: ignore[return-value]
        raise ChainError(f"{self.NAME} has no event {name!r}")


class PaymentEscrow(QuarryContract):
    NAME = "PaymentEscrow"

    def withdraw(self, sender: LocalAccount) -> TxResult:
        return self._tx(sender, "withdraw")

    def withdrawable(self, account: str) -> int:
        return int(self._call("withdrawable", to_checksum_address(account)))

    def escrowed(self, task_id: int) -> int:
        return int(self._call("escrowed", task_id))

    def total_escrowed(self) -> int:
        return int(self._call("totalEscrowed"))

    def total_withdrawable(self) -> int:
        return int(self._call("totalWithdrawable"))

    def balance(self) -> int:
        """The contract's wei: always `total_escrowed() + total_withdrawable()`."""
        return self.chain.balance(self.address)


class GPURegistry(QuarryContract):
    NAME = "GPURegistry"

    def register(
        self,
        sender: LocalAccount,
        model_ids: Sequence[bytes],
        gpu: GpuSpec,
        endpoint: str,
        price_per_token: int,
        stake: int,
        precisions: Sequence[object] | None = None,
    ) -> TxResult:
        """Register serving `model_ids[i]` in `precisions[i]` (a `Precision`, its name or
        number; default FP32 for every model)."""
        return self._tx(sender, "register", list(model_ids),
                        _precisions(model_ids, precisions), gpu.as_tuple(), endpoint,
                        price_per_token, value=stake)

    def add_stake(self, sender: LocalAccount, amount: int) -> TxResult:
        return self._tx(sender, "addStake", value=amount)

    def update(
        self,
        sender: LocalAccount,
        model_ids: Sequence[bytes],
        gpu: GpuSpec,
        endpoint: str,
        price_per_token: int,
        precisions: Sequence[object] | None = None,
    ) -> TxResult:
        """Replace the profile; `precisions` as `register`'s."""
        return self._tx(sender, "update", list(model_ids), _precisions(model_ids, precisions),
                        gpu.as_tuple(), endpoint, price_per_token)

    def request_exit(self, sender: LocalAccount) -> TxResult:
        return self._tx(sender, "requestExit")

    def withdraw_stake(self, sender: LocalAccount) -> TxResult:
        return self._tx(sender, "withdrawStake")

    def verdict_wait(self, miner: str) -> tuple[int, int]:
        """(epoch, until): the committee report an exiting miner's withdrawal waits for (the
        one carrying any fault found on its last settled shards) and the latest time it waits,
        0 when it waits for nothing (`GPURegistry.verdictWait`)."""
        epoch, until = self._call("verdictWait", to_checksum_address(miner))
        return int(epoch), int(until)

    def reserve_of(self, miner: str) -> int:
        """Wei of `miner`'s stake held for the untrusted burn from a dispute's opening until the
        verdict report (`GPURegistry.reserveOf`): no claim locks it and no slash paying a client
        or voter takes it, so faulting on purpose towards its own client cannot dodge the burn."""
        return int(self._call("reserveOf", to_checksum_address(miner)))

    def is_eligible(self, miner: str, model_id: bytes, min_rep_bps: int = 0,
                    allow_probation: bool = False) -> bool:
        return bool(self._call("isEligible", to_checksum_address(miner), model_id, min_rep_bps,
                               allow_probation))

    def precision_of(self, miner: str, model_id: bytes) -> Precision | None:
        """The precision `miner` declared for `model_id`; None when it does not serve it."""
        p = int(self._call("precisionOf", to_checksum_address(miner), model_id))
        return Precision(p) if p else None

    def eligible_precision(self, miner: str, model_id: bytes, min_rep_bps: int = 0,
                           allow_probation: bool = False) -> Precision | None:
        """`miner`'s declared precision for `model_id` when `is_eligible`, else None."""
        p = int(self._call("eligiblePrecision", to_checksum_address(miner), model_id,
                           min_rep_bps, allow_probation))
        return Precision(p) if p else None

    def on_probation(self, miner: str) -> bool:
        return bool(self._call("onProbation", to_checksum_address(miner)))

    def set_probation(self, sender: LocalAccount, epochs: int, pass_bps: int) -> TxResult:
        """Owner only."""
        return self._tx(sender, "setProbation", epochs, pass_bps)

    def probation_params(self) -> tuple[int, int]:
        """(probationEpochs, probationPassBps)."""
        return int(self._call("probationEpochs")), int(self._call("probationPassBps"))

    def is_registered(self, miner: str) -> bool:
        return bool(self._call("isRegistered", to_checksum_address(miner)))

    def untrusted_reports_of(self, miner: str) -> int:
        """Consecutive committee reports that left `miner` untrusted (from the second on,
        each burned `untrustedSlashBps` of its stake)."""
        return int(self._call("untrustedReportsOf", to_checksum_address(miner)))

    def rechallenge_pending(self, miner: str) -> bool:
        return bool(self._call("rechallengePending", to_checksum_address(miner)))

    def missed_reports_of(self, miner: str) -> int:
        """Consecutive committee reports that found `miner`'s challenge unanswered (past
        `missedReportsAllowed` in a row, it went back on probation)."""
        return int(self._call("missedReportsOf", to_checksum_address(miner)))

    def missed_reports_allowed(self) -> int:
        return int(self._call("missedReportsAllowed"))

    def set_missed_reports_allowed(self, sender: LocalAccount, allowed: int) -> TxResult:
        """Owner only."""
        return self._tx(sender, "setMissedReportsAllowed", allowed)

    def rechallenge_fee(self) -> int:
        return int(self._call("rechallengeFee"))

    def request_rechallenge(self, sender: LocalAccount, fee: int) -> TxResult:
        """An untrusted miner pays `fee` (burned) to be challenged again."""
        return self._tx(sender, "requestRechallenge", value=fee)

    def miner_info(self, miner: str, block: BlockIdentifier = "latest") -> MinerInfo:
        """The miner's record as of `block`."""
        return as_struct(MinerInfo, self.chain.call(
            self.fn("minerInfo", to_checksum_address(miner)), block=block))

    def offer_terms(self, miners: Sequence[tuple[str, Sequence[bytes]]], min_rep_bps: int = 0,
                    allow_probation: bool = False
                    ) -> list[tuple[MinerInfo, list[Precision | None]]]:
        """For each (miner, its models): its registry entry and, per model, the precision it
        declared when `isEligible` (None when not: `eligiblePrecision`), all from one batch
        of reads (`Chain.read`): a client's offer list in one round trip, however many
        miners the market lists."""
        reads: list[Read] = []
        for miner, models in miners:
            address = to_checksum_address(miner)
            reads.append(self.fn("minerInfo", address))
            reads += [self.fn("eligiblePrecision", address, m, min_rep_bps, allow_probation)
                      for m in models]
        answers = iter(self.chain.read(reads))
        return [(as_struct(MinerInfo, next(answers)),
                 [Precision(p) if (p := int(next(answers))) else None for _ in models])
                for _, models in miners]

    def models_of(self, miner: str) -> list[bytes]:
        return [bytes(m) for m in self._call("modelsOf", to_checksum_address(miner))]

    def min_stake(self) -> int:
        return int(self._call("minStake"))

    def verdict_grace_epochs(self) -> int:
        return int(self._call("verdictGraceEpochs"))

    def untrusted_below_bps(self) -> int:
        """Miners under this reputation are untrusted: never eligible."""
        return int(self._call("untrustedBelowBps"))

    def untrusted_slash_bps(self) -> int:
        """The share of its stake an untrusted miner's burn takes, which claims never lock."""
        return int(self._call("untrustedSlashBps"))

    # -- swarms (GPURegistry's swarm notice)

    def nonces(self, member: str) -> int:
        """`member`'s current swarm-consent nonce: the one its next consent must sign."""
        return int(self._call("nonces", to_checksum_address(member)))

    def sign_swarm_consent(self, consent: SwarmConsent, member: LocalAccount) -> bytes:
        """`member`'s signature of `consent` at its current nonce, in this contract's domain."""
        mine = consent.with_nonce(self.nonces(member.address))
        return mine.sign(member.key, self.chain.chain_id, self.address)

    def hash_swarm_consent(self, consent: SwarmConsent) -> bytes:
        """The digest the contract checks for `consent` (at `consent.nonce`)."""
        return bytes(self._call("hashSwarmConsent", consent.terms(), consent.nonce))

    def register_swarm(self, sender: LocalAccount, consent: SwarmConsent,
                       signatures: Sequence[bytes]) -> tuple[int, TxResult]:
        """Register the swarm `consent` describes with one signature per member, in
        `consent.members` order (anyone may send it); returns the swarm id."""
        if len(signatures) != len(consent.members):
            raise ChainError(f"register_swarm needs {len(consent.members)} signatures (one per "
                             f"member), got {len(signatures)}")
        result = self._tx(sender, "registerSwarm", consent.terms(),
                          [bytes(s) for s in signatures])
        return int(result.event("SwarmRegistered")["swarmId"]), result

    def leave_swarm(self, sender: LocalAccount, swarm_id: int) -> TxResult:
        """The sender leaves; the swarm takes no new claims (its open shards run on)."""
        return self._tx(sender, "leaveSwarm", swarm_id)

    def cancel_swarm_consent(self, sender: LocalAccount) -> TxResult:
        """Use the sender's nonce, revoking every consent it signed and nobody registered."""
        return self._tx(sender, "cancelSwarmConsent")

    def swarm_info(self, swarm_id: int) -> SwarmInfo:
        return as_struct(SwarmInfo, self._call("swarmInfo", swarm_id))

    def swarm_precision(self, swarm_id: int) -> Precision | None:
        """The precision the swarm serves its model in (its members' least exact
        declaration); None when no member declares one (it cannot claim)."""
        p = int(self._call("swarmPrecision", swarm_id))
        return Precision(p) if p else None

    def swarm_count(self) -> int:
        return int(self._call("swarmCount"))

    def swarm_split(self, swarm_id: int, amount: int) -> dict[str, int]:
        """How `amount` wei splits over the swarm's members (floor each, remainder to head)."""
        members, parts = self._call("swarmSplit", swarm_id, amount)
        return {to_checksum_address(m): int(p) for m, p in zip(members, parts, strict=True)}


MAX_CLAIM_BATCH = 64
"""Most shards one `claimShards` transaction claims (TaskRegistry.MAX_CLAIM_BATCH)."""


class TaskRegistry(QuarryContract):
    NAME = "TaskRegistry"

    def create_task(
        self,
        sender: LocalAccount,
        *,
        model_id: bytes,
        input_root: bytes,
        input_uri: str,
        num_requests: int,
        shard_size: int,
        max_tokens_per_request: int,
        price_per_token: int,
        deadline: int,
        min_reputation_bps: int = 0,
        arbiter: str = ZERO_ADDRESS,
        allow_probation: bool = False,
        precisions: int = 0,
        require_commitments: bool = False,
        payment: int | None = None,
    ) -> tuple[int, TxResult]:
        """Post a task paying `payment` (default: the exact maximum cost); returns its id.
        `allow_probation` lets miners on probation claim its shards; `precisions` is the
        accepted-precision mask (`precision.precision_mask`; 0 accepts any);
        `require_commitments` asks every non-empty output for an activation commitment."""
        if payment is None:
            payment = num_requests * max_tokens_per_request * price_per_token
        terms = (model_id, input_root, input_uri, num_requests, shard_size,
                 max_tokens_per_request, price_per_token, deadline, min_reputation_bps,
                 to_checksum_address(arbiter), allow_probation, precisions,
                 require_commitments)
        result = self._tx(sender, "createTask", terms, value=payment)
        return int(result.event("TaskCreated")["taskId"]), result

    def claim_shard(self, sender: LocalAccount, task_id: int, shard: int) -> TxResult:
        return self._tx(sender, "claimShard", task_id, shard)

    def claim_shards(self, sender: LocalAccount, task_id: int,
                     shards: Sequence[int]) -> TxResult:
        """Several Open shards of one task in one transaction, all or none (at most
        `MAX_CLAIM_BATCH`): one `ShardClaimed` event each."""
        return self._tx(sender, "claimShards", task_id, [int(k) for k in shards])

    def claim_shard_for_swarm(self, sender: LocalAccount, task_id: int, shard: int,
                              swarm_id: int) -> TxResult:
        """The swarm's head claims for the group: the collateral is locked from the head's stake
        alone (it alone answers for the shard's faults); the payment is split by share."""
        return self._tx(sender, "claimShardForSwarm", task_id, shard, swarm_id)

    def shard_swarm(self, task_id: int, shard: int) -> int:
        """The swarm holding (or that last held) the shard's claim; 0 for a single miner."""
        return int(self._call("shardSwarm", task_id, shard))

    def submit_result(
        self,
        sender: LocalAccount,
        task_id: int,
        shard: int,
        result_root: bytes,
        result_uri: str,
        tokens_used: int,
    ) -> TxResult:
        return self._tx(sender, "submitResult", task_id, shard, result_root, result_uri,
                        tokens_used)

    def reclaim_expired(self, sender: LocalAccount, task_id: int, shard: int) -> TxResult:
        return self._tx(sender, "reclaimExpired", task_id, shard)

    def finalize_shard(self, sender: LocalAccount, task_id: int, shard: int) -> TxResult:
        return self._tx(sender, "finalizeShard", task_id, shard)

    def cancel_task(self, sender: LocalAccount, task_id: int) -> TxResult:
        return self._tx(sender, "cancelTask", task_id)

    def refund_unfinished(self, sender: LocalAccount, task_id: int, shard: int) -> TxResult:
        return self._tx(sender, "refundUnfinished", task_id, shard)

    def get_task(self, task_id: int) -> Task:
        return as_struct(Task, self._call("getTask", task_id))

    def get_shard(self, task_id: int, shard: int) -> Shard:
        return as_struct(Shard, self._call("getShard", task_id, shard))

    def read_task(self, task_id: int, num_shards: int,
                  also: Sequence[Read] = ()) -> tuple[Task, list[Shard], list[Any]]:
        """The task, its shards 0 .. `num_shards` - 1 (a task's count never changes) and the
        answers to `also`, from one batch of reads (`Chain.read`): a job's whole state in one
        round trip, however many shards it has."""
        return self.read_shards(task_id, range(num_shards), also)

    def read_shards(self, task_id: int, shards: Sequence[int],
                    also: Sequence[Read] = ()) -> tuple[Task, list[Shard], list[Any]]:
        """The task, the given shards and the answers to `also`, from one batch of reads;
        a shard that does not exist raises its named revert (`BadShard`)."""
        reads: list[Read] = [self.fn("getTask", task_id),
                             *(self.fn("getShard", task_id, k) for k in shards), *also]
        answers = self.chain.read(reads)
        n = len(shards)
        return (as_struct(Task, answers[0]), [as_struct(Shard, a) for a in answers[1:1 + n]],
                answers[1 + n:])

    def shard_range(self, task_id: int, shard: int) -> tuple[int, int]:
        start, end = self._call("shardRange", task_id, shard)
        return int(start), int(end)

    def shard_budget(self, task_id: int, shard: int) -> int:
        return int(self._call("shardBudget", task_id, shard))

    def num_shards(self, task_id: int) -> int:
        return int(self._call("numShards", task_id))

    def task_count(self) -> int:
        return int(self._call("taskCount"))

    def hash_receipt(self, receipt: Receipt) -> bytes:
        """The EIP-712 digest the contract computes for `receipt` (what the miner signs)."""
        return bytes(self._call("hashReceipt", receipt.as_tuple()))

    def receipt_struct_hash(self, receipt: Receipt) -> bytes:
        return bytes(self._call("receiptStructHash", receipt.as_tuple()))

    def domain_separator(self) -> bytes:
        return bytes(self._call("domainSeparator"))

    def params(self) -> dict[str, int]:
        names = ("collateralBps", "claimTimeout", "challengeWindow", "reclaimPenaltyBps")
        return {_snake(n): int(self._call(n)) for n in names}


class VerifierCommittee(QuarryContract):
    NAME = "VerifierCommittee"

    def register(self, sender: LocalAccount, stake: int) -> TxResult:
        return self._tx(sender, "register", value=stake)

    def request_exit(self, sender: LocalAccount) -> TxResult:
        return self._tx(sender, "requestExit")

    def withdraw_stake(self, sender: LocalAccount) -> TxResult:
        return self._tx(sender, "withdrawStake")

    def commit_challenge_set(
        self, sender: LocalAccount, epoch: int, challenge_set_hash: bytes,
        sigs: Sequence[bytes],
    ) -> TxResult:
        """`sigs`: member signatures, signers ascending (see `eip712.quorum_signatures`)."""
        return self._tx(sender, "commitChallengeSet", epoch, challenge_set_hash, list(sigs))

    def submit_reputation(self, sender: LocalAccount, report: Report,
                          sigs: Sequence[bytes]) -> TxResult:
        return self._tx(sender, "submitReputation", report.epoch, list(report.miners),
                        list(report.scores_bps), report.evidence_root, list(sigs))

    def prove_equivocation(
        self, sender: LocalAccount, verifier: str, a: Report, sig_a: bytes, b: Report,
        sig_b: bytes,
    ) -> TxResult:
        return self._tx(sender, "proveEquivocation", to_checksum_address(verifier),
                        a.as_tuple(), sig_a, b.as_tuple(), sig_b)

    def is_member(self, account: str) -> bool:
        """A member of the current epoch's committee."""
        return bool(self._call("isMember", to_checksum_address(account)))

    def members(self) -> list[str]:
        """The current epoch's committee, ascending by address."""
        return [to_checksum_address(m) for m in self._call("members")]

    def members_at(self, epoch: int) -> list[str]:
        """Epoch `epoch`'s committee, ascending by address."""
        return [to_checksum_address(m) for m in self._call("membersAt", epoch)]

    def seats(self) -> list[str]:
        """Every verifier holding a seat or still leaving one (unordered)."""
        return [to_checksum_address(m) for m in self._call("seats")]

    def weight_at(self, account: str, epoch: int) -> int:
        return int(self._call("weightAt", to_checksum_address(account), epoch))

    def weights_at(self, epoch: int) -> dict[str, int]:
        """Every member of `epoch`'s committee with its voting weight."""
        return {m: self.weight_at(m, epoch) for m in self.members_at(epoch)}

    def total_weight_at(self, epoch: int) -> int:
        return int(self._call("totalWeightAt", epoch))

    def quorum_weight(self, epoch: int) -> int:
        """The least signer weight that is a quorum in `epoch` (more than 2/3 of its total)."""
        return int(self._call("quorumWeight", epoch))

    def activation_delay(self) -> int:
        return int(self._call("activationDelay"))

    def epoch_start(self, epoch: int) -> int:
        return int(self._call("epochStart", epoch))

    def unbonding_period(self) -> int:
        return int(self._call("unbondingPeriod"))

    def next_report_epoch(self) -> int:
        return int(self._call("nextReportEpoch"))

    def strikes_of(self, account: str) -> int:
        return int(self._call("strikesOf", to_checksum_address(account)))

    def verifier_info(self, account: str) -> VerifierInfo:
        return as_struct(VerifierInfo, self._call("verifierInfo", to_checksum_address(account)))

    def current_epoch(self) -> int:
        return int(self._call("currentEpoch"))

    def epoch_duration(self) -> int:
        return int(self._call("epochDuration"))

    def genesis_time(self) -> int:
        return int(self._call("genesisTime"))

    def challenge_answer_window(self) -> int:
        """Seconds a challenged miner has, from its challenge task's creation, to answer
        before the committee may report the challenge missed."""
        return int(self._call("challengeAnswerWindow"))

    def leader_of(self, epoch: int, block: BlockIdentifier = "latest") -> str:
        """`leaderOf(epoch)` as of `block`: it moves with lastCommitHash, so an epoch's
        leader is read at the block that committed its challenge set."""
        return to_checksum_address(self.chain.call(self.fn("leaderOf", epoch), block=block))

    def raise_audit_rate(self, sender: LocalAccount, task_id: int, rate_bps: int,
                         fee: int | None = None) -> TxResult:
        """Buy the audit rate `rate_bps` for `sender`'s task, paying `fee` (default: the
        `audit_fee` quoted now) to the current committee; only while no shard is claimed."""
        if fee is None:
            fee = self.audit_fee(task_id, rate_bps)
        return self._tx(sender, "raiseAuditRate", task_id, rate_bps, value=fee)

    def audit_fee(self, task_id: int, rate_bps: int) -> int:
        """Wei `raise_audit_rate(task_id, rate_bps)` takes now."""
        return int(self._call("auditFee", task_id, rate_bps))

    def audit_rate_of(self, task_id: int, block: BlockIdentifier = "latest") -> int:
        """The audit rate (bps) bought for the task as of `block` (0: none bought)."""
        return int(self.chain.call(self.fn("auditRateOf", task_id), block=block))

    def base_audit_rate_bps(self) -> int:
        return int(self._call("BASE_AUDIT_RATE_BPS"))

    def audit_fee_bps(self) -> int:
        return int(self._call("auditFeeBps"))

    def audit_fee_per_member(self, epoch: int) -> int:
        return int(self._call("auditFeePerMember", epoch))

    def claim_audit_fees(self, sender: LocalAccount, epoch: int) -> TxResult:
        """Credit `sender`'s share of `epoch`'s audit fees in the escrow (once it is over)."""
        return self._tx(sender, "claimAuditFees", epoch)

    def challenge_set_of(self, epoch: int) -> bytes:
        return bytes(self._call("challengeSetOf", epoch))

    def reported(self, epoch: int) -> bool:
        return bool(self._call("reported", epoch))

    def last_commit_hash(self) -> bytes:
        return bytes(self._call("lastCommitHash"))

    def hash_challenge_set(self, epoch: int, challenge_set_hash: bytes) -> bytes:
        return bytes(self._call("hashChallengeSet", epoch, challenge_set_hash))

    def hash_report(self, report: Report) -> bytes:
        return bytes(self._call("hashReport", report.as_tuple()))

    def domain_separator(self) -> bytes:
        return bytes(self._call("domainSeparator"))


class DisputeStatus(IntEnum):
    NONE = 0
    OPEN = 1
    MINER_AT_FAULT = 2
    MINER_NOT_AT_FAULT = 3
    EXPIRED = 4


class Ballot(IntEnum):
    NONE = 0
    FAULT = 1
    NO_FAULT = 2
    ABSENT = 3  # reported absent from an expired dispute


class ChallengeStatus(IntEnum):
    NONE = 0
    OPEN = 1
    ANSWERED = 2
    UNANSWERED = 3


@dataclass(frozen=True)
class Dispute:
    task_id: int
    shard: int
    status: DisputeStatus
    opener: str
    miner: str
    bond: int
    opened_at: int
    deadline: int
    epoch: int  # the epoch whose committee judges it
    total_weight: int  # that committee's weight: a verdict needs more than 2/3 of it
    fault_weight: int
    no_fault_weight: int
    receipt: Receipt
    evidence_uri: str

    @staticmethod
    def _convert(kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "status": DisputeStatus(kw["status"]),
                "receipt": Receipt.from_message(kw["receipt"])}


@dataclass(frozen=True)
class AvailabilityChallenge:
    task_id: int
    shard: int
    index: int
    status: ChallengeStatus
    challenger: str
    miner: str
    bond: int
    opened_at: int
    deadline: int

    @staticmethod
    def _convert(kw: dict[str, Any]) -> dict[str, Any]:
        return {**kw, "status": ChallengeStatus(kw["status"])}


def _precisions(model_ids: Sequence[bytes], precisions: Sequence[object] | None) -> list[int]:
    """The `uint8[]` register and update take: one Precision per model (FP32 by default)."""
    if precisions is None:
        return [int(Precision.FP32)] * len(model_ids)
    return [int(parse_precision(p)) for p in precisions]


def _proof(proof: Sequence[SumNode]) -> list[tuple[bytes, int]]:
    return [p.as_tuple() for p in proof]


class Arbitration(QuarryContract):
    NAME = "Arbitration"

    def open_dispute(
        self,
        sender: LocalAccount,
        task_id: int,
        shard: int,
        receipt: Receipt,
        proof: Sequence[SumNode],
        evidence_uri: str,
        bond: int,
    ) -> tuple[int, TxResult]:
        """Dispute one receipt, proven under the shard's result tree (by the task's client or
        arbiter); returns the dispute id."""
        result = self._tx(sender, "openDispute", task_id, shard, receipt.as_tuple(),
                          _proof(proof), evidence_uri, value=bond)
        return int(result.event("DisputeOpened")["disputeId"]), result

    def cast_votes(self, sender: LocalAccount, dispute_id: int, miner_at_fault: bool,
                   sigs: Sequence[bytes]) -> TxResult:
        """Record committee Vote signatures (signers ascending, `eip712.sort_signatures`);
        the dispute resolves once one verdict holds more than 2/3 of its committee's weight
        (the result then carries `DisputeResolved`)."""
        return self._tx(sender, "castVotes", dispute_id, miner_at_fault, list(sigs))

    def expire_dispute(self, sender: LocalAccount, dispute_id: int) -> TxResult:
        return self._tx(sender, "expireDispute", dispute_id)

    def report_absence(self, sender: LocalAccount, dispute_id: int,
                       absent: Sequence[str]) -> TxResult:
        """Penalize members of an expired dispute's committee that cast no vote."""
        return self._tx(sender, "reportAbsence", dispute_id,
                        [to_checksum_address(a) for a in absent])

    def get_dispute(self, dispute_id: int) -> Dispute:
        return as_struct(Dispute, self._call("getDispute", dispute_id))

    def ballot_of(self, dispute_id: int, member: str) -> Ballot:
        return Ballot(int(self._call("ballotOf", dispute_id, to_checksum_address(member))))

    def voters_of(self, dispute_id: int, miner_at_fault: bool) -> list[str]:
        return [to_checksum_address(v) for v in self._call("votersOf", dispute_id,
                                                             miner_at_fault)]

    def dispute_count(self) -> int:
        return int(self._call("disputeCount"))

    def min_bond(self) -> int:
        return int(self._call("minBond"))

    # ------------------------------------------------------------------ availability, billing
    def challenge_availability(self, sender: LocalAccount, task_id: int, shard: int,
                               index: int, bond: int) -> tuple[int, TxResult]:
        """Ask the shard's miner to show request `index`'s receipt on-chain; returns the
        challenge id."""
        result = self._tx(sender, "challengeAvailability", task_id, shard, index, value=bond)
        return int(result.event("AvailabilityChallenged")["challengeId"]), result

    def answer_availability(self, sender: LocalAccount, challenge_id: int, receipt: Receipt,
                            proof: Sequence[SumNode]) -> TxResult:
        return self._tx(sender, "answerAvailability", challenge_id, receipt.as_tuple(),
                        _proof(proof))

    def settle_unanswered(self, sender: LocalAccount, challenge_id: int) -> TxResult:
        return self._tx(sender, "settleUnanswered", challenge_id)

    def prove_billing_fault(self, sender: LocalAccount, task_id: int, shard: int,
                            receipt: Receipt, proof: Sequence[SumNode], text_hash: bytes,
                            token_ids: Sequence[int]) -> TxResult:
        return self._tx(sender, "proveBillingFault", task_id, shard, receipt.as_tuple(),
                        _proof(proof), text_hash, list(token_ids))

    def prove_sum_fault(self, sender: LocalAccount, task_id: int, shard: int,
                        receipt: Receipt, path: Sequence[SumStep]) -> TxResult:
        """Prove that the shard's result tree records a false sum on `receipt`'s path
        (`path`: `sum_lie_path`); settled at once as a billing fault."""
        return self._tx(sender, "proveSumFault", task_id, shard, receipt.as_tuple(),
                        [p.as_tuple() for p in path])

    def availability_challenges_of(self, task_id: int, shard: int, challenger: str) -> int:
        """Availability challenges `challenger` opened on the shard (three at most, each
        challenger its own budget)."""
        return int(self._call("availabilityChallengesOf", task_id, shard, challenger))

    def get_challenge(self, challenge_id: int) -> AvailabilityChallenge:
        return as_struct(AvailabilityChallenge, self._call("getChallenge", challenge_id))

    def challenge_count(self) -> int:
        return int(self._call("challengeCount"))

    def proves(self, task_id: int, shard: int, receipt: Receipt,
               proof: Sequence[SumNode]) -> bool:
        """Whether the contract accepts `proof` for `receipt` under the shard's commitment."""
        return bool(self._call("proves", task_id, shard, receipt.as_tuple(), _proof(proof)))

    def min_availability_bond(self) -> int:
        return int(self._call("minAvailabilityBond"))

    def response_window(self) -> int:
        return int(self._call("responseWindow"))

    def hash_vote(self, dispute_id: int, miner_at_fault: bool) -> bytes:
        return bytes(self._call("hashVote", dispute_id, miner_at_fault))

    def receipt_leaf(self, receipt: Receipt) -> bytes:
        return bytes(self._call("receiptLeaf", receipt.as_tuple()))

    def domain_separator(self) -> bytes:
        return bytes(self._call("domainSeparator"))

    def params(self) -> dict[str, int]:
        names = ("minBond", "disputeTimeout", "faultSlashBps", "verifierRewardBps",
                 "minerBondShareBps", "minAvailabilityBond", "responseWindow")
        return {_snake(n): int(self._call(n)) for n in names}


WRAPPERS: dict[str, type[QuarryContract]] = {
    c.NAME: c for c in (PaymentEscrow, GPURegistry, TaskRegistry, VerifierCommittee, Arbitration)
}
