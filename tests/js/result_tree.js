// Cross-check for market/protocol/merkle.py's result (sum) tree against the JavaScript one the
// Hardhat tests use (contracts/test/resultTree.js).
// stdin:  {"cases": [{"leaves": [{"index": "0", "structHash": "0x..", "tokens": "12"}, ...]}, ...]}
// stdout: {"cases": [{"root": "0x..", "total": "..", "leafHashes": [..], "proofs": [[{"hash", "sum"}, ...], ...]}]}
// A case with "lies" ({"lo:hi": "sum", "root": "tokensUsed"}) also gets "lying": the LyingSumTree's
// root, total, proofs and SumStep paths ([{"sum", "sibling", "siblingSum"}, ...] per leaf), and
// "findSumLie": what ResultTree.findSumLie says of each leaf's path ({ok, root, lie}).
const path = require("path");
const { leafHash, SumTree, LyingSumTree, findSumLie } = require(path.join(__dirname, "..", "..", "contracts", "test", "resultTree.js"));

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const { cases } = JSON.parse(input);
  const out = cases.map(({ leaves, lies }) => {
    const nodes = leaves.map((l) => ({ hash: leafHash(BigInt(l.index), l.structHash), sum: BigInt(l.tokens) }));
    const tree = new SumTree(nodes);
    const proofs = nodes.map((_, i) => tree.proof(i).map((p) => ({ hash: p.hash, sum: p.sum.toString() })));
    const res = { root: tree.root, total: tree.total.toString(), leafHashes: nodes.map((n) => n.hash), proofs };
    if (lies) {
      const lt = new LyingSumTree(nodes, Object.fromEntries(Object.entries(lies).map(([k, v]) => [k, BigInt(v)])));
      const str = (p) => ({ sum: p.sum.toString(), sibling: p.sibling, siblingSum: p.siblingSum.toString() });
      res.lying = {
        root: lt.root,
        total: lt.total.toString(),
        proofs: nodes.map((_, i) => lt.proof(i).map((p) => ({ hash: p.hash, sum: p.sum.toString() }))),
        paths: nodes.map((_, i) => lt.path(i).map(str)),
        findSumLie: nodes.map((n, i) => findSumLie(i, nodes.length, n, lt.total, lt.path(i))),
      };
    }
    return res;
  });
  process.stdout.write(JSON.stringify({ cases: out }));
});
