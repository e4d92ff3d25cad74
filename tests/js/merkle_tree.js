// Cross-check for market/protocol/merkle.py: builds @openzeppelin/merkle-tree StandardMerkleTrees.
// stdin:  {"cases": [{"types": ["uint256","bytes32"], "values": [["0","0x.."], ...]}, ...]}
// stdout: {"cases": [{"root": "0x..", "proofs": [["0x..", ...], ...], "tree": [...]}, ...]}
const { StandardMerkleTree } = require("@openzeppelin/merkle-tree");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const { cases } = JSON.parse(input);
  const out = cases.map(({ types, values }) => {
    const tree = StandardMerkleTree.of(values, types);
    const proofs = values.map((_, i) => tree.getProof(i));
    return { root: tree.root, proofs, tree: tree.dump().tree };
  });
  process.stdout.write(JSON.stringify({ cases: out }));
});
