// Cross-check for market/protocol/canonical.py: RFC 8785-style canonical JSON in JavaScript.
// stdin: a JSON array of values; stdout: a JSON array of their canonical texts.
function canonical(v) {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
  const keys = Object.keys(v).sort(); // UTF-16 code-unit order, as RFC 8785 says
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonical(v[k])).join(",") + "}";
}

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  process.stdout.write(JSON.stringify(JSON.parse(input).map(canonical)));
});
