"""Create the embedded tiny model: a random init from a seed, Llama by default or any
architecture in `market.model.archs` (`--arch`).

Same arguments -> byte-identical files -> same modelId, on every run and machine: weights
come from numpy's PCG64 seeded per tensor by (seed, tensor name), in float32, written with
safetensors under fixed metadata, and every JSON file is written by this code (no library
version strings). The tensors' names and shapes are read off transformers' own model class,
built on the meta device (no memory, no init), so each architecture gets exactly the
parameters it loads.

The init is scaled so the random model is useful for tests: large embeddings and a large
lm_head make next-token distributions peaked (a clear top-1 margin), so greedy output is
stable under tiny numeric differences (batched vs unbatched, pipelined vs not), while
sampling at temperature 1 still departs from greedy.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from market.errors import QuarryError
from market.model.archs import arch_of, tiny_config
from market.model.manifest import (
    MANIFEST_NAME,
    Manifest,
    ModelError,
    build_manifest,
    load_manifest,
    write_manifest,
)
from market.model.tokenizer import (
    ASSISTANT,
    BOS_ID,
    DEFAULT_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    SYSTEM,
    TOKENIZER_FILES,
    USER,
    write_tokenizer,
)

DEFAULT_NAME = "quarry-tiny"
DEFAULT_LAYERS = 4
DEFAULT_HIDDEN = 128
DEFAULT_SEED = 0
DEFAULT_MAX_POSITIONS = 1024
HEAD_DIM = 32

# Init scales (std multipliers). EMBED_STD keeps the token embedding dominant in the
# residual stream; LOGIT_SCALE sets how peaked the output distribution is.
EMBED_STD = 1.0
ATTN_OUT_SCALE = 0.5
MLP_OUT_SCALE = 0.5
LOGIT_SCALE = 10.0
BIAS_STD = 0.1

NEVER_GENERATED = (PAD_ID, BOS_ID, *(SPECIAL_TOKENS.index(t) for t in (SYSTEM, USER, ASSISTANT)))

if TYPE_CHECKING:
    import numpy as np

WEIGHTS_FILE = "model.safetensors"
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    WEIGHTS_FILE,
    *TOKENIZER_FILES,
    MANIFEST_NAME,
)


def llama_config(
    *,
    layers: int,
    hidden: int,
    vocab_size: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_positions: int,
) -> dict[str, Any]:
    """config.json content, written explicitly so it does not vary with transformers."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "use_cache": True,
    }


