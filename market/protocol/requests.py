"""Batch request lines (the OpenAI Batch input shape) and the output hash miners sign.

A request line is

    {"custom_id": str, "method": "POST", "url": "/v1/completions" | "/v1/chat/completions",
     "body": {"model": str, "prompt": str | "messages": [...], "max_tokens": int,
              "temperature": number, "top_p": number, "seed": int,
              "stop": str | [str, ...]}}

`max_tokens` is required (it bounds the shard budget); `temperature`, `top_p` and `seed` may
be left out and then mean greedy decoding (0.0), 1.0 and 0 (see `SamplingParams`). `stop` is
OpenAI's: one string or a list of 1 to 4, each non-empty and at most 64 UTF-8 bytes; the
output ends where its decoded text first contains one, and the returned text ends before it
(`find_stop` is the one rule engines and checks share). Unknown keys are rejected rather
than ignored, since a field such as `n` would change the output without changing what the
miner was paid to do; `stop` does too, which is fine because requestHash covers it.

Validation never rewrites the object: `requestHash` covers the line exactly as uploaded.
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from market.jsonsafe import JsonTooDeep, check_depth
from market.protocol.canonical import MAX_SAFE_INTEGER, keccak, request_hash
from market.protocol.errors import ProtocolError, RequestError

__all__ = [
    "COMPLETIONS_URL",
    "CHAT_COMPLETIONS_URL",
    "BatchError",
    "RequestTooLarge",
    "ParsedRequest",
    "SamplingParams",
    "validate_request",
    "sampling_params",
    "stop_strings",
    "find_stop",
    "MAX_STOP_STRINGS",
    "MAX_STOP_BYTES",
    "parse_jsonl",
    "load_jsonl",
    "request_line_sizes",
    "check_line_sizes",
    "encode_jsonl",
    "prompt_lines",
    "chat_lines",
    "output_hash",
    "token_ids_hash",
]

COMPLETIONS_URL = "/v1/completions"
CHAT_COMPLETIONS_URL = "/v1/chat/completions"
_TOP_KEYS = {"custom_id", "method", "url", "body"}
_BODY_KEYS = {"model", "prompt", "messages", "max_tokens", "temperature", "top_p", "seed",
              "stop"}
_FOREIGN_SAMPLERS = {"top_k", "min_p", "typical_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "logit_bias"}
"""Sampling knobs other engines have and the protocol does not: its one rule is temperature,
then the top_p nucleus (`market.engine.sampling`), which is what verifiers test."""
_ROLES = {"system", "user", "assistant"}
MAX_SEED = MAX_SAFE_INTEGER
"""Seeds stop at 2**53-1: the request line is hashed as canonical JSON, which holds no larger
integer exactly (a larger seed's requestHash could not be reproduced outside Python)."""
MAX_TOKEN_ID = 2**32 - 1
assert array("I").itemsize == 4, "token_ids_hash packs ids as 4-byte unsigned ints"
MAX_STOP_STRINGS = 4
"""OpenAI's limit on `stop`."""
MAX_STOP_BYTES = 64
"""The longest stop string, in UTF-8 bytes: it bounds how far back an engine's check looks."""


class BatchError(ProtocolError):
    """A batch that cannot be submitted as given (size, model, shape); the message says why."""


class RequestTooLarge(BatchError):
    """One request line is over the market's `maxRequestBytes`."""

    def __init__(self, line: int, size: int, limit: int) -> None:
        self.line = line
        self.size = size
        self.limit = limit
        super().__init__(f"line {line}: request is {size} bytes, over the market's limit of "
                         f"{limit} bytes per request (maxRequestBytes)")


@dataclass(frozen=True)
class SamplingParams:
    """The effective generation settings of a request, defaults filled in."""

    model: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    prompt: str | None  # /v1/completions
    messages: tuple[tuple[str, str], ...] | None  # /v1/chat/completions: (role, content)
    stop: tuple[str, ...] = ()  # stop strings, in the request's order ("stop": "x" -> ("x",))


@dataclass(frozen=True)
class ParsedRequest:
    """One validated line of a batch file: its 0-based index, line number, object and hash."""

    index: int
    line: int
    request: dict[str, Any]
    request_hash: bytes

    @property
    def custom_id(self) -> str:
        return str(self.request["custom_id"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def validate_request(obj: Any, *, line: int | None = None) -> dict[str, Any]:
    """Check one request object; return it unchanged, or raise RequestError naming the field."""

    def fail(field: str, message: str) -> RequestError:
        return RequestError(message, field=field, line=line)

    if not isinstance(obj, Mapping):
        raise fail("", f"a request line must be a JSON object, not {type(obj).__name__}")
    for key in obj:
        if key not in _TOP_KEYS:
            raise fail(str(key), f"unknown field (allowed: {', '.join(sorted(_TOP_KEYS))})")
    for key in ("custom_id", "method", "url", "body"):
        if key not in obj:
            raise fail(key, "missing")
    if not isinstance(obj["custom_id"], str) or not obj["custom_id"]:
        raise fail("custom_id", "must be a non-empty string")
    if obj["method"] != "POST":
        raise fail("method", f"must be \"POST\", got {obj['method']!r}")
    url = obj["url"]
    if url not in (COMPLETIONS_URL, CHAT_COMPLETIONS_URL):
        raise fail("url", f"must be {COMPLETIONS_URL!r} or {CHAT_COMPLETIONS_URL!r}, got {url!r}")
    body = obj["body"]
    if not isinstance(body, Mapping):
        raise fail("body", "must be a JSON object")
    for key in body:
        if key in _FOREIGN_SAMPLERS:
            raise fail(f"body.{key}", "not part of Quarry's sampling rule (temperature, then "
                       "top_p; no top_k, min_p or penalties): remove it")
        if key not in _BODY_KEYS:
            raise fail(f"body.{key}", f"unknown field (allowed: {', '.join(sorted(_BODY_KEYS))})")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise fail("body.model", "must be a non-empty string" if "model" in body else "missing")
    if url == COMPLETIONS_URL:
        if "messages" in body:
            raise fail("body.messages", f"not allowed with {COMPLETIONS_URL} (use prompt)")
        if "prompt" not in body:
            raise fail("body.prompt", "missing")
        if not isinstance(body["prompt"], str):
            raise fail("body.prompt", "must be a string")
    else:
        if "prompt" in body:
            raise fail("body.prompt", f"not allowed with {CHAT_COMPLETIONS_URL} (use messages)")
        if "messages" not in body:
            raise fail("body.messages", "missing")
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise fail("body.messages", "must be a non-empty list")
        for i, message in enumerate(messages):
            where = f"body.messages[{i}]"
            if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
                raise fail(where, "must be an object with exactly 'role' and 'content'")
            if message["role"] not in _ROLES:
                raise fail(f"{where}.role", f"must be one of {sorted(_ROLES)}")
            if not isinstance(message["content"], str):
                raise fail(f"{where}.content", "must be a string")
    if "max_tokens" not in body:
        raise fail("body.max_tokens", "missing")
    if not _is_int(body["max_tokens"]) or not 1 <= body["max_tokens"] <= 2**32 - 1:
        raise fail("body.max_tokens", "must be an integer in [1, 2**32-1]")
    if "temperature" in body and not (
        _is_number(body["temperature"]) and 0 <= body["temperature"] <= 2
    ):
        raise fail("body.temperature", "must be a number in [0, 2]")
    if "top_p" in body and not (_is_number(body["top_p"]) and 0 < body["top_p"] <= 1):
        raise fail("body.top_p", "must be a number in (0, 1]")
    if "seed" in body and not (_is_int(body["seed"]) and 0 <= body["seed"] <= MAX_SEED):
        raise fail("body.seed", "must be an integer in [0, 2**53-1] (the largest integer "
                   "canonical JSON, and so requestHash, holds exactly)")
    if "stop" in body:
        problem = _stop_problem(body["stop"])
        if problem:
            raise fail(problem[0], problem[1])
    return obj  # type: ignore[return-value]


def _stop_problem(stop: Any) -> tuple[str, str] | None:
    """(field, message) for an invalid `body.stop`, None for a valid one."""
    if isinstance(stop, str):
        items, where = [stop], lambda i: "body.stop"
    elif isinstance(stop, list):
        if not 1 <= len(stop) <= MAX_STOP_STRINGS:
            return "body.stop", (f"must be a string or a list of 1 to {MAX_STOP_STRINGS} "
                                 f"strings, got a list of {len(stop)}")
        items, where = stop, lambda i: f"body.stop[{i}]"
    else:
        return "body.stop", (f"must be a string or a list of 1 to {MAX_STOP_STRINGS} strings, "
                             f"not {type(stop).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            return where(i), "must be a non-empty string"
        try:
            size = len(item.encode("utf-8"))
        except UnicodeEncodeError:
            return where(i), "is not valid Unicode (a lone surrogate)"
        if size > MAX_STOP_BYTES:
            return where(i), f"is {size} UTF-8 bytes, over the limit of {MAX_STOP_BYTES}"
        if "\ufffd" in item:
            # A token that ends mid-character decodes to U+FFFD until the next token
            # completes it, so such a stop string could match text that is not there.
            return where(i), "must not contain U+FFFD (the replacement character)"
    return None


def stop_strings(stop: Any) -> tuple[str, ...]:
    """A validated `body.stop` (absent = None, a string, or a list) as a tuple of strings."""
    if stop is None:
        return ()
    problem = _stop_problem(stop)
    if problem:
        raise RequestError(problem[1], field=problem[0])
    return (stop,) if isinstance(stop, str) else tuple(stop)


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string in `text` starts (None when it contains none).

    The one rule every engine and check shares: generation ends at the first token after
    which the decoded output contains a stop string, and the returned text is cut here.
    """
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def sampling_params(request: Mapping[str, Any]) -> SamplingParams:
    """The effective settings of a validated request: greedy, top_p 1 and seed 0 by default."""
    validate_request(request)
    body = request["body"]
    messages = body.get("messages")
    return SamplingParams(
        model=body["model"],
        max_tokens=int(body["max_tokens"]),
        temperature=float(body.get("temperature", 0.0)),
        top_p=float(body.get("top_p", 1.0)),
        seed=int(body.get("seed", 0)),
        prompt=body.get("prompt"),
        messages=None if messages is None else tuple((m["role"], m["content"]) for m in messages),
        stop=stop_strings(body.get("stop")),
    )


def parse_jsonl(source: str | bytes | Iterable[str]) -> list[ParsedRequest]:
    """Parse and validate a batch file's text; errors name the 1-based line number.

    Blank lines are skipped (they still count for line numbers); `custom_id`s must be unique.
    """
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"batch file is not UTF-8: {exc}") from exc
    lines = source.splitlines() if isinstance(source, str) else source
    out: list[ParsedRequest] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            check_depth(text, what="the request line")
            obj = json.loads(text, parse_constant=_reject_constant)
        except JsonTooDeep as exc:
            raise RequestError(str(exc), line=number) from exc
        except (json.JSONDecodeError, ValueError) as exc:
            raise RequestError(f"not valid JSON: {exc}", line=number) from exc
        validate_request(obj, line=number)
        custom_id = obj["custom_id"]
        if custom_id in seen:
            raise RequestError(
                f"duplicate custom_id {custom_id!r} (first on line {seen[custom_id]})",
                field="custom_id",
                line=number,
            )
        seen[custom_id] = number
        out.append(ParsedRequest(len(out), number, obj, request_hash(obj)))
    if not out:
        raise RequestError("batch file has no requests")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_jsonl(path: str | Path) -> list[ParsedRequest]:
    """`parse_jsonl` over a file; errors name the file and the line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RequestError(f"cannot read batch file {path}: {exc.strerror}") from exc
    try:
        return parse_jsonl(data)
    except RequestError as exc:
        raise RequestError(f"{path}: {exc}") from exc


def request_line_sizes(data: bytes) -> list[tuple[int, int]]:
    """(1-based line number, UTF-8 bytes) of each request line of a batch file.

    Splits exactly as `parse_jsonl` does (blank lines skipped but counted), so the n-th pair
    belongs to the n-th parsed request and the line numbers agree with its errors.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"batch file is not UTF-8: {exc}") from exc
    return [(number, len(line.encode("utf-8")))
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def check_line_sizes(sizes: Iterable[tuple[int, int]], limit: int) -> None:
    """Raise `RequestTooLarge` for the first (line, size) over `limit` bytes."""
    for line, size in sizes:
        if size > limit:
            raise RequestTooLarge(line, size, limit)


def encode_jsonl(lines: Sequence[Mapping[str, Any]]) -> bytes:
    """Request objects as JSONL bytes (compact, UTF-8, one per line)."""
    return b"".join(
        json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        .encode("utf-8") + b"\n"
        for line in lines
    )


def _body(model: str, max_tokens: int, temperature: float, seed: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    return body


def prompt_lines(
    prompts: Sequence[str],
    *,
    model: str,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = 0,
) -> list[dict[str, Any]]:
    """Completions request lines for plain prompts: `custom_id` "request-<i>"."""
    if isinstance(prompts, str):
        raise BatchError("prompts must be a list of strings, not one string")
    lines = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise BatchError(f"prompt {i} is a {type(prompt).__name__}, not a string")
        line = {"custom_id": f"request-{i}", "method": "POST", "url": COMPLETIONS_URL,
                "body": {**_body(model, max_tokens, temperature, seed), "prompt": prompt}}
        lines.append(validate_request(line, line=i + 1))
    return lines


def chat_lines(
    conversations: Sequence[Sequence[Mapping[str, str]]],
    *,
    model: str,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = 0,
) -> list[dict[str, Any]]:
    """Chat request lines, one per message list (`[{"role", "content"}, ...]`)."""
    lines = []
    for i, messages in enumerate(conversations):
        if isinstance(messages, str | Mapping):
            raise BatchError(f"conversation {i} must be a list of {{role, content}} messages")
        line = {"custom_id": f"request-{i}", "method": "POST", "url": CHAT_COMPLETIONS_URL,
                "body": {**_body(model, max_tokens, temperature, seed),
                         "messages": [dict(m) for m in messages]}}
        lines.append(validate_request(line, line=i + 1))
    return lines


def token_ids_hash(token_ids: Sequence[int]) -> bytes:
    """keccak256(abi.encodePacked(uint32[] tokenIds)).

    Solidity's `abi.encodePacked` pads each element of an array to 32 bytes (only the
    top-level scalars are packed tightly), and writes no length. So this is the keccak of
    the token ids as consecutive 32-byte big-endian words, and the empty list hashes to
    keccak256("").
    """
    ids = token_ids if isinstance(token_ids, list | tuple) else list(token_ids)
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        for i, token in enumerate(ids):  # name the first one that is not a uint32
            if not _is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
                raise RequestError(f"token id {token!r} is not a uint32",
                                   field=f"token_ids[{i}]")
    # Each id's 4 big-endian bytes go at the end of its 32-byte word, by strided slice
    # assignment: a shard's receipts hash every output's ids, so no Python loop per id.
    packed = array("I", ids)
    if sys.byteorder == "little":
        packed.byteswap()
    be = packed.tobytes()
    words = bytearray(32 * len(ids))
    for k in range(4):
        words[28 + k::32] = be[k::4]
    return keccak(bytes(words))


def output_hash(text: str, token_ids: Sequence[int]) -> bytes:
    """The Receipt's outputHash:

    keccak256(abi.encode(keccak256(bytes(text)), keccak256(abi.encodePacked(uint32[] ids))))

    where `bytes(text)` is the UTF-8 encoding and the packed array uses 32-byte words (see
    `token_ids_hash`). Verifiers score the token ids, never a re-tokenisation of the text.
    """
    if not isinstance(text, str):
        raise RequestError(f"output text must be a string, not {type(text).__name__}")
    try:
        text_hash = keccak(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise RequestError(f"output text is not valid Unicode: {exc.reason}") from exc
    return keccak(text_hash + token_ids_hash(token_ids))  # abi.encode of two bytes32: concat
