"""EIP-712 messages: the one place Python spells Quarry's typed-data structs.

Every struct is signed under the domain `{name: "Quarry", version: "1", chainId,
verifyingContract}` of the contract that checks it: Receipt -> TaskRegistry (Arbitration
checks receipts against TaskRegistry's domain), Vote -> Arbitration, Report and
ChallengeSet -> VerifierCommittee, SwarmConsent -> GPURegistry. Signatures are 65 bytes
`r ++ s ++ v` with v in {27, 28} and s in the lower half of the curve order, exactly what
OpenZeppelin's `ECDSA.recover` accepts: `recover` refuses the rest, so a signature Python
accepts is never one a contract rejects.

Receipts are the hot path (a miner signs one per output, a client recovers one per output),
so static structs are ABI-encoded here and signing and recovery call libsecp256k1
(coincurve) on the digest directly: eth-abi and eth-account's wrappers cost several times
the hashing and curve operations themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, ClassVar

import coincurve
from eth_account import Account
from eth_account.messages import SignableMessage, encode_typed_data
from eth_utils import is_address, to_checksum_address

from market.protocol.canonical import keccak
from market.protocol.errors import SignatureError

__all__ = [
    "DOMAIN_NAME",
    "DOMAIN_VERSION",
    "TYPES",
    "TYPE_STRINGS",
    "TYPEHASHES",
    "Receipt",
    "Vote",
    "Report",
    "ChallengeSet",
    "SwarmConsent",
    "domain",
    "domain_separator",
    "struct_hash",
    "typed_digest",
    "sign",
    "recover",
    "sign_digest",
    "recover_digest",
    "sign_all",
    "quorum_signatures",
    "sort_signatures",
]

DOMAIN_NAME = "Quarry"
DOMAIN_VERSION = "1"

_DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]

TYPES: dict[str, list[dict[str, str]]] = {
    "Receipt": [
        {"name": "taskId", "type": "uint256"},
        {"name": "shard", "type": "uint32"},
        {"name": "index", "type": "uint32"},
        {"name": "requestHash", "type": "bytes32"},
        {"name": "outputHash", "type": "bytes32"},
        {"name": "outputTokens", "type": "uint32"},
        {"name": "modelId", "type": "bytes32"},
        {"name": "commitment", "type": "bytes32"},
    ],
    "Vote": [
        {"name": "disputeId", "type": "uint256"},
        {"name": "minerAtFault", "type": "bool"},
    ],
    "Report": [
        {"name": "epoch", "type": "uint256"},
        {"name": "miners", "type": "address[]"},
        {"name": "scoresBps", "type": "uint16[]"},
        {"name": "evidenceRoot", "type": "bytes32"},
    ],
    "ChallengeSet": [
        {"name": "epoch", "type": "uint256"},
        {"name": "challengeSetHash", "type": "bytes32"},
    ],
    "SwarmConsent": [
        {"name": "modelId", "type": "bytes32"},
        {"name": "head", "type": "address"},
        {"name": "members", "type": "address[]"},
        {"name": "shares", "type": "uint32[]"},
        {"name": "pricePerToken", "type": "uint256"},
        {"name": "nonce", "type": "uint256"},
        {"name": "deadline", "type": "uint64"},
    ],
}

# "Receipt(uint256 taskId,...)": what Solidity's *_TYPEHASH constants must hash.
TYPE_STRINGS: dict[str, str] = {
    name: f"{name}({','.join(f['type'] + ' ' + f['name'] for f in fields)})"
    for name, fields in TYPES.items()
}
TYPEHASHES: dict[str, bytes] = {name: keccak(s.encode()) for name, s in TYPE_STRINGS.items()}


class _Struct:
    """A typed-data struct: snake_case fields in the type's order, camelCase on the wire."""

    TYPE: ClassVar[str]

    def message(self) -> dict[str, Any]:
        """The EIP-712 message (camelCase keys), as eth-account and ethers take it."""
        values = self._values()
        return {f["name"]: _wire(v) for f, v in zip(TYPES[self.TYPE], values, strict=True)}

    def _values(self) -> tuple[Any, ...]:
        # Not dataclasses.astuple: it deep-copies every field, a third of a receipt's hashing.
        return tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    def as_tuple(self) -> tuple[Any, ...]:
        """The ABI tuple, in field order, for passing the struct to a contract."""
        return tuple(_wire(v) for v in self._values())

    def struct_hash(self) -> bytes:
        """hashStruct, computed once (the structs are frozen): a receipt's is both its
        result-tree leaf and the input of the digest it signs."""
        cached: bytes | None = self.__dict__.get("_struct_hash")
        if cached is None:
            cached = struct_hash(self.TYPE, self.message())
            object.__setattr__(self, "_struct_hash", cached)
        return cached

    def digest(self, chain_id: int, verifying_contract: str) -> bytes:
        return _digest(self.struct_hash(), chain_id, verifying_contract)

    def sign(self, private_key: Any, chain_id: int, verifying_contract: str) -> bytes:
        return _signed(self.TYPE, self.digest(chain_id, verifying_contract), private_key)

    def recover(self, signature: bytes, chain_id: int, verifying_contract: str) -> str:
        return _recovered(self.TYPE, self.digest(chain_id, verifying_contract), signature)


