// Cross-check for market/protocol/eip712.py with ethers v6's TypedDataEncoder.
// stdin:  {"domain": {...}, "items": [{"type": "Receipt", "message": {...}, "signature": "0x.."}]}
// stdout: {"items": [{"structHash": "0x..", "digest": "0x..", "signer": "0x.."}]}
const { TypedDataEncoder, verifyTypedData } = require("ethers");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const { domain, types, items } = JSON.parse(input);
  const out = items.map(({ type, message, signature }) => {
    const t = { [type]: types[type] };
    return {
      typeString: TypedDataEncoder.from(t).encodeType(type),
      structHash: TypedDataEncoder.hashStruct(type, t, message),
      digest: TypedDataEncoder.hash(domain, t, message),
      signer: verifyTypedData(domain, t, message, signature),
    };
  });
  process.stdout.write(JSON.stringify({ items: out }));
});
