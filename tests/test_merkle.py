"""The input tree (StandardMerkleTree) against the npm @openzeppelin/merkle-tree library, and
the result sum tree against the JavaScript one the Hardhat tests use (whose proofs the contract
checks there): roots, sums and every proof."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.protocol import MerkleError, StandardMerkleTree, input_tree, keccak
from market.protocol.merkle import (
    INDEX_HASH_TYPES,
    ResultTree,
    SumNode,
    SumStep,
    find_sum_lie,
    leaf_hash,
    node_hash,
    process_proof,
    process_sum_proof,
    sum_lie_path,
    sum_node_hash,
    verify_sum_proof,
)

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


def _sum_leaves(n: int, seed: int, first_index: int = 0) -> list[tuple[int, bytes, int]]:
    """(request index, receipt struct hash, output tokens) for a shard of n requests."""
    rng = random.Random(seed)
    return [(first_index + i, rng.randbytes(32), rng.randrange(0, 4096)) for i in range(n)]


def _result_tree(leaves: list[tuple[int, bytes, int]]) -> ResultTree:
    return ResultTree([SumNode(leaf_hash(INDEX_HASH_TYPES, (i, h)), t) for i, h, t in leaves])


@pytest.mark.skipif(shutil.which("node") is None
                    or not (ROOT / "node_modules" / "ethers").exists(),
                    reason="node and ethers are needed for the cross-check")
def test_result_tree_roots_sums_and_proofs_match_the_javascript_tree() -> None:
    cases = [_sum_leaves(n, n, first_index=40 if n == 5 else 0)
             for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 100)]
    payload = {"cases": [{"leaves": [{"index": str(i), "structHash": "0x" + h.hex(),
                                      "tokens": str(t)} for i, h, t in leaves]}
                         for leaves in cases]}
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "js" / "result_tree.js")], input=json.dumps(payload),
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    for leaves, expected in zip(cases, json.loads(proc.stdout)["cases"], strict=True):
        tree = _result_tree(leaves)
        assert "0x" + tree.root.hex() == expected["root"]
        assert str(tree.total) == expected["total"] == str(sum(t for _, _, t in leaves))
        assert ["0x" + n.hash.hex() for n in tree.leaves] == expected["leafHashes"]
        for i in range(len(tree)):
            assert [n.to_json() for n in tree.proof(i)] == [
                {"hash": p["hash"], "sum": int(p["sum"])} for p in expected["proofs"][i]]


def test_result_tree_by_hand() -> None:
    """Three leaves: the left subtree holds two (the largest power of two below three)."""
    a, b, c = (SumNode(keccak(bytes([i])), 10 * (i + 1)) for i in range(3))
    ab = SumNode(sum_node_hash(a, b), 30)
    tree = ResultTree([a, b, c])
    assert (tree.root, tree.total) == (sum_node_hash(ab, c), 60)
    assert tree.proof(0) == [b, c] and tree.proof(2) == [ab]
    assert ResultTree([a]).root == a.hash and ResultTree([a]).proof(0) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.integers(0, 2**32)),
                min_size=1, max_size=40, unique_by=lambda v: v[0]))
def test_every_sum_proof_verifies_and_tampering_fails(values: list[tuple[bytes, int]]) -> None:
    """Leaves are distinct, as real ones are (each hashes its request index). The size is
    not tested: a path can be the same in trees of two sizes, and the contract takes the size
    from the shard, never from the prover."""
    leaves = [SumNode(h, t) for h, t in values]
    tree = ResultTree(leaves)
    n = len(leaves)
    assert tree.total == sum(t for _, t in values)
    for i, leaf in enumerate(leaves):
        proof = tree.proof(i)
        assert verify_sum_proof(tree.root, tree.total, i, n, leaf, proof)
        assert process_sum_proof(i, n, leaf, proof) == SumNode(tree.root, tree.total)
        # a billed total that is not the leaves' sum proves nothing
        assert not verify_sum_proof(tree.root, tree.total + 1, i, n, leaf, proof)
        assert not verify_sum_proof(tree.root, tree.total, i, n, SumNode(leaf.hash,
                                                                         leaf.sum + 1), proof)
        # another position or proof length fails
        if n > 1:
            assert not verify_sum_proof(tree.root, tree.total, (i + 1) % n, n, leaf, proof)
            assert not verify_sum_proof(tree.root, tree.total, i, n, leaf, proof[:-1])
        assert not verify_sum_proof(tree.root, tree.total, i, n, leaf,
                                    [*proof, SumNode(tree.root, 0)])


def test_sum_tree_bad_inputs() -> None:
    with pytest.raises(MerkleError, match="at least one leaf"):
        ResultTree([])
    with pytest.raises(MerkleError, match="uint64"):
        SumNode(b"\0" * 32, 2**64)
    with pytest.raises(MerkleError, match="32 bytes"):
        SumNode(b"short", 1)
    with pytest.raises(MerkleError, match="out of range"):
        ResultTree([SumNode(b"\0" * 32, 1)]).proof(1)
    with pytest.raises(MerkleError, match="malformed"):
        SumNode.from_json({"hash": "00" * 32, "sum": 1})
    assert process_sum_proof(3, 3, SumNode(b"\0" * 32, 1), []) is None


# ---------------------------------------------------------------------------- billing lies


def _random_lies(n: int, rng: random.Random, total: int) -> dict[str, int]:
    """One parent records a false sum for one subtree (up or down), or the root's total lies."""
    from conftest import subtree_spans

    keys = [f"{lo}:{hi}" for lo, hi in subtree_spans(n) if (lo, hi) != (0, n)]
    if not keys or rng.random() < 0.2:
        return {"root": total + rng.randrange(1, 50)}
    return {rng.choice(keys): rng.randrange(0, 10_000)}