def _wire(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Receipt(_Struct):
    """A miner's signed statement that `outputHash` answers request `index` of the task,
    computed with the activations `commitment` commits to (`commitments.commitment_hash` of
    the output's commitment bytes; zero when the engine made none)."""

    TYPE: ClassVar[str] = "Receipt"
    task_id: int
    shard: int
    index: int
    request_hash: bytes
    output_hash: bytes
    output_tokens: int
    model_id: bytes
    commitment: bytes = b"\x00" * 32

    @classmethod
    def from_message(cls, m: Mapping[str, Any]) -> Receipt:
        return cls(
            int(m["taskId"]), int(m["shard"]), int(m["index"]), _b32(m["requestHash"]),
            _b32(m["outputHash"]), int(m["outputTokens"]), _b32(m["modelId"]),
            _b32(m["commitment"]),
        )


@dataclass(frozen=True)
class Vote(_Struct):
    """A committee member's verdict on a dispute."""

    TYPE: ClassVar[str] = "Vote"
    dispute_id: int
    miner_at_fault: bool


@dataclass(frozen=True)
class Report(_Struct):
    """An epoch's reputation scores, co-signed by a committee quorum."""

    TYPE: ClassVar[str] = "Report"
    epoch: int
    miners: tuple[str, ...]
    scores_bps: tuple[int, ...]
    evidence_root: bytes

    def __post_init__(self) -> None:
        try:
            miners = tuple(to_checksum_address(m) for m in self.miners)
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"Report.miners: {exc}") from exc
        object.__setattr__(self, "miners", miners)
        object.__setattr__(self, "scores_bps", tuple(int(s) for s in self.scores_bps))
        if len(self.miners) != len(self.scores_bps):
            raise SignatureError(
                f"Report has {len(self.miners)} miners but {len(self.scores_bps)} scores"
            )


@dataclass(frozen=True)
class ChallengeSet(_Struct):
    """The hash of an epoch's challenge prompts, committed before they are sent."""

    TYPE: ClassVar[str] = "ChallengeSet"
    epoch: int
    challenge_set_hash: bytes


