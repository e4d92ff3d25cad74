"""Run a model's call tree in one Python data-stack chunk that stays put.

CPython 3.11 to 3.13 keep each thread's frames in 16 KiB chunks, mmap a new chunk when a
call does not fit in the current one, and munmap it as soon as the call that needed it
returns (python/cpython#142183; only the newest 3.13 and 3.14 releases keep one spare).
A transformers forward pass is deep and branchy: when its base sits near a chunk's end it
crosses that boundary thousands of times per batch, an mmap and an munmap (and fresh
zeroed pages) each time. The miner's engine calls, made from its worker loop, sat at such
a depth and ran 10-20% slower than the same calls from a shallow script (38,000 mmap
calls in 15 s, every one a 16 KiB chunk).

`fresh_frame_chunk` makes the wrapped call from a frame too large for any 16 KiB chunk, so
the call always opens a new, larger chunk (`ROOM_SLOTS` free slots after that frame) that
lives until it returns: one mmap per call, whatever the caller's depth.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Slots reserved by the launching frame's (unused) value stack. More than a 16 KiB chunk
# holds (2,048 slots), so it never fits in the current chunk; CPython then sizes the new
# chunk to a power of two with room for the frame plus 1,000 slots: 128 KiB here, leaving
# about 8,000 slots (64 KiB) for the call tree, several times a transformers decoder's.
ROOM_SLOTS = 8192


def _launch(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


_launch_in_fresh_chunk = types.FunctionType(
    _launch.__code__.replace(co_stacksize=ROOM_SLOTS), _launch.__globals__, "_launch")


def fresh_frame_chunk(fn: F) -> F:
    """`fn`, called from a frame that opens its own data-stack chunk (see the module)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _launch_in_fresh_chunk(fn, args, kwargs)

    return wrapper  # type: ignore[return-value]
