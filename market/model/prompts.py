"""Turn text and chat prompts (OpenAI Batch request bodies) into token ids and requests.

Completions (`prompt`): the tokenizer's own special tokens are added (for the embedded
tokenizer, a leading `<|bos|>`).

Chat (`messages`): the tokenizer's `chat_template` renders the conversation with the
assistant turn opened. A tokenizer without a template gets Quarry's minimal format, which
is also the embedded tokenizer's template:

    <|bos|><|system|>\\n{content}<|eos|>\\n<|user|>\\n{content}<|eos|>\\n<|assistant|>\\n

Roles are `system`, `user` and `assistant`; `content` is a string or a list of
`{"type": "text", "text": ...}` parts (joined without separators). An assistant turn ends
with EOS, so a model's natural stop also ends its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from market.engine.base import GenerationRequest
from market.errors import QuarryError

ROLES = ("system", "user", "assistant")


class PromptError(QuarryError):
    """A prompt or request body that cannot be turned into token ids."""


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise PromptError(f"{where}.content[{i}]: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise PromptError(f"{where}.content must be a string or a list of text parts")


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """Validate chat messages and return them as plain `{"role", "content"}` dicts."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise PromptError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise PromptError(f"{where} must be an object")
        role = msg.get("role")
        if role not in ROLES:
            raise PromptError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        out.append({"role": role, "content": _content_text(msg.get("content"), where)})
    return out


def format_chat(messages: Any) -> str:
    """Quarry's minimal chat format (without BOS), ending with the opened assistant turn."""
    turns = "".join(
        f"<|{m['role']}|>\n{m['content']}<|eos|>\n" for m in normalize_messages(messages)
    )
    return turns + "<|assistant|>\n"


def encode_prompt(tokenizer: Any, prompt: str) -> tuple[int, ...]:
    """Token ids of a completion prompt, with the tokenizer's special tokens (BOS)."""
    if not isinstance(prompt, str):
        raise PromptError(f"prompt must be a string, got {type(prompt).__name__}")
    ids = tuple(int(t) for t in tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if not ids:
        raise PromptError("prompt encodes to no tokens; give a non-empty prompt")
    return ids


def encode_chat(tokenizer: Any, messages: Any) -> tuple[int, ...]:
    """Token ids of a chat conversation with the assistant turn opened."""
    msgs = normalize_messages(messages)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return tuple(int(t) for t in ids)
    text = format_chat(msgs)
    return tuple(int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"])


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PromptError(f"body.{key} must be a number, got {value!r}")
    return float(value)


def request_from_body(
    tokenizer: Any, body: Mapping[str, Any], *, default_max_tokens: int = 16
) -> GenerationRequest:
    """An OpenAI-style body (`prompt` or `messages`, max_tokens, temperature, top_p, seed).

    Defaults follow the protocol: greedy (temperature 0), top_p 1, seed 0.
    """
    if not isinstance(body, Mapping):
        raise PromptError("request body must be an object")
    if "messages" in body and "prompt" in body:
        raise PromptError("request body has both 'prompt' and 'messages'; give one")
    if "messages" in body:
        ids = encode_chat(tokenizer, body["messages"])
    elif "prompt" in body:
        ids = encode_prompt(tokenizer, body["prompt"])
    else:
        raise PromptError("request body needs 'prompt' (completions) or 'messages' (chat)")
    max_tokens = body.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise PromptError(f"body.max_tokens must be a non-negative integer, got {max_tokens!r}")
    seed = body.get("seed", 0)
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PromptError(f"body.seed must be an integer, got {seed!r}")
    return GenerationRequest(
        prompt_ids=ids,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0),
        top_p=_number(body, "top_p", 1.0),
        seed=seed,
    )


def request_from_line(tokenizer: Any, line: Mapping[str, Any]) -> GenerationRequest:
    """A full batch request line, validated by the protocol, as a GenerationRequest."""
    from market.protocol.requests import sampling_params

    params = sampling_params(line)
    if params.messages is not None:
        ids = encode_chat(tokenizer, [{"role": r, "content": c} for r, c in params.messages])
    else:
        ids = encode_prompt(tokenizer, params.prompt or "")
    return GenerationRequest(
        prompt_ids=ids,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
    )
