"""One stage's slice of a Llama model, loaded from the HF directory without the other layers.

The forward pass mirrors `transformers`' `LlamaModel.forward` step for step (same causal-mask
builder, same rotary embedding, same decoder-layer call), so a stage chain computes exactly what
the single-process model computes. Layers are re-indexed locally (0..n-1) so each stage's
`DynamicCache` holds only its own layers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from market.engine.framestack import fresh_frame_chunk
from market.engine.pipeline.errors import PipelineError

SUPPORTED_MODEL_TYPES = ("llama",)


def parse_layers(spec: str) -> tuple[int, int]:
    """'A:B' -> (A, B), the half-open range of decoder layers a stage holds."""
    try:
        a, b = (int(x) for x in spec.split(":"))
    except ValueError as exc:
        raise PipelineError(f"bad layer range {spec!r}: expected A:B, e.g. 0:4") from exc
    if a < 0 or b <= a:
        raise PipelineError(f"bad layer range {spec!r}: need 0 <= A < B")
    return a, b


def split_layers(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous, as-even-as-possible split of `num_layers` into `stages` ranges."""
    if stages < 1:
        raise PipelineError(f"stages must be >= 1, got {stages}")
    if stages > num_layers:
        raise PipelineError(f"cannot split {num_layers} layers into {stages} stages")
    base, extra = divmod(num_layers, stages)
    ranges, start = [], 0
    for i in range(stages):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def load_config(model_dir: str | os.PathLike[str]):  # -> LlamaConfig
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise PipelineError(f"no config.json in model directory {model_dir}")
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise PipelineError(
            f"pipeline engine supports model types {SUPPORTED_MODEL_TYPES}, "
            f"not {config.model_type!r}"
        )
    return config


