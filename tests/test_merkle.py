"""StandardMerkleTree against the npm @openzeppelin/merkle-tree library, root and every proof."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.protocol import MerkleError, StandardMerkleTree, input_tree, keccak, result_tree
from market.protocol.merkle import INDEX_HASH_TYPES, leaf_hash, node_hash, process_proof

ROOT = Path(__file__).resolve().parent.parent
needs_node = pytest.mark.skipif(
    shutil.which("node") is None
    or not (ROOT / "node_modules" / "@openzeppelin" / "merkle-tree").exists(),
    reason="node and @openzeppelin/merkle-tree are needed for the cross-check",
)
SIZES = (1, 2, 3, 7, 100)


def hashes(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


@needs_node
def test_roots_and_every_proof_match_openzeppelin_js() -> None:
    trees = [input_tree(hashes(n, n)) for n in SIZES]
    trees.append(result_tree(hashes(5, 99), first_index=40))  # a shard that starts at 40
    other_types = ("address", "uint32", "bool")
    other_values = [("0x" + f"{i:040x}", i * 7, i % 2 == 0) for i in range(1, 6)]
    trees.append(StandardMerkleTree(other_values, other_types))
    payload = {
        "cases": [
            {"types": list(t.types),
             "values": [[str(x) if isinstance(x, int) and not isinstance(x, bool)
                         else ("0x" + x.hex() if isinstance(x, bytes) else x) for x in v]
                        for v in t.values]}
            for t in trees
        ]
    }
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "js" / "merkle_tree.js")], input=json.dumps(payload),
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    js = json.loads(proc.stdout)["cases"]
    for tree, expected in zip(trees, js, strict=True):
        assert "0x" + tree.root.hex() == expected["root"]
        assert tree.dump()["tree"] == expected["tree"]
        for i in range(len(tree)):
            assert ["0x" + p.hex() for p in tree.proof(i)] == expected["proofs"][i]


def test_hand_built_two_and_three_leaf_trees() -> None:
    h = hashes(3, 1)
    leaves = [keccak(keccak(i.to_bytes(32, "big") + x)) for i, x in enumerate(h)]
    assert input_tree(h[:1]).root == leaves[0]
    assert input_tree(h[:2]).root == keccak(min(leaves[:2]) + max(leaves[:2]))
    s = sorted(leaves)  # layout: [root, n1, s2, s1, s0]; n1 = hash(s1, s0)
    assert input_tree(h).root == node_hash(node_hash(s[1], s[0]), s[2])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=40))
def test_every_proof_verifies_and_tampering_fails(values: list[bytes]) -> None:
    tree = input_tree(values)
    for i, v in enumerate(values):
        proof = tree.proof(i)
        assert tree.verify((i, v), proof)
        assert StandardMerkleTree.verify_value(tree.root, INDEX_HASH_TYPES, (i, v), proof)
        assert process_proof(tree.leaf(i), proof) == tree.root
        assert not tree.verify((i + 1, v), proof)
        flipped = bytes([v[0] ^ 1]) + v[1:]
        assert not tree.verify((i, flipped), proof)


def test_bad_inputs() -> None:
    with pytest.raises(MerkleError, match="at least one leaf"):
        input_tree([])
    tree = input_tree(hashes(3, 2))
    with pytest.raises(MerkleError, match="out of range"):
        tree.proof(3)
    with pytest.raises(MerkleError, match="not 32 bytes"):
        input_tree([b"short"])
    with pytest.raises(MerkleError, match="uint256"):
        leaf_hash(INDEX_HASH_TYPES, (-1, b"\0" * 32))
    with pytest.raises(MerkleError, match="does not fit"):
        leaf_hash(("uint8",), (300,))
    with pytest.raises(MerkleError, match="2 types"):
        leaf_hash(INDEX_HASH_TYPES, (1,))
