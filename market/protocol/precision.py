"""Numeric precisions a miner may serve a model in, as the contracts number them.

A miner declares one precision per model when it registers (GPURegistry); a task may accept
only some (a bit mask, 0 accepting any); the shard records the claiming miner's declaration,
and verifiers judge its outputs against that precision's error model
(`verifier.scoring`, `market.protocol.commitments`). Serving a cheaper precision than the one
declared is cheating. Numbers run from the most exact to the least, so "at least as exact
as" is `<=`; 0 is "undeclared" and never valid.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

from market.protocol.errors import ProtocolError


class PrecisionError(ProtocolError):
    """An unknown precision name or number."""


class Precision(IntEnum):
    """The `uint8` GPURegistry, TaskRegistry and the shards use."""

    FP32 = 1
    FP16 = 2
    BF16 = 3
    FP8 = 4
    INT8 = 5

    @property
    def label(self) -> str:
        """The name configs, the CLI and the market use: fp32, fp16, bf16, fp8, int8."""
        return self.name.lower()

    @property
    def torch_dtype_name(self) -> str:
        """The dtype an engine computes in: fp8 and int8 are weight quantisations that
        compute in bf16 (as vLLM's weight-only schemes do on most GPUs)."""
        return {Precision.FP32: "float32", Precision.FP16: "float16"}.get(self, "bfloat16")


ALL_PRECISIONS = tuple(Precision)
ANY = 0
"""A task's accepted mask that accepts every precision."""


def parse_precision(value: object) -> Precision:
    """A Precision from its name ("bf16", "bfloat16", "fp32"...) or contract number."""
    if isinstance(value, Precision):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return Precision(value)
        except ValueError:
            pass
    elif isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        name = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                "bfloat16": "bf16", "float8": "fp8"}.get(name, name)
        for p in Precision:
            if p.label == name:
                return p
    names = ", ".join(p.label for p in Precision)
    raise PrecisionError(f"unknown precision {value!r}; use one of {names}")


def precision_mask(precisions: Iterable[object]) -> int:
    """The accepted-precision bit mask of a task (bit p for Precision p); empty -> ANY."""
    mask = 0
    for p in precisions:
        mask |= 1 << int(parse_precision(p))
    return mask


def accepts(mask: int, precision: object) -> bool:
    """Whether a task with accepted `mask` may be served in `precision`."""
    return mask == ANY or bool(mask >> int(parse_precision(precision)) & 1)


def mask_labels(mask: int) -> list[str]:
    """The names of the precisions `mask` accepts (every one for ANY)."""
    return [p.label for p in Precision if accepts(mask, p)]


MASK_BITS = precision_mask(ALL_PRECISIONS)
"""The bits a task's accepted mask may set (TaskRegistry.PRECISION_BITS, 0x3E)."""


def check_mask(mask: object) -> int:
    """`mask` when TaskRegistry accepts it as a task's accepted-precision mask (bits 1 to 5,
    or 0 for any), else `PrecisionError` naming the problem (the contract would revert
    `InvalidPrecisionMask`)."""
    if not isinstance(mask, int) or isinstance(mask, bool) or mask < 0 or mask & ~MASK_BITS:
        raise PrecisionError(f"a precision mask sets bits 1 (fp32) to 5 (int8), or is 0 for "
                             f"any; got {mask!r}")
    return mask
