// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

/// @title OneTimeWiring
/// @notice The guard of the contracts' wiring setters: each address (the other Quarry
/// contracts) is set once, to a non-zero value, and can never be repointed.
abstract contract OneTimeWiring {
    /// @notice A one-time wiring setter was called twice.
    error AlreadySet();
    /// @notice An address argument is zero.
    error ZeroAddress();

    /// @dev Runs the setter only while `current` is unset and `next` is not zero.
    modifier setOnce(address current, address next) {
        if (current != address(0)) revert AlreadySet();
        if (next == address(0)) revert ZeroAddress();
        _;
    }
}
