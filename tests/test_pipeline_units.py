"""Pure-logic tests of the pipelined engine: scheduler formula, wire format, delayed sender,
layer splitting, swarm keys and routes. No model, no stage processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import zmq

from market.engine.pipeline import wire
from market.engine.pipeline.auth import (
    public_key,
    read_allow_file,
    stage_keypair,
    write_allow_file,
)
from market.engine.pipeline.delay import DelayedSender
from market.engine.pipeline.errors import PipelineError
from market.engine.pipeline.parts import mask_from_lengths, parse_layers, positions_from_mask
from market.engine.pipeline.parts import split_layers as split
from market.engine.pipeline.scheduler import PipelineTimings, microbatches_in_flight
from market.engine.pipeline.swarm import RouteChooser, StageRef, coverage_width
from market.engine.torch_engine import left_pad
from market.scheduler.parallax_phase2 import NoRouteError


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


# -- swarm: keys, allow lists, stage refs, routes -------------------------------------------


def test_stage_keypair_is_deterministic_and_a_real_curve_pair() -> None:
    pub, sec = stage_keypair(b"\x01" * 32)
    assert (pub, sec) == stage_keypair(b"\x01" * 32)
    assert stage_keypair(b"\x02" * 32)[0] != pub
    assert public_key(sec) == pub and len(pub) == len(sec) == 40
    with pytest.raises(PipelineError, match="32-byte"):
        stage_keypair(b"short")


def test_allow_file_round_trip_and_bad_lines_are_named(tmp_path: Path) -> None:
    keys = [stage_keypair(bytes([i]) * 32)[0] for i in range(1, 4)]
    path = write_allow_file(tmp_path / "allow", keys)
    assert read_allow_file(path) == frozenset(keys)
    path.write_text(keys[0] + "\nnot-a-key\n")
    with pytest.raises(PipelineError, match=r"allow:2: 'not-a-key' is not a 40-character"):
        read_allow_file(path)


def test_stage_ref_rejects_bad_fields() -> None:
    with pytest.raises(PipelineError, match="not tcp://"):
        StageRef("m", "http://h:1", (0, 4))
    with pytest.raises(PipelineError, match="bad layer range 4:4"):
        StageRef("m", "tcp://h:1", (4, 4))
    with pytest.raises(PipelineError, match="public key"):
        StageRef("m", "tcp://h:1", (0, 4), "short")


def _chooser(ranges: dict[int, tuple[int, int]], router: str = "parallax") -> RouteChooser:
    return RouteChooser(ranges, num_layers=8, hidden_size=64, bytes_per_layer=100_000,
                        kv_bytes_per_token_per_layer=512, router=router)


@pytest.mark.parametrize("router", ["parallax", "wsrr"])
def test_routes_spread_over_replicas_and_avoid_a_removed_stage(router: str) -> None:
    routes = _chooser({0: (0, 4), 1: (0, 4), 2: (4, 8), 3: (4, 8)}, router)
    assert routes.width == 2
    chains = [tuple(h.stage for h in routes.acquire(mb, 10)) for mb in range(4)]
    assert all(c[0] in (0, 1) and c[1] in (2, 3) for c in chains)
    assert len({c[0] for c in chains}) == 2 and len({c[1] for c in chains}) == 2  # both used
    lost = routes.remove(1)
    assert sorted(lost) == [mb for mb, c in enumerate(chains) if 1 in c]
    assert all(h.stage != 1 for h in routes.acquire(9, 10))
    routes.remove(0)
    assert not routes.covers()
    with pytest.raises(NoRouteError, match="no live stage holds layer 0"):
        routes.best()


def test_overlapping_stages_route_a_sub_range() -> None:
    routes = _chooser({0: (0, 6), 1: (4, 8)})
    hops = routes.best()
    assert [h.stage for h in hops] == [0, 1]
    assert hops[0].start == 0 and hops[0].end == hops[1].start and hops[1].end == 8
    assert coverage_width([(0, 6), (4, 8)], 8) == 1 and coverage_width([(0, 6)], 8) == 0


def test_swarm_in_flight_counts_the_chain_times_its_width() -> None:
    t = PipelineTimings(stages=4, configured_latency_s=0.0)
    assert t.in_flight("microbatch", chain=[0, 2], width=2) == 4  # nothing measured yet
    t.observe_at([0, 2], [0.010, 0.010])
    assert t.in_flight("microbatch", chain=[0, 2], width=2) == 4  # 2 per chain, 2 chains
    t.configured_latency_s = 0.010
    assert t.in_flight("microbatch", chain=[0, 2], width=2) == 10  # ceil(50 / 10) * 2
    assert t.in_flight("naive", chain=[0, 2], width=2) == 4
