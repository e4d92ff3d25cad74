"""Whether a request fits a model's context, checked from the model's manifest alone.

A request whose prompt tokens plus `max_tokens` exceed the model's positions can never be
served: every miner skips it. The client must learn that before it pays, so the check runs
on what the client can get without the weights: the manifest (the context length is in its
architecture config) and the tokenizer files, fetched from the market's store by the sha256
the manifest commits to (so a store cannot hand over another tokenizer). Prompts are
counted as a miner's tokenizer counts them (`PromptCounter`).

The tokenizer files get to the store when a miner publishes them (`publish_tokenizer`, at
registration). Without them the check still refuses what no prompt could make fit:
`max_tokens` + 1 over the context.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from market.model.manifest import Manifest
from market.protocol.errors import RequestError

__all__ = [
    "CONTEXT_KEYS",
    "TOKENIZER_FILES",
    "ContextCheck",
    "PromptCounter",
    "context_length",
    "publish_tokenizer",
    "store_tokenizer",
]

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
"""Architecture config keys that hold a model's context length, in the order looked up."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
"""The files `AutoTokenizer` reads (the manifest's other files are weights and configs)."""


class Store(Protocol):
    """What this module needs of the market's store (`MarketAPI` is one)."""

    def get(self, uri: str) -> bytes: ...

    def put(self, data: bytes) -> str: ...


def context_length(manifest: Manifest) -> int | None:
    """The model's positions from its architecture config; None when it names none."""
    for key in CONTEXT_KEYS:
        value = manifest.architecture.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def publish_tokenizer(market: Store, model_dir: Path, manifest: Manifest) -> list[str]:
    """Upload the model's tokenizer files that the manifest lists to the market's store, so
    clients can check their prompts against the context before paying. Returns their URIs."""
    uris = []
    for name in TOKENIZER_FILES:
        if name in manifest.files:
            uris.append(market.put((Path(model_dir) / name).read_bytes()))
    return uris


@dataclass(frozen=True)
class PromptCounter:
    """Counts a request's prompt tokens as a miner's `AutoTokenizer` would
    (`market.model.prompts.encode_prompt` / `encode_chat`), from `tokenizer.json` and the
    chat template only: `tokenizers` and jinja2 load in a fraction of a second, where
    importing transformers takes seconds, on every submit."""

    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | None
    special: Mapping[str, str]  # bos_token, eos_token... for the template

    def count(self, request: Mapping[str, Any]) -> int:
        from market.model.prompts import format_chat, normalize_messages

        body = request["body"]
        if "messages" not in body:
            return len(self.tokenizer.encode(body["prompt"], add_special_tokens=True).ids)
        messages = normalize_messages(body["messages"])
        if self.chat_template:
            import jinja2

            text = jinja2.Environment().from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, **self.special)
            return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return len(self.tokenizer.encode(format_chat(messages), add_special_tokens=True).ids)


def store_tokenizer(market: Store, manifest: Manifest) -> PromptCounter | None:
    """The model's prompt counter from its `tokenizer.json` (and `tokenizer_config.json`),
    fetched from the store by the sha256 the manifest lists (checked on download); None when
    the manifest lists no tokenizer.json or the store does not have it."""
    import json

    from tokenizers import Tokenizer

    from market.store import StoreError

    def fetch(name: str) -> bytes | None:
        if name not in manifest.files:
            return None
        try:
            return market.get(f"sha256:{manifest.files[name].lower()}")
        except StoreError:  # ContentNotFound among them
            return None

    tokenizer_json = fetch("tokenizer.json")
    if tokenizer_json is None:
        return None
    config: dict[str, Any] = {}
    raw = fetch("tokenizer_config.json")
    if raw is not None:
        try:
            loaded = json.loads(raw)
            config = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            return None
    try:
        tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    except Exception:  # tokenizers raises plain Exception for a malformed file
        return None
    template = config.get("chat_template")
    special = {k: v for k, v in config.items()
               if k.endswith("_token") and isinstance(v, str)}
    return PromptCounter(tokenizer, template if isinstance(template, str) else None, special)


@dataclass(frozen=True)
class ContextCheck:
    """A model's context length and (when its files are in the store) its tokenizer."""

    model: str  # the name errors use
    positions: int
    tokenizer: PromptCounter | None

    def check(self, lines: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """Raise `RequestError` naming the first (line number, request) that cannot fit."""
        for line, request in lines:
            max_tokens = int(request["body"]["max_tokens"])
            if self.tokenizer is None:
                prompt, what = 1, "at least 1 prompt token"
            else:
                prompt = self.tokenizer.count(request)
                what = f"{prompt} prompt tokens"
            if prompt + max_tokens > self.positions:
                raise RequestError(
                    f"{what} + max_tokens {max_tokens} = {prompt + max_tokens} is over the "
                    f"{self.positions}-position context of model {self.model}: no miner "
                    "can serve it (shorten the prompt or lower max_tokens)", line=line)
