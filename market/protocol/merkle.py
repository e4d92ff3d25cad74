"""OpenZeppelin StandardMerkleTree, byte for byte (npm `@openzeppelin/merkle-tree` 1.x).

- leaf  = keccak256(bytes.concat(keccak256(abi.encode(types, values)))) (double hashing
  keeps a 64-byte leaf preimage from being mistaken for an inner node);
- node  = keccak256(min(a, b) ++ max(a, b)) (sorted pairs, so proofs need no left/right bits);
- layout: the leaves, sorted by hash (the library's default `sortLeaves: true`), fill the
  end of a flat array in reverse, and node i has children 2i+1 and 2i+2; the root is node 0.

`MerkleProof.verify` in OpenZeppelin Contracts checks these proofs on-chain. Quarry's input
tree has leaves `(uint256 index, bytes32 requestHash)`; `proof(i)` takes the position `i` in
the value list given to the constructor, whatever the sorted layout.

A shard's result tree is not a StandardMerkleTree but a Merkle *sum* tree (`ResultTree`,
Solidity library `ResultTree`): its leaves are the shard's receipts in index order, each
carrying its `outputTokens`, and every node carries the tokens below it, so the root's sum is
the shard's `tokensUsed` and any receipt proven under the root is proven to be billed.

A miner can still write a false sum for a subtree into its parent's hash: `tokensUsed` grows
while every receipt outside that subtree proves. `find_sum_lie` (Solidity
`ResultTree.findSumLie`) checks, along one leaf's path, each recorded sum against the sum
below it, and `sum_lie_path` finds such a path from a result document's receipts and proofs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi import encode as abi_encode
from eth_abi.exceptions import EncodingError

from market.protocol.canonical import keccak
from market.protocol.errors import MerkleError

__all__ = [
    "INDEX_HASH_TYPES",
    "StandardMerkleTree",
    "SumNode",
    "SumStep",
    "ResultTree",
    "leaf_hash",
    "node_hash",
    "sum_node_hash",
    "process_proof",
    "process_sum_proof",
    "verify_proof",
    "verify_sum_proof",
    "find_sum_lie",
    "sum_lie_path",
    "input_tree",
    "receipt_leaf",
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


UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class SumNode:
    """A result-tree node: a subtree's hash and the output tokens it holds (Solidity's
    `SumNode {bytes32 hash; uint64 sum;}`), and the unit of a result-tree proof."""

    hash: bytes
    sum: int

    def __post_init__(self) -> None:
        if not isinstance(self.hash, bytes | bytearray) or len(self.hash) != 32:
            raise MerkleError(f"sum node hash {self.hash!r} is not 32 bytes")
        if not isinstance(self.sum, int) or isinstance(self.sum, bool) \
                or not 0 <= self.sum <= UINT64_MAX:
            raise MerkleError(f"sum node sum {self.sum!r} is not a uint64")

    def as_tuple(self) -> tuple[bytes, int]:
        """The ABI tuple a contract call takes."""
        return (bytes(self.hash), self.sum)

    def to_json(self) -> dict[str, Any]:
        return {"hash": "0x" + bytes(self.hash).hex(), "sum": self.sum}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SumNode:
        try:
            h = str(d["hash"])
            if not h.startswith("0x"):
                raise ValueError("hash must be 0x-prefixed hex")
            return cls(bytes.fromhex(h[2:]), int(d["sum"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise MerkleError(f"malformed sum node {d!r}: {exc}") from exc


def sum_node_hash(left: SumNode, right: SumNode) -> bytes:
    """keccak256(abi.encode(left.hash, uint256 left.sum, right.hash, uint256 right.sum))."""
    return keccak(bytes(left.hash) + left.sum.to_bytes(32, "big")
                  + bytes(right.hash) + right.sum.to_bytes(32, "big"))


def _join(left: SumNode, right: SumNode) -> SumNode:
    return SumNode(sum_node_hash(left, right), left.sum + right.sum)


def _split(n: int) -> int:
    """The largest power of two strictly below `n` (n >= 2): the left subtree's size."""
    return 1 << ((n - 1).bit_length() - 1)


