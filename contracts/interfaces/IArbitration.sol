// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What VerifierCommittee needs from Arbitration.
interface IArbitration {
    function disputeTimeout() external view returns (uint64);
}