@dataclass(frozen=True)
class SwarmConsent(_Struct):
    """A miner's consent to a swarm's terms (GPURegistry.registerSwarm): the model, the head
    that claims and signs receipts for the group, the members (ascending addresses), each
    member's share (e.g. layers served), the least price per token, the signer's own consent
    nonce (GPURegistry.nonces) and a deadline. Every member signs the same terms with its own
    nonce; the contract uses the nonces, so a consent cannot be replayed."""

    TYPE: ClassVar[str] = "SwarmConsent"
    model_id: bytes
    head: str
    members: tuple[str, ...]
    shares: tuple[int, ...]
    price_per_token: int
    nonce: int
    deadline: int

    def __post_init__(self) -> None:
        try:
            members = tuple(to_checksum_address(m) for m in self.members)
            head = to_checksum_address(self.head)
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"SwarmConsent: {exc}") from exc
        shares = tuple(int(x) for x in self.shares)
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "shares", shares)
        object.__setattr__(self, "model_id", _b32(self.model_id))
        if len(members) != len(shares):
            raise SignatureError(
                f"SwarmConsent has {len(members)} members but {len(shares)} shares")
        if any(int(a, 16) >= int(b, 16) for a, b in zip(members, members[1:], strict=False)):
            raise SignatureError("SwarmConsent.members must be strictly ascending by address")
        if any(x <= 0 for x in shares):
            raise SignatureError(f"SwarmConsent.shares must all be positive, got {list(shares)}")
        if head not in members:
            raise SignatureError(f"SwarmConsent.head {head} is not one of the members")

    @classmethod
    def for_plan(cls, model_id: bytes, head: str, shares: Mapping[str, int], price_per_token: int,
                 deadline: int, nonce: int = 0) -> SwarmConsent:
        """The consent for a plan given as {member address: share}, members put in the
        ascending order the contract requires."""
        order = sorted(shares, key=lambda a: int(a, 16))
        return cls(model_id, head, tuple(order), tuple(shares[a] for a in order),
                   price_per_token, nonce, deadline)

    def with_nonce(self, nonce: int) -> SwarmConsent:
        """The same terms at another member's nonce (each member signs its own)."""
        return replace(self, nonce=nonce)

    def terms(self) -> tuple[Any, ...]:
        """The `SwarmTerms` ABI tuple registerSwarm takes (everything but the nonce)."""
        return (self.model_id, self.head, list(self.members), list(self.shares),
                self.price_per_token, self.deadline)


def _b32(value: Any) -> bytes:
    if isinstance(value, str):
        value = bytes.fromhex(value.removeprefix("0x"))
    value = bytes(value)
    if len(value) != 32:
        raise SignatureError(f"expected 32 bytes, got {len(value)}")
    return value


def domain(chain_id: int, verifying_contract: str) -> dict[str, Any]:
    """Quarry's EIP-712 domain for the contract at `verifying_contract` on `chain_id`."""
    if not isinstance(chain_id, int) or isinstance(chain_id, bool) or chain_id <= 0:
        raise SignatureError(f"chainId must be a positive integer, got {chain_id!r}")
    if not isinstance(verifying_contract, str) or not is_address(verifying_contract):
        raise SignatureError(f"verifyingContract {verifying_contract!r} is not an address")
    return {
        "name": DOMAIN_NAME,
        "version": DOMAIN_VERSION,
        "chainId": chain_id,
        "verifyingContract": to_checksum_address(verifying_contract),
    }


def _signable(
    primary_type: str, message: Mapping[str, Any], chain_id: int, verifying_contract: str
) -> SignableMessage:
    if primary_type not in TYPES:
        raise SignatureError(f"unknown struct {primary_type!r} (known: {', '.join(TYPES)})")
    expected = [f["name"] for f in TYPES[primary_type]]
    if sorted(message) != sorted(expected):
        raise SignatureError(
            f"{primary_type} needs fields {expected}, got {sorted(message)}"
        )
    try:
        return encode_typed_data(
            full_message={
                "types": {"EIP712Domain": _DOMAIN_FIELDS, primary_type: TYPES[primary_type]},
                "primaryType": primary_type,
                "domain": domain(chain_id, verifying_contract),
                "message": dict(message),
            }
        )
    except SignatureError:
        raise
    except Exception as exc:  # eth-account raises several types for values that do not fit
        raise SignatureError(f"cannot encode {primary_type}: {exc}") from exc


@lru_cache(maxsize=256)
def domain_separator(chain_id: int, verifying_contract: str) -> bytes:
    """The domain separator (what OpenZeppelin's `_domainSeparatorV4()` returns)."""
    return bytes(
        _signable("ChallengeSet", {"epoch": 0, "challengeSetHash": b"\0" * 32}, chain_id,
                  verifying_contract).header
    )


_STATIC = ("uint", "bytes32", "bool", "address")


