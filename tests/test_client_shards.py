"""The SDK's default shard size: at most what the slowest live miner that reported its speed
ends within half a claim window (four shards claimed together), a fixed cap while none has
said; miners that are not alive, or that sent no usable speed, do not count (pure logic)."""

from __future__ import annotations

from client.sdk import (
    UNMEASURED_SHARD_SIZE,
    MinerOffer,
    ModelOffer,
    _speed,
    shard_fit,
)


def offer(*miners: MinerOffer) -> ModelOffer:
    return ModelOffer(b"\x11" * 32, "m", miners)


def test_the_slowest_live_miner_sets_the_size() -> None:
    fast = MinerOffer("0xa", 1, True, seconds_per_token=0.001)
    slow = MinerOffer("0xb", 1, True, seconds_per_token=0.01)
    asleep = MinerOffer("0xc", 1, False, seconds_per_token=1.0)  # not alive: not counted
    # 0.5 x 600 s / (0.01 s x 25 tokens x 4 shards in flight) = 300
    assert shard_fit(offer(fast, slow, asleep), 25, 600) == 300
    assert shard_fit(offer(fast), 25, 600) == 3000
    assert shard_fit(offer(MinerOffer("0xd", 1, True, seconds_per_token=1e3)), 25, 600) == 1
    assert shard_fit(offer(asleep), 25, 600) == UNMEASURED_SHARD_SIZE
    assert shard_fit(offer(MinerOffer("0xe", 1, True)), 25, 600) == UNMEASURED_SHARD_SIZE


def test_a_heartbeats_speed_is_used_only_when_it_is_a_positive_number() -> None:
    assert _speed({"secondsPerToken": 0.002}) == 0.002
    for bad in (None, {}, {"secondsPerToken": 0}, {"secondsPerToken": -1},
                {"secondsPerToken": "fast"}, {"secondsPerToken": True},
                {"secondsPerToken": float("nan")}, ["secondsPerToken"]):
        assert _speed(bad) is None, bad
