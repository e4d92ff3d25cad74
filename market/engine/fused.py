"""The decode loop's fast path for the Llama family: the decoder layers' math in plain torch.

A decode step of a small model is mostly framework overhead: each transformers decoder
layer goes through module calls, keyword plumbing, its attention interface and a rotary
module call per step, and runs q, k, v (and gate, up) as separate matmuls. For the
architectures whose layers are the same pre-norm block (`FUSED_MODEL_TYPES`: Llama,
Mistral, Qwen 2 with its q/k/v biases, Qwen 3 with its q/k norms, Phi-3 with its partial
rotary) `FusedLayers` runs that block directly on the modules' own weights: q/k/v and
gate/up each one matmul (the weights are concatenated once, and the modules' parameters
become views of the fused tensors, so memory does not grow and in-place writes such as
`market.engine.quantize` still reach both), cos/sin tables computed once by the model's own
rotary module for every position and indexed per step, and K/V written into
`DecodeCache`'s buffers. The norms, rotation, attention (SDPA, as the modules' SDPA path
calls it, with the same masks) and residuals are the modules' formulas, op for op.

Everything else (Gemma's sliding/global layers and soft-caps, eager attention, rotary
embeddings whose tables depend on the sequence length) runs through the modules
(`market.engine.decode.run_layers`), which stays the reference the fast path is tested
against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from market.engine.decode import DecodeCache

FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})
# rotary kinds whose cos/sin at a position depend on the longest position seen
DYNAMIC_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors, as the fast path reads them."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor
    down: torch.Tensor
    qk_norm: torch.Tensor | None  # Qwen 3's q and k norms, one row per q then k head


def _fuse(modules: Sequence[nn.Linear], bias: bool) -> torch.Tensor | None:
    """One tensor of the modules' weights (or biases) stacked along the output dim; each
    module's parameter becomes a view of it."""
    parts = [m.bias if bias else m.weight for m in modules]
    if bias and any(p is None for p in parts):
        if any(p is not None for p in parts):
            raise ValueError("some of the fused projections have a bias and some do not")
        return None
    whole = torch.cat([p.detach() for p in parts])
    start = 0
    for m, p in zip(modules, parts, strict=True):
        view = nn.Parameter(whole[start:start + p.shape[0]], requires_grad=p.requires_grad)
        setattr(m, "bias" if bias else "weight", view)
        start += p.shape[0]
    return whole


def _plain_linears(*modules: Any) -> bool:
    return all(type(m) is nn.Linear for m in modules)


