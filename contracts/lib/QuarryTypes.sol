// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @notice One signed output of a miner: the EIP-712 struct `Receipt` of DESIGN.md section 4.
/// @dev Signed with the TaskRegistry domain `{name: "Quarry", version: "1", chainId, TaskRegistry}`.
struct Receipt {
    uint256 taskId;
    uint32 shard;
    uint32 index;
    bytes32 requestHash;
    bytes32 outputHash;
    uint32 outputTokens;
    bytes32 modelId;
}

/// @notice A committee reputation report for one epoch (EIP-712 struct `Report`).
struct Report {
    uint256 epoch;
    address[] miners;
    uint16[] scoresBps;
    bytes32 evidenceRoot;
}

/// @notice A signature does not parse (bad length or malleable `s`).
error InvalidSignature();
/// @notice Two signatures of a quorum recover to the same signer.
error DuplicateSigner(address signer);
/// @notice Quorum signers must be sorted strictly ascending by address.
error SignersNotSorted();

/// @title SigLib
/// @notice Recovers a list of ECDSA signatures over one digest, enforcing that the recovered
/// signers are strictly ascending by address. Sorting makes a repeated signer detectable in
/// O(n) without storage, so quorum checks need no loop over state.
library SigLib {
    /// @dev Recovers `sig` over `digest`; reverts {InvalidSignature} when it does not parse.
    function recover(bytes32 digest, bytes calldata sig) internal pure returns (address signer) {
        (address rec, ECDSA.RecoverError err,) = ECDSA.tryRecover(digest, sig);
        if (err != ECDSA.RecoverError.NoError || rec == address(0)) revert InvalidSignature();
        return rec;
    }

    /// @dev Recovers every signature; reverts {DuplicateSigner} or {SignersNotSorted} unless the
    /// signers are strictly ascending.
    function recoverSorted(bytes32 digest, bytes[] calldata sigs)
        internal
        pure
        returns (address[] memory signers)
    {
        signers = new address[](sigs.length);
        address prev = address(0);
        for (uint256 i = 0; i < sigs.length; ++i) {
            address s = recover(digest, sigs[i]);
            if (i > 0) {
                if (s == prev) revert DuplicateSigner(s);
                if (s < prev) revert SignersNotSorted();
            }
            signers[i] = s;
            prev = s;
        }
    }
}