class ResultTree:
    """A shard's result tree: a Merkle sum tree over leaves in position order, shaped as
    RFC 9162 (the left subtree of n leaves holds the largest power of two below n), with no
    padding, so every position is a real request and a proof's shape follows from
    (position, size). `root` and `total` are what `submitResult` takes as `resultRoot` and
    `tokensUsed`."""

    def __init__(self, leaves: Sequence[SumNode]) -> None:
        if not leaves:
            raise MerkleError("a result tree needs at least one leaf")
        self.leaves = list(leaves)
        self._nodes: dict[tuple[int, int], SumNode] = {}
        top = self._build(0, len(self.leaves))
        if top.sum > UINT64_MAX:
            raise MerkleError(f"result tree holds {top.sum} tokens, more than a uint64")
        self.root: bytes = top.hash
        self.total: int = top.sum

    def _build(self, lo: int, hi: int) -> SumNode:
        if hi - lo == 1:
            node = self.leaves[lo]
        else:
            k = _split(hi - lo)
            node = _join(self._build(lo, lo + k), self._build(lo + k, hi))
        self._nodes[(lo, hi)] = node
        return node

    def __len__(self) -> int:
        return len(self.leaves)

    def proof(self, position: int) -> list[SumNode]:
        """The siblings from leaf `position` up to the root."""
        n = len(self.leaves)
        if not isinstance(position, int) or not 0 <= position < n:
            raise MerkleError(f"leaf position {position!r} out of range for a tree of {n}")
        path: list[SumNode] = []
        lo, hi = 0, n
        while hi - lo > 1:
            k = _split(hi - lo)
            if position < lo + k:
                path.append(self._nodes[(lo + k, hi)])
                hi = lo + k
            else:
                path.append(self._nodes[(lo, lo + k)])
                lo = lo + k
        path.reverse()
        return path


def process_sum_proof(position: int, size: int, leaf: SumNode,
                      proof: Sequence[SumNode]) -> SumNode | None:
    """The root node `proof` leads to from `leaf` at `position` of a tree of `size` leaves
    (RFC 9162 section 2.1.3.2, as `ResultTree.processProof` on-chain), or None when the
    proof's length does not fit (position, size)."""
    if not 0 <= position < size:
        return None
    fn, sn = position, size - 1
    node = leaf
    for sibling in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            node = _join(sibling, node)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            node = _join(node, sibling)
        fn >>= 1
        sn >>= 1
    return node if sn == 0 else None


def verify_sum_proof(root: bytes, total: int, position: int, size: int, leaf: SumNode,
                     proof: Sequence[SumNode]) -> bool:
    """Whether `proof` proves `leaf` at `position` under a result tree of `size` leaves with
    root hash `root` and root sum `total` (what Arbitration checks)."""
    top = process_sum_proof(position, size, leaf, proof)
    return top is not None and top.hash == bytes(root) and top.sum == total


def receipt_leaf(receipt: Any) -> SumNode:
    """A receipt's result-tree leaf: hash `leaf_hash((index, structHash))`, sum
    `outputTokens` (`Arbitration.receiptLeaf`)."""
    return SumNode(leaf_hash(INDEX_HASH_TYPES, (receipt.index, receipt.struct_hash())),
                   receipt.output_tokens)


def receipts_tree(receipts: Sequence[Any]) -> ResultTree:
    """A shard's result tree from its `Receipt`s in index order."""
    return ResultTree([receipt_leaf(r) for r in receipts])


UINT256_MAX = 2**256 - 1


@dataclass(frozen=True)
class SumStep:
    """One level of a billing-lie path (Solidity `SumStep`): the sum the parent's hash records
    for the path's node, and the node's sibling as the parent records it. Sums are uint256:
    a lying parent may record any word."""

    sum: int
    sibling: bytes
    sibling_sum: int

    def __post_init__(self) -> None:
        if not isinstance(self.sibling, bytes | bytearray) or len(self.sibling) != 32:
            raise MerkleError(f"sum step sibling {self.sibling!r} is not 32 bytes")
        for v in (self.sum, self.sibling_sum):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= UINT256_MAX:
                raise MerkleError(f"sum step sum {v!r} is not a uint256")

    def as_tuple(self) -> tuple[int, bytes, int]:
        """The ABI tuple a contract call takes."""
        return (self.sum, bytes(self.sibling), self.sibling_sum)


def _word_node_hash(lh: bytes, ls: int, rh: bytes, rs: int) -> bytes:
    return keccak(bytes(lh) + ls.to_bytes(32, "big") + bytes(rh) + rs.to_bytes(32, "big"))


