// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {GPURegistry, GpuSpec} from "../GPURegistry.sol";
import {VerifierCommittee} from "../VerifierCommittee.sol";

/// @notice Test only: a contract account that tries to register, which VerifierCommittee and
/// GPURegistry must refuse (ContractAccount). Reverts bubble up unchanged.
contract RegisterProxy {
    /// @notice Calls `VerifierCommittee(committee).register{value: msg.value}()`.
    function joinCommittee(address committee) external payable {
        VerifierCommittee(committee).register{value: msg.value}();
    }

    /// @notice Calls `GPURegistry(gpu).register{value: msg.value}([model], [1], GpuSpec("g", 1, 1), "e", 1)` (FP32).
    function joinMiners(address gpu, bytes32 model) external payable {
        bytes32[] memory models = new bytes32[](1);
        models[0] = model;
        uint8[] memory precisions = new uint8[](1);
        precisions[0] = 1;
        GPURegistry(gpu).register{value: msg.value}(models, precisions, GpuSpec("g", 1, 1), "e", 1);
    }
}

/// @notice Test only: registers from its constructor, while it has no code yet (so an
/// `extcodesize` check would miss it). Registers with the committee when `committee` is not
/// zero, else as a miner with `gpu` serving `model`.
contract RegisterInConstructor {
    constructor(address committee, address gpu, bytes32 model) payable {
        if (committee != address(0)) {
            VerifierCommittee(committee).register{value: msg.value}();
        } else {
            bytes32[] memory models = new bytes32[](1);
            models[0] = model;
            uint8[] memory precisions = new uint8[](1);
            precisions[0] = 1;
            GPURegistry(gpu).register{value: msg.value}(models, precisions, GpuSpec("g", 1, 1), "e", 1);
        }
    }
}
