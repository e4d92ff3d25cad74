"""Generation through a model's own decoder layers with a preallocated KV cache and masks
built once per batch: the loop the torch engine and every pipeline stage run.

transformers' decoder forward rebuilds the 4-D attention mask from the 2-D padding mask at
every step, concatenates each layer's cache (a new tensor per layer per step), and with a
mask present copies the cache to every query head (`repeat_kv`). Here `DecodeCache` owns
per-layer K/V buffers written in place (they double when full) and the batch's additive
key mask, built once at prefill: a decode step's mask is a slice of it, or None when no row
is padded (then SDPA also runs grouped-query attention natively). Sliding-window layers get
only their window's keys back from the cache, so their decode mask is a slice too.
The math is the model's: the same layers, weights, positions and visible keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from market.model.archs import Arch, layer_types


def layer_windows(config: Any) -> list[int | None]:
    """Each decoder layer's sliding window in tokens, None for full attention."""
    window = getattr(config, "sliding_window", None)
    return [int(window) if kind == "sliding_attention" and window else None
            for kind in layer_types(config)]


class DecodeCache:
    """K/V of a batch's layers in preallocated buffers [B, kv_heads, capacity, head_dim],
    plus the batch's key mask. transformers' attention modules call `update` (the only
    cache method a decoder layer uses); `run_layers` advances `length` after each pass.

    `pad_mask` [B, T] is the prompts' left-padding mask (1 real, 0 pad); `windows` holds
    each cached layer's sliding window (None: full), indexed as the layers' `layer_idx`;
    `sdpa` says the layers attend through SDPA, which applies causality itself when a
    prefill has no mask (eager attention needs the causal mask spelled out)."""

    def __init__(self, pad_mask: torch.Tensor, windows: Sequence[int | None],
                 capacity: int, dtype: torch.dtype, device: torch.device | str,
                 sdpa: bool) -> None:
        batch, width = pad_mask.shape
        self.windows = list(windows)
        self._kinds = list(dict.fromkeys(self.windows))  # the distinct windows, once
        self.sdpa = sdpa
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0
        self.capacity = max(int(capacity), int(width), 1)
        self.keys: list[torch.Tensor | None] = [None] * len(self.windows)
        self.values: list[torch.Tensor | None] = [None] * len(self.windows)
        self.padded = bool((pad_mask == 0).any())
        self.key_ok = torch.ones((batch, self.capacity), dtype=torch.bool, device=self.device)
        self.key_ok[:, :width] = pad_mask.to(self.device).bool()
        self._row = self._additive_row()

    def _additive_row(self) -> torch.Tensor | None:
        """[B, 1, 1, capacity]: 0 where a key is real, the dtype's minimum on padding (as
        transformers' eager masks; finite, so a row with no real key stays finite)."""
        if not self.padded:
            return None
        neg = torch.finfo(self.dtype).min
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        return torch.where(self.key_ok, zero, neg)[:, None, None, :]

    def _start(self, window: int | None, q: int, end: int) -> int:
        """The first key a pass of `q` queries ending at column `end` reads: a decode step
        (q == 1) of a sliding layer reads only its window."""
        return max(0, end - window) if window is not None and q == 1 else 0

    def masks(self, q: int) -> dict[int | None, torch.Tensor | None]:
        """The additive attention mask of a pass of `q` new tokens, per window (None: full
        attention), aligned to the keys `update` returns; None where nothing is masked
        beyond causality (a decode step's query is the last column; SDPA applies
        `is_causal` itself to a prefill)."""
        end = self.length + q
        if end > self.capacity:
            self._grow(end)
        out: dict[int | None, torch.Tensor | None] = {}
        for window in self._kinds:
            start = self._start(window, q, end)
            if q == 1:
                out[window] = None if self._row is None else self._row[..., start:end]
                continue
            if (self.sdpa and not self.padded and self.length == 0
                    and (window is None or q <= window)):
                out[window] = None
                continue
            cols = torch.arange(start, end, device=self.device)
            rows = torch.arange(self.length, end, device=self.device)[:, None]
            ok = (cols <= rows) & self.key_ok[:, None, start:end]
            if window is not None:
                ok = ok & (cols > rows - window)
            neg = torch.finfo(self.dtype).min
            zero = torch.zeros((), dtype=self.dtype, device=self.device)
            out[window] = torch.where(ok, zero, neg)[:, None]
        return out

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's K/V at columns [length, length + q) of layer `layer_idx`; return
        the keys and values the pass attends to (views, no copy)."""
        q = key.shape[2]
        end = self.length + q
        if end > self.capacity:
            self._grow(end)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if k is None or v is None:
            shape = (key.shape[0], key.shape[1], self.capacity, key.shape[3])
            k = self.keys[layer_idx] = key.new_empty(shape)
            v = self.values[layer_idx] = value.new_empty(
                (value.shape[0], value.shape[1], self.capacity, value.shape[3]))
        k[:, :, self.length:end] = key
        v[:, :, self.length:end] = value
        window = self.windows[layer_idx]
        start = 0 if window is None else self._start(window, q, end)
        return k[:, :, start:end], v[:, :, start:end]

    def advance(self, q: int) -> None:
        self.length += q

    def select(self, index: torch.Tensor) -> None:
        """Keep only the batch rows in `index` (finished rows leave)."""
        index = index.to(self.device)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:
                    store[i] = t.index_select(0, index)
        self.key_ok = self.key_ok.index_select(0, index)
        self.padded = not bool(self.key_ok[:, : self.length].all())
        self._row = self._additive_row()

    def _grow(self, need: int) -> None:
        """Double the buffers (at least to `need` columns): rare, amortised."""
        new = max(need, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:
                    grown = t.new_empty((t.shape[0], t.shape[1], new, t.shape[3]))
                    grown[:, :, : self.length].copy_(t[:, :, : self.length])
                    store[i] = grown
        ok = torch.ones((self.key_ok.shape[0], new), dtype=torch.bool, device=self.device)
        ok[:, : self.capacity] = self.key_ok
        self.key_ok, self.capacity = ok, new
        self._row = self._additive_row()


def embed(embed_tokens: nn.Module, arch: Arch, hidden_size: int, ids: torch.Tensor
          ) -> torch.Tensor:
    """Token embeddings as the model class computes them (Gemma scales them by
    sqrt(hidden) in the model's dtype). A plain `nn.Embedding` is looked up with the call its
    forward makes, without the module call's per-step overhead."""
    if type(embed_tokens) is nn.Embedding:
        e = embed_tokens
        h = F.embedding(ids, e.weight, e.padding_idx, e.max_norm, e.norm_type,
                        e.scale_grad_by_freq, e.sparse)
    else:
        h = embed_tokens(ids)
    if arch.embed_scaled:
        h = h * torch.tensor(hidden_size**0.5, dtype=h.dtype)
    return h


def rotaries(arch: Arch, decoder: nn.Module) -> dict[str, nn.Module]:
    """The decoder's rotary embeddings keyed by the decoder-layer argument each feeds (one,
    or Gemma 3's global and local pair)."""
    return {arg: getattr(decoder, attr) for attr, arg in arch.rotary}


def run_layers(layers: Iterable[nn.Module], rotary: Mapping[str, nn.Module], h: torch.Tensor,
               position_ids: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
    """Run `layers` (cache slots 0..n-1) on hidden states `h` [B, q, d] of the next `q`
    columns, extending `cache`; `rotary` as `rotaries` gives it."""
    q = int(h.shape[1])
    masks = cache.masks(q)
    cache_position = torch.arange(cache.length, cache.length + q, device=h.device)
    pe = {arg: emb(h, position_ids) for arg, emb in rotary.items()}
    for j, layer in enumerate(layers):
        attn: Any = layer.self_attn
        attn.layer_idx = j  # the cache slot (a stage's hop may start mid-model)
        out = layer(h, attention_mask=masks[cache.windows[j]], position_ids=position_ids,
                    past_key_values=cache, cache_position=cache_position, **pe)
        h = out[0] if isinstance(out, tuple) else out  # Gemma 2's layers return a tuple
    cache.advance(q)
    return h
