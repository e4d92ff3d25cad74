"""The off-chain protocol: bytes that Python and the contracts must agree on.

- `canonical`: canonical JSON, `request_hash`, `json_hash` (modelId), `keccak`;
- `requests`: OpenAI-Batch request lines (validation, JSONL), `output_hash`;
- `merkle`: OpenZeppelin StandardMerkleTree (input tree), the result sum tree;
- `eip712`: Receipt, Vote, Report, ChallengeSet: struct hashes, signing, recovery.

Importing this package pulls in eth-account but not web3.
"""

from market.protocol.canonical import (
    canonical_json,
    canonical_json_bytes,
    json_hash,
    keccak,
    request_hash,
)
from market.protocol.eip712 import (
    ChallengeSet,
    Receipt,
    Report,
    Vote,
    domain,
    quorum_signatures,
    recover,
    sign,
    sign_all,
    sort_signatures,
    struct_hash,
    typed_digest,
)
from market.protocol.errors import (
    CanonicalJSONError,
    MerkleError,
    ProtocolError,
    RequestError,
    SignatureError,
)
from market.protocol.merkle import (
    ResultTree,
    StandardMerkleTree,
    SumNode,
    SumStep,
    input_tree,
    leaf_hash,
    receipt_leaf,
    receipts_tree,
    verify_proof,
    verify_sum_proof,
)
from market.protocol.requests import (
    ParsedRequest,
    SamplingParams,
    load_jsonl,
    output_hash,
    parse_jsonl,
    sampling_params,
    validate_request,
)

__all__ = [
    "CanonicalJSONError",
    "ChallengeSet",
    "MerkleError",
    "ParsedRequest",
    "ProtocolError",
    "Receipt",
    "Report",
    "RequestError",
    "ResultTree",
    "SamplingParams",
    "SignatureError",
    "StandardMerkleTree",
    "SumNode",
    "SumStep",
    "Vote",
    "canonical_json",
    "canonical_json_bytes",
    "domain",
    "input_tree",
    "json_hash",
    "keccak",
    "leaf_hash",
    "load_jsonl",
    "output_hash",
    "parse_jsonl",
    "quorum_signatures",
    "receipt_leaf",
    "receipts_tree",
    "recover",
    "request_hash",
    "sampling_params",
    "sign",
    "sign_all",
    "sort_signatures",
    "struct_hash",
    "typed_digest",
    "validate_request",
    "verify_proof",
    "verify_sum_proof",
]
