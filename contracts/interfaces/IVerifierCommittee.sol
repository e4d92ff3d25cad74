// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the other Quarry contracts need from VerifierCommittee.
interface IVerifierCommittee {
    function currentEpoch() external view returns (uint256);
    function genesisTime() external view returns (uint64);
    function epochDuration() external view returns (uint64);
    function nextReportEpoch() external view returns (uint256);
    function weightAt(address verifier, uint256 epoch) external view returns (uint256);
    function totalWeightAt(uint256 epoch) external view returns (uint256);
    function penalizeAbsence(address verifier, address beneficiary) external returns (uint256 slashed);
}
