// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Receipt, Receipts, RECEIPT_TYPEHASH as RECEIPT_TYPE} from "./lib/QuarryTypes.sol";
import {ITaskRegistry, Task, TaskTerms, Shard, ShardState} from "./interfaces/ITaskRegistry.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @title TaskRegistry
/// @notice Batch jobs, their shards, and the EIP-712 domain `{name: "Quarry", version: "1",
/// chainId, verifyingContract: this}` that miners sign their Receipts in.
///
/// Deploy and wire (any deploy order; every wiring setter is one-time and owner only, a second
/// call reverts `AlreadySet()`):
///   1. `PaymentEscrow()`
///   2. `GPURegistry(minStake, unbondingPeriod, initialReputationBps)`
///   3. `TaskRegistry(collateralBps, claimTimeout, challengeWindow, reclaimPenaltyBps)`
///   4. `VerifierCommittee(minVerifierStake, unbondingPeriod, epochDuration, genesisTime)`
///      (genesisTime 0 means the deploy block's timestamp)
///   5. `Arbitration(minBond, disputeTimeout, faultSlashBps, verifierRewardBps, minerBondShareBps,
///      minAvailabilityBond, responseWindow)`
///   then:
///   - escrow.setTaskRegistry(task), escrow.setArbitration(arb), escrow.setGPURegistry(gpu),
///     escrow.setCommittee(committee)
///   - gpu.setTaskRegistry(task), gpu.setArbitration(arb), gpu.setCommittee(committee),
///     gpu.setEscrow(escrow)
///   - task.setGPURegistry(gpu), task.setEscrow(escrow), task.setArbitration(arb)
///   - committee.setGPURegistry(gpu), committee.setEscrow(escrow), committee.setArbitration(arb)
///     (treasury defaults to the owner)
///   - arb.setTaskRegistry(task), arb.setGPURegistry(gpu), arb.setCommittee(committee),
///     arb.setEscrow(escrow)
///
/// Swarms (GPURegistry's swarm notice): a swarm's head claims with {claimShardForSwarm}; the
/// shard's `miner` is then the head (it submits and signs the receipts, and Arbitration checks
/// them against it) and {shardSwarm} names the swarm, whose fixed shares are the shard's
/// snapshot. The payment is credited to its members by those shares, floor each and the
/// remainder to the head. The collateral is locked from, and a reclaim penalty or a fault
/// slashed from, the head alone, as for a single miner: the head alone decides what is
/// claimed, billed and answered, so no member can be made to pay for it.
///
/// Money: the whole payment `numRequests * maxTokensPerRequest * pricePerToken` sits in
/// PaymentEscrow under the task id. A shard's budget is `requests * maxTokensPerRequest *
/// pricePerToken`; the budgets add up to the payment exactly.
contract TaskRegistry is ITaskRegistry, Ownable, ReentrancyGuard, EIP712, OneTimeWiring {
    /// @notice EIP-712 type hash of {Receipt}.
    bytes32 public constant RECEIPT_TYPEHASH = RECEIPT_TYPE;
    /// @notice 100% in basis points.
    uint16 public constant BPS = 10_000;
    /// @notice The bits a task's accepted-precision mask may set: 1 (FP32) .. 5 (INT8).
    uint8 public constant PRECISION_BITS = 0x3E;
    /// @notice Hard cap on shards per task, so every per-task computation stays gas-bounded.
    uint32 public constant MAX_SHARDS_CAP = 1024;
    /// @notice Most shards one {claimShards} call may claim.
    uint256 public constant MAX_CLAIM_BATCH = 64;

    /// @notice Share of a shard's budget locked from the miner's stake while it holds the shard.
    uint16 public collateralBps;
    /// @notice Seconds a miner has from claim to submit.
    uint64 public claimTimeout;
    /// @notice Seconds after a submit during which the client (or its arbiter) may dispute.
    uint64 public challengeWindow;
    /// @notice Share of the collateral an expired claim loses to the client.
    uint16 public reclaimPenaltyBps;
    /// @notice Most shards one task may have (<= MAX_SHARDS_CAP).
    uint32 public maxShardsPerTask = MAX_SHARDS_CAP;

    IGPURegistry public gpuRegistry;
    IPaymentEscrow public escrow;
    address public arbitration;

    /// @notice Number of tasks created; task ids run from 1 to `taskCount`.
    uint256 public taskCount;
    mapping(uint256 taskId => Task) private _tasks;
    mapping(uint256 taskId => mapping(uint32 shard => Shard)) private _shards;
    /// @notice The swarm that holds (or last held) the shard's claim; 0 for a single miner.
    mapping(uint256 taskId => mapping(uint32 shard => uint256 swarmId)) public shardSwarm;

    event GPURegistrySet(address gpuRegistry);
    event EscrowSet(address escrow);
    event ArbitrationSet(address arbitration);
    event ParamsSet(uint16 collateralBps, uint64 claimTimeout, uint64 challengeWindow, uint16 reclaimPenaltyBps);
    event MaxShardsPerTaskSet(uint32 maxShardsPerTask);
    /// @notice A client posted a task and paid `payment` wei into escrow.
    event TaskCreated(
        uint256 indexed taskId,
        address indexed client,
        bytes32 indexed modelId,
        bytes32 inputRoot,
        string inputURI,
        uint32 numRequests,
        uint32 shardSize,
        uint32 numShards,
        uint256 payment,
        uint64 deadline,
        bool allowProbation,
        uint8 precisions,
        bool requireCommitments
    );
    /// @notice `miner` claimed `shard` until `claimExpiry`, locking `collateral` wei; the shard
    /// is judged at `precision`, the claimant's (or its swarm's) declaration for the model.
    event ShardClaimed(
        uint256 indexed taskId,
        uint32 indexed shard,
        address indexed miner,
        uint64 claimExpiry,
        uint256 collateral,
        uint8 precision
    );
    /// @notice The claim of `shard` (its `miner` the swarm's head) is held by swarm `swarmId`.
    event SwarmShardClaimed(uint256 indexed taskId, uint32 indexed shard, uint256 indexed swarmId);
    /// @notice A swarm shard's payment was credited to the members, `amounts[i]` to `members[i]`.
    event SwarmPaid(uint256 indexed taskId, uint32 indexed shard, uint256 indexed swarmId, address[] members, uint256[] amounts);
    event ResultSubmitted(
        uint256 indexed taskId,
        uint32 indexed shard,
        address indexed miner,
        bytes32 resultRoot,
        string resultURI,
        uint64 tokensUsed,
        uint64 windowEnd
    );
    /// @notice An expired claim was taken back; `reopened` false means the shard was refunded.
    event ClaimReclaimed(
        uint256 indexed taskId, uint32 indexed shard, address indexed miner, uint256 penalty, bool reopened
    );
    event ShardFinalized(
        uint256 indexed taskId, uint32 indexed shard, address indexed miner, uint256 payment, uint256 refund
    );
    event ShardRefunded(uint256 indexed taskId, uint32 indexed shard, uint256 amount);
    /// @notice The client cancelled; every still-open shard's budget (`refund` wei in all) went back.
    event TaskCancelled(uint256 indexed taskId, uint256 refund);
    event ShardDisputed(uint256 indexed taskId, uint32 indexed shard);
    event ShardDisputeResolved(uint256 indexed taskId, uint32 indexed shard, bool minerAtFault);

    error Unauthorized(address caller);
    error NotWired();
    error InvalidBps(uint256 bps);
    error InvalidMaxShards(uint32 v);
    /// @notice `msg.value` is not the task's maximum cost.
    error WrongPayment(uint256 expected, uint256 got);
    error ZeroRequests();
    error ZeroShardSize();
    error ZeroMaxTokens();
    error ZeroPrice();
    /// @notice A task's accepted-precision mask may only set bits 1 (FP32) .. 5 (INT8).
    error InvalidPrecisionMask(uint8 mask);
    /// @notice The claimant's (or swarm's) declared `precision` is not in the task's `mask`
    /// (0 is undeclared, which no task accepts).
    error PrecisionNotAccepted(uint8 precision, uint8 mask);
    error DeadlineInPast(uint64 deadline);
    error TooManyShards(uint256 max, uint256 got);
    error UnknownTask(uint256 taskId);
    error BadShard(uint256 taskId, uint32 shard);
    error ShardNotOpen(ShardState state);
    error BadClaimBatch(uint256 count, uint256 max);
    error ShardNotClaimed(ShardState state);
    error ShardNotSubmitted(ShardState state);
    error ShardNotDisputed(ShardState state);
    error ShardNotRefundable(ShardState state);
    /// @notice The caller may not claim: not registered, exiting, wrong model or low reputation.
    error NotEligible(address miner);
    error DeadlinePassed(uint64 deadline);
    error DeadlineNotPassed(uint64 deadline);
    error NotShardMiner(address caller);
    error ClaimExpired(uint64 claimExpiry);
    error ClaimNotExpired(uint64 claimExpiry);
    error TooManyTokens(uint256 max, uint256 got);
    error ZeroResultRoot();
    /// @notice {finalizeShard} before the challenge window closed.
    error WindowNotClosed(uint64 windowEnd);
    error AlreadyFinalized();
    /// @notice The shard is frozen by an open dispute.
    error DisputeOpen();
    error OutsideWindow(uint64 windowEnd);
    error NotClient(address caller);
    error AlreadyCancelled();

    /// @param collateralBps_ Share of a shard's budget locked from the claiming miner's stake.
    /// @param claimTimeout_ Seconds from claim to the submit deadline.
    /// @param challengeWindow_ Seconds from submit to the end of the dispute window.
    /// @param reclaimPenaltyBps_ Share of the collateral an expired claim pays the client.
    constructor(uint16 collateralBps_, uint64 claimTimeout_, uint64 challengeWindow_, uint16 reclaimPenaltyBps_)
        Ownable(msg.sender)
        EIP712("Quarry", "1")
    {
        _setParams(collateralBps_, claimTimeout_, challengeWindow_, reclaimPenaltyBps_);
    }

    modifier onlyArbitration() {
        if (msg.sender != arbitration || msg.sender == address(0)) revert Unauthorized(msg.sender);
        _;
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets GPURegistry. One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(address(gpuRegistry), a) {
        gpuRegistry = IGPURegistry(a);
        emit GPURegistrySet(a);
    }

    /// @notice Sets PaymentEscrow. One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets Arbitration (may freeze and resolve shards). One-time, owner only.
    function setArbitration(address a) external onlyOwner setOnce(arbitration, a) {
        arbitration = a;
        emit ArbitrationSet(a);
    }

    /// @notice Sets the economic parameters (apply to claims and submits made afterwards).
    function setParams(uint16 collateralBps_, uint64 claimTimeout_, uint64 challengeWindow_, uint16 reclaimPenaltyBps_)
        external
        onlyOwner
    {
        _setParams(collateralBps_, claimTimeout_, challengeWindow_, reclaimPenaltyBps_);
    }

    /// @notice Sets the most shards a new task may have (1..MAX_SHARDS_CAP).
    function setMaxShardsPerTask(uint32 v) external onlyOwner {
        if (v == 0 || v > MAX_SHARDS_CAP) revert InvalidMaxShards(v);
        maxShardsPerTask = v;
        emit MaxShardsPerTaskSet(v);
    }

    // ------------------------------------------------------------------ client

    /// @notice Posts a batch job; `msg.value` must be exactly
    /// `terms.numRequests * terms.maxTokensPerRequest * terms.pricePerToken` and goes into
    /// PaymentEscrow. Emits {TaskCreated}.
    /// @dev The terms arrive as one calldata struct ({TaskTerms}, whose fields document each
    /// term) rather than thirteen parameters: that many, a string among them, leave the
    /// compiler no stack slots for the body ("stack too deep" without via-IR, which would
    /// change every contract's bytecode and gas), and a struct lets later terms be added
    /// without reordering a long positional list.
    /// @param terms What the client asks for and on what conditions (see {TaskTerms}).
    /// @return taskId The new task's id (from 1).
    function createTask(TaskTerms calldata terms) external payable nonReentrant returns (uint256 taskId) {
        if (address(escrow) == address(0) || address(gpuRegistry) == address(0)) revert NotWired();
        uint32 numRequests = terms.numRequests;
        uint32 shardSize = terms.shardSize;
        uint32 maxTokens = terms.maxTokensPerRequest;
        uint256 price = terms.pricePerToken;
        if (numRequests == 0) revert ZeroRequests();
        if (shardSize == 0) revert ZeroShardSize();
        if (maxTokens == 0) revert ZeroMaxTokens();
        if (price == 0) revert ZeroPrice();
        if (terms.deadline <= block.timestamp) revert DeadlineInPast(terms.deadline);
        if (terms.minReputationBps > BPS) revert InvalidBps(terms.minReputationBps);
        if (terms.precisions & ~PRECISION_BITS != 0) revert InvalidPrecisionMask(terms.precisions);
        uint256 shards = (uint256(numRequests) + shardSize - 1) / shardSize;
        if (shards > maxShardsPerTask) revert TooManyShards(maxShardsPerTask, shards);
        uint256 expected = uint256(numRequests) * maxTokens * price;
        if (msg.value != expected) revert WrongPayment(expected, msg.value);

        taskId = ++taskCount;
        Task storage t = _tasks[taskId];
        t.client = msg.sender;
        t.arbiter = terms.arbiter;
        t.modelId = terms.modelId;
        t.inputRoot = terms.inputRoot;
        t.inputURI = terms.inputURI;
        t.numRequests = numRequests;
        t.shardSize = shardSize;
        t.maxTokensPerRequest = maxTokens;
        t.numShards = uint32(shards);
        t.pricePerToken = price;
        t.deadline = terms.deadline;
        t.createdAt = uint64(block.timestamp);
        t.minReputationBps = terms.minReputationBps;
        t.allowProbation = terms.allowProbation;
        t.precisions = terms.precisions;
        t.requireCommitments = terms.requireCommitments;
        _emitCreated(taskId, t, expected);
        escrow.deposit{value: msg.value}(taskId);
    }

    /// @notice Cancels the task: the budget of every shard still Open goes back to the client
    /// now; shards already claimed or submitted run to their end. Client only, once.
    /// @param taskId The task.
    function cancelTask(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        if (msg.sender != t.client) revert NotClient(msg.sender);
        if (t.cancelled) revert AlreadyCancelled();
        t.cancelled = true;
        // Escrow holds exactly the budgets of Open shards plus the committed ones.
        uint256 refund = escrow.escrowed(taskId) - t.committed;
        emit TaskCancelled(taskId, refund);
        escrow.release(taskId, t.client, refund);
    }

    /// @notice After the deadline, refunds an unfinished shard to the client: an Open shard, or a
    /// Claimed shard whose claim expired (then as {reclaimExpired}). Anyone may call.
    /// @param taskId The task.
    /// @param shard The shard index.
    function refundUnfinished(uint256 taskId, uint32 shard) external nonReentrant {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        if (block.timestamp < t.deadline) revert DeadlineNotPassed(t.deadline);
        ShardState st = _stateOf(t, s);
        if (st == ShardState.Open) {
            s.state = ShardState.Refunded;
            uint256 amount = _budget(t, shard);
            emit ShardRefunded(taskId, shard, amount);
            escrow.release(taskId, t.client, amount);
        } else if (st == ShardState.Claimed) {
            _reclaim(taskId, t, shard, s);
        } else {
            revert ShardNotRefundable(st);
        }
    }

    // ------------------------------------------------------------------ miner

    /// @notice Claims an Open shard before the deadline. Locks `budget * collateralBps / 10000`
    /// of the caller's stake and starts a claim that expires after `claimTimeout`. The caller's
    /// declared precision for the task's model (GPURegistry.precisionOf) must be in the task's
    /// accepted mask ({PrecisionNotAccepted}); the shard records it. Emits {ShardClaimed}.
    /// @param taskId The task.
    /// @param shard The shard index.
    function claimShard(uint256 taskId, uint32 shard) external nonReentrant {
        _claim(taskId, shard, 0);
    }

    /// @notice Claims several Open shards of one task, all or none: {claimShard} for each, in
    /// order (a shard listed twice reverts ShardNotOpen). A miner that generates shards back to
    /// back as one stream claims them in one transaction: one inclusion to wait for and one
    /// base cost, instead of a claim per shard while the first is already generating.
    /// @param taskId The task.
    /// @param shards The shard indexes (1..MAX_CLAIM_BATCH of them).
    function claimShards(uint256 taskId, uint32[] calldata shards) external nonReentrant {
        uint256 n = shards.length;
        if (n == 0 || n > MAX_CLAIM_BATCH) revert BadClaimBatch(n, MAX_CLAIM_BATCH);
        for (uint256 i = 0; i < n; ++i) {
            _claim(taskId, shards[i], 0);
        }
    }

    /// @notice Claims an Open shard for swarm `swarmId`, whose head must be the caller; as
    /// {claimShard}, but the swarm must be eligible (GPURegistry.checkSwarmClaim reverts with the
    /// reason) and its precision (GPURegistry.swarmPrecision) accepted. The collateral is locked
    /// from the head alone (it alone answers for the shard). Emits {ShardClaimed} and
    /// {SwarmShardClaimed}.
    /// @param taskId The task.
    /// @param shard The shard index.
    /// @param swarmId The swarm (GPURegistry).
    function claimShardForSwarm(uint256 taskId, uint32 shard, uint256 swarmId) external nonReentrant {
        _claim(taskId, shard, swarmId);
    }

    /// @notice Submits the shard's result before the claim expires and opens the challenge window.
    /// @dev `(resultRoot, tokensUsed)` is the root of the shard's result tree (library
    /// ResultTree): a Merkle sum tree over its receipts in index order whose root sum is the
    /// tokens billed. Arbitration checks every receipt against both, so a miner that bills more
    /// than its receipts hold cannot prove any receipt and loses an availability challenge.
    /// @param taskId The task.
    /// @param shard The shard index.
    /// @param resultRoot The result tree's root hash.
    /// @param resultURI Where outputs and signed receipts live.
    /// @param tokensUsed The result tree's root sum: output tokens billed (<= shard requests *
    /// maxTokensPerRequest).
    function submitResult(uint256 taskId, uint32 shard, bytes32 resultRoot, string calldata resultURI, uint64 tokensUsed)
        external
        nonReentrant
    {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        if (s.state != ShardState.Claimed) revert ShardNotClaimed(s.state);
        if (msg.sender != s.miner) revert NotShardMiner(msg.sender);
        if (block.timestamp >= s.claimExpiry) revert ClaimExpired(s.claimExpiry);
        (uint32 start, uint32 end) = _range(t, shard);
        uint256 maxTokens = uint256(end - start) * t.maxTokensPerRequest;
        if (tokensUsed > maxTokens) revert TooManyTokens(maxTokens, tokensUsed);
        if (resultRoot == bytes32(0)) revert ZeroResultRoot();
        uint64 windowEnd = uint64(block.timestamp) + challengeWindow;
        s.state = ShardState.Submitted;
        s.submittedAt = uint64(block.timestamp);
        s.windowEnd = windowEnd;
        s.resultRoot = resultRoot;
        s.resultURI = resultURI;
        s.tokensUsed = tokensUsed;
        emit ResultSubmitted(taskId, shard, msg.sender, resultRoot, resultURI, tokensUsed, windowEnd);
    }

    // ------------------------------------------------------------------ anyone

    /// @notice Takes back a Claimed shard whose claim expired without a result. The shard
    /// reopens (or is refunded when past the deadline or cancelled); `reclaimPenaltyBps` of the
    /// collateral is slashed to the client and the rest unlocked. Anyone may call.
    /// @param taskId The task.
    /// @param shard The shard index.
    function reclaimExpired(uint256 taskId, uint32 shard) external nonReentrant {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        if (s.state != ShardState.Claimed) revert ShardNotClaimed(s.state);
        _reclaim(taskId, t, shard, s);
    }

    /// @notice Settles a Submitted shard after its window: pays the miner `tokensUsed * price`,
    /// refunds the rest of the shard budget to the client, unlocks the collateral. Anyone may call.
    /// @param taskId The task.
    /// @param shard The shard index.
    function finalizeShard(uint256 taskId, uint32 shard) external nonReentrant {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        ShardState st = s.state;
        if (st == ShardState.Finalized) revert AlreadyFinalized();
        if (st == ShardState.Disputed) revert DisputeOpen();
        if (st != ShardState.Submitted) revert ShardNotSubmitted(_stateOf(t, s));
        if (block.timestamp < s.windowEnd) revert WindowNotClosed(s.windowEnd);
        uint256 budget = _budget(t, shard);
        uint256 payment = uint256(s.tokensUsed) * t.pricePerToken;
        uint256 refund = budget - payment;
        s.state = ShardState.Finalized;
        t.committed -= budget;
        address miner = s.miner;
        uint256 swarmId = shardSwarm[taskId][shard];
        emit ShardFinalized(taskId, shard, miner, payment, refund);
        if (swarmId == 0) {
            escrow.release(taskId, miner, payment);
        } else {
            (address[] memory members, uint256[] memory parts) = gpuRegistry.swarmSplit(swarmId, payment);
            emit SwarmPaid(taskId, shard, swarmId, members, parts);
            for (uint256 i = 0; i < members.length; ++i) {
                escrow.release(taskId, members[i], parts[i]);
            }
        }
        escrow.release(taskId, t.client, refund);
        gpuRegistry.unlockCollateral(miner, s.collateral);
    }

    // ------------------------------------------------------------------ Arbitration hooks

    /// @notice Freezes a Submitted shard inside its window (a dispute, an availability
    /// challenge or a billing proof) and holds the miner's reserve for the untrusted burn until
    /// the verdict (GPURegistry.holdReserve). Arbitration only.
    function markDisputed(uint256 taskId, uint32 shard) external onlyArbitration {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        if (s.state != ShardState.Submitted) revert ShardNotSubmitted(_stateOf(t, s));
        if (block.timestamp >= s.windowEnd) revert OutsideWindow(s.windowEnd);
        s.state = ShardState.Disputed;
        emit ShardDisputed(taskId, shard);
        gpuRegistry.holdReserve(s.miner);
    }

    /// @notice Unfreezes a shard. Fault: the shard is Refunded, its whole budget goes back to
    /// the client and the collateral is unlocked (Arbitration slashes it in the same
    /// transaction). No fault: the shard returns to Submitted with its window ending at
    /// `windowEnd` (now after a verdict, so it can be finalized at once; later after an
    /// answered availability challenge, so the client can still dispute). Arbitration only.
    /// @return miner The shard's miner.
    /// @return collateral The shard's collateral (unlocked on fault, still locked otherwise).
    /// @return client The task's client.
    function resolveDispute(uint256 taskId, uint32 shard, bool minerAtFault, uint64 windowEnd)
        external
        onlyArbitration
        returns (address miner, uint256 collateral, address client)
    {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        if (s.state != ShardState.Disputed) revert ShardNotDisputed(s.state);
        miner = s.miner;
        collateral = s.collateral;
        client = t.client;
        emit ShardDisputeResolved(taskId, shard, minerAtFault);
        gpuRegistry.releaseReserve(miner);
        if (minerAtFault) {
            uint256 budget = _budget(t, shard);
            s.state = ShardState.Refunded;
            t.committed -= budget;
            emit ShardRefunded(taskId, shard, budget);
            escrow.release(taskId, client, budget);
            gpuRegistry.unlockCollateral(miner, collateral);
        } else {
            s.state = ShardState.Submitted;
            s.windowEnd = windowEnd;
        }
    }

    // ------------------------------------------------------------------ views

    /// @notice The task (reverts {UnknownTask} for an unknown id).
    function getTask(uint256 taskId) external view returns (Task memory) {
        return _task(taskId);
    }

    /// @notice The shard; `state` reads Refunded for an Open shard of a cancelled task.
    function getShard(uint256 taskId, uint32 shard) external view returns (Shard memory s) {
        Task storage t = _task(taskId);
        Shard storage st = _shard(taskId, t, shard);
        s = st;
        s.state = _stateOf(t, st);
    }

    /// @notice Number of shards of the task.
    function numShards(uint256 taskId) external view returns (uint32) {
        return _task(taskId).numShards;
    }

    /// @notice The shard's request index range [start, end).
    function shardRange(uint256 taskId, uint32 shard) external view returns (uint32 start, uint32 end) {
        Task storage t = _task(taskId);
        _shard(taskId, t, shard);
        return _range(t, shard);
    }

    /// @notice The shard's budget in wei: requests * maxTokensPerRequest * pricePerToken.
    function shardBudget(uint256 taskId, uint32 shard) external view returns (uint256) {
        Task storage t = _task(taskId);
        _shard(taskId, t, shard);
        return _budget(t, shard);
    }

    /// @notice EIP-712 struct hash of a receipt (the value the result tree commits to).
    function receiptStructHash(Receipt calldata r) public pure returns (bytes32) {
        return Receipts.structHash(r);
    }

    /// @notice Full EIP-712 digest of a receipt under this contract's domain (what the miner signs).
    function hashReceipt(Receipt calldata r) external view returns (bytes32) {
        return _hashTypedDataV4(receiptStructHash(r));
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internal

    function _setParams(uint16 cBps, uint64 claimTimeout_, uint64 window, uint16 pBps) private {
        if (cBps > BPS) revert InvalidBps(cBps);
        if (pBps > BPS) revert InvalidBps(pBps);
        collateralBps = cBps;
        claimTimeout = claimTimeout_;
        challengeWindow = window;
        reclaimPenaltyBps = pBps;
        emit ParamsSet(cBps, claimTimeout_, window, pBps);
    }

    function _emitCreated(uint256 taskId, Task storage t, uint256 payment) private {
        emit TaskCreated(
            taskId,
            t.client,
            t.modelId,
            t.inputRoot,
            t.inputURI,
            t.numRequests,
            t.shardSize,
            t.numShards,
            payment,
            t.deadline,
            t.allowProbation,
            t.precisions,
            t.requireCommitments
        );
    }

    function _claim(uint256 taskId, uint32 shard, uint256 swarmId) private {
        Task storage t = _task(taskId);
        Shard storage s = _shard(taskId, t, shard);
        ShardState st = _stateOf(t, s);
        if (st != ShardState.Open) revert ShardNotOpen(st);
        if (block.timestamp >= t.deadline) revert DeadlinePassed(t.deadline);
        uint8 precision;
        if (swarmId == 0) {
            precision = gpuRegistry.eligiblePrecision(msg.sender, t.modelId, t.minReputationBps, t.allowProbation);
            if (precision == 0) revert NotEligible(msg.sender);
        } else {
            precision = gpuRegistry.checkSwarmClaim(
                swarmId, msg.sender, t.modelId, t.minReputationBps, t.allowProbation, t.pricePerToken
            );
        }
        uint8 mask = t.precisions;
        if (precision == 0 || (mask != 0 && (mask >> precision) & 1 == 0)) {
            revert PrecisionNotAccepted(precision, mask);
        }
        uint256 budget = _budget(t, shard);
        uint256 collateral = budget * collateralBps / BPS;
        uint64 expiry = uint64(block.timestamp) + claimTimeout;
        s.state = ShardState.Claimed;
        s.miner = msg.sender;
        s.precision = precision;
        s.claimExpiry = expiry;
        s.collateral = collateral;
        t.committed += budget;
        emit ShardClaimed(taskId, shard, msg.sender, expiry, collateral, precision);
        if (swarmId != 0) {
            shardSwarm[taskId][shard] = swarmId;
            emit SwarmShardClaimed(taskId, shard, swarmId);
        }
        gpuRegistry.lockCollateral(msg.sender, collateral);
    }

    function _reclaim(uint256 taskId, Task storage t, uint32 shard, Shard storage s) private {
        if (block.timestamp < s.claimExpiry) revert ClaimNotExpired(s.claimExpiry);
        address miner = s.miner;
        uint256 collateral = s.collateral;
        uint256 penalty = collateral * reclaimPenaltyBps / BPS;
        uint256 budget = _budget(t, shard);
        bool reopen = !t.cancelled && block.timestamp < t.deadline;
        t.committed -= budget;
        delete _shards[taskId][shard];
        delete shardSwarm[taskId][shard];
        if (!reopen) _shards[taskId][shard].state = ShardState.Refunded;
        emit ClaimReclaimed(taskId, shard, miner, penalty, reopen);
        if (!reopen) {
            emit ShardRefunded(taskId, shard, budget);
            escrow.release(taskId, t.client, budget);
        }
        gpuRegistry.unlockCollateral(miner, collateral);
        gpuRegistry.slash(miner, penalty, t.client);
    }

    function _task(uint256 taskId) private view returns (Task storage t) {
        t = _tasks[taskId];
        if (t.client == address(0)) revert UnknownTask(taskId);
    }

    function _shard(uint256 taskId, Task storage t, uint32 shard) private view returns (Shard storage) {
        if (shard >= t.numShards) revert BadShard(taskId, shard);
        return _shards[taskId][shard];
    }

    /// @dev Cancellation flips Open shards to Refunded without touching them (no loop).
    function _stateOf(Task storage t, Shard storage s) private view returns (ShardState) {
        ShardState st = s.state;
        if (st == ShardState.Open && t.cancelled) return ShardState.Refunded;
        return st;
    }

    function _range(Task storage t, uint32 shard) private view returns (uint32 start, uint32 end) {
        uint256 s = uint256(shard) * t.shardSize;
        uint256 e = s + t.shardSize;
        if (e > t.numRequests) e = t.numRequests;
        return (uint32(s), uint32(e));
    }

    function _budget(Task storage t, uint32 shard) private view returns (uint256) {
        (uint32 start, uint32 end) = _range(t, shard);
        return uint256(end - start) * t.maxTokensPerRequest * t.pricePerToken;
    }
}
