// Cross-check for market/protocol/requests.py output_hash with ethers v6, which packs arrays
// the way Solidity's abi.encodePacked does (each element padded to 32 bytes).
// stdin: [{"text": "...", "ids": [..]}]; stdout: ["0x..", ...]
const { AbiCoder, keccak256, solidityPackedKeccak256, toUtf8Bytes } = require("ethers");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map(({ text, ids }) => {
    const textHash = keccak256(toUtf8Bytes(text));
    const idsHash = solidityPackedKeccak256(["uint32[]"], [ids]);
    return keccak256(AbiCoder.defaultAbiCoder().encode(["bytes32", "bytes32"], [textHash, idsHash]));
  });
  process.stdout.write(JSON.stringify(out));
});
