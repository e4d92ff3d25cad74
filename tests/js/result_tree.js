// Cross-check for market/protocol/merkle.py's result (sum) tree against the JavaScript one the
// Hardhat tests use (contracts/test/resultTree.js).
// stdin:  {"cases": [{"leaves": [{"index": "0", "structHash": "0x..", "tokens": "12"}, ...]}, ...]}
// stdout: {"cases": [{"root": "0x..", "total": "..", "leafHashes": [..], "proofs": [[{"hash", "sum"}, ...], ...]}]}
const path = require("path");
const { leafHash, SumTree } = require(path.join(__dirname, "..", "..", "contracts", "test", "resultTree.js"));

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const { cases } = JSON.parse(input);
  const out = cases.map(({ leaves }) => {
    const nodes = leaves.map((l) => ({ hash: leafHash(BigInt(l.index), l.structHash), sum: BigInt(l.tokens) }));
    const tree = new SumTree(nodes);
    const proofs = nodes.map((_, i) => tree.proof(i).map((p) => ({ hash: p.hash, sum: p.sum.toString() })));
    return { root: tree.root, total: tree.total.toString(), leafHashes: nodes.map((n) => n.hash), proofs };
  });
  process.stdout.write(JSON.stringify({ cases: out }));
});