def _lied_under(lies: dict[str, int], leaves: list[SumNode], n: int, m: int) -> bool:
    """Whether leaf m's path crosses a recorded sum that differs from the truth."""
    if "root" in lies:
        return True
    [(key, value)] = lies.items()
    lo, hi = map(int, key.split(":"))
    return lo <= m < hi and value != sum(x.sum for x in leaves[lo:hi])


@pytest.mark.skipif(shutil.which("node") is None
                    or not (ROOT / "node_modules" / "ethers").exists(),
                    reason="node and ethers are needed for the cross-check")
def test_lying_trees_and_sum_lie_paths_match_the_javascript_twin() -> None:
    """The Hardhat tests' LyingSumTree and findSumLie against conftest's lying tree and
    `find_sum_lie` / `sum_lie_path`: the path the client finds from a document's proofs is
    the one the contract is shown in the Hardhat tests."""
    from conftest import lying_result_tree

    rng = random.Random(29)
    cases = []
    for n in (1, 2, 3, 4, 5, 7, 8, 13, 17, 40):
        leaves = _sum_leaves(n, n)
        lies = _random_lies(n, rng, sum(t for _, _, t in leaves))
        cases.append((leaves, lies))
    payload = {"cases": [{"leaves": [{"index": str(i), "structHash": "0x" + h.hex(),
                                      "tokens": str(t)} for i, h, t in leaves],
                          "lies": {k: str(v) for k, v in lies.items()}}
                         for leaves, lies in cases]}
    proc = subprocess.run(
        ["node", str(ROOT / "tests" / "js" / "result_tree.js")], input=json.dumps(payload),
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )
    for (leaves, lies), expected in zip(cases, json.loads(proc.stdout)["cases"], strict=True):
        nodes = _result_tree(leaves).leaves
        n = len(nodes)
        root, total, proofs, paths = lying_result_tree(nodes, lies)
        js = expected["lying"]
        assert [[{"sum": str(p.sum), "sibling": "0x" + p.sibling.hex(),
                  "siblingSum": str(p.sibling_sum)} for p in path] for path in paths] \
            == js["paths"]
        assert ("0x" + root.hex(), str(total)) == (js["root"], js["total"])
        assert [[p.to_json() for p in proof] for proof in proofs] == [
            [{"hash": p["hash"], "sum": int(p["sum"])} for p in proof] for proof in js["proofs"]]
        lied = [m for m in range(n) if _lied_under(lies, nodes, n, m)]
        for m in range(n):
            # a receipt proves exactly when no sum on its path lies
            assert verify_sum_proof(root, total, m, n, nodes[m], proofs[m]) == (m not in lied)
            assert js["findSumLie"][m] == {"ok": True, "root": js["root"], "lie": m in lied}
        found = sum_lie_path(nodes, dict(enumerate(proofs)), root, total,
                             prefer=lied[-1:])
        if not lied:
            assert found is None  # a "lie" that records the true sum is none
            continue
        assert found is not None
        m, path = found
        assert m == lied[-1]
        assert [{"sum": str(p.sum), "sibling": "0x" + p.sibling.hex(),
                 "siblingSum": str(p.sibling_sum)} for p in path] == js["paths"][m]
        assert find_sum_lie(m, n, nodes[m], total, path) == (True, root, True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**32), min_size=1, max_size=40), st.randoms())
def test_sum_lie_path_finds_every_lie_and_never_an_honest_tree(
        sums: list[int], rnd: random.Random) -> None:
    """Honest trees: every path is consistent and no lie is found, from the proofs or
    without them. A lying one: found from the proofs (or, for a false total, from the
    receipts alone), on a leaf under the lie, and tampering with the path's sums breaks its
    hash chain."""
    from conftest import lying_result_tree

    nodes = [SumNode(keccak(i.to_bytes(4, "big")), t) for i, t in enumerate(sums)]
    n = len(nodes)
    tree = ResultTree(nodes)
    proofs = {m: tree.proof(m) for m in range(n)}
    assert sum_lie_path(nodes, proofs, tree.root, tree.total) is None
    assert sum_lie_path(nodes, {}, tree.root, tree.total) is None
    lies = _random_lies(n, rnd, tree.total)
    root, total, lying, _ = lying_result_tree(nodes, lies)
    found = sum_lie_path(nodes, dict(enumerate(lying)), root, total)
    if not any(_lied_under(lies, nodes, n, m) for m in range(n)):
        assert found is None
        return
    assert found is not None
    m, path = found
    assert _lied_under(lies, nodes, n, m)
    assert find_sum_lie(m, n, nodes[m], total, path) == (True, root, True)
    for j, step in enumerate(path):
        forged = [*path[:j], SumStep(step.sum + 1, step.sibling, step.sibling_sum), *path[j + 1:]]
        assert find_sum_lie(m, n, nodes[m], total, forged)[1] != root
    assert not find_sum_lie(m, n, nodes[m], total, path[:-1])[0] or n == 1
