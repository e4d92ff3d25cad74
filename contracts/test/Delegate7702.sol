// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {GPURegistry, GpuSpec} from "../GPURegistry.sol";
import {VerifierCommittee} from "../VerifierCommittee.sol";

/// @notice Test only: code an externally owned account delegates to with EIP-7702, to show that
/// such an account passes the `msg.sender == tx.origin` registration check yet gains nothing
/// from having code: every payout is pulled by `msg.sender` behind `nonReentrant`, so a
/// re-entry from `receive` is refused. Its storage is the delegating account's.
contract Delegate7702 {
    /// @notice Re-entries that succeeded (must stay 0).
    uint256 public reentered;
    /// @notice Re-entries that reverted.
    uint256 public refused;
    address private _target;
    bytes private _data;

    error Unauthorized(address caller);

    /// @notice Registers the delegating account with the committee (anyone may call: the
    /// committee itself refuses a caller other than the transaction's origin).
    function joinCommittee(address committee) external payable {
        VerifierCommittee(committee).register{value: msg.value}();
    }

    /// @notice Registers the delegating account as an FP32 miner of `model`.
    function joinMiners(address gpu, bytes32 model) external payable {
        bytes32[] memory models = new bytes32[](1);
        models[0] = model;
        uint8[] memory precisions = new uint8[](1);
        precisions[0] = 1;
        GPURegistry(gpu).register{value: msg.value}(models, precisions, GpuSpec("g", 1, 1), "e", 1);
    }

    /// @notice Makes `receive` call `target` with `data` on every payment (the account only).
    function arm(address target, bytes calldata data) external {
        if (msg.sender != address(this)) revert Unauthorized(msg.sender);
        _target = target;
        _data = data;
    }

    /// @notice Tries the armed re-entry and counts the outcome; never reverts, so the payment
    /// that triggered it goes through.
    receive() external payable {
        if (_target == address(0)) return;
        (bool ok,) = _target.call(_data);
        if (ok) ++reentered;
        else ++refused;
    }
}