def find_sum_lie(position: int, size: int, leaf: SumNode, total: int,
                 path: Sequence[SumStep]) -> tuple[bool, bytes, bool]:
    """(fits, root, lie) as `ResultTree.findSumLie` on-chain: whether the path's length fits
    (position, size), the root hash it leads to, and whether a recorded sum on it (or `total`,
    the shard's tokensUsed) differs from the sum below it."""
    if not 0 <= position < size:
        return False, b"", False
    fn, sn = position, size - 1
    root, below, lie = bytes(leaf.hash), leaf.sum, False
    for p in path:
        if sn == 0:
            return False, b"", False
        if p.sum != below:  # an overflowed `below` (> 2**256 - 1) never equals a word
            lie = True
        if fn & 1 or fn == sn:
            root = _word_node_hash(p.sibling, p.sibling_sum, root, p.sum)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            root = _word_node_hash(root, p.sum, p.sibling, p.sibling_sum)
        below = p.sum + p.sibling_sum
        fn >>= 1
        sn >>= 1
    return sn == 0, root, lie or below != total


def _path_ranges(position: int, size: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(node, sibling) leaf ranges [lo, hi) on `position`'s path, from the leaf up."""
    out: list[tuple[tuple[int, int], tuple[int, int]]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if position < lo + k:
            out.append(((lo, lo + k), (lo + k, hi)))
            hi = lo + k
        else:
            out.append(((lo + k, hi), (lo, lo + k)))
            lo = lo + k
    out.reverse()
    return out


def sum_lie_path(leaves: Sequence[SumNode], proofs: Mapping[int, Sequence[SumNode]],
                 root: bytes, total: int,
                 prefer: Sequence[int] = ()) -> tuple[int, list[SumStep]] | None:
    """A leaf position and its `SumStep` path proving that the committed tree (`root`,
    `total`) lies about a sum, or None when none is found.

    `leaves` are the shard's receipts' leaves, in position order; `proofs` the miner's proofs
    by position (a result document's). A lying parent shows its recorded sums only in the
    proofs of leaves outside the lie, so every node is taken as those proofs record it (the
    first proof naming it), else recomputed from its recorded children. Positions in
    `prefer` are tried first, then every other; O(n log n)."""
    n = len(leaves)
    recorded: dict[tuple[int, int], SumNode] = {}
    for m, proof in proofs.items():
        ranges = _path_ranges(m, n) if 0 <= m < n else []
        if len(proof) != len(ranges):
            continue
        for (_, sib), node in zip(ranges, proof, strict=True):
            recorded.setdefault(sib, node)

    def node_at(lo: int, hi: int, table: Mapping[tuple[int, int], SumNode],
                memo: dict[tuple[int, int], tuple[bytes, int]]) -> tuple[bytes, int]:
        if (lo, hi) in table:
            got = table[(lo, hi)]
            return bytes(got.hash), got.sum
        if (lo, hi) not in memo:
            if hi - lo == 1:
                memo[(lo, hi)] = (bytes(leaves[lo].hash), leaves[lo].sum)
            else:
                k = _split(hi - lo)
                lh, ls = node_at(lo, lo + k, table, memo)
                rh, rs = node_at(lo + k, hi, table, memo)
                memo[(lo, hi)] = (_word_node_hash(lh, ls, rh, rs), ls + rs)
        return memo[(lo, hi)]

    order = list(dict.fromkeys([m for m in prefer if 0 <= m < n] + list(range(n))))
    for table in (recorded, {}):  # the miner's recorded sums, then the receipts' own
        memo: dict[tuple[int, int], tuple[bytes, int]] = {}
        for m in order:
            path: list[SumStep] = []
            for (lo, hi), (slo, shi) in _path_ranges(m, n):
                _, node_sum = node_at(lo, hi, table, memo)
                sib_hash, sib_sum = node_at(slo, shi, table, memo)
                if node_sum > UINT256_MAX or sib_sum > UINT256_MAX:
                    break
                path.append(SumStep(node_sum, sib_hash, sib_sum))
            else:
                fits, got, lie = find_sum_lie(m, n, leaves[m], total, path)
                if fits and lie and got == bytes(root):
                    return m, path
    return None
