"""How many CPU threads torch uses in an engine process, decided once.

torch starts with one intra-op thread per core and as many inter-op threads. An engine runs
one operation at a time, so inter-op threads are never used (set to 1, which torch allows
only before the first parallel operation). Intra-op threads pay only where an operation is
large enough to split: a small model's decode step is dozens of tiny operations, each of
which then waits for every OpenMP thread, and on a core another process holds that wait
costs more than the operation (engine_speed.py measured 2 threads 10 to 60 times slower
than 1 on a busy 2-core box).

So the count is the process's: a script or role that knows it calls `set_threads` (a
verifier's `--threads`, a stage's); an engine given `threads=N` does the same; so does a
process started with `OMP_NUM_THREADS=N` (the operator's choice, which torch itself
honours: a machine shared by several engine processes); an engine given none in
a process that has not chosen times a few decode steps of its own model at 1, 2, 4 ...
threads up to the CPUs it may use (`pick_threads`) and keeps the fastest, once per process
and model width (`engine_threads`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable

import torch

from market.errors import QuarryError

OMP_ENV = "OMP_NUM_THREADS"
_INTEROP_SET = False
_CHOSEN: int | None = None  # the count this process chose (`set_threads`)
_PICKED: dict[Hashable, int] = {}


class ThreadsError(QuarryError):
    """A thread count that is not a positive integer."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all of them where none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def check_threads(threads: object) -> int | None:
    """`threads` as given to an engine: None (pick) or a positive int; ThreadsError else."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ThreadsError(f"threads must be a positive integer or None (pick), got {threads!r}")
    return threads


def set_threads(threads: int) -> None:
    """This process runs torch on `threads` intra-op threads from now on, engines loaded
    later included (those given no count keep it); ThreadsError for a bad count."""
    global _CHOSEN
    chosen = check_threads(threads)
    if chosen is None:
        raise ThreadsError("threads must be a positive integer, got None")
    _CHOSEN = chosen
    _apply(chosen)


def _apply(threads: int) -> None:
    """`threads` intra-op threads, and one inter-op thread (once: torch refuses to change
    it after parallel work began, in which case it stays as it was)."""
    global _INTEROP_SET
    torch.set_num_threads(int(threads))
    if not _INTEROP_SET:
        _INTEROP_SET = True
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass


def candidates(cpus: int) -> list[int]:
    """1, 2, 4 ... up to `cpus`, and `cpus` itself."""
    counts, n = [], 1
    while n < cpus:
        counts.append(n)
        n *= 2
    return [*counts, cpus]


def pick_threads(step: Callable[[], object], cpus: int | None = None, rounds: int = 3) -> int:
    """The thread count among `candidates` at which `step` (a few decode steps of the
    engine's own model) runs fastest: each timed up to `rounds` times, alternating, best
    time kept (a count over twice the best so far is not timed again: on a busy CPU it is
    the slow one); a count must beat every smaller one by 10% to win (fewer threads leave
    cores to the rest of the miner). Leaves that count set."""
    counts = candidates(cpus or usable_cpus())
    if len(counts) == 1:
        _apply(counts[0])
        return counts[0]
    best = {n: float("inf") for n in counts}
    for _ in range(rounds):
        fastest = min(best.values())
        for n in counts:
            if best[n] > 2 * fastest:
                continue
            _apply(n)
            t0 = time.perf_counter()
            step()
            best[n] = min(best[n], time.perf_counter() - t0)
    chosen = counts[0]
    for n in counts[1:]:
        if best[n] < 0.9 * best[chosen]:
            chosen = n
    _apply(chosen)
    return chosen


def env_threads() -> int | None:
    """The count `OMP_NUM_THREADS` sets (None where unset or empty): its first level, as
    OpenMP reads a nested list like "4,2"; ThreadsError naming it where that is not a
    positive integer."""
    raw = os.environ.get(OMP_ENV, "").strip()
    if not raw:
        return None
    first = raw.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ThreadsError(f"{OMP_ENV} must be a positive integer, got {raw!r}")
    return int(first)


def engine_threads(threads: int | None, key: Hashable, step: Callable[[], object]) -> int:
    """The count an engine runs with: `threads` where given (then the process's choice);
    else what the process chose (`set_threads`, or `OMP_NUM_THREADS` at start); else
    `pick_threads(step)` the first time this process meets `key` (a model's operation
    sizes), the same count again after."""
    if threads is None and _CHOSEN is None:
        threads = env_threads()
    if threads is not None:
        set_threads(threads)
        return threads
    if _CHOSEN is not None:
        _apply(_CHOSEN)
        return _CHOSEN
    if key not in _PICKED:
        _PICKED[key] = pick_threads(step)
    else:
        _apply(_PICKED[key])
    return _PICKED[key]