def _static_fields(primary_type: str) -> list[str] | None:
    """The field types when every one is a static ABI type (hashStruct is then one
    `abi.encode`), else None (arrays: left to eth-account's general encoder)."""
    types = [f["type"] for f in TYPES.get(primary_type, [])]
    if types and all(t.startswith(_STATIC) and not t.endswith("]") for t in types):
        return types
    return None


def _word(abi_type: str, value: Any) -> bytes:
    """One static value as its 32-byte ABI word, range-checked as eth-abi would."""
    if abi_type == "bytes32":
        return _b32(value)
    if abi_type == "bool":
        if not isinstance(value, bool):
            raise SignatureError(f"a bool is needed, got {value!r}")
        return int(value).to_bytes(32, "big")
    if abi_type == "address":
        if not isinstance(value, str) or not is_address(value):
            raise SignatureError(f"{value!r} is not an address")
        return bytes(12) + bytes.fromhex(value[2:])
    bits = int(abi_type[4:] or 256)  # uintN
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise SignatureError(f"{value!r} does not fit {abi_type}")
    return value.to_bytes(32, "big")


def struct_hash(primary_type: str, message: Mapping[str, Any]) -> bytes:
    """hashStruct(message): the receipt's result-tree leaf value and `_hashTypedDataV4` input.

    Structs of static fields (Receipt, Vote, ChallengeSet: one per output or vote, so this is
    the hot path) hash as `keccak256(typeHash ++ abi.encode(fields))` directly; the others
    go through eth-account with a placeholder domain (the struct hash ignores the domain).
    """
    static = _static_fields(primary_type)
    if static is None:
        return bytes(_signable(primary_type, message, 1, "0x" + "00" * 20).body)
    expected = [f["name"] for f in TYPES[primary_type]]
    if sorted(message) != sorted(expected):
        raise SignatureError(f"{primary_type} needs fields {expected}, got {sorted(message)}")
    try:
        words = b"".join(_word(t, message[n]) for n, t in zip(expected, static, strict=True))
    except SignatureError as exc:
        raise SignatureError(f"cannot encode {primary_type}: {exc}") from exc
    return keccak(TYPEHASHES[primary_type] + words)


def typed_digest(
    primary_type: str, message: Mapping[str, Any], chain_id: int, verifying_contract: str
) -> bytes:
    """keccak256("\\x19\\x01" ++ domainSeparator ++ hashStruct): the hash that is signed."""
    if primary_type not in TYPES:
        raise SignatureError(f"unknown struct {primary_type!r} (known: {', '.join(TYPES)})")
    return _digest(struct_hash(primary_type, message), chain_id, verifying_contract)


def _digest(struct_hash: bytes, chain_id: int, verifying_contract: str) -> bytes:
    if isinstance(chain_id, bool):  # True == 1 would hit chain 1's cached separator
        raise SignatureError(f"chainId must be a positive integer, got {chain_id!r}")
    return keccak(b"\x19\x01" + domain_separator(chain_id, verifying_contract) + struct_hash)


_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _key_bytes(private_key: Any) -> bytes:
    """The 32 key bytes from what callers hold: bytes/HexBytes, a hex string, an eth-keys
    key, or an int."""
    if hasattr(private_key, "to_bytes") and not isinstance(private_key, int):
        private_key = private_key.to_bytes()
    if isinstance(private_key, str):
        text = private_key[2:] if private_key[:2].lower() == "0x" else private_key
        try:
            private_key = bytes.fromhex(text)
        except ValueError as exc:
            raise ValueError(f"not hex: {exc}") from None
    elif isinstance(private_key, int) and not isinstance(private_key, bool):
        if not 0 < private_key < _SECP256K1_N:
            raise ValueError("out of range")
        private_key = private_key.to_bytes(32, "big")
    if not isinstance(private_key, (bytes, bytearray, memoryview)):
        raise TypeError(f"a private key is 32 bytes, got {type(private_key).__name__}")
    if len(private_key) != 32:
        raise ValueError(f"a private key is 32 bytes, got {len(private_key)}")
    return bytes(private_key)


@lru_cache(maxsize=64)
def _signer(key: bytes) -> coincurve.PrivateKey:
    return coincurve.PrivateKey(key)  # raises ValueError for 0 or >= the curve order


