"""OpenAI Batch input lines as users write them -> Quarry request lines, and error lines out.

Quarry hashes each request line into the task's input root and a miner is paid to answer it
exactly, so a field is either carried into the Quarry line (where `validate_request` judges
it: `model`, `messages`/`prompt`, `max_tokens`, `temperature`, `top_p`, `seed`, `stop`),
rewritten to the one Quarry spelling (`max_completion_tokens` -> `max_tokens`, a
`developer` message -> `system`, text content parts -> one string, a one-string `prompt`
list -> the string), dropped only where dropping changes nothing the miner does (`user`;
`n: 1`, `stream: false`, zero penalties and the other values in `NEUTRAL`), or refused on
its line with a message naming it. Nothing is dropped silently.

Output lines come from `client.batch.output_line` (the SDK's, with its `quarry` proof
object); this module writes only the error file's lines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client.sdk import DEFAULT_MAX_TOKENS
from market.jsonsafe import JsonTooDeep, check_depth
from market.protocol.errors import RequestError
from market.protocol.requests import (
    CHAT_COMPLETIONS_URL,
    COMPLETIONS_URL,
    validate_request,
)

ENDPOINTS = (CHAT_COMPLETIONS_URL, COMPLETIONS_URL)
PASSED = ("model", "max_tokens", "temperature", "top_p", "seed", "stop")
"""Body fields carried into the Quarry line unchanged (besides `messages`/`prompt`)."""
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "stream": (False, None),
    "logprobs": (False, None),
    "top_logprobs": (None, 0),
    "frequency_penalty": (0, None),
    "presence_penalty": (0, None),
    "logit_bias": (None,),
    "echo": (False, None),
    "best_of": (1, None),
    "store": (False, None),
    "suffix": (None,),
}
"""Fields accepted only at the value that asks for nothing beyond what Quarry does
(checked by `==`, so `0` and `0.0` are the same penalty); any other value is refused."""
DROPPED = ("user",)
"""Fields about the caller, never sent to miners."""
MAX_ERRORS = 1000
"""Validation stops collecting line errors after this many (the batch fails either way)."""


@dataclass(frozen=True)
class LineError:
    """One input line that cannot be run: OpenAI's `BatchError` fields."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}


@dataclass(frozen=True)
class Translated:
    """The Quarry lines of a valid input file, in order, with each one's input line."""

    lines: tuple[dict[str, Any], ...]
    line_numbers: tuple[int, ...]
    model: str


