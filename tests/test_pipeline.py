"""The pipelined engine against the single-process reference, with real stage processes.

Every test runs real forward passes of the tiny model (4 layers) in separate stage processes
(one torch thread per stage, the engine default).
"""

from __future__ import annotations

import _thread
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from market.engine.base import GenerationRequest
from market.engine.factory import load_engine
from market.engine.pipeline.engine import PipelineEngine
from market.engine.pipeline.errors import PipelineError, StageFailedError
from market.engine.pipeline.parts import StageModel
from market.engine.torch_engine import EngineError, TorchEngine
from market.model.create import create_model

pytestmark = pytest.mark.timeout(240)

# 2 is the model's EOS; 480 is a frequent token of this seed's greedy outputs, added as a
# stop token so some rows stop early (mid-microbatch) in both engines.
STOP = {2, 480}

PROMPTS = [
    (5, 6, 7, 8, 9, 10),
    (11, 12),
    (13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24),
    (30,),
    (40, 41, 42, 43),
    (7, 7, 7, 9, 100, 200, 300),
    (250, 3),
]
MAX_TOKENS = [12, 20, 5, 16, 1, 9, 0]


def greedy_requests() -> list[GenerationRequest]:
    return [GenerationRequest(p, m) for p, m in zip(PROMPTS, MAX_TOKENS, strict=True)]


def sampled_requests() -> list[GenerationRequest]:
    return [
        GenerationRequest(p, 10, temperature=t, top_p=tp, seed=seed)
        for p, t, tp, seed in zip(
            PROMPTS[:5],
            [1.0, 0.7, 1.3, 1.0, 0.9],
            [1.0, 0.9, 1.0, 0.5, 0.95],
            [1, 2, 3, 4, 5],
            strict=True,
        )
    ]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pipe") / "tiny"
    create_model(d, layers=4, hidden=64, seed=1)
    return d


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict:
    ref = TorchEngine(model_dir, stop_token_ids=STOP)
    greedy = ref.generate(greedy_requests())
    sampled = ref.generate(sampled_requests())
    scored = ref.score([r.prompt_ids for r in sampled_requests()], [o.token_ids for o in sampled])
    return {"greedy": greedy, "sampled": sampled, "score": scored}


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda s: f"{s}stages")
def engine(request: pytest.FixtureRequest, model_dir: Path):
    # through the factory, as miners build it
    with load_engine(
        "pipeline", model_dir, stages=request.param, microbatch_size=2, stop_token_ids=STOP
    ) as e:
        assert isinstance(e, PipelineEngine)
        pids = list(e.stage_pids)
        assert len(pids) == request.param
        yield e
    assert all(_gone(p) for p in pids)  # close() left no stage process behind


def test_a_stage_holds_only_its_own_layers(model_dir: Path) -> None:
    middle = StageModel(str(model_dir), 1, 3)
    assert len(middle.layers) == 2 and middle.embed_tokens is None and middle.lm_head is None
    assert middle.config.num_hidden_layers == 2  # its cache and masks size to 2 layers
    last = StageModel(str(model_dir), 3, 4)
    assert last.embed_tokens is None and last.lm_head is not None and last.norm is not None
    first = StageModel(str(model_dir), 0, 1)
    assert first.embed_tokens is not None and first.lm_head is None
    n_params = sum(p.numel() for p in middle.parameters())
    assert n_params == 2 * sum(p.numel() for p in first.layers[0].parameters())


def test_reference_exercises_stop_and_length(reference: dict) -> None:
    reasons = {o.finish_reason for o in reference["greedy"]}
    assert reasons == {"stop", "length"}
    assert reference["greedy"][-1].token_ids == ()  # max_tokens=0


def test_greedy_matches_single_process(engine: PipelineEngine, reference: dict) -> None:
    out = engine.generate(greedy_requests())
    assert engine.last_run["microbatches"] == 3  # 6 live requests, 2 per microbatch
    for got, want in zip(out, reference["greedy"], strict=True):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.text == want.text
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_sampling_is_reproducible_and_matches_single_process(
    engine: PipelineEngine, reference: dict
) -> None:
    first = engine.generate(sampled_requests())
    again = engine.generate(sampled_requests())
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert [o.token_ids for o in first] == [o.token_ids for o in reference["sampled"]]
    greedy_view = [
        o.token_ids
        for o in engine.generate(
            [GenerationRequest(r.prompt_ids, r.max_tokens) for r in sampled_requests()]
        )
    ]
    assert greedy_view != [o.token_ids for o in first]  # sampling actually departed from greedy


def test_score_through_the_pipeline(engine: PipelineEngine, reference: dict) -> None:
    prompts = [r.prompt_ids for r in sampled_requests()] + [(9, 9)]
    outputs = [o.token_ids for o in reference["sampled"]] + [()]
    got = engine.score(prompts, outputs)
    for g, w in zip(got, reference["score"], strict=False):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        assert g.argmax_ids == w.argmax_ids
    assert got[-1].logprobs == ()
    # teacher forcing reproduces what generation recorded (logprobs are untempered)
    for g, o in zip(got, reference["sampled"], strict=False):
        assert g.logprobs == pytest.approx(o.logprobs, abs=1e-4)