def sign_digest(digest: bytes, private_key: Any) -> bytes:
    """The 65-byte `r ++ s ++ v` signature of a 32-byte digest (libsecp256k1 gives low s)."""
    try:
        sig = _signer(_key_bytes(private_key)).sign_recoverable(digest, hasher=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"bad private key ({exc})") from exc
    return sig[:64] + bytes([sig[64] + 27])


def recover_digest(digest: bytes, signature: bytes) -> str:
    """The checksummed address that signed `digest`, by OpenZeppelin's `ECDSA.recover` rules
    (v is 27 or 28, s at most half the curve order); SignatureError otherwise."""
    sig = bytes(signature)
    if len(sig) != 65:
        raise SignatureError(f"a signature is 65 bytes, got {len(sig)}")
    v, s = sig[64], int.from_bytes(sig[32:64], "big")
    if v not in (27, 28):
        raise SignatureError(f"signature v must be 27 or 28, got {v}")
    if not 0 < s <= _SECP256K1_N // 2:
        raise SignatureError("signature s is not in the lower half of the curve order")
    try:
        public = coincurve.PublicKey.from_signature_and_message(
            sig[:64] + bytes([v - 27]), digest, hasher=None)
    except Exception as exc:  # coincurve raises ValueError/Exception for r or s off the curve
        raise SignatureError(f"signature does not recover: {exc}") from exc
    return _checksummed(keccak(public.format(compressed=False)[1:])[-20:])


def _checksummed(address: bytes) -> str:
    """EIP-55 spelling of a 20-byte address (eth-utils' costs more than the recovery)."""
    text = address.hex()
    nibbles = keccak(text.encode()).hex()
    return "0x" + "".join(c.upper() if n in "89abcdef" else c
                          for c, n in zip(text, nibbles, strict=False))


def sign(
    primary_type: str,
    message: Mapping[str, Any],
    private_key: Any,
    chain_id: int,
    verifying_contract: str,
) -> bytes:
    """Sign a typed-data struct; returns the 65-byte signature."""
    return _signed(primary_type, typed_digest(primary_type, message, chain_id,
                                              verifying_contract), private_key)


def _signed(primary_type: str, digest: bytes, private_key: Any) -> bytes:
    try:
        return sign_digest(digest, private_key)
    except SignatureError as exc:
        raise SignatureError(f"cannot sign {primary_type}: {exc}") from exc


def recover(
    primary_type: str,
    message: Mapping[str, Any],
    signature: bytes,
    chain_id: int,
    verifying_contract: str,
) -> str:
    """The checksummed address that signed `message` under the given domain."""
    return _recovered(primary_type, typed_digest(primary_type, message, chain_id,
                                                 verifying_contract), signature)


def _recovered(primary_type: str, digest: bytes, signature: bytes) -> str:
    try:
        return recover_digest(digest, signature)
    except SignatureError as exc:
        raise SignatureError(f"invalid {primary_type} signature: {exc}") from exc


def sign_all(
    struct: _Struct, private_keys: Sequence[Any], chain_id: int, verifying_contract: str
) -> list[bytes]:
    """One signature per key, in the keys' order."""
    return [struct.sign(k, chain_id, verifying_contract) for k in private_keys]


def quorum_signatures(
    struct: _Struct, private_keys: Sequence[Any], chain_id: int, verifying_contract: str
) -> list[bytes]:
    """One signature per key, ordered by signer address ascending: the contracts recover
    quorum signatures in order and require strictly ascending signers (no duplicates)."""
    signed = [
        (int(Account.from_key(k).address, 16), struct.sign(k, chain_id, verifying_contract))
        for k in private_keys
    ]
    return [sig for _, sig in sorted(signed, key=lambda pair: pair[0])]


def sort_signatures(
    struct: _Struct, signatures: Sequence[bytes], chain_id: int, verifying_contract: str
) -> list[bytes]:
    """Already collected signatures (e.g. from other verifiers), put in ascending signer order."""
    keyed = [(int(struct.recover(s, chain_id, verifying_contract), 16), bytes(s))
             for s in signatures]
    return [sig for _, sig in sorted(keyed, key=lambda pair: pair[0])]
