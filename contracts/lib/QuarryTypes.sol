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
    /// @dev keccak256 of the output's activation commitment bytes (TOPLOC, see
    /// market/protocol/commitments.py); zero when the miner's engine made none.
    bytes32 commitment;
}

/// @dev EIP-712 type hash of {Receipt}.
bytes32 constant RECEIPT_TYPEHASH = keccak256(
    "Receipt(uint256 taskId,uint32 shard,uint32 index,bytes32 requestHash,bytes32 outputHash,uint32 outputTokens,bytes32 modelId,bytes32 commitment)"
);

/// @title Receipts
/// @notice The EIP-712 struct hash of a receipt, shared by TaskRegistry (whose domain miners
/// sign in) and Arbitration (which proves receipts under result roots).
library Receipts {
    function structHash(Receipt calldata r) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                RECEIPT_TYPEHASH,
                r.taskId,
                r.shard,
                r.index,
                r.requestHash,
                r.outputHash,
                r.outputTokens,
                r.modelId,
                r.commitment
            )
        );
    }
}

/// @notice A committee reputation report for one epoch (EIP-712 struct `Report`).
struct Report {
    uint256 epoch;
    address[] miners;
    uint16[] scoresBps;
    bytes32 evidenceRoot;
}

/// @notice One sibling on a result-tree path: a subtree's hash and the output tokens it holds.
struct SumNode {
    bytes32 hash;
    uint64 sum;
}

/// @notice One level of a billing-lie path (ResultTree.findSumLie): the sum the parent's hash
/// records for the path's node, and the node's sibling as that parent records it. Sums are
/// full words because a lying parent may record any value its hash can hold.
struct SumStep {
    uint256 sum;
    bytes32 sibling;
    uint256 siblingSum;
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

/// @title ResultTree
/// @notice The shard result commitment: a Merkle sum tree over the shard's receipts in index
/// order, whose root carries the shard's total output tokens. `submitResult` stores the root's
/// hash as `resultRoot` and its sum as `tokensUsed`, so every receipt proven under the root is
/// also proven to be part of what the shard bills.
/// @dev Shape: RFC 9162 (Certificate Transparency v2) over `size` leaves, the left subtree
/// holding the largest power of two below `size`; no padding, so every leaf position is a real
/// request of the shard and a proof's length and directions follow from (position, size).
/// - leaf: `hash = keccak256(bytes.concat(keccak256(abi.encode(uint256 index, bytes32
///   receiptStructHash))))`, `sum = outputTokens` (OpenZeppelin StandardMerkleTree's leaf);
/// - node: `hash = keccak256(abi.encode(left.hash, uint256 left.sum, right.hash, uint256
///   right.sum))`, `sum = left.sum + right.sum`.
library ResultTree {
    /// @dev The leaf hash of a receipt with the given struct hash.
    function leafHash(uint256 index, bytes32 receiptStructHash) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(index, receiptStructHash))));
    }

    /// @dev The hash of an inner node.
    function nodeHash(bytes32 left, uint256 leftSum, bytes32 right, uint256 rightSum)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(left, leftSum, right, rightSum));
    }

    /// @dev The root (hash, sum) that `proof` leads to from the leaf at `position` of a tree of
    /// `size` leaves (RFC 9162 section 2.1.3.2); `ok` is false when the proof's length does not
    /// fit (position, size).
    function processProof(
        uint256 position,
        uint256 size,
        bytes32 leaf,
        uint256 leafSum,
        SumNode[] calldata proof
    ) internal pure returns (bool ok, bytes32 root, uint256 sum) {
        if (position >= size) return (false, bytes32(0), 0);
        uint256 fn = position;
        uint256 sn = size - 1;
        root = leaf;
        sum = leafSum;
        for (uint256 i = 0; i < proof.length; ++i) {
            if (sn == 0) return (false, bytes32(0), 0);
            SumNode calldata p = proof[i];
            if (fn & 1 == 1 || fn == sn) {
                root = nodeHash(p.hash, p.sum, root, sum);
                sum += p.sum;
                if (fn & 1 == 0) {
                    while (fn & 1 == 0 && fn != 0) {
                        fn >>= 1;
                        sn >>= 1;
                    }
                }
            } else {
                root = nodeHash(root, sum, p.hash, p.sum);
                sum += p.sum;
            }
            fn >>= 1;
            sn >>= 1;
        }
        ok = sn == 0;
    }

    /// @dev True when `proof` proves the leaf (`leaf`, `leafSum`) at `position` under a tree of
    /// `size` leaves whose root hash is `root` and whose root sum is `total`.
    function verify(
        bytes32 root,
        uint256 total,
        uint256 position,
        uint256 size,
        bytes32 leaf,
        uint256 leafSum,
        SumNode[] calldata proof
    ) internal pure returns (bool) {
        (bool ok, bytes32 r, uint256 s) = processProof(position, size, leaf, leafSum, proof);
        return ok && r == root && s == total;
    }

    /// @dev Walks `path` from the leaf at `position` of a tree of `size` leaves to the root,
    /// hashing every parent with the sums it records (`path[i].sum` for the path's node), and
    /// compares each recorded sum with the one recomputed from below: the leaf's own `leafSum`
    /// at the bottom, the sum of a node's two recorded children above, and `total` (the
    /// shard's `tokensUsed`) for the root. Any difference is a sum the miner's own commitment
    /// contradicts. A lie in an inner node leaves every receipt outside its subtree provable,
    /// so it is caught only by a path through it: this one reveals each level's pair
    /// (O(log n) calldata), so the lie is checked where it sits.
    /// @return ok The path's length fits (position, size).
    /// @return root The root hash the path leads to (the caller checks it against `resultRoot`).
    /// @return lie Some recorded sum on the path, or `total`, differs from the sum below it.
    function findSumLie(
        uint256 position,
        uint256 size,
        bytes32 leaf,
        uint256 leafSum,
        uint256 total,
        SumStep[] calldata path
    ) internal pure returns (bool ok, bytes32 root, bool lie) {
        if (position >= size) return (false, bytes32(0), false);
        uint256 fn = position;
        uint256 sn = size - 1;
        root = leaf;
        uint256 below = leafSum;
        // an overflowing sum of two recorded children exceeds any word a parent can record
        bool overflow = false;
        for (uint256 i = 0; i < path.length; ++i) {
            if (sn == 0) return (false, bytes32(0), false);
            SumStep calldata p = path[i];
            if (overflow || p.sum != below) lie = true;
            if (fn & 1 == 1 || fn == sn) {
                root = nodeHash(p.sibling, p.siblingSum, root, p.sum);
                if (fn & 1 == 0) {
                    while (fn & 1 == 0 && fn != 0) {
                        fn >>= 1;
                        sn >>= 1;
                    }
                }
            } else {
                root = nodeHash(root, p.sum, p.sibling, p.siblingSum);
            }
            unchecked {
                below = p.sum + p.siblingSum;
                overflow = below < p.sum;
            }
            fn >>= 1;
            sn >>= 1;
        }
        ok = sn == 0;
        if (overflow || below != total) lie = true;
    }
}
