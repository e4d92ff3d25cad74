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

/**
 * A result tree whose parents may record false sums: `lies` maps a subtree "lo:hi" (leaf
 * positions [lo, hi)) to the sum its parent records for it, and "root" to the tokensUsed
 * submitted. Every hash is computed honestly over what the parents record, so receipts outside
 * a lying subtree still prove (`proof(m)`), while `path(m)` gives the SumStep path
 * (Arbitration.proveSumFault) from leaf m: each node's recorded sum and its recorded sibling.
 */
class LyingSumTree {
  constructor(leaves, lies = {}) {
    this.leaves = leaves.map((l) => ({ hash: l.hash, sum: BigInt(l.sum) }));
    this.lies = lies;
    this.nodes = new Map(); // "lo:hi" -> {hash, sum: as its parent records it}
    const top = this._build(0, this.leaves.length);
    this.root = top.hash;
    this.total = lies.root !== undefined ? BigInt(lies.root) : top.below;
  }
  _build(lo, hi) {
    let node;
    if (hi - lo === 1) {
      node = { ...this.leaves[lo], below: this.leaves[lo].sum };
    } else {
      const k = split(hi - lo);
      const l = this._build(lo, lo + k);
      const r = this._build(lo + k, hi);
      node = { hash: nodeHash(l, r), below: l.sum + r.sum };
      node.sum = node.below;
    }
    const key = `${lo}:${hi}`;
    if (this.lies[key] !== undefined) node.sum = BigInt(this.lies[key]);
    this.nodes.set(key, node);
    return node;
  }
  /** [{lo, hi, sibling: [lo, hi]}] from leaf m up to the root's children. */
  _ranges(m) {
    const out = [];
    let lo = 0;
    let hi = this.leaves.length;
    while (hi - lo > 1) {
      const k = split(hi - lo);
      if (m < lo + k) {
        out.push({ key: `${lo}:${lo + k}`, sib: `${lo + k}:${hi}` });
        hi = lo + k;
      } else {
        out.push({ key: `${lo + k}:${hi}`, sib: `${lo}:${lo + k}` });
        lo = lo + k;
      }
    }
    return out.reverse();
  }
  /** Ordinary proof of leaf m: siblings {hash, sum} as their parents record them. */
  proof(m) {
    return this._ranges(m).map(({ sib }) => ({ hash: this.nodes.get(sib).hash, sum: this.nodes.get(sib).sum }));
  }
  /** SumStep path of leaf m: [{sum, sibling, siblingSum}] from the leaf up. */
  path(m) {
    return this._ranges(m).map(({ key, sib }) => ({
      sum: this.nodes.get(key).sum, sibling: this.nodes.get(sib).hash, siblingSum: this.nodes.get(sib).sum,
    }));
  }
}

/** ResultTree.findSumLie in JavaScript: {ok, root, lie}. */
function findSumLie(position, size, leaf, total, path) {
  if (position >= size) return { ok: false };
  let fn = BigInt(position);
  let sn = BigInt(size - 1);
  let root = leaf.hash;
  let below = BigInt(leaf.sum);
  let lie = false;
  for (const p of path) {
    if (sn === 0n) return { ok: false };
    const sum = BigInt(p.sum);
    if (sum !== below) lie = true;
    if ((fn & 1n) === 1n || fn === sn) {
      root = nodeHash({ hash: p.sibling, sum: p.siblingSum }, { hash: root, sum });
      if ((fn & 1n) === 0n) {
        while ((fn & 1n) === 0n && fn !== 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      root = nodeHash({ hash: root, sum }, { hash: p.sibling, sum: p.siblingSum });
    }
    below = sum + BigInt(p.siblingSum);
    fn >>= 1n;
    sn >>= 1n;
  }
  if (below !== BigInt(total)) lie = true;
  return { ok: sn === 0n, root, lie };
}

module.exports = { leafHash, nodeHash, rootOf, proofOf, processProof, SumTree, LyingSumTree, findSumLie };