def _weight_index(model_dir: str) -> dict[str, str]:
    """Tensor name -> safetensors file that holds it (single file or sharded index)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        return {k: os.path.join(model_dir, v) for k, v in wmap.items()}
    single = os.path.join(model_dir, "model.safetensors")
    if not os.path.isfile(single):
        raise PipelineError(f"no model.safetensors (or index) in {model_dir}")
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        return {k: single for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def _read_tensors(index: dict[str, str], names: dict[str, str]) -> dict[str, torch.Tensor]:
    """Read only the tensors in `names` (file name -> local name), file by file."""
    from safetensors import safe_open

    missing = [n for n in names if n not in index]
    if missing:
        raise PipelineError(
            f"model weights lack {missing[:3]} (and {max(0, len(missing) - 3)} more)"
        )
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(index[n], []).append(n)
    out: dict[str, torch.Tensor] = {}
    for path, keys in by_file.items():
        with safe_open(path, framework="pt") as f:
            for k in keys:
                out[names[k]] = f.get_tensor(k)
    return out


@dataclass
class StageSpec:
    start: int
    end: int
    num_layers: int

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end == self.num_layers


class StageModel(nn.Module):
    """Decoder layers [start, end) plus the embedding (first stage) and norm + lm_head (last)."""

    def __init__(
        self,
        model_dir: str,
        start: int,
        end: int,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_implementation: str = "sdpa",
    ) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        full = load_config(model_dir)
        num_layers = int(full.num_hidden_layers)
        if not 0 <= start < end <= num_layers:
            raise PipelineError(f"layer range {start}:{end} outside the model's 0:{num_layers}")
        self.spec = StageSpec(start, end, num_layers)
        # A local config whose layers are this stage's only: caches and masks size to it.
        config = load_config(model_dir)
        config.num_hidden_layers = end - start
        config._attn_implementation = attn_implementation
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype

        names: dict[str, str] = {}
        layer_keys = _layer_keys(config)
        for local, glob in enumerate(range(start, end)):
            prefix = f"model.layers.{glob}."
            for key in layer_keys:
                names[prefix + key] = f"layers.{local}.{key}"
        index = _weight_index(model_dir)
        if self.spec.first:
            names["model.embed_tokens.weight"] = "embed_tokens.weight"
        if self.spec.last:
            names["model.norm.weight"] = "norm.weight"
            if "lm_head.weight" in index:
                names["lm_head.weight"] = "lm_head.weight"
            elif getattr(full, "tie_word_embeddings", False):
                names["model.embed_tokens.weight"] = "lm_head.weight"
            else:
                raise PipelineError("model weights lack lm_head.weight and embeddings are not tied")
        state = _read_tensors(index, names)
        if self.spec.first and self.spec.last and "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = state["lm_head.weight"]

        with torch.device("meta"):
            self.layers = nn.ModuleList(
                [LlamaDecoderLayer(config, layer_idx=i) for i in range(end - start)]
            )
            self.embed_tokens = (
                nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
                if self.spec.first
                else None
            )
            self.norm = (
                LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
                if self.spec.last
                else None
            )
            self.lm_head = (
                nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                if self.spec.last
                else None
            )
        self.load_state_dict(
            {k: v.to(device=self.device, dtype=dtype) for k, v in state.items()},
            strict=True,
            assign=True,
        )
        self.rotary_emb = LlamaRotaryEmbedding(config=config, device=self.device)
        self.eval()

    def new_cache(self, num_layers: int | None = None):
        """A KV cache for `num_layers` of this stage's layers (a hop may run a sub-range)."""
        import copy

        from transformers import DynamicCache

        if num_layers is None or num_layers == self.config.num_hidden_layers:
            return DynamicCache(config=self.config)
        config = copy.copy(self.config)
        config.num_hidden_layers = num_layers
        return DynamicCache(config=config)

    @fresh_frame_chunk
    @torch.inference_mode()
    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache_position: torch.Tensor,
        cache=None,
        layers: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Run this stage's layers. `x` is token ids on the first stage, hidden states after.

        `layers` (global, default all of the stage's) runs a sub-range, as a swarm route may
        ask: the embedding runs only when it starts at layer 0, the final norm only when it
        ends at the last layer, and the cache holds the sub-range's layers from index 0 (so
        the mask builder, which reads the cache's first layer, sees this microbatch's past).
        Returns hidden states, final-normed at the model's end (lm_head is applied by the
        caller on the positions it needs).
        """
        from transformers.masking_utils import create_causal_mask

        spec = self.spec
        a, b = layers if layers is not None else (spec.start, spec.end)
        if not spec.start <= a < b <= spec.end:
            raise PipelineError(f"layers {a}:{b} outside this stage's {spec.start}:{spec.end}")
        if a == 0 and self.embed_tokens is not None:  # the first hop embeds token ids
            h = self.embed_tokens(x.to(self.device))
        else:
            h = x.to(device=self.device, dtype=self.dtype)
        attention_mask = attention_mask.to(self.device)
        position_ids = position_ids.to(self.device)
        cache_position = cache_position.to(self.device)
        causal = create_causal_mask(
            config=self.config,
            input_embeds=h,
            attention_mask=attention_mask,
            cache_position=cache_position,
            past_key_values=cache,
            position_ids=position_ids,
        )
        pe = self.rotary_emb(h, position_ids)
        for j, layer in enumerate(self.layers[a - spec.start : b - spec.start]):
            attn: Any = layer.self_attn
            attn.layer_idx = j  # the cache slot for this microbatch's hop
            h = layer(
                h,
                attention_mask=causal,
                position_ids=position_ids,
                past_key_values=cache,
                cache_position=cache_position,
                position_embeddings=pe,
            )
        if self.norm is not None and b == spec.num_layers:  # the model's last layer
            h = self.norm(h)
        return h

    @torch.inference_mode()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head on already-normed hidden states (last stage only), as fp32."""
        assert self.lm_head is not None
        return self.lm_head(h).float()


def _layer_keys(config) -> list[str]:
    """Parameter names inside one decoder layer (taken from the module itself, not guessed)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, layer_idx=0)
    return [k for k, _ in layer.state_dict().items()]


def positions_from_mask(mask: torch.Tensor, q: int) -> torch.Tensor:
    """Position ids of the last `q` columns of a left-padded 2D mask: real tokens count from 0
    (pads get 0), so a row's positions ignore how much it was padded. Same rule as
    `market.engine.torch_engine.left_pad`, which the single-process engine uses."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q:]


def mask_from_lengths(lengths: list[int], width: int) -> torch.Tensor:
    """The left-padding mask for rows of the given real lengths."""
    lens = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
    return (torch.arange(width).unsqueeze(0) >= width - lens).long()
