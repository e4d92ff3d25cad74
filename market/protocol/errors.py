"""Errors of the off-chain protocol: each names the field, value or line at fault."""

from __future__ import annotations

from market.errors import QuarryError


class ProtocolError(QuarryError):
    """Data that cannot be hashed, signed or proven the way the contracts expect."""


class CanonicalJSONError(ProtocolError):
    """A value with no canonical JSON form (NaN, infinity, bytes, a non-string key...)."""


class RequestError(ProtocolError):
    """A batch request line that is not a valid OpenAI Batch input line.

    `field` is the dotted path of the offending field (empty for the whole line) and `line`
    the 1-based line number in a JSONL file, when known.
    """

    def __init__(self, message: str, *, field: str = "", line: int | None = None) -> None:
        self.field = field
        self.line = line
        where = f"line {line}: " if line is not None else ""
        what = f"{field}: " if field else ""
        super().__init__(f"{where}{what}{message}")


class MerkleError(ProtocolError):
    """An empty tree, an index out of range, or leaf values that do not fit their types."""


class SignatureError(ProtocolError):
    """A malformed EIP-712 message or signature."""
