// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the other Quarry contracts need from GPURegistry.
interface IGPURegistry {
    function lockCollateral(address miner, uint256 amount) external;
    function unlockCollateral(address miner, uint256 amount) external;
    function holdReserve(address miner) external;
    function releaseReserve(address miner) external;
    function slash(address miner, uint256 amount, address beneficiary) external returns (uint256 slashed);
    function setReputation(address miner, uint16 bps, uint256 epochStart) external;
    function recordMissed(address miner) external;
    function isEligible(address miner, bytes32 modelId, uint16 minRepBps, bool allowProbation)
        external
        view
        returns (bool);
    function eligiblePrecision(address miner, bytes32 modelId, uint16 minRepBps, bool allowProbation)
        external
        view
        returns (uint8);
    function isRegistered(address miner) external view returns (bool);
    function taskRegistry() external view returns (address);
    function checkSwarmClaim(
        uint256 swarmId,
        address head,
        bytes32 modelId,
        uint16 minRepBps,
        bool allowProbation,
        uint256 taskPrice
    ) external view returns (uint8 precision);
    function swarmSplit(uint256 swarmId, uint256 amount)
        external
        view
        returns (address[] memory members, uint256[] memory parts);
}
