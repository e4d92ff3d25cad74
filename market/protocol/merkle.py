"""OpenZeppelin StandardMerkleTree, byte for byte (npm `@openzeppelin/merkle-tree` 1.x).

- leaf  = keccak256(bytes.concat(keccak256(abi.encode(types, values)))) (double hashing
  keeps a 64-byte leaf preimage from being mistaken for an inner node);
- node  = keccak256(min(a, b) ++ max(a, b)) (sorted pairs, so proofs need no left/right bits);
- layout: the leaves, sorted by hash (the library's default `sortLeaves: true`), fill the
  end of a flat array in reverse, and node i has children 2i+1 and 2i+2; the root is node 0.

`MerkleProof.verify` in OpenZeppelin Contracts checks these proofs on-chain. Quarry's input
tree has leaves `(uint256 index, bytes32 requestHash)` and the result tree
`(uint256 index, bytes32 receiptStructHash)`; `proof(i)` takes the position `i` in the value
list given to the constructor, whatever the sorted layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eth_abi import encode as abi_encode
from eth_abi.exceptions import EncodingError

from market.protocol.canonical import keccak
from market.protocol.errors import MerkleError

__all__ = [
    "INDEX_HASH_TYPES",
    "StandardMerkleTree",
    "leaf_hash",
    "node_hash",
    "process_proof",
    "verify_proof",
    "input_tree",
    "result_tree",
    "receipts_tree",
]

INDEX_HASH_TYPES: tuple[str, str] = ("uint256", "bytes32")


def leaf_hash(types: Sequence[str], value: Sequence[Any]) -> bytes:
    """keccak256(bytes.concat(keccak256(abi.encode(types, value))))."""
    if len(types) != len(value):
        raise MerkleError(f"leaf {value!r} has {len(value)} values for {len(types)} types")
    if tuple(types) == INDEX_HASH_TYPES:  # the hot path: both Quarry trees, no eth_abi call
        index, digest = value
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 2**256:
            raise MerkleError(f"leaf index {index!r} is not a uint256")
        if not isinstance(digest, bytes | bytearray) or len(digest) != 32:
            raise MerkleError(f"leaf hash {digest!r} is not 32 bytes")
        encoded = index.to_bytes(32, "big") + bytes(digest)
    else:
        try:
            encoded = abi_encode(list(types), list(value))
        except (EncodingError, TypeError, ValueError) as exc:
            raise MerkleError(f"leaf {value!r} does not fit types {list(types)}: {exc}") from exc
    return keccak(keccak(encoded))


def node_hash(a: bytes, b: bytes) -> bytes:
    """keccak256 of the two children in ascending byte order (OpenZeppelin's commutative hash)."""
    return keccak(a + b) if a <= b else keccak(b + a)


def process_proof(leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that `proof` leads to from `leaf` (MerkleProof.processProof)."""
    node = bytes(leaf)
    for sibling in proof:
        if len(sibling) != 32:
            raise MerkleError(f"proof node {bytes(sibling).hex()} is not 32 bytes")
        node = node_hash(node, bytes(sibling))
    return node


def verify_proof(root: bytes, leaf: bytes, proof: Sequence[bytes]) -> bool:
    """Whether `proof` proves `leaf` (an already hashed leaf) under `root`."""
    return process_proof(leaf, proof) == bytes(root)


class StandardMerkleTree:
    """`StandardMerkleTree.of(values, types)` with the library's defaults (leaves sorted)."""

    def __init__(
        self, values: Sequence[Sequence[Any]], types: Sequence[str], *, sort_leaves: bool = True
    ) -> None:
        if not values:
            raise MerkleError("a Merkle tree needs at least one leaf")
        self.types = tuple(types)
        self.values = [tuple(v) for v in values]
        hashed = [(leaf_hash(self.types, v), i) for i, v in enumerate(self.values)]
        if sort_leaves:
            hashed.sort(key=lambda item: item[0])
        n = len(hashed)
        tree: list[bytes] = [b""] * (2 * n - 1)
        self._tree_index = [0] * n
        for position, (digest, value_index) in enumerate(hashed):
            tree_index = len(tree) - 1 - position
            tree[tree_index] = digest
            self._tree_index[value_index] = tree_index
        for i in range(len(tree) - 1 - n, -1, -1):
            tree[i] = node_hash(tree[2 * i + 1], tree[2 * i + 2])
        self.tree = tree

    @classmethod
    def of(cls, values: Sequence[Sequence[Any]], types: Sequence[str]) -> StandardMerkleTree:
        return cls(values, types)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def root(self) -> bytes:
        return self.tree[0]

    def leaf(self, i: int) -> bytes:
        """The hashed leaf of value `i`."""
        return self.tree[self._tree_index[self._check(i)]]

    def proof(self, i: int) -> list[bytes]:
        """The sibling hashes from value `i`'s leaf up to the root (OZ `getProof(i)`)."""
        node = self._tree_index[self._check(i)]
        proof: list[bytes] = []
        while node > 0:
            sibling = node - 1 if node % 2 == 0 else node + 1
            proof.append(self.tree[sibling])
            node = (node - 1) // 2
        return proof

    def verify(self, value: Sequence[Any], proof: Sequence[bytes]) -> bool:
        """Whether `proof` proves `value` under this tree's root."""
        return verify_proof(self.root, leaf_hash(self.types, value), proof)

    @staticmethod
    def verify_value(
        root: bytes, types: Sequence[str], value: Sequence[Any], proof: Sequence[bytes]
    ) -> bool:
        """`StandardMerkleTree.verify(root, types, value, proof)` without building a tree."""
        return verify_proof(root, leaf_hash(types, value), proof)

    def dump(self) -> dict[str, Any]:
        """The npm library's `standard-v1` dump, hex-encoded, for cross-checks and storage."""
        return {
            "format": "standard-v1",
            "leafEncoding": list(self.types),
            "tree": ["0x" + node.hex() for node in self.tree],
            "values": [
                {"value": [_jsonable(x) for x in v], "treeIndex": self._tree_index[i]}
                for i, v in enumerate(self.values)
            ],
        }

    def _check(self, i: int) -> int:
        if not isinstance(i, int) or not 0 <= i < len(self.values):
            raise MerkleError(f"leaf index {i!r} out of range for a tree of {len(self.values)}")
        return i


def _jsonable(x: Any) -> Any:
    if isinstance(x, bytes | bytearray):
        return "0x" + bytes(x).hex()
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return x


def input_tree(request_hashes: Sequence[bytes]) -> StandardMerkleTree:
    """The task's input tree: leaf i is `(uint256 i, bytes32 requestHash_i)`."""
    return StandardMerkleTree([(i, h) for i, h in enumerate(request_hashes)], INDEX_HASH_TYPES)


def receipts_tree(receipts: Sequence[Any]) -> StandardMerkleTree:
    """A shard's result tree straight from its `Receipt`s: leaf `(r.index, r.struct_hash())`.

    This is the leaf `Arbitration.receiptLeaf` recomputes, with `index` the request's global
    index in the task (within the shard's `[start, end)`).
    """
    return StandardMerkleTree([(r.index, r.struct_hash()) for r in receipts], INDEX_HASH_TYPES)


def result_tree(receipt_struct_hashes: Sequence[bytes], first_index: int = 0) -> StandardMerkleTree:
    """A shard's result tree: leaf j is `(uint256 first_index + j, bytes32 structHash_j)`.

    Pass the receipts' EIP-712 struct hashes in index order, and the global request index
    of the first one (the shard's `start`) as `first_index`: Arbitration checks the leaf
    `(receipt.index, structHash)` with the task-wide index.
    """
    return StandardMerkleTree(
        [(first_index + j, h) for j, h in enumerate(receipt_struct_hashes)], INDEX_HASH_TYPES
    )