def _tensor_specs(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], float | None]]:
    """(name, shape, std) for every tensor the architecture loads, from transformers' own
    model class on the meta device; std None means a norm weight at its identity value.
    Inputs of a projection scale its std by 1/sqrt(fan-in); a tied lm_head is not stored."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    specs: list[tuple[str, tuple[int, ...], float | None]] = []
    for name, p in model.state_dict().items():
        shape = tuple(int(n) for n in p.shape)
        std: float | None
        if name == "lm_head.weight":
            if cfg.get("tie_word_embeddings"):
                continue
            std = LOGIT_SCALE / math.sqrt(shape[1])
        elif name.endswith("embed_tokens.weight"):
            std = EMBED_STD
        elif len(shape) == 1:
            std = BIAS_STD if name.endswith(".bias") else None
        else:
            scale = {"o_proj": ATTN_OUT_SCALE, "down_proj": MLP_OUT_SCALE}.get(
                name.split(".")[-2], 1.0)
            std = scale / math.sqrt(shape[1])
        specs.append((name, shape, std))
    return specs


def _random_tensor(seed: int, name: str, shape: tuple[int, ...], std: float | None,
                   identity: float = 1.0) -> np.ndarray:
    import numpy as np

    if std is None:
        return np.full(shape, identity, dtype=np.float32)
    name_words = np.frombuffer(hashlib.sha256(name.encode()).digest()[:16], dtype="<u4")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *name_words])))
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _write_json(path: Path, obj: Any) -> None:
    path.write_bytes((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def create_model(
    out_dir: Path,
    *,
    name: str = DEFAULT_NAME,
    layers: int = DEFAULT_LAYERS,
    hidden: int = DEFAULT_HIDDEN,
    seed: int = DEFAULT_SEED,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_positions: int = DEFAULT_MAX_POSITIONS,
    replace: bool = False,
    arch: str = "llama",
) -> Manifest:
    """Write a deterministic random model of architecture `arch` (`market.model.archs`; HF
    format + quarry-manifest.json) to `out_dir`.

    `heads` defaults to hidden // 32, `kv_heads` to half of that (grouped-query attention),
    `intermediate` to 3 * hidden. `vocab_size` caps the tokenizer (the corpus may yield fewer).
    """
    out_dir = Path(out_dir)
    arch_of(arch, f"--arch {arch}")
    for label, value, low in (("layers", layers, 1), ("hidden", hidden, 8), ("seed", seed, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ModelError(f"{label} must be an integer >= {low}, got {value!r}")
    heads = heads if heads is not None else max(1, hidden // HEAD_DIM)
    kv_heads = kv_heads if kv_heads is not None else (heads // 2 if heads % 2 == 0 else heads)
    intermediate = intermediate if intermediate is not None else 3 * hidden
    if heads < 1 or hidden % heads:
        raise ModelError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if (hidden // heads) % 2:
        raise ModelError(f"head dim hidden/heads = {hidden // heads} must be even (RoPE)")
    if kv_heads < 1 or heads % kv_heads:
        raise ModelError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if intermediate < 1 or max_positions < 2:
        raise ModelError("intermediate must be >= 1 and max_positions >= 2")
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir():
        stray = sorted(p.name for p in out_dir.iterdir() if p.name not in OUTPUT_FILES)
        if stray:
            raise ModelError(
                f"{out_dir} is not empty (holds {', '.join(stray[:5])}); "
                "choose an empty or new directory"
            )
    previous = _existing_model_id(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if previous is None:
        return _write_model(out_dir, name, layers, hidden, seed, heads, kv_heads,
                            intermediate, vocab_size, max_positions, arch)
    # The directory already holds a model: build beside it, and only swap the files in when
    # it is the same model (re-running the same command) or the caller asked to replace it.
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}-") as tmp:
        manifest = _write_model(Path(tmp), name, layers, hidden, seed, heads, kv_heads,
                                intermediate, vocab_size, max_positions, arch)
        if manifest.model_id_hex != previous and not replace:
            raise ModelError(
                f"{out_dir} already holds another model ({previous}); this one would be "
                f"{manifest.model_id_hex}: choose an empty directory or pass --force"
            )
        for fname in OUTPUT_FILES:
            os.replace(Path(tmp) / fname, out_dir / fname)
    return manifest


def _existing_model_id(out_dir: Path) -> str | None:
    """The modelId recorded in `out_dir`'s manifest, if a model was written there before."""
    if not (out_dir / MANIFEST_NAME).is_file():
        return None
    try:
        return load_manifest(out_dir).model_id_hex
    except QuarryError:
        return "an unreadable manifest"


def _write_model(
    out_dir: Path,
    name: str,
    layers: int,
    hidden: int,
    seed: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab_size: int,
    max_positions: int,
    arch: str = "llama",
) -> Manifest:
    actual_vocab = write_tokenizer(out_dir, vocab_size)
    cfg = tiny_config(arch, llama_config(
        layers=layers,
        hidden=hidden,
        vocab_size=actual_vocab,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        max_positions=max_positions,
    ))
    identity = arch_of(arch).norm_identity
    tensors = {
        tname: _random_tensor(seed, tname, shape, std, identity)
        for tname, shape, std in _tensor_specs(cfg)
    }
    # Zero logits for pad/bos/role tokens: far below the peaked top-1, so the random model
    # never emits them, while EOS keeps a random row and ends some generations naturally.
    # A tied head is the embedding: those tokens then embed to zero, which no test minds.
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
    tensors[head][list(NEVER_GENERATED)] = 0.0
    return write_model_files(out_dir, name, cfg, tensors)


def write_model_files(out_dir: Path, name: str, cfg: dict[str, Any],
                      tensors: dict[str, np.ndarray]) -> Manifest:
    """Write config, generation config, float32 safetensors weights and the manifest of a
    model whose embedded tokenizer is already in `out_dir`; the same inputs give the same
    bytes (also used by the trained test model's script, testmodels/train.py)."""
    from safetensors.numpy import save_file  # numpy stays out of `market model --help`

    _write_json(out_dir / "config.json", cfg)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
    )
    save_file({k: tensors[k] for k in sorted(tensors)}, str(out_dir / WEIGHTS_FILE),
              metadata={"format": "pt"})
    manifest = build_manifest(out_dir, name)
    write_manifest(manifest, out_dir)
    return manifest
