"""Canonical JSON and the hashes built on it.

Canonical JSON is what `requestHash` and `modelId` commit to, so two parties that parse and
re-serialise the same object must produce the same bytes. The rules follow RFC 8785 (JCS),
which any language can reproduce:

- object keys sorted by their UTF-16 code units (the same as code-point order for the
  ASCII keys Quarry uses), no whitespace anywhere;
- strings as UTF-8, not ASCII-escaped; only `"`, `\\` and control characters are escaped;
- integers as integers (never `1.0` or `1e3`), and only those a JavaScript number or any
  RFC 8785 implementation holds exactly: [-(2**53-1), 2**53-1] (`MAX_SAFE_INTEGER`). A
  larger one (a seed near 2**64, say) would be rounded by every other implementation, so
  its hash could not be reproduced: it is refused with `UnsafeInteger`, naming the path;
- finite floats in ECMAScript `Number.prototype.toString` form: the shortest digits that
  round-trip, so `0.7` stays `0.7` and an integral float such as `1.0` becomes `1`;
- NaN, infinities, bytes, sets, non-string keys and other non-JSON values are rejected.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from sha3 import keccak_256 as _keccak_256

from market.protocol.errors import CanonicalJSONError

__all__ = [
    "MAX_SAFE_INTEGER",
    "UnsafeInteger",
    "canonical_json",
    "canonical_json_bytes",
    "keccak",
    "request_hash",
    "json_hash",
]

MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer an IEEE double (a JavaScript number, an RFC 8785 value) holds exactly."""


class UnsafeInteger(CanonicalJSONError):
    """An integer outside [-(2**53-1), 2**53-1]: other canonical JSON implementations would
    round it, so a hash over it could not be reproduced outside Python."""

    def __init__(self, path: str, value: int) -> None:
        self.path = path
        self.value = value
        super().__init__(f"{path or 'value'}: integer {value} is outside the range canonical "
                         f"JSON holds exactly, [-(2**53-1), 2**53-1]")


def keccak(data: bytes) -> bytes:
    """Ethereum's keccak256 (not NIST SHA3-256). safe-pysha3's C hash directly: receipts,
    Merkle nodes and request hashes make it the market path's most called function, and
    eth-hash's default (pycryptodome through ctypes) costs 8 times as much per call."""
    return _keccak_256(data).digest()


def _format_float(value: float, path: str) -> str:
    if math.isnan(value) or math.isinf(value):
        raise CanonicalJSONError(f"{path or 'value'}: {value!r} has no JSON form")
    if value == 0:
        return "0"  # both 0.0 and -0.0, as in JCS
    # repr() gives the shortest digits that round-trip; Decimal splits them for us.
    sign, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = exponent + k  # value = 0.digits * 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return ("-" if value < 0 else "") + text


def _encode(value: Any, path: str, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise UnsafeInteger(path, int(value))
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_format_float(float(value), path))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise CanonicalJSONError(
                    f"{path or 'object'}: key {key!r} is a {type(key).__name__}, not a string"
                )
        keys = sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))
        out.append("{")
        for i, key in enumerate(keys):
            if i:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], f"{path}.{key}" if path else key, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, f"{path}[{i}]", out)
        out.append("]")
    else:
        raise CanonicalJSONError(
            f"{path or 'value'}: {type(value).__name__} is not a JSON type"
        )


# For values `_plain` accepts, json's C encoder writes exactly the canonical text: keys
# sorted (ASCII keys sort the same by code point as by UTF-16 unit), no whitespace, strings
# escaped as `_encode` escapes them (it calls json.dumps for each), ints in decimal.
_C_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                              allow_nan=False)
_SAFE_RANGE = range(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1)
_NOT_PLAIN, _PLAIN, _PLAIN_ONCE_INTS = 0, 1, 2


def _plain(value: Any) -> int:
    """Whether json's C encoder writes `value` canonically (`_PLAIN`): it holds None, bools,
    safe ints, strings, lists/tuples, dicts with ASCII string keys, and floats whose repr is
    their ECMAScript form (fixed-point, not integral: `0.7`; `_format_float` starts from the
    same shortest digits). `_PLAIN_ONCE_INTS`: it also holds integral floats (`0.0`, the
    usual temperature), written as ints. Anything else (`_NOT_PLAIN`) goes to `_encode`,
    which formats it or names the problem; so does a container met twice (shared, or a
    cycle). Lists of ints (token ids, the bulk of a result document) are checked at C speed.
    """
    verdict = _PLAIN
    stack = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str or t is bool or v is None:
            continue
        if t is int:
            if v not in _SAFE_RANGE:
                return _NOT_PLAIN
        elif t is float:
            if v.is_integer():
                if abs(v) > MAX_SAFE_INTEGER:  # 2.0**53 has no exact int form here
                    return _NOT_PLAIN
                verdict = _PLAIN_ONCE_INTS
            elif "e" in (text := repr(v)) or "n" in text:  # 1e-05, inf, nan
                return _NOT_PLAIN
        elif v and id(v) in seen:  # empty ones are safe to meet again
            return _NOT_PLAIN
        elif t is dict:
            seen.add(id(v))
            for key in v:
                if type(key) is not str or not key.isascii():
                    return _NOT_PLAIN
            stack.extend(v.values())
        elif t is list or t is tuple:
            seen.add(id(v))
            kinds = set(map(type, v))
            if kinds == {int}:
                if min(v) not in _SAFE_RANGE or max(v) not in _SAFE_RANGE:
                    return _NOT_PLAIN
            elif kinds != {str}:
                stack.extend(v)
        else:
            return _NOT_PLAIN
    return verdict


def _ints_for_integral_floats(value: Any) -> Any:
    """A copy of a `_PLAIN_ONCE_INTS` value with its integral floats as ints (1.0 -> 1)."""
    t = type(value)
    if t is float:
        return int(value) if value.is_integer() else value
    if t is dict:
        return {k: _ints_for_integral_floats(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_ints_for_integral_floats(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """The canonical JSON text of `value` (see the module docstring for the rules).

    Plain values (result documents, request lines, the messages Quarry signs) go through
    json's C encoder, several times faster; the rest through `_encode`, rule by rule."""
    verdict = _plain(value)
    if verdict == _PLAIN:
        return _C_ENCODER.encode(value)
    if verdict == _PLAIN_ONCE_INTS:
        return _C_ENCODER.encode(_ints_for_integral_floats(value))
    out: list[str] = []
    _encode(value, "", out)
    return "".join(out)


def canonical_json_bytes(value: Any) -> bytes:
    """The canonical JSON of `value` as UTF-8 bytes: the preimage of every Quarry JSON hash."""
    text = canonical_json(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates survive json.dumps but not UTF-8
        raise CanonicalJSONError(f"string is not valid Unicode: {exc.reason}") from exc


def json_hash(value: Any) -> bytes:
    """keccak256 of the canonical JSON of `value` (modelId uses this over the manifest)."""
    return keccak(canonical_json_bytes(value))


def request_hash(request: Mapping[str, Any]) -> bytes:
    """`requestHash = keccak256(canonical JSON)` of one batch request line (the parsed object).

    It hashes exactly what it is given: validate first with `validate_request` when the
    object comes from outside.
    """
    if not isinstance(request, Mapping):
        raise CanonicalJSONError(f"a request is a JSON object, not a {type(request).__name__}")
    return json_hash(request)
