// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Nonces} from "@openzeppelin/contracts/utils/Nonces.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {SigLib} from "./lib/QuarryTypes.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {IVerifierCommittee} from "./interfaces/IVerifierCommittee.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @notice A miner's GPUs.
struct GpuSpec {
    string name;
    uint32 memoryMiB;
    uint16 count;
}

/// @notice Everything Quarry keeps about a miner.
struct MinerInfo {
    uint256 stake;
    /// @dev Collateral locked by open shards; never above `stake`, so 192 bits hold it, and it
    /// shares its slot with `settledAt`, which every unlock writes with it.
    uint192 locked;
    /// @dev When collateral of the miner was last unlocked: its latest shard settled (finalized,
    /// reclaimed, or resolved at fault). The committee's report of the next epoch carries any
    /// fault found up to then, so the stake stays bonded until that report ({verdictWait}).
    uint64 settledAt;
    uint16 reputationBps;
    uint256 pricePerToken;
    string endpoint;
    GpuSpec gpu;
    uint64 exitRequestedAt;
    bool active;
    /// @dev When the miner (last) registered: probation counts only epochs that started then or later.
    uint64 registeredAt;
    /// @dev True from registration until `probationEpochs` consecutive passing reports.
    bool onProbation;
    /// @dev Consecutive committee reports at or above `probationPassBps` while on probation.
    uint16 passedEpochs;
}

/// @notice A swarm: miners serving one model together, each paid by its share; its head alone
/// is liable for its shards. Immutable once registered except `active` (see GPURegistry's
/// swarm notice).
struct Swarm {
    bytes32 modelId;
    /// @dev The member that claims shards for the group and signs its receipts.
    address head;
    /// @dev Least task price (wei per token) every member agreed to work for.
    uint256 pricePerToken;
    /// @dev Strictly ascending addresses, each a registered miner.
    address[] members;
    /// @dev Each member's weight (e.g. the layers it serves), in `members` order, all > 0.
    uint32[] shares;
    uint64 totalShares;
    /// @dev Index of `head` in `members`: it gets the payment split's rounding remainder.
    uint8 headIndex;
    /// @dev False once any member left: no new claims (open ones run to their end).
    bool active;
}

/// @notice What every member of a swarm signs (with its own nonce) to form it.
struct SwarmTerms {
    bytes32 modelId;
    address head;
    address[] members;
    uint32[] shares;
    uint256 pricePerToken;
    uint64 deadline;
}

/// @notice Stake held back for the untrusted burn while a dispute against a miner is open and
/// until the committee's verdict report on it (see GPURegistry's notice, "The reserve").
struct Reserve {
    /// @dev Wei held: `untrustedSlashBps` of the stake when the first open dispute began.
    uint128 amount;
    /// @dev Disputes (and availability challenges, billing proofs) against the miner still open.
    uint32 open;
    /// @dev True once a report that named the miner untrusted came while the reserve was held:
    /// it stays held until that report's burn is paid (leaving, a re-challenge, a second report).
    bool due;
    /// @dev When the last of them closed; the reserve frees at the report of the next epoch.
    uint64 since;
}

