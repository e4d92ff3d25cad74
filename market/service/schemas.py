"""The market API's request and response bodies, as pydantic models: what `/openapi.json`
and `/docs` publish and what the schemathesis run checks every response against.

The JSON keys are the ones `MarketAPI` and the roles read (camelCase). Response models allow
extra keys (`extra="allow"`) so a field added on the board is never silently dropped by the
framework's response filtering; the documented ones are always there. Wei amounts are JSON
integers of any size (they pass 2^64).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

I64_MAX = 2**63 - 1


class Out(BaseModel):
    """A response body: documented keys, extra keys kept."""

    model_config = ConfigDict(extra="allow")


class ErrorOut(BaseModel):
    """Every error: one line naming the problem."""

    detail: str


# -- service ---------------------------------------------------------------------------
class HealthOut(Out):
    ok: bool = Field(description="the deployment is loaded and its chain answers")
    status: str = Field(description="`ok`; `degraded` with no live worker or no Redis (the "
                        "board stops following the chain); `down` when `ok` is false")
    chainId: int | None
    indexedBlock: int | None = Field(description="the board's cursor (null before indexing)")
    headBlock: int | None
    redis: bool = Field(description="whether the broker answers")
    workers: int = Field(description="Celery workers whose liveness key is fresh (< 10 s)")
    workerNames: list[str]
    settler: str | None = Field(None, description="the address that sends due settlements "
                                "(finalize, reclaim, refund...); null: none is set, so the "
                                "sweeps only report what is due (set [market] settler_key)")
    detail: str | None = None


class DeploymentOut(Out):
    chainId: int
    rpcUrl: str
    addresses: dict[str, str]
    deployBlock: int
    deployer: str | None = None
    params: dict[str, Any] | None = None
    anvilPid: int | None = None
    anvilLog: str | None = None


class LimitsOut(Out):
    maxFileBytes: int
    maxRequestBytes: int


# -- store -----------------------------------------------------------------------------
class StoredOut(Out):
    uri: str = Field(description="`sha256:` + the content's hex digest")
    size: int


# -- models ----------------------------------------------------------------------------
class ModelRegisteredOut(Out):
    modelId: str
    name: str


class ModelOut(Out):
    modelId: str
    name: str | None
    miners: int = Field(description="registered miners that may claim an ordinary task")
    minPricePerToken: int | None
    probationMiners: int
    hasManifest: bool


# -- jobs and shards -------------------------------------------------------------------
class ShardOut(Out):
    shard: int
    start: int
    end: int
    state: str
    miner: str | None
    claimExpiry: int
    windowEnd: int
    collateral: int
    tokensUsed: int
    resultRoot: str | None
    resultUri: str | None
    payment: int
    refund: int
    budget: int
    reclaims: int
    penalty: int
    precision: str | None = Field(description="the claimant's declared precision at the "
                                  "claim (fp32, fp16, bf16, fp8, int8), what the shard is "
                                  "judged at; null while open")


class DisputeOut(Out):
    disputeId: int
    shard: int
    index: int
    opener: str
    miner: str
    bond: int
    deadline: int
    evidenceUri: str
    status: str
    slashed: int
    openedBlock: int
    epoch: int
    totalWeight: int
    faultWeight: int
    noFaultWeight: int
    votes: int
    absent: int
    absentSlashed: int


class ChallengeOut(Out):
    challengeId: int
    shard: int
    index: int
    challenger: str
    miner: str
    bond: int
    deadline: int
    status: str
    windowEnd: int
    slashed: int
    openedBlock: int


class BillingFaultOut(Out):
    shard: int
    index: int
    prover: str
    slashed: int
    provenBlock: int


class JobSummaryOut(Out):
    taskId: int
    client: str
    arbiter: str | None
    modelId: str
    inputRoot: str
    inputUri: str
    numRequests: int
    shardSize: int
    numShards: int
    maxTokensPerRequest: int
    pricePerToken: int
    minReputationBps: int
    allowProbation: bool
    precisions: int = Field(description="accepted-precision mask: bit p accepts precision p "
                            "(1 fp32, 2 fp16, 3 bf16, 4 fp8, 5 int8); 0 accepts any")
    acceptedPrecisions: list[str]
    requireCommitments: bool
    payment: int
    deadline: int
    createdAt: int
    cancelled: bool
    createdBlock: int
    shardStates: dict[str, int]
    tokensUsed: int
    paid: int
    refunded: int
    done: bool


class JobOut(JobSummaryOut):
    shards: list[ShardOut]
    disputes: list[DisputeOut]
    challenges: list[ChallengeOut]
    billingFaults: list[BillingFaultOut]


class OpenShardOut(Out):
    taskId: int
    shard: int
    modelId: str
    pricePerToken: int
    deadline: int
    inputUri: str
    inputRoot: str
    start: int
    end: int
    maxTokensPerRequest: int
    minReputationBps: int
    allowProbation: bool
    precisions: int = Field(description="accepted-precision mask (0: any)")
    requireCommitments: bool
    budget: int
    offeredTo: str | None


# -- tasks and offers ------------------------------------------------------------------
class OfferIn(BaseModel):
    """A task's client offering the task to one miner, signed (EIP-191) over the canonical
    JSON of {taskId, miner, timestamp}."""

    miner: str
    timestamp: int = Field(ge=0, le=I64_MAX)
    signature: str


class OfferOut(Out):
    taskId: int
    miner: str
    until: int


# -- miners ----------------------------------------------------------------------------
class HeartbeatIn(BaseModel):
    """A miner's liveness report, signed (EIP-191) over the canonical JSON of {miner,
    timestamp, status}; `status` is a few counters (at most 4096 bytes)."""

    miner: str
    timestamp: int = Field(ge=0, le=I64_MAX)
    status: dict[str, Any]
    signature: str


class HeartbeatOut(Out):
    miner: str
    timestamp: int
    registered: bool


class GpuOut(Out):
    name: str | None
    memoryMiB: int
    count: int


class MinerOut(Out):
    address: str
    endpoint: str
    models: list[str]
    precisions: dict[str, str] = Field(description="each served model's declared precision "
                                       "(fp32, fp16, bf16, fp8, int8)")
    gpu: GpuOut
    pricePerToken: int
    stake: int
    locked: int
    slashed: int
    reputationBps: int
    exiting: bool
    withdrawableAt: int = Field(description="when an exiting miner's unbonding ends; its stake "
                                "also waits for its shards to settle and for the committee's "
                                "report of the epoch after the last settlement "
                                "(GPURegistry.verdictWait)")
    onProbation: bool
    untrusted: bool
    rechallengePending: bool
    missedReports: int = Field(description="committee reports in a row that found its "
                               "challenge unanswered")
    standing: str = Field(description="exiting | untrusted | re-challenged | on probation | "
                          "trusted (market.standing)")
    eligible: bool
    eligibleAllowingProbation: bool
    registeredBlock: int
    lastSeen: int | None
    status: dict[str, Any] | None
    alive: bool


# -- committee -------------------------------------------------------------------------
class CommitteeMessageIn(BaseModel):
    """A verifier's message, signed (EIP-191) over the canonical JSON of the other fields;
    `author` checksummed (EIP-55)."""

    author: str
    kind: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    epoch: int = Field(ge=0, le=I64_MAX)
    topic: str = Field(max_length=256)
    body: dict[str, Any]
    signature: str


class MessageIdOut(Out):
    id: int


class CommitteeMessageOut(Out):
    id: int
    author: str
    kind: str
    epoch: int
    topic: str
    body: dict[str, Any]
    signature: str
    receivedAt: float


# -- swarms ----------------------------------------------------------------------------
Address = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
ModelIdHex = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{64}$")]
Signature = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{130}$")]
Z85_KEY = r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$"
U256_MAX = 2**256 - 1
PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
"""A TCP port, 1 to 65535, as a pattern (so the OpenAPI document states the range)."""


class SwarmJoinIn(BaseModel):
    """A miner joining a model's swarm, or its heartbeat there: what it declares, signed
    (EIP-191) over the canonical JSON of every field but `signature`, the price as a decimal
    string (`market.protocol.messages.swarm_join_message`)."""

    miner: Address
    model_id: ModelIdHex
    memory_mib: int = Field(ge=1, le=1 << 24, description="memory it offers the swarm")
    tflops: float = Field(gt=0, le=1e6, description="the dense TFLOP/s it declares")
    endpoint: str = Field(pattern=rf"^tcp://[^\s/:]+:{PORT}$", max_length=256,
                          description="its stage's address, tcp://host:port")
    public_key: str = Field(pattern=Z85_KEY, description="its stage's CURVE key (z85)")
    rtts: dict[Address, Annotated[float, Field(ge=0, le=60)]] = Field(
        max_length=64, description="seconds to the other members it measured")
    price_per_token: int = Field(ge=0, le=U256_MAX, description="its ask, wei")
    timestamp: int = Field(ge=0, le=I64_MAX)
    signature: Signature


class SwarmJoinOut(Out):
    miner: str
    model_id: str
    version: int | None = Field(description="the current plan's version (null: no plan "
                                "covers the model yet)")
    layers: list[int] | None = Field(description="[start, end) it serves in that plan "
                                     "(null: standby or no plan)")
    ttl_s: float = Field(description="join again within this many seconds to stay")


class SwarmMemberOut(Out):
    address: str
    endpoint: str
    public_key: str
    layers: list[int]
    memory_mib: int


class SwarmTermsOut(Out):
    model_id: str
    head: str
    members: list[str]
    shares: list[int]
    price_per_token: int
    deadline: int


class SwarmPlanOut(Out):
    model_id: str
    version: int
    algorithm: str
    num_layers: int
    head: str
    members: list[SwarmMemberOut]
    standby: list[str]
    predicted_s_per_token: float
    terms: SwarmTermsOut | None = Field(description="the SwarmConsent terms every member "
                                        "signs (null when fewer than 2 or more than 16 "
                                        "members serve layers)")
    swarm_id: int | None = Field(description="the on-chain swarm of this plan, once its "
                                 "head reported it and the market checked swarmInfo")
    replanned: str = Field(description="how this version came about: `fresh` (Phase 1), "
                           "or the joins and leaves applied to the previous version under "
                           "the churn rules and any global re-plan they triggered")


class SwarmConsentIn(BaseModel):
    """A member's EIP-712 SwarmConsent signature of plan `version`'s terms at its nonce."""

    member: Address
    version: int = Field(ge=1, le=I64_MAX)
    nonce: int = Field(ge=0, le=U256_MAX)
    signature: Signature


class SwarmConsentOut(Out):
    member: str
    version: int


class SwarmSignatureOut(Out):
    nonce: int
    signature: str


class SwarmConsentsOut(Out):
    version: int
    signatures: dict[str, SwarmSignatureOut]
    complete: bool = Field(description="every member of the terms has consented")


class SwarmRegisteredIn(BaseModel):
    """The head reporting plan `version` registered on-chain as `swarm_id`, signed (EIP-191)
    over the canonical JSON of {head, model_id, version, swarm_id, timestamp}."""

    head: Address
    version: int = Field(ge=1, le=I64_MAX)
    swarm_id: int = Field(ge=1, le=I64_MAX)
    timestamp: int = Field(ge=0, le=I64_MAX)
    signature: Signature


class SwarmRegisteredOut(Out):
    version: int
    swarm_id: int
