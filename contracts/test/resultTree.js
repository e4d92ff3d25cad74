// The shard result tree (contracts/lib/QuarryTypes.sol, library ResultTree) in JavaScript: a
// Merkle sum tree over receipts in index order, RFC 9162 shape, whose root carries the shard's
// total output tokens. Used by the Hardhat tests and by tests/js/result_tree.js, which
// cross-checks market/protocol/merkle.py.
const { ethers } = require("ethers");

const coder = ethers.AbiCoder.defaultAbiCoder();

/** keccak256(bytes.concat(keccak256(abi.encode(uint256 index, bytes32 structHash)))) */
function leafHash(index, structHash) {
  return ethers.keccak256(ethers.keccak256(coder.encode(["uint256", "bytes32"], [index, structHash])));
}

/** keccak256(abi.encode(left.hash, left.sum, right.hash, right.sum)) */
function nodeHash(l, r) {
  return ethers.keccak256(coder.encode(["bytes32", "uint256", "bytes32", "uint256"], [l.hash, l.sum, r.hash, r.sum]));
}

/** The largest power of two strictly below n (n >= 2). */
function split(n) {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

/** Root node {hash, sum} of leaves [{hash, sum}]. */
function rootOf(leaves) {
  if (leaves.length === 1) return leaves[0];
  const k = split(leaves.length);
  const l = rootOf(leaves.slice(0, k));
  const r = rootOf(leaves.slice(k));
  return { hash: nodeHash(l, r), sum: l.sum + r.sum };
}

/** Proof of leaf m, from the leaf up: sibling nodes {hash, sum}. */
function proofOf(leaves, m) {
  if (leaves.length === 1) return [];
  const k = split(leaves.length);
  if (m < k) return [...proofOf(leaves.slice(0, k), m), rootOf(leaves.slice(k))];
  return [...proofOf(leaves.slice(k), m - k), rootOf(leaves.slice(0, k))];
}

/** RFC 9162 verification with sums; returns {ok, hash, sum}. */
function processProof(position, size, leaf, proof) {
  if (position >= size) return { ok: false };
  let fn = BigInt(position);
  let sn = BigInt(size - 1);
  let node = { hash: leaf.hash, sum: BigInt(leaf.sum) };
  for (const p of proof) {
    if (sn === 0n) return { ok: false };
    const sib = { hash: p.hash, sum: BigInt(p.sum) };
    if ((fn & 1n) === 1n || fn === sn) {
      node = { hash: nodeHash(sib, node), sum: sib.sum + node.sum };
      if ((fn & 1n) === 0n) {
        while ((fn & 1n) === 0n && fn !== 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      node = { hash: nodeHash(node, sib), sum: node.sum + sib.sum };
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return { ok: sn === 0n, hash: node.hash, sum: node.sum };
}

/** A result tree over leaves [{hash, sum}] in position order. */
class SumTree {
  constructor(leaves) {
    if (leaves.length === 0) throw new Error("a result tree needs at least one leaf");
    this.leaves = leaves.map((l) => ({ hash: l.hash, sum: BigInt(l.sum) }));
    const r = rootOf(this.leaves);
    this.root = r.hash;
    this.total = r.sum;
  }
  proof(m) {
    return proofOf(this.leaves, m);
  }
}

module.exports = { leafHash, nodeHash, rootOf, proofOf, processProof, SumTree };
