"""One stage's slice of a decoder model, loaded from the HF directory without the other layers.

The stage holds transformers' own modules for its architecture (`market.model.archs`): the
model class is built on the meta device, the stage keeps its decoder layers, embedding,
norm, rotary embedding and lm_head, and only those tensors are read from the weights. Its
passes repeat what the model class does around the layers (embedding scale, masks per
attention type, full or sliding window, the final norm, the logit soft-cap), so a stage
chain computes exactly what the single-process model computes. Generation runs the layers
as the torch engine does (`market.engine.decode`: a preallocated cache of the hop's layers
from slot 0, masks built once per microbatch); scoring is one cacheless pass.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from market.engine.decode import DecodeCache, embed, layer_windows, rotaries, run_layers
from market.engine.framestack import fresh_frame_chunk
from market.engine.fused import fuse_layers
from market.engine.pipeline.errors import PipelineError
from market.model.archs import SDPA_KINDS, arch_of, attention_for, final_logits, layer_types
from market.model.manifest import ModelError


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


def load_config(model_dir: str | os.PathLike[str]) -> Any:
    """The model's transformers config; PipelineError when its architecture is not served."""
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise PipelineError(f"no config.json in model directory {model_dir}")
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    try:
        arch_of(config.model_type, str(model_dir))
    except ModelError as exc:
        raise PipelineError(str(exc)) from exc
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
        fused: bool = True,
    ) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        full = load_config(model_dir)
        num_layers = int(full.num_hidden_layers)
        if not 0 <= start < end <= num_layers:
            raise PipelineError(f"layer range {start}:{end} outside the model's 0:{num_layers}")
        self.spec = StageSpec(start, end, num_layers)
        self.arch = arch_of(full.model_type)
        full._attn_implementation = attention_for(full, attn_implementation)
        self.layer_types = layer_types(full)
        self.windows = layer_windows(full)  # each global layer's sliding window, or None
        self.config = self._local_config(full, start, end)  # caches and masks size to it
        self.device = torch.device(device)
        self.dtype = dtype

        with torch.device("meta"):  # the whole model class, no memory: we keep our part
            causal = AutoModelForCausalLM.from_config(
                full, attn_implementation=full._attn_implementation)
        base = causal.get_decoder()
        # the weights' prefix: the decoder's attribute ("model"; Gemma 3's base_model_prefix
        # names another)
        prefix = next(n for n, m in causal.named_children() if m is base) + "."
        self.layers = nn.ModuleList(list(base.layers)[start:end])
        self.embed_tokens = base.embed_tokens if self.spec.first else None
        self.norm = base.norm if self.spec.last else None
        self.lm_head = causal.get_output_embeddings() if self.spec.last else None
        # built again off the meta device, each from its own config (Gemma 3's local one
        # has its own base)
        self.rotary = nn.ModuleDict({
            arg: type(emb)(config=emb.config, device=self.device)
            for arg, emb in rotaries(self.arch, base).items()})

        names: dict[str, str] = {}
        for local, glob in enumerate(range(start, end)):
            for key in self.layers[local].state_dict():
                names[f"{prefix}layers.{glob}.{key}"] = f"layers.{local}.{key}"
        index = _weight_index(model_dir)
        if self.spec.first:
            names[prefix + "embed_tokens.weight"] = "embed_tokens.weight"
        if self.spec.last:
            names[prefix + "norm.weight"] = "norm.weight"
            if "lm_head.weight" in index:
                names["lm_head.weight"] = "lm_head.weight"
            elif getattr(full, "tie_word_embeddings", False):
                names[prefix + "embed_tokens.weight"] = "lm_head.weight"
            else:
                raise PipelineError("model weights lack lm_head.weight and embeddings are not tied")
        state = _read_tensors(index, names)
        if self.spec.first and self.spec.last and "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = state["lm_head.weight"]
        self.load_state_dict(
            {k: v.to(device=self.device, dtype=dtype) for k, v in state.items()},
            strict=True,
            assign=True,
        )
        if self.embed_tokens is not None and self.lm_head is not None and "lm_head.weight" \
                not in index:
            self.lm_head.weight = self.embed_tokens.weight  # tied: one tensor, as HF keeps it
        if self.embed_tokens is not None and hasattr(self.embed_tokens, "embed_scale"):
            # Gemma 3's embedding scales by a buffer that is not in the weights
            self.embed_tokens.embed_scale = torch.tensor(full.hidden_size**0.5,
                                                         device=self.device)
        left = [n for n, t in (*self.named_parameters(), *self.named_buffers()) if t.is_meta]
        if left:
            raise PipelineError(f"{full.model_type} stage: {left[0]} was not loaded")
        self.eval()
        # the torch engine's plain-torch decode of the Llama family (`market.engine.fused`)
        self.fused = (fuse_layers(full, list(self.layers), dict(self.rotary.items()),
                                  full._attn_implementation in SDPA_KINDS) if fused else None)

    def _local_config(self, full: Any, a: int, b: int) -> Any:
        """A copy of the config for global layers [a, b) alone, so the cache built from it
        holds those layers' kinds (full or sliding window) from index 0."""
        config = copy.copy(full)
        config.num_hidden_layers = b - a
        config.layer_types = self.layer_types[a:b]
        return config

    def new_cache(self, pad_mask: torch.Tensor, layers: tuple[int, int] | None = None,
                  capacity: int = 0) -> DecodeCache:
        """A KV cache for a microbatch with left-padding mask `pad_mask` [B, T] through
        global `layers` of this stage's (default all; a hop may run a sub-range), held from
        slot 0, with room for `capacity` columns (it grows past them)."""
        a, b = self._range(layers)
        return DecodeCache(pad_mask, self.windows[a:b], capacity, self.dtype, self.device,
                           self.config._attn_implementation in SDPA_KINDS)

    def _range(self, layers: tuple[int, int] | None) -> tuple[int, int]:
        spec = self.spec
        a, b = layers if layers is not None else (spec.start, spec.end)
        if not spec.start <= a < b <= spec.end:
            raise PipelineError(f"layers {a}:{b} outside this stage's {spec.start}:{spec.end}")
        return a, b

    def _enter(self, x: torch.Tensor, a: int) -> torch.Tensor:
        """The hop's input: token ids embedded where it starts at layer 0, else hidden
        states in the stage's dtype."""
        if a == 0 and self.embed_tokens is not None:
            return embed(self.embed_tokens, self.arch, self.config.hidden_size,
                         x.to(self.device))
        return x.to(device=self.device, dtype=self.dtype)

    def _leave(self, h: torch.Tensor, b: int) -> torch.Tensor:
        """Final-normed where the hop ends at the model's last layer."""
        if self.norm is not None and b == self.spec.num_layers:
            return self.norm(h)
        return h

    @fresh_frame_chunk
    @torch.inference_mode()
    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DecodeCache,
        layers: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """One generation pass (the prefill or a decode step) of this stage's layers on the
        next columns of `cache` (`new_cache(mask, layers)`). `x` is token ids where the hop
        starts at layer 0, hidden states after; `layers` (global, default all of the
        stage's) runs a sub-range, as a swarm route may ask. Returns hidden states,
        final-normed at the model's end (lm_head is applied by the caller on the positions
        it needs)."""
        a, b = self._range(layers)
        lo, hi = a - self.spec.start, b - self.spec.start
        h, pos = self._enter(x, a), position_ids.to(self.device)
        if self.fused is not None:
            h = self.fused.run(h, pos, cache, lo, hi)
        else:
            h = run_layers(self.layers[lo:hi], dict(self.rotary.items()), h, pos, cache)
        return self._leave(h, b)

    @fresh_frame_chunk
    @torch.inference_mode()
    def score(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor,
        layers: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """A teacher-forced pass without a cache over a left-padded batch (`attention_mask`
        [B, T]), masks built by transformers' own builders once for the pass, one per
        attention kind (full or sliding window). Inputs and outputs as `forward`'s."""
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        a, b = self._range(layers)
        h = self._enter(x, a)
        width = int(h.shape[1])
        position_ids = positions_from_mask(attention_mask, width).to(self.device)
        mask_args = {
            "config": self._local_config(self.config, a, b),
            "input_embeds": h,
            "attention_mask": attention_mask.to(self.device),
            "cache_position": torch.arange(width, device=self.device),
            "past_key_values": None,
            "position_ids": position_ids,
        }
        kinds = self.layer_types[a:b]
        builders = {"full_attention": create_causal_mask,
                    "sliding_attention": create_sliding_window_causal_mask}
        masks = {kind: builders[kind](**mask_args) for kind in set(kinds)}
        pe = {arg: emb(h, position_ids) for arg, emb in self.rotary.items()}
        for j, layer in enumerate(self.layers[a - self.spec.start : b - self.spec.start]):
            out = layer(h, attention_mask=masks[kinds[j]], position_ids=position_ids,
                        cache_position=mask_args["cache_position"], **pe)
            h = out[0] if isinstance(out, tuple) else out  # Gemma 2's layers return a tuple
        return self._leave(h, b)

    @torch.inference_mode()
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head (and the architecture's soft-cap) on already-normed hidden states (last
        stage only), as fp32."""
        assert self.lm_head is not None
        return final_logits(self.config, self.lm_head(h).float())


def positions_from_mask(mask: torch.Tensor, q: int) -> torch.Tensor:
    """Position ids of the last `q` columns of a left-padded 2D mask: real tokens count from 0
    (pads get 0), so a row's positions ignore how much it was padded. Same rule as
    `market.engine.torch_engine.left_pad`, which the single-process engine uses."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q:]


def mask_from_lengths(lengths: list[int], width: int) -> torch.Tensor:
    """The left-padding mask for rows of the given real lengths."""
    lens = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
    return (torch.arange(width).unsqueeze(0) >= width - lens).long()