def translate_file(data: bytes, endpoint: str) -> Translated | list[LineError]:
    """Every line of an OpenAI Batch input file as a Quarry line, or every error found."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [LineError("invalid_file", f"the input file is not UTF-8: {exc}")]
    lines: list[dict[str, Any]] = []
    numbers: list[int] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    model: tuple[str, int] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            check_depth(raw, what="the request line")
            obj = json.loads(raw, parse_constant=_reject_constant)
            line = translate_line(obj, endpoint, number)
        except JsonTooDeep as exc:
            errors.append(LineError("invalid_json", str(exc), number))
            continue
        except ValueError as exc:  # json.JSONDecodeError included
            errors.append(LineError("invalid_json", f"not valid JSON: {exc}", number))
            continue
        except RequestError as exc:
            errors.append(_line_error(exc, number))
            continue
        custom_id = str(line["custom_id"])
        if custom_id in seen:
            errors.append(LineError("duplicate_custom_id", f"custom_id {custom_id!r} is also "
                                    f"on line {seen[custom_id]}", number, "custom_id"))
            continue
        seen[custom_id] = number
        name = str(line["body"]["model"])
        if model is None:
            model = (name, number)
        elif name != model[0]:
            errors.append(LineError("model_mismatch", f"body.model {name!r} differs from line "
                                    f"{model[1]}'s {model[0]!r}; a batch serves one model",
                                    number, "body.model"))
            continue
        lines.append(line)
        numbers.append(number)
    if errors:
        return errors
    if model is None:
        return [LineError("empty_file", "the input file has no request lines")]
    return Translated(tuple(lines), tuple(numbers), model[0])


def translate_line(obj: Any, endpoint: str, line: int) -> dict[str, Any]:
    """One OpenAI input line as a Quarry line; `RequestError` naming the field otherwise."""

    def fail(field: str, message: str) -> RequestError:
        return RequestError(message, field=field, line=line)

    if not isinstance(obj, Mapping):
        raise fail("", f"a request line must be a JSON object, not {type(obj).__name__}")
    if obj.get("url") != endpoint:
        raise fail("url", f"must be the batch's endpoint {endpoint!r}, got {obj.get('url')!r}")
    body = obj.get("body")
    if not isinstance(body, Mapping):
        raise fail("body", "must be a JSON object" if "body" in obj else "missing")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in PASSED:
            if value is not None or key == "model":  # OpenAI's null means "the default"
                out[key] = value
        elif key == "max_completion_tokens":
            if endpoint != CHAT_COMPLETIONS_URL:
                raise fail(f"body.{key}", f"only {CHAT_COMPLETIONS_URL} takes it (use "
                           "max_tokens)")
            if "max_tokens" in body and body["max_tokens"] != value:
                raise fail(f"body.{key}", f"{value!r} differs from body.max_tokens "
                           f"{body['max_tokens']!r}; give one of them")
            out["max_tokens"] = value
        elif key == "messages" and endpoint == CHAT_COMPLETIONS_URL:
            out[key] = _messages(value, fail)
        elif key == "prompt" and endpoint == COMPLETIONS_URL:
            out[key] = _prompt(value, fail)
        elif key in DROPPED:
            if not isinstance(value, str):
                raise fail(f"body.{key}", "must be a string")
        elif key in NEUTRAL:
            if not any(value == ok and type(value) is not bool or value is ok
                       for ok in NEUTRAL[key]):
                allowed = " or ".join(json.dumps(ok) for ok in NEUTRAL[key])
                raise fail(f"body.{key}", f"{json.dumps(value)} is not supported by Quarry "
                           f"(only {allowed}, which asks for nothing extra)")
        else:
            raise fail(f"body.{key}", "not supported by Quarry (supported: "
                       f"{', '.join(_supported(endpoint))})")
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    quarry = {k: v for k, v in obj.items() if k != "body"}
    quarry["body"] = out
    return validate_request(quarry, line=line)


def _supported(endpoint: str) -> list[str]:
    text = "messages" if endpoint == CHAT_COMPLETIONS_URL else "prompt"
    extra = ["max_completion_tokens"] if endpoint == CHAT_COMPLETIONS_URL else []
    return [text, *PASSED, *extra, *DROPPED, *(f"{k}={NEUTRAL[k][0]!r}" for k in NEUTRAL)]


def _messages(value: Any, fail: Any) -> Any:
    """Chat messages in Quarry's form: `developer` is `system`, text parts one string."""
    if not isinstance(value, list):
        return value  # validate_request names the problem
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            out.append(m)
            continue
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise fail(f"body.messages[{i}].{extra[0]}", "not supported by Quarry (a message "
                       "has only role and content)")
        role = "system" if m.get("role") == "developer" else m.get("role")
        out.append({"role": role, "content": _content(m.get("content"), i, fail)})
    return out


def _content(content: Any, i: int, fail: Any) -> Any:
    if not isinstance(content, list):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text" or \
                not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise fail(f"body.messages[{i}].content[{j}]", f"content part {kind!r} is not "
                       "supported by Quarry (text parts only)")
        texts.append(part["text"])
    return "".join(texts)


def _prompt(value: Any, fail: Any) -> Any:
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return value[0]
        raise fail("body.prompt", "a list prompt is supported only as one string (token "
                   "arrays and several prompts are not: give one line per prompt)")
    return value


def _line_error(exc: RequestError, line: int) -> LineError:
    message = str(exc).removeprefix(f"line {line}: ")
    return LineError("invalid_request", message, line, exc.field or None)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def error_line(custom_id: str, request_id: str, code: str, message: str) -> dict[str, Any]:
    """An OpenAI Batch error-file line: the request that produced no verified output."""
    return {"id": request_id, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
