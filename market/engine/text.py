"""Tokenizer-facing helpers every concrete engine shares: identity, encoding, decoding.

Miners turn request lines into `GenerationRequest`s and outputs back into text the same way
whichever engine runs, so these live once here rather than in each engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from market.engine.base import Engine, GenerationRequest, text_for
from market.engine.sampling import validate_sampling
from market.errors import QuarryError
from market.model.manifest import Manifest
from market.model.prompts import PromptError, encode_chat, encode_prompt
from market.protocol.errors import RequestError
from market.protocol.requests import sampling_params, stop_strings


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
    """An OpenAI-style body (`prompt` or `messages`, max_tokens, temperature, top_p, seed,
    stop).

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
    try:
        stop = stop_strings(body.get("stop"))
    except RequestError as exc:
        raise PromptError(str(exc)) from exc
    return GenerationRequest(
        prompt_ids=ids,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0),
        top_p=_number(body, "top_p", 1.0),
        seed=seed,
        stop=stop,
    )


def request_from_line(tokenizer: Any, line: Mapping[str, Any]) -> GenerationRequest:
    """A full batch request line, validated by the protocol, as a GenerationRequest."""
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
        stop=params.stop,
    )


class EngineError(QuarryError):
    """Bad input to an engine (empty prompt, unknown token id, too long a sequence...)."""


_PLAIN_FAST: dict[type, bool] = {}


def _plain_fast(tokenizer: Any) -> bool:
    """Whether `tokenizer` decodes as its Rust backend does: a transformers fast tokenizer
    whose class overrides neither `decode` nor `_decode`, whose decode without clean-up is
    the backend's. `TextEngine.decode` then calls the backend itself, in half the time (an
    engine decodes every output, and every step of a row with stop strings). Decided once
    per class."""
    kind = type(tokenizer)
    plain = _PLAIN_FAST.get(kind)
    if plain is None:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        plain = _PLAIN_FAST[kind] = (
            issubclass(kind, PreTrainedTokenizerFast)
            and getattr(kind, "_decode", None) is PreTrainedTokenizerFast._decode
            and getattr(kind, "decode", None) is PreTrainedTokenizerBase.decode)
    return plain


class TextEngine(Engine):
    """An Engine with a Hugging Face tokenizer and (usually) a Quarry manifest.

    Subclasses set `tokenizer`, `manifest`, `model_dir`, `vocab_size` and `max_positions`;
    input checks live here so every engine rejects bad input with the same EngineError.
    """

    tokenizer: Any
    manifest: Manifest | None
    model_dir: Path
    vocab_size: int
    max_positions: int

    @property
    def model_id(self) -> bytes:
        if self.manifest is None:
            raise QuarryError(f"{self.model_dir} has no quarry manifest, so no model id")
        return self.manifest.model_id

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids, special tokens (EOS, BOS) left out."""
        if _plain_fast(self.tokenizer):
            return str(self.tokenizer.backend_tokenizer.decode(list(token_ids),
                                                               skip_special_tokens=True))
        return str(
            self.tokenizer.decode(
                list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    def output_text(self, token_ids: Sequence[int], stop: Sequence[str]) -> tuple[str, bool]:
        """`text_for` with this engine's tokenizer: (text cut at a stop string, stopped)."""
        return text_for(self.decode, token_ids, stop)

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

    # -- input checks shared by every engine ----------------------------------------------
    def check_ids(self, ids: Sequence[int], what: str) -> None:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise EngineError(f"{what}: token id {t!r} is outside [0, {self.vocab_size})")

    def validate_request(self, i: int, r: GenerationRequest) -> None:
        if not isinstance(r, GenerationRequest):
            raise EngineError(f"request {i}: expected a GenerationRequest, got {type(r).__name__}")
        if not r.prompt_ids:
            raise EngineError(f"request {i}: empty prompt (it needs at least one token)")
        self.check_ids(r.prompt_ids, f"request {i}")
        if isinstance(r.max_tokens, bool) or not isinstance(r.max_tokens, int) or r.max_tokens < 0:
            raise EngineError(f"request {i}: max_tokens must be an integer >= 0")
        if len(r.prompt_ids) + r.max_tokens > self.max_positions:
            raise EngineError(
                f"request {i}: prompt ({len(r.prompt_ids)}) + max_tokens ({r.max_tokens}) "
                f"exceeds the model's {self.max_positions} positions"
            )
        try:
            validate_sampling(r, i)
        except QuarryError as exc:
            raise EngineError(str(exc)) from exc

    def validate_score_inputs(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The (prompt, output) pairs as tuples, after the checks `score` needs."""
        if len(prompt_ids) != len(output_ids):
            raise EngineError(
                f"{len(prompt_ids)} prompts but {len(output_ids)} outputs; they pair up"
            )
        pairs = []
        for i, (p, o) in enumerate(zip(prompt_ids, output_ids, strict=True)):
            p, o = tuple(p), tuple(o)
            if not p:
                raise EngineError(f"sequence {i}: empty prompt (it needs at least one token)")
            self.check_ids(p, f"sequence {i} prompt")
            self.check_ids(o, f"sequence {i} output")
            if len(p) + len(o) > self.max_positions:
                raise EngineError(
                    f"sequence {i}: prompt + output ({len(p) + len(o)} tokens) exceeds the "
                    f"model's {self.max_positions} positions"
                )
            pairs.append((p, o))
        return pairs