/// @title GPURegistry
/// @notice Miners: staked registration, served models, collateral locked by open shards,
/// slashing, committee-written reputation and probation.
/// @dev Slashed wei always goes to PaymentEscrow.credit for the named beneficiary, so it is
/// pulled like every other payment. Stake locked as collateral (an open shard, or a shard
/// under dispute, whose collateral stays locked until the dispute resolves) cannot leave.
///
/// Identities are not free: every registration, a fresh key's or one re-registering after a
/// withdrawal, starts on probation. A miner on probation may claim only tasks whose client
/// opted in (`allowProbation`, which the committee's challenge tasks set); it leaves probation
/// after `probationEpochs` consecutive committee reports at or above `probationPassBps`.
/// Only externally owned accounts may register: receipts are checked with ECDSA, and a
/// contract account could not sign them (ERC-1271 is not accepted, see the README).
///
/// Declared precision: a miner names, per model, the numeric precision it serves it in
/// (`precisions`, numbered as market/protocol/precision.py: 1 FP32, 2 FP16, 3 BF16, 4 FP8,
/// 5 INT8, from the most exact to the least). Tasks accept a set of precisions; a claim records
/// the claimant's declaration in the shard, and verifiers judge its outputs against that
/// precision's error model, so serving a cheaper precision than declared is caught as cheating.
///
/// Untrust has consequences beyond lost work: every committee report after the first in a
/// row that leaves a miner untrusted burns `untrustedSlashBps` of its stake (credited to
/// `BURN`, which no one can withdraw), taken from its free stake only: collateral locked by
/// its open shards stays whole, so their clients are still settled. An untrusted miner that believes it was wrongly
/// judged pays `rechallengeFee` (burned too, so asking is never free) to be challenged
/// again: it goes back on probation, eligible for the committee's challenges (tasks that
/// allow probation) despite its reputation, until the next report that names it.
///
/// No escape before the verdict: an exiting miner's stake leaves only once every shard it took
/// is settled (nothing locked: past its dispute and audit window, every dispute resolved) and
/// the committee has reported the epoch after the last settlement, the report that carries any
/// fault found on those shards ({verdictWait}); if the committee stays silent, after
/// `verdictGraceEpochs` more epochs, so a dead committee cannot trap an honest miner's stake.
/// The first untrusted report in a row burns nothing at once, but its burn is due as soon as
/// the miner acts on it: asking to be challenged again ({requestRechallenge}) or leaving
/// ({withdrawStake}) pays it. Otherwise a captured cheater could answer the (recognisable)
/// re-challenge honestly, or leave, and keep its whole stake; an honest miner pays it only
/// after a false fault, which the verifiers' test bounds at 1e-6 per judged set.
///
/// The reserve: a miner that sees a dispute against it open could otherwise move its stake out
/// before the verdict by faulting on purpose towards a client key of its own (an expired claim's
/// penalty and a proven billing fault pay the client), so that the burn took 10% of what is
/// left. So when a dispute, availability challenge or billing proof against a miner opens
/// (TaskRegistry.markDisputed), `untrustedSlashBps` of its stake is held ({reserveOf}) until
/// the committee's report of the epoch after the last one closed, with the withdrawal's
/// fallback (`verdictGraceEpochs`) so a silent committee never holds it for good, and longer
/// only while a report that named the miner untrusted waits for its burn to be paid. While
/// held, no slash paying anyone but `BURN` takes it, and the untrusted burn takes at least it.
/// Collateral never uses the last `untrustedSlashBps` of the stake (nor a larger reserve), so
/// the reserve always fits in the free stake when a dispute opens: every shard's own collateral,
/// unlocked just before its slash, still covers that slash in full, and no client or voter is
/// ever paid less because of the reserve.
///
/// Missing is not failing: a challenge the miner did not answer in time is evidence that it
/// was unavailable, not that it cheated. The committee reports it as missed ({recordMissed}):
/// the reputation stays as it was, no stake is burned, the probation count neither advances
/// nor restarts, and the miner stays eligible for the next challenges. Only a run of more
/// than `missedReportsAllowed` missed reports in a row puts it back on probation (ordinary
/// clients' tasks exclude it until it passes `probationEpochs` reports again), so a miner that
/// is never available ends up with no ordinary work, at no cost to its stake.
///
/// Swarms (one model served across several miners' GPUs). Rules:
/// - Formation: {registerSwarm} takes the terms (`SwarmTerms`): the model, the head, the members (2..MAX_SWARM_MEMBERS
///   registered, non-exiting miners, strictly ascending), each member's share (a positive
///   weight, e.g. the layers it serves), the swarm's least price per token, a deadline, and one
///   EIP-712 `SwarmConsent` signature per member over exactly those terms and the member's own
///   current nonce ({nonces}) in this contract's domain. Registering uses every member's nonce,
///   so no consent can be replayed (and a member revokes its outstanding consents with
///   {cancelSwarmConsent}). Anyone may submit the signatures; no one can change the terms.
/// - A swarm never changes: a re-plan (other members, shares or head) is a new swarm with new
///   consents. A claim names its swarm, so the shares in force for a shard are those of the
///   swarm that claimed it (the snapshot), whatever happens to the plan later.
/// - Eligibility: a swarm may claim a task only while active, through its head, for its model,
///   at a task price at least its `pricePerToken`, and only if every member is eligible as a
///   single miner would be (registered, not exiting, stake >= minStake, reputation at the task's
///   floor and above the untrusted line, on probation only where the task allows it; a member
///   need not list the model, it serves only part of it).
/// - Precision: the swarm serves its model in the least exact precision its members declared
///   for it ({swarmPrecision}); members that do not list the model declare nothing, and a swarm
///   none of whose members declares one cannot claim. The shard records the precision at the
///   claim, so a later {update} of a member does not change what the shard is judged at.
/// - Liability: the head alone decides what the swarm claims, what it submits and bills, and
///   whether a challenge is answered, so a swarm shard's collateral is locked from the head's
///   stake alone, and every fault of the shard (an expired claim's penalty, an unanswered
///   availability challenge, a proven billing fault, a lost dispute) is slashed from the head's
///   stake alone, exactly as for a single miner's shard. No other member's stake is ever locked
///   or slashed for a swarm shard: a head that also holds the client's key can only pay itself
///   its own stake (less the voters' reward after a verdict), never its members'. The members
///   trust the head with their work, not their stake; the head trusts its members' stages with
///   its stake (it answers for their wrong outputs as for its own).
/// - Money: the payment of a finalized swarm shard is split over the members by their shares:
///   each member gets `floor(amount * share / totalShares)` and the head also the remainder, so
///   the parts add up to the payment to the wei ({swarmSplit}). Each member's part is credited
///   to its own address in PaymentEscrow. The split only credits; it never takes from a stake,
///   so no rounding can take more than a member locked or leave a shard unsettleable.
/// - Leaving: any member may leave ({leaveSwarm}); the swarm then takes no new claims (re-form it
///   as a new swarm). Shards it claimed before run to their end under their snapshot: the
///   leaver keeps its pay for them (the head keeps its collateral locked and its liability),
///   and loses nothing for leaving.
contract GPURegistry is IGPURegistry, Ownable, ReentrancyGuard, EIP712, Nonces, OneTimeWiring {
    /// @notice Most models one miner may list.
    uint256 public constant MAX_MODELS = 16;
    /// @notice The largest precision number (INT8); declared precisions run from 1 (FP32,
    /// the most exact) to this (the least).
    uint8 public constant MAX_PRECISION = 5;
    /// @notice 100% in basis points.
    uint16 public constant BPS = 10_000;

    /// @notice Least stake (wei) a miner must hold to register and to stay eligible.
    uint256 public minStake;
    /// @notice Seconds between {requestExit} and {withdrawStake}.
    uint64 public unbondingPeriod;
    /// @notice Reputation a newly registered miner starts at.
    uint16 public initialReputationBps;
    /// @notice Miners below this reputation are untrusted and never eligible.
    uint16 public untrustedBelowBps = 4000;
    /// @notice Consecutive passing committee reports that end a new miner's probation
    /// (0: no probation).
    uint16 public probationEpochs = 3;
    /// @notice Least reported reputation that counts as a passing epoch on probation.
    uint16 public probationPassBps = 6000;
    /// @notice Share of its stake a miner loses for each report after the first in a row
    /// that leaves it untrusted.
    uint16 public untrustedSlashBps = 1000;
    /// @notice Wei an untrusted miner burns to be challenged again ({requestRechallenge}).
    uint256 public rechallengeFee = 0.01 ether;
    /// @notice Missed reports in a row ({recordMissed}) a miner may have before the next one
    /// puts it back on probation.
    uint16 public missedReportsAllowed = 2;
    /// @notice Epochs after the one in which a miner's last shard settled that its withdrawal
    /// waits for the committee's report of the next epoch (the verdict) before it goes ahead
    /// without it: the bound on how long a silent committee can hold an exiting miner's stake.
    uint16 public verdictGraceEpochs = 3;
    /// @notice Where burned stake and fees are credited: no key exists for it.
    address public constant BURN = address(0xdEaD);
    /// @notice Most members one swarm may have (bounds every per-member loop).
    uint256 public constant MAX_SWARM_MEMBERS = 16;
    /// @notice EIP-712 type hash of a member's consent to a swarm's terms.
    bytes32 public constant SWARM_CONSENT_TYPEHASH = keccak256(
        "SwarmConsent(bytes32 modelId,address head,address[] members,uint32[] shares,uint256 pricePerToken,uint256 nonce,uint64 deadline)"
    );

    address public taskRegistry;
    address public arbitration;
    address public committee;
    IPaymentEscrow public escrow;

    mapping(address miner => MinerInfo) private _miners;
    mapping(address miner => bytes32[]) private _models;
    /// @dev The precision (market/protocol/precision.py: FP32 1 .. INT8 5) `miner` declared for
    /// `modelId`; non-zero exactly when it serves the model.
    mapping(address miner => mapping(bytes32 modelId => uint8)) private _precisions;
    /// @notice Consecutive committee reports that left the miner untrusted; a re-challenge
    /// that pays the first report's burn ({requestRechallenge}) counts as the second.
    mapping(address miner => uint16) public untrustedReportsOf;
    /// @notice True from {requestRechallenge} until the next report naming the miner.
    mapping(address miner => bool) public rechallengePending;
    /// @notice Consecutive committee reports that found the miner's challenge unanswered.
    mapping(address miner => uint16) public missedReportsOf;
    /// @notice Number of swarms registered; ids run from 1 to `swarmCount`.
    uint256 public swarmCount;
    mapping(uint256 swarmId => Swarm) private _swarms;
    mapping(address miner => Reserve) private _reserves;

    event TaskRegistrySet(address taskRegistry);
    event ArbitrationSet(address arbitration);
    event CommitteeSet(address committee);
    event EscrowSet(address escrow);
    event MinStakeSet(uint256 minStake);
    event UnbondingPeriodSet(uint64 unbondingPeriod);
    event UntrustedBelowSet(uint16 bps);
    event InitialReputationSet(uint16 bps);
    /// @notice A miner registered with `stake` wei, serving `modelIds[i]` in precision
    /// `precisions[i]` (FP32 1, FP16 2, BF16 3, FP8 4, INT8 5).
    event MinerRegistered(
        address indexed miner,
        bytes32[] modelIds,
        uint8[] precisions,
        GpuSpec gpu,
        string endpoint,
        uint256 pricePerToken,
        uint256 stake
    );
    /// @notice A miner changed its models, their declared precisions, GPUs, endpoint or price.
    event MinerUpdated(
        address indexed miner,
        bytes32[] modelIds,
        uint8[] precisions,
        GpuSpec gpu,
        string endpoint,
        uint256 pricePerToken
    );
    event StakeAdded(address indexed miner, uint256 amount, uint256 stake);
    /// @notice `miner` asked to leave; `withdrawableAt` is when its unbonding ends. The stake
    /// also waits for its shards to settle and for the verdict report on them ({verdictWait}).
    event ExitRequested(address indexed miner, uint64 withdrawableAt);
    event StakeWithdrawn(address indexed miner, uint256 amount);
    event CollateralLocked(address indexed miner, uint256 amount, uint256 locked);
    event CollateralUnlocked(address indexed miner, uint256 amount, uint256 locked);
    event Slashed(address indexed miner, uint256 amount, address indexed beneficiary, address indexed by);
    event ReputationSet(address indexed miner, uint16 bps);
    event ProbationParamsSet(uint16 epochs, uint16 passBps);
    /// @notice `miner` passed probation and may claim every task its reputation allows.
    event ProbationEnded(address indexed miner);
    event UntrustedPenaltySet(uint16 slashBps, uint256 rechallengeFee);
    /// @notice An untrusted miner paid `fee` to be challenged again.
    event RechallengeRequested(address indexed miner, uint256 fee);
    event MissedReportsAllowedSet(uint16 missedReportsAllowed);
    event VerdictGraceSet(uint16 epochs);
    /// @notice A dispute against `miner` opened: `amount` wei of its stake is held for the
    /// untrusted burn while `open` disputes are open and until the verdict report.
    event ReserveHeld(address indexed miner, uint256 amount, uint32 open);
    /// @notice A committee report found `miner`'s challenge unanswered, the `missed`-th time in
    /// a row; `probation` is true when this put it back on probation.
    event ReportMissed(address indexed miner, uint16 missed, bool probation);
    /// @notice Every member consented to a swarm with these terms.
    event SwarmRegistered(
        uint256 indexed swarmId,
        bytes32 indexed modelId,
        address indexed head,
        address[] members,
        uint32[] shares,
        uint256 pricePerToken
    );
    /// @notice `member` left; the swarm takes no new claims.
    event SwarmLeft(uint256 indexed swarmId, address indexed member);
    /// @notice `member` used nonce `nonce`, revoking every consent it signed with it.
    event SwarmConsentCancelled(address indexed member, uint256 nonce);

    error Unauthorized(address caller);
    error NotWired();
    /// @notice `msg.value` (or the stake left) is below `minStake`.
    error InsufficientStake(uint256 required, uint256 got);
    error AlreadyRegistered(address miner);
    error NotRegistered(address miner);
    error TooManyModels(uint256 max, uint256 got);
    error NoModels();
    error DuplicateModel(bytes32 modelId);
    /// @notice `modelIds` and `precisions` must have one entry per model.
    error PrecisionsLengthMismatch(uint256 models, uint256 precisions);
    /// @notice A declared precision must be 1 (FP32) .. MAX_PRECISION (INT8).
    error InvalidPrecision(bytes32 modelId, uint8 precision);
    error InvalidGpuSpec();
    error EmptyEndpoint();
    error ZeroAmount();
    error AlreadyExiting(address miner);
    error NotExiting(address miner);
    error UnbondingNotOver(uint64 withdrawableAt);
    /// @notice The committee has not yet reported `epoch`, whose report carries any fault found on
    /// the miner's last settled shards; the stake may leave once it has, or at `until` without it.
    error VerdictPending(uint256 epoch, uint64 until);
    /// @notice Stake is locked as collateral and cannot leave.
    error StakeLocked(uint256 locked);
    /// @notice `stake - locked` is smaller than the collateral asked.
    error InsufficientFreeStake(uint256 free, uint256 requested);
    error UnlockExceedsLocked(uint256 locked, uint256 requested);
    error InvalidBps(uint256 bps);
    /// @notice Only externally owned accounts may register (receipts need ECDSA signatures).
    /// @dev The check is `msg.sender == tx.origin`: an EIP-7702-delegated account passes when its
    /// own key sends the transaction. Harmless while every payout is pulled behind
    /// `nonReentrant` and signatures are plain ECDSA (EIP7702.test.js).
    error ContractAccount(address account);
    /// @notice Only an untrusted miner may ask to be challenged again.
    error NotUntrusted(address miner, uint16 reputationBps);
    error RechallengeAlreadyPending(address miner);
    /// @notice `msg.value` differs from `rechallengeFee`.
    error WrongFee(uint256 required, uint256 got);
    /// @notice A swarm needs 2..MAX_SWARM_MEMBERS members.
    error InvalidSwarmSize(uint256 got);
    /// @notice Members, shares and signatures must have one entry per member.
    error SwarmLengthMismatch();
    /// @notice Members must be strictly ascending by address (no duplicates).
    error MembersNotSorted();
    error ZeroShare(address member);
    error HeadNotMember(address head);
    /// @notice The consent's deadline passed.
    error ConsentExpired(uint64 deadline);
    /// @notice The signature is not `member`'s consent to these terms at its current nonce.
    error InvalidConsent(address member);
    error UnknownSwarm(uint256 swarmId);
    /// @notice The swarm lost a member and takes no new claims.
    error SwarmInactive(uint256 swarmId);
    error NotSwarmMember(uint256 swarmId, address account);
    /// @notice Only the swarm's head may claim for it.
    error NotSwarmHead(uint256 swarmId, address caller);
    error SwarmModelMismatch(bytes32 swarmModel, bytes32 taskModel);
    /// @notice The task pays less per token than the members agreed to.
    error AskAboveTaskPrice(uint256 ask, uint256 taskPrice);
    /// @notice A member is not eligible for the task, so the swarm is not.
    error MemberNotEligible(address member);

    /// @param minStake_ Least stake (wei) to register.
    /// @param unbondingPeriod_ Seconds from {requestExit} to {withdrawStake}.
    /// @param initialReputationBps_ Reputation of a new miner (basis points, <= 10000).
    constructor(uint256 minStake_, uint64 unbondingPeriod_, uint16 initialReputationBps_)
        Ownable(msg.sender)
        EIP712("Quarry", "1")
    {
        if (initialReputationBps_ > BPS) revert InvalidBps(initialReputationBps_);
        minStake = minStake_;
        unbondingPeriod = unbondingPeriod_;
        initialReputationBps = initialReputationBps_;
    }

    modifier onlyRegistered() {
        if (!_miners[msg.sender].active) revert NotRegistered(msg.sender);
        _;
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets TaskRegistry (locks, unlocks, slashes). One-time, owner only.
    function setTaskRegistry(address a) external onlyOwner setOnce(taskRegistry, a) {
        taskRegistry = a;
        emit TaskRegistrySet(a);
    }

    /// @notice Sets Arbitration (slashes). One-time, owner only.
    function setArbitration(address a) external onlyOwner setOnce(arbitration, a) {
        arbitration = a;
        emit ArbitrationSet(a);
    }

    /// @notice Sets VerifierCommittee (writes reputation). One-time, owner only.
    function setCommittee(address a) external onlyOwner setOnce(committee, a) {
        committee = a;
        emit CommitteeSet(a);
    }

    /// @notice Sets PaymentEscrow (receives slashed stake). One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets the least stake to register (applies to new registrations and eligibility).
    function setMinStake(uint256 v) external onlyOwner {
        minStake = v;
        emit MinStakeSet(v);
    }

    /// @notice Sets the unbonding period in seconds (applies to exits already requested too).
    function setUnbondingPeriod(uint64 v) external onlyOwner {
        unbondingPeriod = v;
        emit UnbondingPeriodSet(v);
    }

    /// @notice Sets the reputation below which a miner is untrusted (basis points).
    function setUntrustedBelowBps(uint16 v) external onlyOwner {
        if (v > BPS) revert InvalidBps(v);
        untrustedBelowBps = v;
        emit UntrustedBelowSet(v);
    }

    /// @notice Sets the reputation new miners start at (basis points).
    function setInitialReputationBps(uint16 v) external onlyOwner {
        if (v > BPS) revert InvalidBps(v);
        initialReputationBps = v;
        emit InitialReputationSet(v);
    }

    /// @notice Sets probation: `epochs` consecutive committee reports at or above `passBps`
    /// end it (applies to miners already on probation too; 0 epochs disables it for new ones).
    function setProbation(uint16 epochs, uint16 passBps) external onlyOwner {
        if (passBps > BPS) revert InvalidBps(passBps);
        probationEpochs = epochs;
        probationPassBps = passBps;
        emit ProbationParamsSet(epochs, passBps);
    }

    /// @notice Sets the stake burned per repeated untrusted report and the re-challenge fee.
    function setUntrustedPenalty(uint16 slashBps, uint256 fee) external onlyOwner {
        if (slashBps > BPS) revert InvalidBps(slashBps);
        untrustedSlashBps = slashBps;
        rechallengeFee = fee;
        emit UntrustedPenaltySet(slashBps, fee);
    }

    /// @notice Sets how many missed reports in a row a miner may have before the next one puts
    /// it back on probation (see the contract's notice).
    function setMissedReportsAllowed(uint16 v) external onlyOwner {
        missedReportsAllowed = v;
        emit MissedReportsAllowedSet(v);
    }

    /// @notice Sets how many epochs a withdrawal waits for the verdict report before going ahead
    /// without it (see {verdictWait}; applies to exits already requested too).
    function setVerdictGrace(uint16 epochs) external onlyOwner {
        verdictGraceEpochs = epochs;
        emit VerdictGraceSet(epochs);
    }

    // ------------------------------------------------------------------ miners

    /// @notice Registers the caller as a miner with `msg.value` as stake, on probation (see
    /// the contract's notice). Externally owned accounts only. Emits {MinerRegistered}.
    /// @param modelIds Models served (1..16, distinct).
    /// @param precisions The precision each model is served in, in `modelIds` order (1 FP32 ..
    /// 5 INT8): the shards it claims are judged at it, and serving a cheaper one is cheating.
    /// @param gpu GPU description (count and memory must be non-zero).
    /// @param endpoint Where clients and the market reach the miner.
    /// @param pricePerToken Asking price in wei per token.
    function register(
        bytes32[] calldata modelIds,
        uint8[] calldata precisions,
        GpuSpec calldata gpu,
        string calldata endpoint,
        uint256 pricePerToken
    ) external payable {
        // solhint-disable-next-line avoid-tx-origin
        if (msg.sender != tx.origin) revert ContractAccount(msg.sender);
        MinerInfo storage m = _miners[msg.sender];
        if (m.active) revert AlreadyRegistered(msg.sender);
        if (msg.value == 0 || msg.value < minStake) revert InsufficientStake(minStake, msg.value);
        _setProfile(msg.sender, modelIds, precisions, gpu, endpoint);
        m.stake = msg.value;
        m.locked = 0;
        m.reputationBps = initialReputationBps;
        m.pricePerToken = pricePerToken;
        m.exitRequestedAt = 0;
        m.active = true;
        m.registeredAt = uint64(block.timestamp);
        m.onProbation = probationEpochs > 0;
        m.passedEpochs = 0;
        delete untrustedReportsOf[msg.sender];
        delete rechallengePending[msg.sender];
        delete missedReportsOf[msg.sender];
        emit MinerRegistered(msg.sender, modelIds, precisions, gpu, endpoint, pricePerToken, msg.value);
    }

    /// @notice Adds `msg.value` to the caller's stake.
    function addStake() external payable onlyRegistered {
        if (msg.value == 0) revert ZeroAmount();
        MinerInfo storage m = _miners[msg.sender];
        m.stake += msg.value;
        emit StakeAdded(msg.sender, msg.value, m.stake);
    }

    /// @notice Replaces the caller's models, their precisions, GPU spec, endpoint and price.
    /// Shards already claimed keep the precision recorded at their claim. Emits {MinerUpdated}.
    /// @param modelIds Models served (1..16, distinct).
    /// @param precisions The precision each model is served in, in `modelIds` order (1..5).
    /// @param gpu GPU description.
    /// @param endpoint Where clients and the market reach the miner.
    /// @param pricePerToken Asking price in wei per token.
    function update(
        bytes32[] calldata modelIds,
        uint8[] calldata precisions,
        GpuSpec calldata gpu,
        string calldata endpoint,
        uint256 pricePerToken
    ) external onlyRegistered {
        _clearModels(msg.sender);
        _setProfile(msg.sender, modelIds, precisions, gpu, endpoint);
        _miners[msg.sender].pricePerToken = pricePerToken;
        emit MinerUpdated(msg.sender, modelIds, precisions, gpu, endpoint, pricePerToken);
    }

    /// @notice Starts the caller's exit: it stops being eligible at once, and may withdraw its
    /// stake after `unbondingPeriod` once no collateral is locked and the verdict on its last
    /// shards is in ({verdictWait}).
    function requestExit() external onlyRegistered {
        MinerInfo storage m = _miners[msg.sender];
        if (m.exitRequestedAt != 0) revert AlreadyExiting(msg.sender);
        m.exitRequestedAt = uint64(block.timestamp);
        emit ExitRequested(msg.sender, uint64(block.timestamp) + unbondingPeriod);
    }

    /// @notice Sends the caller its stake and removes its registration. Needs a prior
    /// {requestExit}, an elapsed `unbondingPeriod`, no locked collateral, and the verdict on its
    /// last shards ({verdictWait}). A miner leaving untrusted after a single untrusted report
    /// (which burned nothing, so that it could ask to be challenged again) pays that report's
    /// burn now: `untrustedSlashBps` of its stake goes to `BURN` and the rest to it.
    function withdrawStake() external nonReentrant onlyRegistered {
        MinerInfo storage m = _miners[msg.sender];
        if (m.exitRequestedAt == 0) revert NotExiting(msg.sender);
        uint64 at = m.exitRequestedAt + unbondingPeriod;
        if (block.timestamp < at) revert UnbondingNotOver(at);
        if (m.locked != 0) revert StakeLocked(m.locked);
        (uint256 epoch, uint64 until) = verdictWait(msg.sender);
        if (until != 0) revert VerdictPending(epoch, until);
        uint256 burn = 0;
        if (m.reputationBps < untrustedBelowBps && untrustedReportsOf[msg.sender] == 1) {
            if (address(escrow) == address(0)) revert NotWired();
            burn = _burnDue(m, msg.sender);
            if (burn > m.stake) burn = m.stake;
        }
        uint256 amount = m.stake - burn;
        _clearModels(msg.sender);
        delete _miners[msg.sender];
        delete untrustedReportsOf[msg.sender];
        delete _reserves[msg.sender];
        if (burn > 0) emit Slashed(msg.sender, burn, BURN, msg.sender);
        emit StakeWithdrawn(msg.sender, amount);
        if (burn > 0) escrow.credit{value: burn}(BURN);
        if (amount > 0) Address.sendValue(payable(msg.sender), amount);
    }

    /// @notice What `miner`'s withdrawal waits for beyond unbonding and locks: the committee's
    /// report of `epoch`, the one after the epoch in which its last shard settled (faults
    /// found during an epoch are reported in the next one). `until` is 0 when nothing is
    /// pending (no shard ever settled, that report is in, or the committee stayed silent past
    /// the start of epoch `epoch + verdictGraceEpochs`), else that time: the latest the wait
    /// can last, so an honest miner's stake is never held by a silent committee.
    function verdictWait(address miner) public view returns (uint256 epoch, uint64 until) {
        return _verdictWait(_miners[miner].settledAt);
    }

    /// @notice Wei of `miner`'s stake held for the untrusted burn (see the contract's notice,
    /// "The reserve"): no collateral is locked from it and no slash paying anyone but `BURN`
    /// takes it. 0 when none is held.
    function reserveOf(address miner) public view returns (uint256) {
        Reserve storage r = _reserves[miner];
        if (r.amount == 0 || r.open != 0 || r.due) return r.amount;
        (, uint64 until) = _verdictWait(r.since);
        return until != 0 ? r.amount : 0;
    }

    /// @dev {verdictWait} for a settlement (or a dispute's close) at `settled`.
    function _verdictWait(uint64 settled) private view returns (uint256 epoch, uint64 until) {
        if (settled == 0 || committee == address(0)) return (0, 0);
        IVerifierCommittee c = IVerifierCommittee(committee);
        uint64 genesis = c.genesisTime();
        uint64 duration = c.epochDuration();
        epoch = settled < genesis ? 0 : (settled - genesis) / duration + 1;
        if (c.nextReportEpoch() > epoch) return (epoch, 0);
        uint256 bound = genesis + (epoch + verdictGraceEpochs) * duration;
        if (block.timestamp < bound) until = uint64(bound);
    }

    // ------------------------------------------------------------------ Quarry hooks

    /// @notice Locks `amount` of `miner`'s free stake as shard collateral. TaskRegistry only.
    function lockCollateral(address miner, uint256 amount) external {
        _onlyTaskRegistry();
        _lock(miner, amount);
    }

    /// @notice Unlocks `amount` of `miner`'s collateral. TaskRegistry only.
    function unlockCollateral(address miner, uint256 amount) external {
        _onlyTaskRegistry();
        _unlock(miner, amount);
    }

    /// @notice A dispute, availability challenge or billing proof against `miner` opened: holds
    /// `untrustedSlashBps` of its stake (or the larger reserve already held) until the verdict
    /// report (see the contract's notice, "The reserve"). TaskRegistry only. Emits {ReserveHeld}.
    function holdReserve(address miner) external {
        _onlyTaskRegistry();
        MinerInfo storage m = _miners[miner];
        Reserve storage r = _reserves[miner];
        uint256 amount = _burnDue(m, miner);
        uint256 free = m.stake - m.locked;
        // Collateral leaves the reserve free for an eligible miner; only after an untrusted
        // burn can less be free, and the reserve never takes what covers an open shard's slash.
        if (amount > free) amount = free;
        r.amount = SafeCast.toUint128(amount);
        uint32 open = ++r.open;
        emit ReserveHeld(miner, amount, open);
    }

    /// @notice A dispute against `miner` closed (resolved, expired, answered): once none is
    /// open, its reserve frees at the committee's report of the next epoch. TaskRegistry only.
    function releaseReserve(address miner) external {
        _onlyTaskRegistry();
        Reserve storage r = _reserves[miner];
        --r.open;
        r.since = uint64(block.timestamp);
    }

    /// @notice Takes up to `amount` wei of `miner`'s free stake and credits it to `beneficiary`
    /// in PaymentEscrow. The callers unlock a shard's collateral before slashing it for that
    /// shard, so the free stake covers the slash; the collateral of the miner's other open
    /// shards is never taken, so each of them can still be settled. TaskRegistry or
    /// Arbitration only.
    /// @return slashed The wei actually taken (`min(amount, stake - locked)`).
    function slash(address miner, uint256 amount, address beneficiary) external nonReentrant returns (uint256 slashed) {
        if (msg.sender == address(0) || (msg.sender != taskRegistry && msg.sender != arbitration)) {
            revert Unauthorized(msg.sender);
        }
        if (beneficiary == address(0)) revert ZeroAddress();
        if (address(escrow) == address(0)) revert NotWired();
        MinerInfo storage m = _miners[miner];
        slashed = _slash(m, miner, amount, beneficiary);
    }

    /// @notice Pays `rechallengeFee` (burned) to be challenged again: an untrusted miner,
    /// registered and not exiting, goes back on probation and is eligible for tasks that
    /// allow probation (the committee's challenges) until the next report that names it,
    /// which then decides as usual. After a single untrusted report it also pays that
    /// report's burn (`untrustedSlashBps` of its free stake, see the contract's notice), which
    /// then counts as the second report in a row. Emits {RechallengeRequested}.
    function requestRechallenge() external payable nonReentrant onlyRegistered {
        MinerInfo storage m = _miners[msg.sender];
        if (m.reputationBps >= untrustedBelowBps) revert NotUntrusted(msg.sender, m.reputationBps);
        if (m.exitRequestedAt != 0) revert AlreadyExiting(msg.sender);
        if (rechallengePending[msg.sender]) revert RechallengeAlreadyPending(msg.sender);
        if (msg.value != rechallengeFee) revert WrongFee(rechallengeFee, msg.value);
        if (address(escrow) == address(0)) revert NotWired();
        bool due = untrustedReportsOf[msg.sender] == 1;
        rechallengePending[msg.sender] = true;
        m.onProbation = true;
        m.passedEpochs = 0;
        if (due) untrustedReportsOf[msg.sender] = 2;
        emit RechallengeRequested(msg.sender, msg.value);
        if (msg.value > 0) escrow.credit{value: msg.value}(BURN);
        if (due) _burnUntrusted(m, msg.sender);
    }

    /// @notice Writes `miner`'s reputation from the committee's report of the epoch that
    /// started at `epochStart`, and counts that epoch towards the end of its probation if it
    /// started at or after the miner's registration (a report below `probationPassBps` restarts the
    /// count). VerifierCommittee only; reports arrive in epoch order and name a miner once.
    function setReputation(address miner, uint16 bps, uint256 epochStart) external {
        if (msg.sender != committee || msg.sender == address(0)) revert Unauthorized(msg.sender);
        if (bps > BPS) revert InvalidBps(bps);
        MinerInfo storage m = _miners[miner];
        if (!m.active) revert NotRegistered(miner);
        m.reputationBps = bps;
        emit ReputationSet(miner, bps);
        delete rechallengePending[miner];
        delete missedReportsOf[miner];
        if (_reserves[miner].amount != 0) _reportReserve(miner, bps < untrustedBelowBps, epochStart);
        if (bps >= untrustedBelowBps) {
            delete untrustedReportsOf[miner];
        } else if (++untrustedReportsOf[miner] > 1 && address(escrow) != address(0)) {
            _burnUntrusted(m, miner);
        }
        if (m.onProbation && epochStart >= m.registeredAt) {
            if (bps < probationPassBps) {
                m.passedEpochs = 0;
            } else if (++m.passedEpochs >= probationEpochs) {
                m.onProbation = false;
                emit ProbationEnded(miner);
            }
        }
    }

    /// @notice Records that the committee's report found `miner`'s challenge unanswered in
    /// time (see the contract's notice): its reputation, stake and probation count stay as
    /// they are; a pending re-challenge is used up (a miner cannot stay eligible by never
    /// answering); past `missedReportsAllowed` missed reports in a row it is back on
    /// probation. VerifierCommittee only. Emits {ReportMissed}.
    function recordMissed(address miner) external {
        if (msg.sender != committee || msg.sender == address(0)) revert Unauthorized(msg.sender);
        MinerInfo storage m = _miners[miner];
        if (!m.active) revert NotRegistered(miner);
        uint16 missed = ++missedReportsOf[miner];
        delete rechallengePending[miner];
        bool relapse = missed > missedReportsAllowed && !m.onProbation;
        if (relapse) {
            m.onProbation = true;
            m.passedEpochs = 0;
        }
        emit ReportMissed(miner, missed, relapse);
    }

    /// @dev Takes up to `amount` of `m`'s free stake (`stake - locked`) and credits it to
    /// `beneficiary` through the escrow. Never the collateral of an open shard: every caller
    /// unlocks a shard's collateral before slashing it for that shard, and a slash never
    /// exceeds that collateral, so capping at the free stake changes no outcome; it guarantees
    /// that a fault on one shard can never leave `locked` below another open shard's collateral
    /// (whose settlement would then revert `UnlockExceedsLocked` forever).
    function _slash(MinerInfo storage m, address miner, uint256 amount, address beneficiary)
        private
        returns (uint256 slashed)
    {
        uint256 free = m.stake - m.locked;
        if (beneficiary != BURN) free = _less(free, reserveOf(miner));
        slashed = amount < free ? amount : free;
        if (slashed == 0) return 0;
        m.stake -= slashed;
        emit Slashed(miner, slashed, beneficiary, msg.sender);
        escrow.credit{value: slashed}(beneficiary);
    }

    /// @dev The untrusted burn: `untrustedSlashBps` of the stake, or the reserve held since a
    /// dispute opened if larger (what the stake was before any fault on purpose drained it);
    /// paying it frees the reserve.
    function _burnUntrusted(MinerInfo storage m, address miner) private {
        _slash(m, miner, _burnDue(m, miner), BURN);
        Reserve storage r = _reserves[miner];
        r.amount = 0;
        r.due = false;
    }

    /// @dev `max(stake * untrustedSlashBps, reserveOf(miner))`.
    function _burnDue(MinerInfo storage m, address miner) private view returns (uint256) {
        uint256 burn = m.stake * untrustedSlashBps / BPS;
        uint256 held = reserveOf(miner);
        return held > burn ? held : burn;
    }

    /// @dev A report named `miner`, which has a reserve: a report of the verdict epoch or earlier
    /// (or one while a dispute is open) that leaves it untrusted keeps the reserve until that
    /// burn is paid; one that trusts it at or after the verdict epoch frees it; a later one finds
    /// it freed already and clears it.
    function _reportReserve(address miner, bool untrusted, uint256 epochStart) private {
        Reserve storage r = _reserves[miner];
        IVerifierCommittee c = IVerifierCommittee(committee);
        uint64 genesis = c.genesisTime();
        uint64 duration = c.epochDuration();
        uint256 epoch = (epochStart - genesis) / duration;
        // {reserveOf} just before this report: its verdict epoch not reported, the grace not over
        uint256 verdict = r.since < genesis ? 0 : (r.since - genesis) / duration + 1;
        bool pending = r.open != 0 || r.due
            || (epoch <= verdict && block.timestamp < genesis + (verdict + verdictGraceEpochs) * duration);
        if (pending && untrusted) {
            r.due = true;
        } else if (!pending || (r.open == 0 && epoch >= verdict)) {
            delete _reserves[miner];
        } else {
            r.due = false;
        }
    }

    /// @dev `a - b`, or 0 when `b >= a`.
    function _less(uint256 a, uint256 b) private pure returns (uint256) {
        return a > b ? a - b : 0;
    }

    // ------------------------------------------------------------------ swarms

    /// @notice Registers a swarm that every member consented to (see the contract's notice).
    /// Each `sigs[i]` is `terms.members[i]`'s EIP-712 `SwarmConsent` over exactly `terms` and
    /// its current {nonces} ({hashSwarmConsent}); registering uses every member's nonce.
    /// Anyone may submit.
    /// @param terms Model, head, members (2..16 registered, non-exiting miners, strictly
    /// ascending), shares (> 0 each), least price per token, consent deadline.
    /// @param sigs One consent signature per member, in `terms.members` order.
    /// @return swarmId The new swarm's id (from 1).
    function registerSwarm(SwarmTerms calldata terms, bytes[] calldata sigs) external returns (uint256 swarmId) {
        uint256 n = terms.members.length;
        if (n < 2 || n > MAX_SWARM_MEMBERS) revert InvalidSwarmSize(n);
        if (terms.shares.length != n || sigs.length != n) revert SwarmLengthMismatch();
        if (block.timestamp > terms.deadline) revert ConsentExpired(terms.deadline);
        swarmId = ++swarmCount;
        Swarm storage w = _swarms[swarmId];
        uint256 total = 0;
        bool headFound = false;
        for (uint256 i = 0; i < n; ++i) {
            address member = terms.members[i];
            if (i > 0 && member <= terms.members[i - 1]) revert MembersNotSorted();
            if (terms.shares[i] == 0) revert ZeroShare(member);
            MinerInfo storage m = _miners[member];
            if (!m.active) revert NotRegistered(member);
            if (m.exitRequestedAt != 0) revert AlreadyExiting(member);
            if (member == terms.head) {
                headFound = true;
                w.headIndex = uint8(i);
            }
            total += terms.shares[i];
            bytes32 digest = hashSwarmConsent(terms, _useNonce(member));
            if (SigLib.recover(digest, sigs[i]) != member) revert InvalidConsent(member);
        }
        if (!headFound) revert HeadNotMember(terms.head);
        w.modelId = terms.modelId;
        w.head = terms.head;
        w.pricePerToken = terms.pricePerToken;
        w.members = terms.members;
        w.shares = terms.shares;
        w.totalShares = uint64(total);
        w.active = true;
        emit SwarmRegistered(swarmId, terms.modelId, terms.head, terms.members, terms.shares, terms.pricePerToken);
    }

    /// @notice EIP-712 digest of `SwarmConsent(terms, nonce)` in this contract's domain: what
    /// a member signs to consent to `terms` at its nonce `nonce`.
    function hashSwarmConsent(SwarmTerms calldata terms, uint256 nonce) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    SWARM_CONSENT_TYPEHASH,
                    terms.modelId,
                    terms.head,
                    keccak256(abi.encodePacked(terms.members)),
                    keccak256(abi.encodePacked(terms.shares)),
                    terms.pricePerToken,
                    nonce,
                    terms.deadline
                )
            )
        );
    }

    /// @notice This contract's EIP-712 domain separator (swarm consents).
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /// @notice The caller leaves the swarm, which then takes no new claims. Shards it claimed
    /// before run to their end: the caller keeps its pay for them (the head, its liability).
    /// @param swarmId The swarm.
    function leaveSwarm(uint256 swarmId) external {
        Swarm storage w = _swarm(swarmId);
        if (!_isMember(w, msg.sender)) revert NotSwarmMember(swarmId, msg.sender);
        if (!w.active) revert SwarmInactive(swarmId);
        w.active = false;
        emit SwarmLeft(swarmId, msg.sender);
    }

    /// @notice Uses the caller's current swarm-consent nonce, so no consent signed with it can
    /// register a swarm.
    function cancelSwarmConsent() external {
        emit SwarmConsentCancelled(msg.sender, _useNonce(msg.sender));
    }

    /// @notice Reverts with the reason unless `head` may claim a shard of a task for
    /// (`modelId`, `minRepBps`, `allowProbation`, `taskPrice`) for swarm `swarmId` (see the
    /// contract's notice: active, its head, its model, price, every member eligible).
    /// @return precision The swarm's precision for the model ({swarmPrecision}): the shard
    /// records it, and TaskRegistry checks it against the task's accepted mask.
    function checkSwarmClaim(
        uint256 swarmId,
        address head,
        bytes32 modelId,
        uint16 minRepBps,
        bool allowProbation,
        uint256 taskPrice
    ) external view returns (uint8 precision) {
        Swarm storage w = _swarm(swarmId);
        if (!w.active) revert SwarmInactive(swarmId);
        if (head != w.head) revert NotSwarmHead(swarmId, head);
        if (modelId != w.modelId) revert SwarmModelMismatch(w.modelId, modelId);
        if (taskPrice < w.pricePerToken) revert AskAboveTaskPrice(w.pricePerToken, taskPrice);
        for (uint256 i = 0; i < w.members.length; ++i) {
            address member = w.members[i];
            if (!_eligible(member, minRepBps, allowProbation)) revert MemberNotEligible(member);
            uint8 p = _precisions[member][modelId];
            if (p > precision) precision = p;
        }
    }

    /// @notice The precision swarm `swarmId` serves its model in: the largest number (the
    /// least exact) among its members' declarations for the model, since the output is only
    /// as exact as its least exact stage. Members that do not list the model (they serve
    /// layers of it) declare nothing; 0 when none does, and no task accepts 0.
    function swarmPrecision(uint256 swarmId) external view returns (uint8 precision) {
        Swarm storage w = _swarm(swarmId);
        for (uint256 i = 0; i < w.members.length; ++i) {
            uint8 p = _precisions[w.members[i]][w.modelId];
            if (p > precision) precision = p;
        }
    }

    /// @notice `amount` split over the swarm's members by share: `floor(amount * share /
    /// totalShares)` each, plus the remainder to the head, so the parts sum to `amount`. Used
    /// only to credit a finalized swarm shard's payment (collateral and faults are the head's).
    function swarmSplit(uint256 swarmId, uint256 amount)
        external
        view
        returns (address[] memory members, uint256[] memory parts)
    {
        Swarm storage w = _swarm(swarmId);
        return (w.members, _split(w, amount));
    }

    /// @notice The swarm's terms and whether it still takes claims.
    function swarmInfo(uint256 swarmId) external view returns (Swarm memory) {
        return _swarm(swarmId);
    }

    // ------------------------------------------------------------------ views

    /// @notice True when `miner` may claim work for `modelId` at reputation floor `minRepBps`:
    /// registered, not exiting, stake >= minStake, serves the model, reputation at least
    /// `max(minRepBps, untrustedBelowBps)`, and not on probation unless `allowProbation`.
    function isEligible(address miner, bytes32 modelId, uint16 minRepBps, bool allowProbation)
        external
        view
        returns (bool)
    {
        return _precisions[miner][modelId] != 0 && _eligible(miner, minRepBps, allowProbation);
    }

    /// @notice {isEligible}'s answer and the precision the claim is made in, in one call for
    /// TaskRegistry's claims: `miner`'s declared precision for `modelId` when eligible, else 0.
    function eligiblePrecision(address miner, bytes32 modelId, uint16 minRepBps, bool allowProbation)
        external
        view
        returns (uint8)
    {
        uint8 p = _precisions[miner][modelId];
        return p != 0 && _eligible(miner, minRepBps, allowProbation) ? p : 0;
    }

    /// @notice The precision `miner` declared for `modelId` (1 FP32 .. 5 INT8); 0 when it
    /// does not serve the model.
    function precisionOf(address miner, bytes32 modelId) external view returns (uint8) {
        return _precisions[miner][modelId];
    }

    /// @notice True while `miner` is on probation (see the contract's notice).
    function onProbation(address miner) external view returns (bool) {
        return _miners[miner].onProbation;
    }

    /// @notice True when `miner` is registered (possibly exiting).
    function isRegistered(address miner) external view returns (bool) {
        return _miners[miner].active;
    }

    /// @notice Everything about `miner` (all zero when not registered).
    function minerInfo(address miner) external view returns (MinerInfo memory) {
        return _miners[miner];
    }

    /// @notice Models `miner` serves.
    function modelsOf(address miner) external view returns (bytes32[] memory) {
        return _models[miner];
    }

    /// @notice True when `miner` lists `modelId`.
    function servesModel(address miner, bytes32 modelId) external view returns (bool) {
        return _precisions[miner][modelId] != 0;
    }

    // ------------------------------------------------------------------ internal

    function _onlyTaskRegistry() private view {
        if (msg.sender != taskRegistry || msg.sender == address(0)) revert Unauthorized(msg.sender);
    }

    function _lock(address miner, uint256 amount) private {
        MinerInfo storage m = _miners[miner];
        if (!m.active) revert NotRegistered(miner);
        uint256 free = _less(m.stake - m.locked, _burnDue(m, miner));
        if (free < amount) revert InsufficientFreeStake(free, amount);
        m.locked += SafeCast.toUint192(amount);
        emit CollateralLocked(miner, amount, m.locked);
    }

    function _unlock(address miner, uint256 amount) private {
        MinerInfo storage m = _miners[miner];
        if (amount > m.locked) revert UnlockExceedsLocked(m.locked, amount);
        m.locked -= uint192(amount); // amount <= locked, checked above
        m.settledAt = uint64(block.timestamp);
        emit CollateralUnlocked(miner, amount, m.locked);
    }

    /// @dev {isEligible} without the model: registered, not exiting, stake >= minStake,
    /// reputation floor, probation only where allowed.
    function _eligible(address miner, uint16 minRepBps, bool allowProbation) private view returns (bool) {
        MinerInfo storage m = _miners[miner];
        if (!m.active || m.exitRequestedAt != 0 || m.stake < minStake) return false;
        if (m.onProbation && !allowProbation) return false;
        if (rechallengePending[miner] && allowProbation && minRepBps == 0) return true;
        uint16 floor = minRepBps > untrustedBelowBps ? minRepBps : untrustedBelowBps;
        return m.reputationBps >= floor;
    }

    /// @dev Forgets every model `miner` lists, with its precision.
    function _clearModels(address miner) private {
        bytes32[] storage old = _models[miner];
        for (uint256 i = 0; i < old.length; ++i) {
            delete _precisions[miner][old[i]];
        }
        delete _models[miner];
    }

    function _swarm(uint256 swarmId) private view returns (Swarm storage w) {
        if (swarmId == 0 || swarmId > swarmCount) revert UnknownSwarm(swarmId);
        return _swarms[swarmId];
    }

    function _isMember(Swarm storage w, address account) private view returns (bool) {
        for (uint256 i = 0; i < w.members.length; ++i) {
            if (w.members[i] == account) return true;
        }
        return false;
    }

    /// @dev floor(amount * share / total) per member, the remainder to the head.
    function _split(Swarm storage w, uint256 amount) private view returns (uint256[] memory parts) {
        uint256 n = w.members.length;
        uint256 total = w.totalShares;
        parts = new uint256[](n);
        uint256 given = 0;
        for (uint256 i = 0; i < n; ++i) {
            parts[i] = amount * w.shares[i] / total;
            given += parts[i];
        }
        parts[w.headIndex] += amount - given;
    }

    function _setProfile(
        address miner,
        bytes32[] calldata modelIds,
        uint8[] calldata precisions,
        GpuSpec calldata gpu,
        string calldata endpoint
    ) private {
        if (modelIds.length == 0) revert NoModels();
        if (modelIds.length > MAX_MODELS) revert TooManyModels(MAX_MODELS, modelIds.length);
        if (precisions.length != modelIds.length) revert PrecisionsLengthMismatch(modelIds.length, precisions.length);
        if (gpu.count == 0 || gpu.memoryMiB == 0) revert InvalidGpuSpec();
        if (bytes(endpoint).length == 0) revert EmptyEndpoint();
        mapping(bytes32 => uint8) storage declared = _precisions[miner];
        for (uint256 i = 0; i < modelIds.length; ++i) {
            bytes32 model = modelIds[i];
            uint8 p = precisions[i];
            if (declared[model] != 0) revert DuplicateModel(model);
            if (p == 0 || p > MAX_PRECISION) revert InvalidPrecision(model, p);
            declared[model] = p;
        }
        _models[miner] = modelIds;
        MinerInfo storage m = _miners[miner];
        m.gpu = gpu;
        m.endpoint = endpoint;
    }
}
