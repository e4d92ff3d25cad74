"""fresh_frame_chunk: a deep call tree no longer maps and unmaps a frame chunk per crossing.

The thrash shows as a page fault per crossing (each crossing maps a fresh chunk and
touches it), counted per thread with getrusage. Some caller depth in the scanned range puts
a chunk boundary inside the tree on CPython 3.11 to 3.13 (before the fix of
python/cpython#142183); wrapped, no depth does.
"""

from __future__ import annotations

import resource
import sys
import threading
from collections.abc import Callable

import pytest

from market.engine.framestack import fresh_frame_chunk

CALLS = 200


def chain(n: int) -> int:
    return chain(n - 1) if n else 0


def pad(k: int, fn: Callable[[], None]) -> None:
    """Call `fn` from `k` frames deeper: moves where the chunk boundaries fall."""
    if k:
        pad(k - 1, fn)
    else:
        fn()


def many_chains() -> None:
    for _ in range(CALLS):
        chain(30)


def worst_faults(work: Callable[[], None]) -> int:
    """The most page faults `work` took, over caller depths that cover a whole chunk."""
    worst = 0
    for base in range(0, 300, 3):
        faults: list[int] = []

        def measured(faults: list[int] = faults) -> None:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            work()
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

        thread = threading.Thread(target=pad, args=(base, measured))
        thread.start()
        thread.join()
        worst = max(worst, faults[0])
    return worst


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RUSAGE_THREAD is Linux's")
def test_a_wrapped_call_tree_does_not_remap_a_chunk_per_crossing() -> None:
    unwrapped = worst_faults(many_chains)
    wrapped = worst_faults(fresh_frame_chunk(many_chains))
    assert wrapped < 20, (unwrapped, wrapped)
    if sys.version_info < (3, 13):  # no released 3.11 or 3.12 has the fix
        assert unwrapped >= CALLS, "some depth should straddle a chunk boundary unwrapped"


def test_the_wrapper_is_transparent() -> None:
    @fresh_frame_chunk
    def f(a: int, *, b: int = 0) -> tuple[int, int]:
        """Doc."""
        if a < 0:
            raise ValueError("negative")
        return a, b

    assert f(1, b=2) == (1, 2)
    assert f.__name__ == "f" and f.__doc__ == "Doc."
    with pytest.raises(ValueError, match="negative"):
        f(-1)

