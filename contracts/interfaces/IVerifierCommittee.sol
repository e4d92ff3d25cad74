// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the other Quarry contracts need from VerifierCommittee.
interface IVerifierCommittee {
    function isMember(address account) external view returns (bool);
    function quorum() external view returns (uint256);
}
