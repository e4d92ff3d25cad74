"""Tokenizer-facing helpers every concrete engine shares: identity, encoding, decoding.

Miners turn request lines into `GenerationRequest`s and outputs back into text the same way
whichever engine runs, so these live once here rather than in each engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from market.engine.base import Engine, GenerationRequest
from market.errors import QuarryError
from market.model.manifest import Manifest
from market.model.prompts import encode_chat, encode_prompt, request_from_body, request_from_line


class TextEngine(Engine):
    """An Engine with a Hugging Face tokenizer and (usually) a Quarry manifest."""

    tokenizer: Any
    manifest: Manifest | None
    model_dir: Path

    @property
    def model_id(self) -> bytes:
        if self.manifest is None:
            raise QuarryError(f"{self.model_dir} has no quarry manifest, so no model id")
        return self.manifest.model_id

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids, special tokens (EOS, BOS) left out."""
        return str(
            self.tokenizer.decode(
                list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    def encode_prompt(self, prompt: str) -> tuple[int, ...]:
        return encode_prompt(self.tokenizer, prompt)

    def encode_chat(self, messages: Any) -> tuple[int, ...]:
        return encode_chat(self.tokenizer, messages)

    def request_from_body(self, body: Mapping[str, Any]) -> GenerationRequest:
        """An OpenAI-style request body (prompt or messages) as a GenerationRequest."""
        return request_from_body(self.tokenizer, body)

    def request_from_line(self, line: Mapping[str, Any]) -> GenerationRequest:
        """A validated batch request line as a GenerationRequest."""
        return request_from_line(self.tokenizer, line)
