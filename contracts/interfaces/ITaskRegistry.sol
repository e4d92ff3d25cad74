// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Receipt} from "../lib/QuarryTypes.sol";

/// @notice Life of a shard. `Open` is the zero value, so a fresh task needs no per-shard writes.
enum ShardState {
    Open,
    Claimed,
    Submitted,
    Disputed,
    Finalized,
    Refunded
}

/// @notice A batch job. Amounts in wei; times in seconds since the epoch.
struct Task {
    address client;
    address arbiter;
    bytes32 modelId;
    bytes32 inputRoot;
    string inputURI;
    uint32 numRequests;
    uint32 shardSize;
    uint32 maxTokensPerRequest;
    uint32 numShards;
    uint256 pricePerToken;
    uint64 deadline;
    uint64 createdAt;
    uint16 minReputationBps;
    /// @dev The client lets miners on probation claim its shards (GPURegistry's notice).
    bool allowProbation;
    /// @dev Accepted precisions: bit p accepts precision p (1 FP32 .. 5 INT8); 0 accepts any.
    uint8 precisions;
    /// @dev Every non-empty output must carry an activation commitment (its receipt's
    /// `commitment` non-zero); verifiers fault a shard that lacks one.
    bool requireCommitments;
    bool cancelled;
    /// @dev Sum of the budgets of shards that are Claimed, Submitted or Disputed.
    uint256 committed;
}

/// @notice What a client posts with TaskRegistry.createTask: the job and its conditions.
struct TaskTerms {
    /// @dev keccak256 of the model's canonical manifest.
    bytes32 modelId;
    /// @dev StandardMerkleTree root over (uint256 index, bytes32 requestHash).
    bytes32 inputRoot;
    /// @dev Where the requests JSONL lives (content-addressed store).
    string inputURI;
    /// @dev Number of requests (> 0).
    uint32 numRequests;
    /// @dev Requests per shard (> 0); the last shard may be shorter.
    uint32 shardSize;
    /// @dev Token budget per request (> 0).
    uint32 maxTokensPerRequest;
    /// @dev Wei per output token (> 0).
    uint256 pricePerToken;
    /// @dev After it no shard is claimed and unfinished shards are refunded.
    uint64 deadline;
    /// @dev Least miner reputation to claim (the untrusted floor also applies).
    uint16 minReputationBps;
    /// @dev Optional address allowed to dispute on the client's behalf (zero: none).
    address arbiter;
    /// @dev Whether miners on probation may claim (GPURegistry's notice).
    bool allowProbation;
    /// @dev Accepted precisions, bit p for precision p (1 FP32 .. 5 INT8; 0x3E at most); 0
    /// accepts any. A claimant whose declaration for the model is outside it cannot claim.
    uint8 precisions;
    /// @dev Every non-empty output must carry an activation commitment.
    bool requireCommitments;
}

/// @notice One index range [shard*shardSize, min(numRequests, (shard+1)*shardSize)) of a task.
struct Shard {
    ShardState state;
    address miner;
    /// @dev The claimant's (or its swarm's) declared precision for the task's model at the
    /// claim: what the shard's outputs are judged at, whatever the miner declares later.
    uint8 precision;
    uint64 claimExpiry;
    uint64 submittedAt;
    /// @dev End of the challenge window: disputes need `now < windowEnd`, finalize `now >= windowEnd`.
    uint64 windowEnd;
    /// @dev The root sum of the result tree: the output tokens the shard bills.
    uint64 tokensUsed;
    uint256 collateral;
    /// @dev The root hash of the result tree (library ResultTree).
    bytes32 resultRoot;
    string resultURI;
}

/// @notice What Arbitration needs from TaskRegistry.
interface ITaskRegistry {
    function getTask(uint256 taskId) external view returns (Task memory);
    function getShard(uint256 taskId, uint32 shard) external view returns (Shard memory);
    function shardSwarm(uint256 taskId, uint32 shard) external view returns (uint256 swarmId);
    function shardRange(uint256 taskId, uint32 shard) external view returns (uint32 start, uint32 end);
    function hashReceipt(Receipt calldata receipt) external view returns (bytes32);
    function receiptStructHash(Receipt calldata receipt) external pure returns (bytes32);
    function markDisputed(uint256 taskId, uint32 shard) external;
    function resolveDispute(uint256 taskId, uint32 shard, bool minerAtFault, uint64 windowEnd)
        external
        returns (address miner, uint256 collateral, address client);
}
