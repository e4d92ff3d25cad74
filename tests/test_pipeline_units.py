"""Pure-logic tests of the pipelined engine: scheduler formula, wire format, delayed sender,
layer splitting. No model, no stage processes."""

from __future__ import annotations

import time

import pytest
import torch
import zmq

from market.engine.pipeline import wire
from market.engine.pipeline.delay import DelayedSender
from market.engine.pipeline.errors import PipelineError
from market.engine.pipeline.parts import mask_from_lengths, parse_layers, positions_from_mask
from market.engine.pipeline.parts import split_layers as split
from market.engine.pipeline.scheduler import PipelineTimings, microbatches_in_flight
from market.engine.torch_engine import left_pad


def test_deserve_figure_2c_example() -> None:
    # 4 stages, link latency T_S / 2, DeServe's ring of S hops: two extra microbatches.
    assert microbatches_in_flight(4, 0.010, 0.005) == 6


def test_no_latency_needs_only_one_per_stage() -> None:
    assert microbatches_in_flight(4, 0.010, 0.0) == 4
    assert microbatches_in_flight(1, 0.010, 0.0) == 1


def test_in_flight_grows_with_latency_and_shrinks_with_stage_time() -> None:
    counts = [microbatches_in_flight(4, 0.005, d / 1000, hops=5) for d in (0, 4, 16, 64)]
    assert counts == sorted(counts) and counts[0] == 4 and counts[-1] > counts[1]
    # S * (1 + d / T_S) with hops = S: 4 * (1 + 64 / 5) = 55.2 -> 56
    assert microbatches_in_flight(4, 0.005, 0.064) == 56
    # the driver hop adds d / T_S more: 4 + 5 * 64 / 5 = 68
    assert microbatches_in_flight(4, 0.005, 0.064, hops=5) == 68
    slow = microbatches_in_flight(4, 0.050, 0.064, hops=5)
    assert 4 < slow < 68


def test_unbalanced_stages_use_the_sum_of_stage_times() -> None:
    # cycle = (1 + 1 + 1 + 4) ms + 0 latency; bottleneck 4 ms -> ceil(7/4) = 2, floored at S
    assert microbatches_in_flight(4, 0.004, 0.0, stage_times_s=[0.001] * 3 + [0.004]) == 4
    n = microbatches_in_flight(4, 0.004, 0.020, hops=5, stage_times_s=[0.001] * 3 + [0.004])
    assert n == 27  # ceil((7 + 100) / 4)


def test_in_flight_is_capped_and_rejects_bad_input() -> None:
    assert microbatches_in_flight(4, 0.0001, 1.0, max_in_flight=64) == 64
    with pytest.raises(ValueError, match="stage time"):
        microbatches_in_flight(4, 0.0, 0.01)
    with pytest.raises(ValueError, match="stages"):
        microbatches_in_flight(0, 0.01, 0.01)


def test_timings_drive_the_count_from_measurements() -> None:
    t = PipelineTimings(stages=4, configured_latency_s=0.016)
    assert t.in_flight("microbatch") == 4  # nothing measured yet: start like the naive pipe
    t.observe_stages([0.004, 0.004, 0.004, 0.004])
    assert t.in_flight("microbatch") == 4 + 20  # 4 + 5 hops * 16 / 4
    assert t.in_flight("naive") == 4
    t.set_hop_latency(0.032)  # measured latency above the configured one wins
    assert t.in_flight("microbatch") == 4 + 40
    for _ in range(200):  # stages got slower: fewer microbatches fill the same latency
        t.observe_stages([0.008] * 4)
    assert t.in_flight("microbatch") == 4 + 20
    with pytest.raises(ValueError, match="mode"):
        t.in_flight("bogus")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_wire_roundtrip(dtype: torch.dtype) -> None:
    x = (torch.randn(3, 5, 7) * 100).to(dtype)
    frames = wire.encode({"t": "decode", "mb": 7, "keep": [0, 2]}, [x, torch.zeros(0)])
    header, (y, empty) = wire.decode([bytes(f) for f in frames])
    assert header == {"t": "decode", "mb": 7, "keep": [0, 2]}
    assert y.dtype == dtype and torch.equal(x, y) and empty.numel() == 0
    y += 1  # decoded tensors are writable copies


def test_wire_rejects_mismatched_frames() -> None:
    frames = [bytes(f) for f in wire.encode({"t": "x"}, [torch.ones(4)])]
    with pytest.raises(wire.WireError, match="frames"):
        wire.decode(frames[:1])
    with pytest.raises(wire.WireError, match="bytes"):
        wire.decode([frames[0], frames[1][:-4]])
    with pytest.raises(wire.WireError, match="header"):
        wire.decode([b"not json"])


def test_delayed_sender_keeps_order_and_never_delivers_early() -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    sender = DelayedSender(ctx, f"tcp://127.0.0.1:{port}", 0.05, "test")
    try:
        sent = {}
        for i in range(5):
            sent[i] = time.monotonic()
            sender.send(wire.encode({"i": i}))  # returns at once: the delay is off-thread
        got = []
        for _ in range(5):
            assert pull.poll(5000)
            h, _ = wire.decode(pull.recv_multipart())
            got.append(h["i"])
            assert time.monotonic() - sent[h["i"]] >= 0.05
        assert got == [0, 1, 2, 3, 4]
    finally:
        sender.close()
        pull.close(linger=0)
        ctx.term()


def test_split_layers_and_ranges() -> None:
    assert split(4, 1) == [(0, 4)]
    assert split(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(PipelineError, match="cannot split"):
        split(2, 3)
    assert parse_layers("2:5") == (2, 5)
    for bad in ("5:2", "x", "1:1", "-1:2"):
        with pytest.raises(PipelineError, match="layer range"):
            parse_layers(bad)


def test_stage_masks_and_positions_match_the_reference_padding() -> None:
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    _, mask, positions = left_pad(prompts, 0)
    stage_mask = mask_from_lengths([3, 1, 5], 5)
    assert torch.equal(stage_mask, mask)
    assert torch.equal(positions_from_mask(stage_mask, 5), positions)
    grown = torch.cat([stage_mask, torch.ones(3, 1, dtype=torch.long)], 1)
    assert positions_from_mask(grown, 1).flatten().tolist() == [3, 1, 5]
