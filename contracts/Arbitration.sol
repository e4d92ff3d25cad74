// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {Receipt, SigLib, InvalidSignature, DuplicateSigner, SignersNotSorted} from "./lib/QuarryTypes.sol";
import {ITaskRegistry, Task, Shard, ShardState} from "./interfaces/ITaskRegistry.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {IVerifierCommittee} from "./interfaces/IVerifierCommittee.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @notice Where a dispute stands.
enum DisputeStatus {
    None,
    Open,
    MinerAtFault,
    MinerNotAtFault,
    Expired
}

/// @notice One dispute over one receipt of a submitted shard.
struct Dispute {
    uint256 taskId;
    uint32 shard;
    DisputeStatus status;
    address opener;
    address miner;
    uint256 bond;
    uint64 openedAt;
    uint64 deadline;
    Receipt receipt;
    string evidenceURI;
}

/// @title Arbitration
/// @notice Disputes over signed receipts, resolved by a quorum of committee votes (ERC-792's
/// arbitrator/arbitrable split in spirit: TaskRegistry is the arbitrable, this the arbitrator).
/// EIP-712 domain `{name: "Quarry", version: "1", chainId, verifyingContract: this}`.
/// @dev The bond is held here while the dispute is open and then credited through PaymentEscrow.
/// Outcomes:
/// - Fault: the client gets the whole shard budget back (TaskRegistry), the miner loses
///   `collateral * faultSlashBps / 10000` of its stake, of which `verifierRewardBps` is split
///   equally among the voters and the rest goes to the client; the bond returns to the opener.
/// - No fault: `minerBondShareBps` of the bond goes to the miner and the rest is split equally
///   among the voters (rounding dust to the miner); the shard can be finalized at once.
/// - Expired (no quorum by `deadline`): no fault, the bond returns to the opener.
contract Arbitration is Ownable, ReentrancyGuard, EIP712, OneTimeWiring {
    bytes32 public constant VOTE_TYPEHASH = keccak256("Vote(uint256 disputeId,bool minerAtFault)");
    uint16 public constant BPS = 10_000;

    /// @notice Least bond (wei) to open a dispute.
    uint256 public minBond;
    /// @notice Seconds a dispute may stay open before {expireDispute}.
    uint64 public disputeTimeout;
    /// @notice Share of the shard's collateral slashed on fault.
    uint16 public faultSlashBps;
    /// @notice Share of the slashed stake paid to the voters on fault.
    uint16 public verifierRewardBps;
    /// @notice Share of the bond paid to the miner on no fault (the rest to the voters).
    uint16 public minerBondShareBps;

    ITaskRegistry public taskRegistry;
    IGPURegistry public gpuRegistry;
    IVerifierCommittee public committee;
    IPaymentEscrow public escrow;

    /// @notice Number of disputes; ids run from 1 to `disputeCount`.
    uint256 public disputeCount;
    mapping(uint256 disputeId => Dispute) private _disputes;

    event TaskRegistrySet(address taskRegistry);
    event GPURegistrySet(address gpuRegistry);
    event CommitteeSet(address committee);
    event EscrowSet(address escrow);
    event ParamsSet(
        uint256 minBond, uint64 disputeTimeout, uint16 faultSlashBps, uint16 verifierRewardBps, uint16 minerBondShareBps
    );
    event DisputeOpened(
        uint256 indexed disputeId,
        uint256 indexed taskId,
        uint32 indexed shard,
        address opener,
        address miner,
        uint256 bond,
        uint64 deadline,
        Receipt receipt,
        string evidenceURI
    );
    /// @notice Resolved by a quorum; `slashed` is the miner's stake taken (0 on no fault).
    event DisputeResolved(uint256 indexed disputeId, bool minerAtFault, address[] voters, uint256 slashed);
    event DisputeExpired(uint256 indexed disputeId);

    error NotWired();
    error InvalidBps(uint256 bps);
    /// @notice `msg.value` is below `minBond`.
    error InsufficientBond(uint256 required, uint256 got);
    /// @notice Only the task's client or its named arbiter may dispute.
    error NotClientOrArbiter(address caller);
    error ShardNotSubmitted(ShardState state);
    /// @notice The shard's challenge window is closed.
    error OutsideWindow(uint64 windowEnd);
    /// @notice The receipt's taskId, shard, modelId or index does not match the disputed shard.
    error ReceiptMismatch();
    /// @notice The receipt signature does not recover to the shard's miner.
    error InvalidMinerSignature(address recovered, address miner);
    /// @notice The Merkle proof does not prove the receipt under the shard's resultRoot.
    error InvalidProof();
    error UnknownDispute(uint256 disputeId);
    error DisputeNotOpen(DisputeStatus status);
    error DisputeDeadlinePassed(uint64 deadline);
    error DisputeNotExpired(uint64 deadline);
    /// @notice A vote signer is not a committee member.
    error NotCommitteeMember(address signer);
    error QuorumNotReached(uint256 required, uint256 got);

    /// @param minBond_ Least dispute bond (wei).
    /// @param disputeTimeout_ Seconds until an unresolved dispute may be expired.
    /// @param faultSlashBps_ Share of the shard collateral slashed on fault (<= 10000).
    /// @param verifierRewardBps_ Share of the slashed stake paid to voters on fault (<= 10000).
    /// @param minerBondShareBps_ Share of the bond paid to the miner on no fault (<= 10000).
    constructor(
        uint256 minBond_,
        uint64 disputeTimeout_,
        uint16 faultSlashBps_,
        uint16 verifierRewardBps_,
        uint16 minerBondShareBps_
    ) Ownable(msg.sender) EIP712("Quarry", "1") {
        _setParams(minBond_, disputeTimeout_, faultSlashBps_, verifierRewardBps_, minerBondShareBps_);
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets TaskRegistry. One-time, owner only.
    function setTaskRegistry(address a) external onlyOwner setOnce(address(taskRegistry), a) {
        taskRegistry = ITaskRegistry(a);
        emit TaskRegistrySet(a);
    }

    /// @notice Sets GPURegistry. One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(address(gpuRegistry), a) {
        gpuRegistry = IGPURegistry(a);
        emit GPURegistrySet(a);
    }

    /// @notice Sets VerifierCommittee. One-time, owner only.
    function setCommittee(address a) external onlyOwner setOnce(address(committee), a) {
        committee = IVerifierCommittee(a);
        emit CommitteeSet(a);
    }

    /// @notice Sets PaymentEscrow. One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets the economic parameters (apply to disputes opened or resolved afterwards).
    function setParams(
        uint256 minBond_,
        uint64 disputeTimeout_,
        uint16 faultSlashBps_,
        uint16 verifierRewardBps_,
        uint16 minerBondShareBps_
    ) external onlyOwner {
        _setParams(minBond_, disputeTimeout_, faultSlashBps_, verifierRewardBps_, minerBondShareBps_);
    }

    // ------------------------------------------------------------------ disputes

    /// @notice Disputes one receipt of a Submitted shard inside its challenge window, with
    /// `msg.value` (>= minBond) as bond. Checks that the receipt matches the task and shard,
    /// that the miner signed it, and that it is a leaf of the shard's resultRoot. Freezes the shard.
    /// @param taskId The task.
    /// @param shard The shard index.
    /// @param receipt The disputed receipt.
    /// @param minerSig The miner's EIP-712 signature over the receipt (TaskRegistry domain).
    /// @param proof StandardMerkleTree proof of (uint256 index, receiptStructHash) under resultRoot.
    /// @param evidenceURI Where the disputed output and evidence live.
    /// @return disputeId The new dispute's id (from 1).
    function openDispute(
        uint256 taskId,
        uint32 shard,
        Receipt calldata receipt,
        bytes calldata minerSig,
        bytes32[] calldata proof,
        string calldata evidenceURI
    ) external payable nonReentrant returns (uint256 disputeId) {
        if (address(taskRegistry) == address(0)) revert NotWired();
        if (msg.value < minBond || msg.value == 0) revert InsufficientBond(minBond, msg.value);
        address miner = _checkDispute(taskId, shard, receipt, minerSig, proof);

        disputeId = ++disputeCount;
        Dispute storage d = _disputes[disputeId];
        d.taskId = taskId;
        d.shard = shard;
        d.status = DisputeStatus.Open;
        d.opener = msg.sender;
        d.miner = miner;
        d.bond = msg.value;
        d.openedAt = uint64(block.timestamp);
        d.deadline = uint64(block.timestamp) + disputeTimeout;
        d.receipt = receipt;
        d.evidenceURI = evidenceURI;
        _emitOpened(disputeId, d);
        taskRegistry.markDisputed(taskId, shard);
    }

    /// @notice Resolves an open dispute before its deadline with a quorum of committee votes:
    /// EIP-712 `Vote(disputeId, minerAtFault)` signatures, signers strictly ascending by address.
    /// @param disputeId The dispute.
    /// @param minerAtFault The verdict the signatures vote for.
    /// @param sigs Member signatures.
    function resolve(uint256 disputeId, bool minerAtFault, bytes[] calldata sigs) external nonReentrant {
        Dispute storage d = _dispute(disputeId);
        if (d.status != DisputeStatus.Open) revert DisputeNotOpen(d.status);
        if (block.timestamp >= d.deadline) revert DisputeDeadlinePassed(d.deadline);
        address[] memory voters = SigLib.recoverSorted(hashVote(disputeId, minerAtFault), sigs);
        for (uint256 i = 0; i < voters.length; ++i) {
            if (!committee.isMember(voters[i])) revert NotCommitteeMember(voters[i]);
        }
        uint256 q = committee.quorum();
        if (voters.length < q) revert QuorumNotReached(q, voters.length);

        d.status = minerAtFault ? DisputeStatus.MinerAtFault : DisputeStatus.MinerNotAtFault;
        (address miner, uint256 collateral, address client) =
            taskRegistry.resolveDispute(d.taskId, d.shard, minerAtFault);
        uint256 bond = d.bond;
        uint256 n = voters.length;
        if (minerAtFault) {
            uint256 slashAmount = collateral * faultSlashBps / BPS;
            uint256 each = slashAmount * verifierRewardBps / BPS / n;
            uint256 slashed = 0;
            for (uint256 i = 0; i < n; ++i) {
                slashed += gpuRegistry.slash(miner, each, voters[i]);
            }
            slashed += gpuRegistry.slash(miner, slashAmount - each * n, client);
            emit DisputeResolved(disputeId, true, voters, slashed);
            escrow.credit{value: bond}(d.opener);
        } else {
            uint256 toMiner = bond * minerBondShareBps / BPS;
            uint256 each = (bond - toMiner) / n;
            emit DisputeResolved(disputeId, false, voters, 0);
            for (uint256 i = 0; i < n; ++i) {
                escrow.credit{value: each}(voters[i]);
            }
            escrow.credit{value: bond - each * n}(miner);
        }
    }

    /// @notice Ends a dispute that no quorum resolved by its deadline: no fault, the bond goes
    /// back to the opener and the shard can be finalized. Anyone may call.
    /// @param disputeId The dispute.
    function expireDispute(uint256 disputeId) external nonReentrant {
        Dispute storage d = _dispute(disputeId);
        if (d.status != DisputeStatus.Open) revert DisputeNotOpen(d.status);
        if (block.timestamp < d.deadline) revert DisputeNotExpired(d.deadline);
        d.status = DisputeStatus.Expired;
        emit DisputeExpired(disputeId);
        taskRegistry.resolveDispute(d.taskId, d.shard, false);
        escrow.credit{value: d.bond}(d.opener);
    }

    // ------------------------------------------------------------------ views

    /// @notice The dispute (reverts {UnknownDispute} for an unknown id).
    function getDispute(uint256 disputeId) external view returns (Dispute memory) {
        return _dispute(disputeId);
    }

    /// @notice EIP-712 digest of `Vote(disputeId, minerAtFault)` in this domain.
    function hashVote(uint256 disputeId, bool minerAtFault) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(VOTE_TYPEHASH, disputeId, minerAtFault)));
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /// @notice The result-tree leaf of a receipt: OpenZeppelin StandardMerkleTree's leaf for
    /// the value (uint256 index, bytes32 receiptStructHash).
    function receiptLeaf(Receipt calldata receipt) public view returns (bytes32) {
        bytes32 structHash = taskRegistry.receiptStructHash(receipt);
        return keccak256(bytes.concat(keccak256(abi.encode(uint256(receipt.index), structHash))));
    }

    // ------------------------------------------------------------------ internal

    function _checkDispute(
        uint256 taskId,
        uint32 shard,
        Receipt calldata receipt,
        bytes calldata minerSig,
        bytes32[] calldata proof
    ) private view returns (address miner) {
        Task memory t = taskRegistry.getTask(taskId);
        if (msg.sender != t.client && (t.arbiter == address(0) || msg.sender != t.arbiter)) {
            revert NotClientOrArbiter(msg.sender);
        }
        Shard memory s = taskRegistry.getShard(taskId, shard);
        if (s.state != ShardState.Submitted) revert ShardNotSubmitted(s.state);
        if (block.timestamp >= s.windowEnd) revert OutsideWindow(s.windowEnd);
        (uint32 start, uint32 end) = taskRegistry.shardRange(taskId, shard);
        if (
            receipt.taskId != taskId || receipt.shard != shard || receipt.modelId != t.modelId
                || receipt.index < start || receipt.index >= end
        ) revert ReceiptMismatch();
        address signer = SigLib.recover(taskRegistry.hashReceipt(receipt), minerSig);
        if (signer != s.miner) revert InvalidMinerSignature(signer, s.miner);
        if (!MerkleProof.verifyCalldata(proof, s.resultRoot, receiptLeaf(receipt))) revert InvalidProof();
        return s.miner;
    }

    function _emitOpened(uint256 disputeId, Dispute storage d) private {
        emit DisputeOpened(
            disputeId, d.taskId, d.shard, d.opener, d.miner, d.bond, d.deadline, d.receipt, d.evidenceURI
        );
    }

    function _dispute(uint256 disputeId) private view returns (Dispute storage d) {
        d = _disputes[disputeId];
        if (d.status == DisputeStatus.None) revert UnknownDispute(disputeId);
    }

    function _setParams(uint256 minBond_, uint64 timeout, uint16 fBps, uint16 vBps, uint16 mBps) private {
        if (fBps > BPS) revert InvalidBps(fBps);
        if (vBps > BPS) revert InvalidBps(vBps);
        if (mBps > BPS) revert InvalidBps(mBps);
        minBond = minBond_;
        disputeTimeout = timeout;
        faultSlashBps = fBps;
        verifierRewardBps = vBps;
        minerBondShareBps = mBps;
        emit ParamsSet(minBond_, timeout, fBps, vBps, mBps);
    }
}
