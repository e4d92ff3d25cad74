"""Wire format between driver and stages: one small JSON header frame plus raw tensor frames.

Why not pickle: hidden states are the bulk of the traffic, so they go as their raw bytes
(zero-copy on send), and the header (a few hundred bytes) says each tensor's dtype and shape.
A message is a zmq multipart message `[header_json, tensor_0_bytes, tensor_1_bytes, ...]`.
"""

from __future__ import annotations

import json
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class WireError(ValueError):
    """A frame that does not decode (wrong frame count, unknown dtype, size mismatch)."""


def encode(header: dict[str, Any], tensors: list[torch.Tensor] | tuple = ()) -> list[Any]:
    """Build the multipart frames for `header` and `tensors` (tensors go as raw bytes)."""
    specs = []
    frames: list[Any] = [b""]
    for t in tensors:
        if t.dtype not in _NAMES:
            raise WireError(f"cannot send tensor of dtype {t.dtype}")
        t = t.detach().to("cpu").contiguous()
        specs.append([_NAMES[t.dtype], list(t.shape)])
        # A uint8 view keeps bf16 sendable (numpy has no bf16) and avoids a copy.
        frames.append(t.view(torch.uint8).numpy().data if t.numel() else b"")
    frames[0] = json.dumps({**header, "tensors": specs}, separators=(",", ":")).encode()
    return frames


def decode(frames: list[Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Inverse of `encode`: (header, tensors). Tensors are fresh, writable copies."""
    if not frames:
        raise WireError("empty message")
    try:
        header = json.loads(bytes(getattr(frames[0], "buffer", frames[0])))
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"bad header frame: {exc}") from exc
    specs = header.pop("tensors", [])
    if len(frames) != len(specs) + 1:
        raise WireError(f"header names {len(specs)} tensors but {len(frames) - 1} frames came")
    tensors = []
    for (name, shape), frame in zip(specs, frames[1:], strict=True):
        dtype = _DTYPES.get(name)
        if dtype is None:
            raise WireError(f"unknown dtype {name!r}")
        raw = bytearray(getattr(frame, "buffer", frame))
        numel = 1
        for s in shape:
            numel *= s
        if len(raw) != numel * torch.empty((), dtype=dtype).element_size():
            raise WireError(f"tensor of shape {shape} ({name}) does not match {len(raw)} bytes")
        if numel == 0:
            tensors.append(torch.empty(shape, dtype=dtype))
        else:
            tensors.append(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape))
    return header, tensors
