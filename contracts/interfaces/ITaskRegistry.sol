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
    bool cancelled;
    /// @dev Sum of the budgets of shards that are Claimed, Submitted or Disputed.
    uint256 committed;
}

/// @notice One index range [shard*shardSize, min(numRequests, (shard+1)*shardSize)) of a task.
struct Shard {
    ShardState state;
    address miner;
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
