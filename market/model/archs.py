"""The decoder architectures Quarry serves, and what each does outside its decoder layers.

Every engine runs transformers' own modules (decoder layers, norms, rotary embeddings);
this table holds only the steps a model class performs around them that a stage of a
split model must repeat itself: Gemma scales embeddings by sqrt(hidden) and its RMSNorm
computes (1 + w), Gemma 2 soft-caps the final logits, Gemma 3 gives its sliding and full
attention layers rotary embeddings of different bases, and some layers attend through a
sliding window. Keys are config.json's `model_type`: Gemma 3's text-only model
(Gemma3ForCausalLM) is "gemma3_text" ("gemma3" is the image-and-text model, not served).
Cheap to import: torch loads only where a tensor is touched.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from market.model.manifest import ModelError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Arch:
    """What a stage or the model writer must know about one `model_type`."""

    causal_lm: str  # the transformers class in config.json's "architectures"
    embed_scaled: bool = False  # the model multiplies embeddings by sqrt(hidden_size)
    norm_identity: float = 1.0  # the RMSNorm weight that leaves a vector unscaled
    # (the decoder's rotary embedding attribute, the decoder layer's argument it feeds)
    rotary: tuple[tuple[str, str], ...] = (("rotary_emb", "position_embeddings"),)


ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaForCausalLM"),
    "qwen2": Arch("Qwen2ForCausalLM"),
    "qwen3": Arch("Qwen3ForCausalLM"),
    "mistral": Arch("MistralForCausalLM"),
    "gemma2": Arch("Gemma2ForCausalLM", embed_scaled=True, norm_identity=0.0),
    # Gemma 3's embedding module scales by itself (a buffer `StageModel` fills in).
    "gemma3_text": Arch("Gemma3ForCausalLM", norm_identity=0.0,
                        rotary=(("rotary_emb", "position_embeddings_global"),
                                ("rotary_emb_local", "position_embeddings_local"))),
    "phi3": Arch("Phi3ForCausalLM"),
}
SUPPORTED_MODEL_TYPES = tuple(ARCHS)

# The tiny models' sliding window, in tokens: short enough that the tests' prompts plus a
# few decode steps pass it, so a stage that ignored the window would disagree.
TINY_SLIDING_WINDOW = 8


def arch_of(model_type: Any, where: str = "the model") -> Arch:
    """The table entry for `model_type`; one line naming it and the supported list if none."""
    arch = ARCHS.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        raise ModelError(f"{where} has model_type {model_type!r}, which Quarry does not serve "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return arch


def layer_types(config: Any) -> list[str]:
    """Each decoder layer's attention ("full_attention" or "sliding_attention"): the config's
    `layer_types` where it has them, else every layer slides when `sliding_window` is set
    (Mistral, Phi-3): the rule transformers' DynamicCache and model classes apply."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return list(types)
    sliding = getattr(config, "sliding_window", None) is not None
    return ["sliding_attention" if sliding else "full_attention"] * int(config.num_hidden_layers)


# transformers' SDPA attention copies every layer's K/V to each query head (`repeat_kv`)
# whenever a mask is given (any padded batch); this one lets SDPA group the heads itself
# (`enable_gqa`), which gives the same numbers at half the attention time on a CPU.
GQA_SDPA = "quarry_sdpa"
SDPA_KINDS = ("sdpa", GQA_SDPA)  # both apply causality themselves when given no mask


def attention_for(config: Any, requested: str | None) -> str | None:
    """The attention kernel to load: eager where the attention logits are soft-capped
    (Gemma 2), since SDPA would silently skip the cap; SDPA with native grouped-query
    attention (`GQA_SDPA`) where SDPA (transformers' default) is asked for; else what the
    caller asked."""
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "eager"
    if requested in (None, "sdpa"):
        _register_gqa_sdpa()
        return GQA_SDPA
    return requested


@functools.cache
def _register_gqa_sdpa() -> None:
    """Make `GQA_SDPA` a name transformers loads (attention and mask functions)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_SDPA, _gqa_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)


def _gqa_sdpa_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' `sdpa_attention_forward` (same mask slicing and causal rule) with the
    key/value heads grouped by SDPA instead of copied."""
    import torch

    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    if is_causal is None:
        is_causal = (query.shape[2] > 1 and attention_mask is None
                     and getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(is_causal), enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def final_logits(config: Any, logits: torch.Tensor) -> torch.Tensor:
    """The lm_head's output as the model class returns it: Gemma 2 soft-caps it
    (cap * tanh(logits / cap)); other architectures leave it as is."""
    import torch

    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def tiny_config(arch: str, base: dict[str, Any]) -> dict[str, Any]:
    """config.json of a tiny `arch` model from the Llama fields in `base` (sizes, ids),
    written out explicitly so the bytes, and so the modelId, do not vary with transformers.

    Each architecture keeps its real models' traits: Qwen 2 (as its small models) and Gemma
    tie the embeddings (a tied random model mostly repeats its last token: the residual
    stream is that token's embedding), Qwen 2 has q/k/v biases, Qwen 3 q/k norms, Mistral
    and Gemma 2 slide (Gemma 2 on every other layer, with both soft caps), Gemma 3 slides on
    every other layer too (its real models on 5 of 6) with a local rotary base of 10^4 and a
    global one of 10^6, Phi-3 fuses its projections and rotates half of each head."""
    a = arch_of(arch, f"--arch {arch}")
    cfg = dict(base)
    if arch == "llama":
        return cfg
    for key in ("attention_bias", "mlp_bias"):
        cfg.pop(key)
    cfg.update(architectures=[a.causal_lm], model_type=arch, attention_dropout=0.0)
    layers = int(cfg["num_hidden_layers"])
    if arch in ("qwen2", "qwen3"):
        cfg.update(tie_word_embeddings=arch == "qwen2", use_sliding_window=False,
                   sliding_window=None, max_window_layers=layers,
                   layer_types=["full_attention"] * layers)
        if arch == "qwen3":
            cfg["attention_bias"] = False
    elif arch == "mistral":
        cfg["sliding_window"] = TINY_SLIDING_WINDOW
    elif arch in ("gemma2", "gemma3_text"):
        cfg.pop("hidden_act")
        cfg.update(
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=cfg["head_dim"],
            sliding_window=TINY_SLIDING_WINDOW,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                         for i in range(layers)],
            attention_bias=False,
        )
        if arch == "gemma2":
            cfg.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        else:  # Gemma 3: two rotary bases, no soft-caps
            cfg.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                       attn_logit_softcapping=None, final_logit_softcapping=None,
                       use_bidirectional_attention=False)
    elif arch == "phi3":
        cfg.update(partial_rotary_factor=0.5, sliding_window=None, resid_pdrop=0.0,
                   embd_pdrop=0.0, original_max_position_embeddings=cfg["max_position_embeddings"],
                   rope_scaling=None)
    return cfg
