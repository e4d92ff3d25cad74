"""The miner's Prometheus metrics (default registry; `miner run --metrics-port` serves them).

Updated by `miner.worker.Worker` from what it already knows at each step (no chain reads
of their own): `model` labels are the model id in hex (0x...), as the heartbeat names it.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

from market.metrics import metric

INFO = metric(Info, "quarry_miner", "This miner: its address and engine")
TOKENS = metric(Counter, "quarry_miner_tokens_generated_total",
                "Output tokens the engine generated (given-up shards included)", ["model"])
TOKENS_PER_SECOND = metric(Gauge, "quarry_miner_tokens_per_second",
                           "The latest engine batch's output tokens over its wall time",
                           ["model"])
SHARDS = metric(Counter, "quarry_miner_shards_total",
                "Shards by outcome: submitted, failed (claimed, then not submitted: the "
                "claim expires), skipped (not claimed) and finalized (paid: as for "
                "quarry_miner_wei_earned_total)", ["outcome"])
WEI_EARNED = metric(Counter, "quarry_miner_wei_earned_total",
                    "Wei paid for this miner's finalized shards (those this process "
                    "submitted, whoever finalized them, and those it finalized itself)")
CLAIM_TO_SUBMIT = metric(Histogram, "quarry_miner_claim_to_submit_seconds",
                         "Seconds from a shard's claim to its result submitted on-chain",
                         buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600))
BATCH_SIZE = metric(Histogram, "quarry_miner_engine_batch_size",
                    "Requests per engine generate call",
                    buckets=tuple(2.0 ** i for i in range(9)))  # 1 .. 256
CHALLENGES = metric(Counter, "quarry_miner_availability_challenges_total",
                    "Availability challenges of this miner: answered, or missed (slashed)",
                    ["outcome"])

SHARD_OUTCOMES = ("submitted", "failed", "skipped", "finalized")
for _outcome in SHARD_OUTCOMES:  # every series present (at 0) from the start
    SHARDS.labels(_outcome)
for _outcome in ("answered", "missed"):
    CHALLENGES.labels(_outcome)
