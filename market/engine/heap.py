"""Keep the garbage collector's full passes out of the generating loop.

By the time a serving process generates it holds a large heap that lives as long as the
process: the model, torch, web3, pydantic and their modules. CPython's oldest-generation
collection walks all of it, and a generating loop allocates fast enough (every tensor is a
tracked object) to start one every few jobs: in `miner run` on the embedded tiny model, a
0.2 s pause inside a 2 s shard, once every two or three shards. `freeze_startup_heap`
collects once and moves everything alive into the permanent generation (`gc.freeze()`, as
vLLM does after its warm-up), so later full passes walk only what the jobs allocated.

Call it once, at the start of a long-running process that has loaded its models; never in
a library path or a test process, where the frozen objects could not be freed by the
collector afterwards.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("startup heap frozen: %d objects out of the collector's full passes", frozen)
    return frozen
