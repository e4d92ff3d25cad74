"""The embedded tokenizer: byte-level BPE trained deterministically on `corpus.CORPUS`.

Training runs in plain Python with an explicit tie-break (highest pair count, then the
lexicographically smallest pair), and `tokenizer.json` is written from a dict this module
builds, so the bytes depend only on this code and the corpus, not on the `tokenizers`
version. Byte-level symbols mean every UTF-8 string encodes and decodes back exactly.

Vocabulary layout: the special tokens first (ids 0..5), then the 256 byte symbols in byte
order, then the merges in training order.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from market.errors import QuarryError
from market.model.corpus import CORPUS

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, SYSTEM, USER, ASSISTANT)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

DEFAULT_VOCAB_SIZE = 512
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# Jinja twin of `prompts.format_chat` (plus the leading BOS), so
# `tokenizer.apply_chat_template(..., add_generation_prompt=True)` gives the same ids.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|eos|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def _pretokenize(text: str) -> list[str]:
    """Split like the runtime ByteLevel pre-tokenizer so training sees what encoding sees."""
    from tokenizers import pre_tokenizers

    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return [piece for piece, _ in splitter.pre_tokenize_str(text)]


@lru_cache(maxsize=4)
def train_bpe(vocab_size: int = DEFAULT_VOCAB_SIZE) -> tuple[tuple[str, str], ...]:
    """Learn up to `vocab_size - 262` merges on the corpus; stops early when pairs run out."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise QuarryError(f"vocab_size {vocab_size} is below the minimum {MIN_VOCAB_SIZE}")
    n_merges = vocab_size - MIN_VOCAB_SIZE
    counts = Counter(_pretokenize(CORPUS))
    words: list[list[str]] = [list(w) for w in sorted(counts)]
    freqs: list[int] = [counts[w] for w in sorted(counts)]
    pair_counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:], strict=False):
            pair_counts[pair] += freqs[i]
            where[pair].add(i)

    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges and pair_counts:
        best = min(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        pair = best[0]
        merges.append(pair)
        merged = pair[0] + pair[1]
        for i in sorted(where.pop(pair, ())):
            word, freq = words[i], freqs[i]
            for old in zip(word, word[1:], strict=False):
                pair_counts[old] -= freq
                if pair_counts[old] <= 0:
                    del pair_counts[old]
            out: list[str] = []
            j = 0
            while j < len(word):
                if j + 1 < len(word) and word[j] == pair[0] and word[j + 1] == pair[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            words[i] = out
            for new in zip(out, out[1:], strict=False):
                pair_counts[new] += freq
                where[new].add(i)
        pair_counts.pop(pair, None)
    return tuple(merges)


def tokenizer_json(vocab_size: int = DEFAULT_VOCAB_SIZE) -> dict[str, Any]:
    """The complete `tokenizer.json` content for the embedded tokenizer."""
    merges = train_bpe(vocab_size)
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    byte_map = bytes_to_unicode()
    for b in range(256):
        vocab[byte_map[b]] = len(vocab)
    for left, right in merges:
        vocab[left + right] = len(vocab)
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}},
        },
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_tokenizer(out_dir: Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json; return vocab size."""
    tok = tokenizer_json(vocab_size)
    size = len(tok["model"]["vocab"])
    (out_dir / "tokenizer.json").write_bytes(_dump(tok))
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "additional_special_tokens": [SYSTEM, USER, ASSISTANT],
        "model_max_length": 1 << 20,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_bytes(_dump(config))
    special_map_full = {**special_map, "additional_special_tokens": [SYSTEM, USER, ASSISTANT]}
    (out_dir / "special_tokens_map.json").write_bytes(_dump(special_map_full))
    return size
