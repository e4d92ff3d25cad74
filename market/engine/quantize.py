"""Weight-only quantisation: what the torch engines run for a miner that declares int8 or fp8.

A miner serving a model in `Precision.INT8` or `Precision.FP8` stores every linear layer's
weights in 8 bits and computes in bf16, as vLLM's weight-only schemes do on most GPUs. The
torch engines reproduce the numbers, not the memory saving: each weight is rounded to its
8-bit grid and kept in the compute dtype (`quantize_weights_`). Per output channel, with the
channel's largest magnitude as the scale:

- int8: symmetric, 255 levels, `round(w / s) * s` with s = max|w| / 127;
- fp8: e4m3 (torch.float8_e4m3fn), s = max|w| / 448 (e4m3's largest finite value).

Embeddings and the LM head stay in the compute dtype, as is usual (they are lookups, and the
head sets the logits a greedy miner ranks by). The same function turns an honest engine
into the `int8` cheating mode of `miner.cheats` (an 8-bit model served under a more exact
declaration).
"""

from __future__ import annotations

from typing import Any

from market.errors import QuarryError

SCHEMES = ("int8", "fp8")
FP8_MAX = 448.0


class QuantizeError(QuarryError):
    """An unknown quantisation scheme."""


def quantize_weights_(model: Any, scheme: str) -> int:
    """Round every linear layer's weight of `model` (in place) to `scheme`'s grid, except
    the LM head; returns how many layers were rounded."""
    import torch

    if scheme not in SCHEMES:
        raise QuantizeError(f"unknown quantisation {scheme!r}; use one of {', '.join(SCHEMES)}")
    head = model.get_output_embeddings()
    done = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or module is head:
                continue
            w = module.weight.detach().float()
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
            if scheme == "int8":
                s = scale / 127.0
                q = torch.round(w / s).clamp(-127, 127) * s
            else:
                s = scale / FP8_MAX
                q = (w / s).to(torch.float8_e4m3fn).float() * s
            module.weight.copy_(q.to(module.weight.dtype))
            done += 1
    return done