def test_bad_input_is_rejected_before_anything_is_sent(engine: PipelineEngine) -> None:
    with pytest.raises(EngineError, match="empty prompt"):
        engine.generate([GenerationRequest((), 3)])
    with pytest.raises(EngineError, match="outside"):
        engine.generate([GenerationRequest((10**6,), 3)])
    with pytest.raises(EngineError, match="top_p"):
        engine.generate([GenerationRequest((5,), 3, temperature=1.0, top_p=0.0)])
    with pytest.raises(EngineError, match="pair up"):
        engine.score([(5,)], [])
    assert engine.generate([]) == []
    assert engine.generate([GenerationRequest((5, 6), 2)])[0].token_ids  # still usable


def test_latency_raises_microbatch_count_and_killed_stage_is_named(
    model_dir: Path, reference: dict
) -> None:
    engine = PipelineEngine(
        model_dir, stages=2, link_latency_ms=25, microbatch_size=1, stop_token_ids=STOP
    )
    pids = list(engine.stage_pids)
    try:
        # 3 hops of 25 ms against millisecond stages: the formula asks for many microbatches
        assert engine.stats()["in_flight"] > 2
        assert engine.stats()["hop_latency_ms"] >= 25
        out = engine.generate(greedy_requests())
        assert [o.token_ids for o in out] == [o.token_ids for o in reference["greedy"]]
        assert engine.last_run["max_in_flight"] == 6  # all six live requests at once

        # the same processes as the naive pipeline: one microbatch per stage in flight
        engine.mode = "naive"
        assert engine.stats()["in_flight"] == 2
        out = engine.generate(greedy_requests())
        assert engine.last_run["max_in_flight"] == 2
        assert [o.token_ids for o in out] == [o.token_ids for o in reference["greedy"]]

        # latency switched in-band and re-measured: the count follows it down
        engine.mode = "microbatch"
        high = engine.stats()["in_flight"]
        low = engine.set_link_latency(0)
        assert low["hop_latency_ms"] < 25 and low["in_flight"] < high
        engine.set_link_latency(25)

        long = [GenerationRequest(p, 400) for p in PROMPTS] * 2  # ~400 steps of >= 75 ms
        killer = threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        with pytest.raises(StageFailedError, match="stage 1 failed.*killed by signal 9") as info:
            engine.generate(long)
        killer.join()
        assert info.value.stage == 1
        assert all(_gone(p) for p in pids)  # stage 0 was shut down too
        with pytest.raises(PipelineError, match="unusable"):
            engine.generate(greedy_requests())
    finally:
        engine.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hand_started_stages_and_heartbeat_loss(model_dir: Path, reference: dict) -> None:
    ports = [_free_port(), _free_port()]
    endpoints = [f"tcp://127.0.0.1:{p}" for p in ports]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "market.engine.pipeline.stage",
                "--model",
                str(model_dir),
                "--layers",
                layers,
                "--listen",
                ep,
                "--threads",
                "1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for layers, ep in zip(["0:3", "3:4"], endpoints, strict=True)
    ]
    try:
        with PipelineEngine(
            model_dir,
            stages=endpoints,
            driver_host="127.0.0.1",
            stage_timeout_s=3.0,
            microbatch_size=3,
            stop_token_ids=STOP,
        ) as engine:
            assert [s.layers for s in engine.stages] == [(0, 3), (3, 4)]
            out = engine.generate(greedy_requests())
            assert [o.token_ids for o in out] == [o.token_ids for o in reference["greedy"]]

            # a stage that errors reports it, named
            engine._send({"t": "decode", "mb": 10**9}, [torch.zeros((1, 1), dtype=torch.long)])
            with pytest.raises(StageFailedError, match="stage 0 failed.*unknown microbatch"):
                engine._next_result()

        # released, not shut down: the same stage processes serve a new driver session
        with PipelineEngine(
            model_dir,
            stages=endpoints,
            driver_host="127.0.0.1",
            stage_timeout_s=3.0,
            microbatch_size=2,
            stop_token_ids=STOP,
        ) as engine:
            out = engine.generate(greedy_requests())
            assert [o.token_ids for o in out] == [o.token_ids for o in reference["greedy"]]

            # a remote stage that vanishes is noticed by its missing heartbeats
            long = [GenerationRequest(p, 900) for p in PROMPTS] * 4
            killer = threading.Timer(1.0, procs[1].kill)
            killer.start()
            with pytest.raises(StageFailedError, match="stage 1 failed: no heartbeat") as info:
                engine.generate(long)
            killer.join()
            assert info.value.stage == 1
        assert procs[0].poll() is None  # a hand-started stage is released, not killed
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_ctrl_c_cleans_up(model_dir: Path) -> None:
    engine = PipelineEngine(model_dir, stages=1, link_latency_ms=20, calibrate=False)
    pids = list(engine.stage_pids)
    interrupter = threading.Timer(1.0, _thread.interrupt_main)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        engine.generate([GenerationRequest(p, 500) for p in PROMPTS])
    interrupter.join()
    assert all(_gone(p) for p in pids)
    with pytest.raises(PipelineError):
        engine.generate([GenerationRequest((5,), 1)])