class FusedLayers:
    """Decoder layers of a `FUSED_MODEL_TYPES` model run in plain torch on a `DecodeCache`
    (build with `fuse_layers`, which says where it applies)."""

    def __init__(self, config: Any, layers: Sequence[nn.Module], rotary: nn.Module) -> None:
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scaling = self.head_dim ** -0.5
        self.split = (self.heads * self.head_dim, self.kv_heads * self.head_dim,
                      self.kv_heads * self.head_dim)
        self.hidden_act = getattr(config, "hidden_act", None)
        self.rotary = rotary
        self.cos = self.sin = torch.empty(0)
        self.layers: list[_Layer] = []
        self.act: Any = None
        with torch.no_grad():
            for layer in layers:
                self.layers.append(self._take(layer))

    def _take(self, layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        if hasattr(attn, "qkv_proj"):  # Phi-3 ships them fused
            qkv, qkv_bias = attn.qkv_proj.weight, attn.qkv_proj.bias
        else:
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            qkv = _fuse(projs, bias=False)
            qkv_bias = _fuse(projs, bias=True)
        if hasattr(mlp, "gate_up_proj"):
            gate_up = mlp.gate_up_proj.weight
            self.act = mlp.activation_fn
        else:
            gate_up = _fuse((mlp.gate_proj, mlp.up_proj), bias=False)
            self.act = mlp.act_fn
        assert qkv is not None and gate_up is not None
        if self.hidden_act in ("silu", "swish"):
            self.act = F.silu  # what transformers' SiLU module calls
        qk_norm = None
        if getattr(attn, "q_norm", None) is not None:
            qk_norm = torch.cat([attn.q_norm.weight[None].expand(self.heads, -1),
                                 attn.k_norm.weight[None].expand(self.kv_heads, -1)])
        return _Layer(norm1=layer.input_layernorm.weight,
                      norm2=layer.post_attention_layernorm.weight, qkv=qkv,
                      qkv_bias=qkv_bias, o=attn.o_proj.weight, o_bias=attn.o_proj.bias,
                      gate_up=gate_up, down=mlp.down_proj.weight, qk_norm=qk_norm)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNorm, op for op (fp32 statistics, weight times the cast back):
        the layers' norms and the decoder's final one. In fp32 the ops write into their own
        temporaries (same kernels, same values, fewer allocations per decode step)."""
        if x.dtype == torch.float32 == weight.dtype:  # in place on its own temporaries
            return (x * x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()).mul_(weight)
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """transformers' rotation of the first cos.shape[-1] dims of each head (all of them
        but on Phi-3's partial rotary), q * cos + cat(-q2, q1) * sin, with `sin`'s first
        half negated in the table (`_tables`) rather than q2 at every layer: a product's
        sign moves exactly, so the values are the same."""
        dim = cos.shape[-1]
        rot = x if dim == x.shape[-1] else x[..., :dim]
        half = dim // 2
        out = (rot * cos).add_(torch.cat((rot[..., half:], rot[..., :half]), dim=-1).mul_(sin))
        return out if rot is x else torch.cat((out, x[..., dim:]), dim=-1)

    def _tables(self, h: torch.Tensor, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, the first half of sin negated (`_rope`), [positions, rotary dim]
        from the model's rotary module, for positions 0..need-1 at least (a position's row
        does not depend on the others: `fuse_layers` admits no length-dependent rotary)."""
        if self.cos.shape[0] < need or self.cos.dtype != h.dtype or self.cos.device != h.device:
            n = max(need, 2 * self.cos.shape[0], 256)
            cos, sin = self.rotary(h, torch.arange(n, device=h.device)[None])
            half = sin.shape[-1] // 2
            self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)
        return self.cos, self.sin

    def run(self, h: torch.Tensor, position_ids: torch.Tensor, cache: DecodeCache,
            start: int = 0, stop: int | None = None) -> torch.Tensor:
        """`run_layers` over layers [start, stop) of this object's (cache slots from 0), on
        hidden states `h` [B, q, d] of the next `q` columns."""
        batch, q = int(h.shape[0]), int(h.shape[1])
        masks = cache.masks(q)
        need = cache.length + q
        if q > 1:
            need = max(need, int(position_ids.max()) + 1)
        cos_t, sin_t = self._tables(h, need)
        # [B, q, 1, rot]: broadcast over the heads of q and k, rotated together
        cos, sin = cos_t[position_ids][:, :, None], sin_t[position_ids][:, :, None]
        nq, nk = self.split[0], self.split[1]
        heads = self.heads + self.kv_heads
        gqa = self.heads != self.kv_heads
        for j, w in enumerate(self.layers[start:stop]):
            mask = masks[cache.windows[j]]
            x = F.linear(self.norm(h, w.norm1), w.qkv, w.qkv_bias)
            qk = x[..., : nq + nk].view(batch, q, heads, self.head_dim)
            if w.qk_norm is not None:
                qk = self.norm(qk, w.qk_norm)
            qk = self._rope(qk, cos, sin)
            k, v = cache.update(
                qk[:, :, self.heads:].transpose(1, 2),
                x[..., nq + nk:].view(batch, q, self.kv_heads, self.head_dim).transpose(1, 2),
                j)
            att = F.scaled_dot_product_attention(
                qk[:, :, : self.heads].transpose(1, 2), k, v, attn_mask=mask,
                is_causal=q > 1 and mask is None, scale=self.scaling, enable_gqa=gqa)
            # residuals added into the fresh projections (x + y is y + x, bit for bit)
            h = F.linear(att.transpose(1, 2).reshape(batch, q, nq), w.o, w.o_bias).add_(h)
            gate, up = F.linear(self.norm(h, w.norm2), w.gate_up).chunk(2, dim=-1)
            h = F.linear(self.act(gate).mul_(up), w.down).add_(h)
        cache.advance(q)
        return h


def fuse_layers(config: Any, layers: Sequence[nn.Module], rotary: Mapping[str, nn.Module],
                sdpa: bool) -> FusedLayers | None:
    """The fast path over `layers` (their q/k/v and gate/up weights fused in place), or
    None where it does not apply: an architecture outside `FUSED_MODEL_TYPES`, attention
    other than SDPA, a rotary embedding whose tables depend on the sequence length, biased
    MLPs or output projections other than Qwen 2's layout, or linear layers replaced by
    something other than `nn.Linear`."""
    if getattr(config, "model_type", None) not in FUSED_MODEL_TYPES or not sdpa:
        return None
    if set(rotary) != {"position_embeddings"}:
        return None
    emb = rotary["position_embeddings"]
    if getattr(emb, "rope_type", "default") in DYNAMIC_ROPE:
        return None
    for layer in layers:
        attn: Any = layer.self_attn
        mlp: Any = layer.mlp
        projs = ((attn.qkv_proj,) if hasattr(attn, "qkv_proj")
                 else (attn.q_proj, attn.k_proj, attn.v_proj))
        mlps = ((mlp.gate_up_proj,) if hasattr(mlp, "gate_up_proj")
                else (mlp.gate_proj, mlp.up_proj))
        if not _plain_linears(*projs, attn.o_proj, *mlps, mlp.down_proj):
            return None
        if any(m.bias is not None for m in (*mlps, mlp.down_proj)):
            return None
    return FusedLayers(config, layers, emb)
