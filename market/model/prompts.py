"""Turn text and chat prompts (OpenAI Batch request bodies) into token ids.

Completions (`prompt`): the tokenizer's own special tokens are added (for the embedded
tokenizer, a leading `<|bos|>`).

Chat (`messages`): the tokenizer's `chat_template` renders the conversation with the
assistant turn opened. A tokenizer without a template gets Quarry's minimal format, which
is also the embedded tokenizer's template:

    <|bos|><|system|>\\n{content}<|eos|>\\n<|user|>\\n{content}<|eos|>\\n<|assistant|>\\n

Roles are `system`, `user` and `assistant`; `content` is a string or a list of
`{"type": "text", "text": ...}` parts (joined without separators). An assistant turn ends
with EOS, so a model's natural stop also ends its turn. Whole request bodies become
`GenerationRequest`s in `market.engine.text`, which owns that type's construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
