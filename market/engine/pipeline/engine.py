"""PipelineEngine: the driver of a DeServe-style pipelined engine (DeServe section 4).

Processes. The model's decoder layers are split into S contiguous ranges, one per stage
process (`market.engine.pipeline.stage`). With `stages=S` (an int) the engine starts them
locally, each with `threads_per_stage` torch threads (default 1: several stages share the
CPU, and on a busy 2-core box two OpenMP threads per stage made a decode step of the tiny
model ~70x slower than one; raise it for big models on dedicated cores); with
`stages=[endpoint, ...]` it drives stages started by hand on other hosts; with
`stages=[StageRef, ...]` it drives a swarm's members (see swarm.py): ranges may repeat
(replicas) or overlap, and each microbatch gets its own route, a chain of (stage, layers)
covering the model chosen by Parallax Phase 2 or WS-RR (`router=`), pinned until the
microbatch is freed. The route travels in every message's header; each stage forwards to
the route's next hop. With `curve_secret`, every socket between driver and stages is CURVE
(auth.py): the stages admit only the keys in their allow files, the driver only its stages'.
The driver (this object) sits on each route's ring:

    driver --d--> hop 0 --d--> hop 1 ... hop k --d--> driver

Hidden states travel over zmq PUSH/PULL as raw tensor bytes plus a JSON header (wire.py).
Every hop, the return hop included, can get an injected one-way latency `link_latency_ms`,
applied by a sender thread that releases each message at queue time + d (delay.py), so
latency overlaps with compute as on a real link.

Scheduling. Requests are cut into microbatches (FIFO, `microbatch_size` rows each). Each
stage keeps the KV cache of its layers per microbatch id. The driver keeps N microbatches in
flight, N from `scheduler.microbatches_in_flight` on measured stage times and link latency
(about S * (1 + d / T_S)); rows that hit EOS / max_tokens leave their microbatch's caches,
and when a microbatch empties it is freed and the next one is admitted from the queue
(continuous refill). `mode="naive"` keeps S in flight (vLLM-style pipeline baseline).
Stop strings are the driver's business (the stages only see token ids): a row leaves when
its decoded text contains one, by the single-process engine's rule (`base.text_for`).

Selection. The last stage applies the final norm and lm_head to the last position and calls
`market.engine.sampling.select_next` with per-request generators it builds from the request
seeds (exactly as the single-process engine does), so only token ids and logprobs come back.

Scoring. `score` runs through the pipeline: one teacher-forced pass per microbatch, the last
stage returns log_softmax at each output position.

Failure. Local stage processes are polled and every stage heartbeats the driver. Inside
`generate`, a dead or silent stage (within `stage_timeout_s`) leaves the router and the
microbatches routed through it restart from their prompts on surviving routes (requests
are deterministic from their seeds, so outputs do not change); when no full chain is left,
and anywhere else (`score`, calibration, a stage that reports an error), StageFailedError
names the stage, after which the engine closes itself. `close()` (also the context
manager exit and an atexit hook) stops every process it started; stages also exit on their
own when their parent process disappears.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import zmq

from market.engine.base import GenerationOutput, GenerationRequest, ScoreResult
from market.engine.pipeline import wire
from market.engine.pipeline.auth import CurveServer, curve_client, public_key
from market.engine.pipeline.delay import DelayedSender
from market.engine.pipeline.errors import PipelineError, StageFailedError
from market.engine.pipeline.parts import load_config, split_layers
from market.engine.pipeline.scheduler import PipelineTimings
from market.engine.pipeline.swarm import ROUTERS, Hop, RouteChooser, StageRef
from market.engine.text import TextEngine
from market.engine.torch_engine import left_pad
from market.model.manifest import Manifest

MODES = ("microbatch", "naive")
__all__ = ["MODES", "ROUTERS", "PipelineEngine", "StageRef"]
_LIVE: weakref.WeakSet[PipelineEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for engine in list(_LIVE):
        engine.close()


@dataclass
class _Microbatch:
    id: int
    rows: list[int]  # request indices, in the order the stages' caches hold them
    hops: tuple[Hop, ...] = ()  # its route, pinned until it is freed


@dataclass
class _Stage:
    index: int
    endpoint: str = ""
    proc: subprocess.Popen | None = None
    log_path: str | None = None
    ctrl: Any = None  # zmq PUSH socket straight to the stage
    layers: tuple[int, int] = (0, 0)
    pid: int | None = None
    host: str = ""
    name: str = ""  # a swarm member's address (StageRef.name)
    public_key: str | None = None
    declared: tuple[int, int] | None = None  # the layers its StageRef says it serves
    alive: bool = True


class _Monitor:
    """Owns the driver's control socket on its own thread: heartbeats, errors, hellos.

    A separate thread (not the generate loop) so heartbeats are taken in, and judged fresh,
    even while the caller is not inside `generate`; results use another socket.
    """

    def __init__(
        self, ctx: zmq.Context, host: str, session: str, curve: CurveServer | None = None
    ) -> None:
        self.session = session
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.secure(self._sock)
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.port = port
        self.last_hb: dict[int, float] = {}
        self.ready: dict[int, dict[str, Any]] = {}
        self.announced: dict[int, str] = {}  # pid -> listen endpoint
        self.errors: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                h, _ = wire.decode(self._sock.recv_multipart())
                kind = h.get("t")
                if kind == "announce":
                    self.announced[int(h["pid"])] = str(h["listen"])
                    continue
                if h.get("s") != self.session:
                    continue  # from an earlier session of a reused stage
                stage = int(h["stage"])
                if kind in ("hb", "ready"):
                    self.last_hb[stage] = time.monotonic()
                if kind == "ready":
                    self.ready[stage] = h
                elif kind == "error":
                    self.errors.append((stage, str(h.get("msg", "unknown error"))))
        except Exception as exc:  # a dead monitor must not read as silent stages
            self.errors.append((-1, f"driver monitor failed: {exc}"))
        finally:
            self._sock.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


class PipelineEngine(TextEngine):
    """Pipelined generation over S stage processes; see the module docstring."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        stages: int | Sequence[str] | Sequence[StageRef] = 2,
        link_latency_ms: float = 0.0,
        mode: str = "microbatch",
        microbatch_size: int | None = None,
        max_microbatch_size: int = 16,
        layers: Sequence[tuple[int, int]] | None = None,
        threads_per_stage: int | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        attn_implementation: str = "sdpa",
        driver_host: str | None = None,
        driver_advertise: str | None = None,
        startup_timeout_s: float = 180.0,
        stage_timeout_s: float = 5.0,
        progress_timeout_s: float = 600.0,
        max_in_flight: int = 1024,
        min_in_flight: int = 0,
        manifest: Manifest | None = None,
        verify_manifest: bool = True,
        stop_token_ids: Iterable[int] | None = None,
        calibrate: bool = True,
        curve_secret: str | None = None,
        router: str = "parallax",
    ) -> None:
        self._closed = True  # until the processes exist: close() must be safe from here on
        self.stages: list[_Stage] = []
        self._ctx: zmq.Context | None = None
        self._pull: Any = None
        self._monitor: _Monitor | None = None
        self._data: DelayedSender | None = None  # to the first stage of the default route
        self._senders: dict[int, DelayedSender] = {}
        self._curve: CurveServer | None = None
        self._routes: RouteChooser | None = None
        self._lost: list[int] = []  # microbatches whose route lost a stage, to restart
        self._reroute = False  # True inside generate: a lost stage is routed around
        self._logdir: tempfile.TemporaryDirectory | None = None

        self.model_dir = Path(model_dir)
        if not (isinstance(link_latency_ms, int | float) and 0 <= link_latency_ms < 60_000):
            raise PipelineError(f"link_latency_ms must be in [0, 60000), got {link_latency_ms!r}")
        if microbatch_size is not None and microbatch_size < 1:
            raise PipelineError(f"microbatch_size must be >= 1, got {microbatch_size}")
        if max_microbatch_size < 1:
            raise PipelineError(f"max_microbatch_size must be >= 1, got {max_microbatch_size}")
        if attn_implementation not in ("sdpa", "eager"):
            raise PipelineError(
                f"attn_implementation must be sdpa or eager, got {attn_implementation!r}"
            )
        if dtype not in ("float32", "bfloat16", "float16"):
            raise PipelineError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.mode = mode
        self.link_latency_ms = float(link_latency_ms)
        self.microbatch_size = microbatch_size
        self.max_microbatch_size = max_microbatch_size
        self.stage_timeout_s = float(stage_timeout_s)
        self.progress_timeout_s = float(progress_timeout_s)
        self.max_in_flight = int(max_in_flight)
        self.min_in_flight = int(min_in_flight)

        if not os.path.isdir(self.model_dir):
            raise PipelineError(f"model directory {self.model_dir} does not exist")
        self.manifest = self._manifest(manifest, verify_manifest)
        self.config = load_config(self.model_dir)
        self.num_layers = int(self.config.num_hidden_layers)
        self.vocab_size = int(self.config.vocab_size)
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.tokenizer = self._load_tokenizer()
        # Stop tokens and the pad id follow the single-process engine's rules exactly.
        self.stop_token_ids = (
            frozenset(int(t) for t in stop_token_ids)
            if stop_token_ids is not None
            else self._stop_ids()
        )
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = min(self.stop_token_ids) if self.stop_token_ids else 0
        self.pad_id = int(pad)

        if router not in ROUTERS:
            raise PipelineError(f"router must be one of {ROUTERS}, got {router!r}")
        self.router = router
        remote = not isinstance(stages, int)
        refs: list[StageRef] = []
        if remote:
            items = list(stages)  # type: ignore[arg-type]
            if not items:
                raise PipelineError("stages: give a stage count or a non-empty endpoint list")
            if all(isinstance(e, StageRef) for e in items):
                refs = list(items)  # type: ignore[arg-type]
                endpoints = [r.endpoint for r in refs]
            elif all(isinstance(e, str) for e in items):
                endpoints = [str(e) for e in items]
            else:
                raise PipelineError("stages: give endpoint strings or StageRefs, not a mix")
            self.num_stages = len(endpoints)
            self._check_curve(refs, curve_secret)
        else:
            if curve_secret is not None:
                raise PipelineError("curve_secret needs remote stages (StageRefs with keys)")
            self.num_stages = int(stages)  # type: ignore[arg-type]
            ranges = (
                [tuple(r) for r in layers]
                if layers is not None
                else split_layers(self.num_layers, self.num_stages)
            )
            self._check_ranges(ranges)  # type: ignore[arg-type]
        self.timings = PipelineTimings(self.num_stages, configured_latency_s=link_latency_ms / 1000)
        self.swarm = bool(refs)  # replicas and routes allowed; otherwise one contiguous chain
        self.curve_secret = curve_secret
        self.session = uuid.uuid4().hex[:12]
        self._mb_ids = itertools.count(1)
        self._broken: BaseException | None = None
        if threads_per_stage is not None and threads_per_stage < 1:
            raise PipelineError(f"threads_per_stage must be >= 1, got {threads_per_stage}")
        self.threads_per_stage = threads_per_stage or 1

        # Two driver sockets: results (read by generate) and control (read by the monitor).
        host = driver_host or ("0.0.0.0" if remote else "127.0.0.1")
        advertise = driver_advertise or (socket.getfqdn() if host in ("0.0.0.0", "*") else host)
        self._ctx = zmq.Context()
        self._closed = False
        _LIVE.add(self)
        try:
            if curve_secret is not None:
                # Only the stages' keys may reach the driver's result and control sockets.
                self._curve = CurveServer(
                    self._ctx, curve_secret, allow=[r.public_key for r in refs if r.public_key]
                )
            self._pull = self._ctx.socket(zmq.PULL)
            self._pull.setsockopt(zmq.LINGER, 0)
            self._pull.setsockopt(zmq.RCVHWM, 0)
            if self._curve is not None:
                self._curve.secure(self._pull)
            data_port = self._pull.bind_to_random_port(f"tcp://{host}")
            self._monitor = _Monitor(self._ctx, host, self.session, self._curve)
            self.result_address = f"tcp://{advertise}:{data_port}"
            self.control_address = f"tcp://{advertise}:{self._monitor.port}"
            if refs:
                self.stages = [
                    _Stage(
                        i,
                        endpoint=r.endpoint,
                        name=r.name,
                        public_key=r.public_key,
                        declared=r.layers,
                    )
                    for i, r in enumerate(refs)
                ]
            elif remote:
                self.stages = [
                    _Stage(i, endpoint=e, name=f"stage{i}") for i, e in enumerate(endpoints)
                ]
            else:
                self._spawn(ranges, device, dtype, attn_implementation, startup_timeout_s)  # type: ignore[arg-type]
            self._hello(startup_timeout_s)
            if calibrate:
                self.calibrate()
        except BaseException:
            self.close()
            raise

    # -- setup --------------------------------------------------------------------------
    @staticmethod
    def _check_curve(refs: Sequence[StageRef], secret: str | None) -> None:
        """All stages keyed and a driver key, or no keys at all (plain TCP, trusted hosts)."""
        keyed = [r for r in refs if r.public_key]
        if keyed and len(keyed) != len(refs):
            plain = next(r.name for r in refs if not r.public_key)
            raise PipelineError(f"stage {plain} has no CURVE public key while others do")
        if keyed and secret is None:
            raise PipelineError("the stages use CURVE keys: pass curve_secret (the driver's key)")
        if secret is not None and not keyed:
            raise PipelineError("curve_secret given but no stage has a CURVE public key")
        if secret is not None:
            public_key(secret)  # checks its shape

    def _manifest(self, manifest: Manifest | None, verify: bool) -> Manifest | None:
        """The model's manifest (given, or the directory's own if it has one), verified.

        Stages read the weights themselves; the driver checks the files once, up front.
        A directory without a manifest is accepted (then `model_id` is unavailable).
        """
        from market.model.manifest import load_manifest, manifest_path

        path = Path(self.model_dir)
        if manifest is None and manifest_path(path).is_file():
            manifest = load_manifest(path)
        if manifest is not None and verify:
            manifest.verify(path)
        return manifest

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(
                self.model_dir, local_files_only=True, trust_remote_code=False
            )
        except (OSError, ValueError) as exc:
            raise PipelineError(f"cannot load the tokenizer in {self.model_dir}: {exc}") from exc

    def _stop_ids(self) -> frozenset[int]:
        """generation_config.json's eos, else config.json's, else the tokenizer's."""
        from transformers import GenerationConfig

        try:
            gen = GenerationConfig.from_pretrained(self.model_dir, local_files_only=True)
        except OSError:
            gen = None
        for source in (gen, self.config):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                return frozenset([eos] if isinstance(eos, int) else [int(e) for e in eos])
        if self.tokenizer.eos_token_id is not None:
            return frozenset([int(self.tokenizer.eos_token_id)])
        return frozenset()

    def _check_ranges(self, ranges: Sequence[tuple[int, int]]) -> None:
        if len(ranges) != self.num_stages:
            raise PipelineError(f"{len(ranges)} layer ranges for {self.num_stages} stages")
        expect = 0
        for k, (a, b) in enumerate(ranges):
            if a != expect or b <= a:
                raise PipelineError(
                    f"stage {k} layers {a}:{b}: ranges must be contiguous and non-empty, "
                    f"covering 0:{self.num_layers}"
                )
            expect = b
        if expect != self.num_layers:
            raise PipelineError(f"layer ranges end at {expect}, the model has {self.num_layers}")

    def _spawn(
        self, ranges: Sequence[tuple[int, int]], device: str, dtype: str, attn: str, timeout: float
    ) -> None:
        self._logdir = tempfile.TemporaryDirectory(prefix="quarry-pipeline-")
        env = dict(os.environ)
        threads = str(self.threads_per_stage)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
        for k, (a, b) in enumerate(ranges):
            log_path = os.path.join(self._logdir.name, f"stage{k}.log")
            cmd = [
                sys.executable,
                "-m",
                "market.engine.pipeline.stage",
                "--model",
                str(self.model_dir),
                "--layers",
                f"{a}:{b}",
                "--listen",
                "tcp://127.0.0.1:*",
                "--threads",
                threads,
                "--device",
                device,
                "--dtype",
                dtype,
                "--attn-implementation",
                attn,
                "--announce",
                self.control_address,
                "--parent-pid",
                str(os.getpid()),
            ]
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # Ctrl-C reaches the driver, which closes us
                )
            self.stages.append(
                _Stage(
                    k, proc=proc, log_path=log_path, layers=(a, b), pid=proc.pid, name=f"stage{k}"
                )
            )
        assert self._monitor is not None
        deadline = time.monotonic() + timeout
        while any(not s.endpoint for s in self.stages):
            self._check_processes()
            if time.monotonic() > deadline:
                late = [s.index for s in self.stages if not s.endpoint]
                raise StageFailedError(late[0], f"did not start within {timeout:.0f}s")
            time.sleep(0.05)
            for s in self.stages:
                s.endpoint = self._monitor.announced.get(s.pid or -1, "")

    def _hello(self, timeout: float) -> None:
        assert self._ctx is not None
        for s in self.stages:
            s.ctrl = self._ctx.socket(zmq.PUSH)
            s.ctrl.setsockopt(zmq.LINGER, 0)
            curve_client(s.ctrl, self.curve_secret, s.public_key)
            s.ctrl.connect(s.endpoint)
        d = self.link_latency_ms
        driver_key = public_key(self.curve_secret) if self.curve_secret else None
        for s in self.stages:
            s.ctrl.send_multipart(
                wire.encode(
                    {
                        "t": "hello",
                        "s": self.session,
                        "stage": s.index,
                        "stages": self.num_stages,
                        "driver": self.control_address,
                        "ret": self.result_address,
                        "driver_key": driver_key,
                        "latency_ms": d,
                    }
                )
            )
        assert self._monitor is not None
        deadline = time.monotonic() + timeout
        while len(self._monitor.ready) < self.num_stages:
            self._check_processes()
            self._check_errors()
            if time.monotonic() > deadline:
                k = min(set(range(self.num_stages)) - set(self._monitor.ready))
                why = " (is the driver's CURVE key in its allow file?)" if self.curve_secret else ""
                raise StageFailedError(
                    k, f"no answer from {self.stages[k].endpoint} within {timeout:.0f}s{why}"
                )
            time.sleep(0.05)
        for s in self.stages:
            h = self._monitor.ready[s.index]
            s.layers, s.pid, s.host = (int(h["start"]), int(h["end"])), int(h["pid"]), h["host"]
            if int(h["num_layers"]) != self.num_layers:
                raise PipelineError(
                    f"stage {s.index} serves a model with {h['num_layers']} layers, "
                    f"the driver's has {self.num_layers}"
                )
            if s.declared is not None and s.layers != s.declared:
                raise PipelineError(
                    f"stage {s.index} ({s.name}) serves layers {s.layers[0]}:{s.layers[1]}, "
                    f"its StageRef says {s.declared[0]}:{s.declared[1]}"
                )
        if self.swarm:
            uncovered = [
                layer
                for layer in range(self.num_layers)
                if not any(a <= layer < b for a, b in (s.layers for s in self.stages))
            ]
            if uncovered or any(s.layers[1] > self.num_layers for s in self.stages):
                raise PipelineError(
                    f"the stages do not cover the model's layers 0:{self.num_layers} "
                    f"(layer {uncovered[0] if uncovered else self.num_layers} is missing)"
                )
        else:
            self._check_ranges([s.layers for s in self.stages])
        self._routes = RouteChooser(
            {s.index: s.layers for s in self.stages},
            num_layers=self.num_layers,
            hidden_size=int(self.config.hidden_size),
            bytes_per_layer=_layer_bytes(self.config),
            kv_bytes_per_token_per_layer=_kv_bytes(self.config),
            hop_latency_s=d / 1000.0,
            router=self.router,
        )
        self._data = self._sender(self._routes.best()[0].stage)

    def _sender(self, stage: int) -> DelayedSender:
        """The driver's (delayed) data sender to one stage, made on first use."""
        sender = self._senders.get(stage)
        if sender is None:
            assert self._ctx is not None
            s = self.stages[stage]
            sender = DelayedSender(
                self._ctx,
                s.endpoint,
                self.link_latency_ms / 1000.0,
                f"stage{stage}",
                curve=(self.curve_secret, s.public_key),
            )
            self._senders[stage] = sender
        return sender

    # -- liveness -----------------------------------------------------------------------
    def _log_tail(self, s: _Stage) -> str:
        if not s.log_path or not os.path.exists(s.log_path):
            return ""
        with open(s.log_path, "rb") as f:
            lines = [ln for ln in f.read()[-4000:].decode(errors="replace").splitlines() if ln]
        return f"; last log line: {lines[-1].strip()}" if lines else ""

    def _check_processes(self) -> None:
        for s in self.stages:
            if s.alive and s.proc is not None and s.proc.poll() is not None:
                rc = s.proc.returncode
                how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
                self._stage_lost(s, f"process {s.proc.pid} {how}{self._log_tail(s)}")

    def _stage_lost(self, s: _Stage, reason: str) -> None:
        """A dead or silent stage: route around it inside generate, else fail naming it.

        Routing around drops the stage from the router and queues the microbatches that ran
        through it for a restart (`self._lost`); requests are deterministic from their
        seeds, so a restarted row produces the same tokens.
        """
        if not self._reroute or self._routes is None:
            raise StageFailedError(s.index, reason)
        s.alive = False
        self._lost.extend(self._routes.remove(s.index))
        if not self._routes.covers():
            raise StageFailedError(
                s.index, f"{reason}; no full chain of live stages is left ({s.name})"
            )

    def _check_errors(self) -> None:
        assert self._monitor is not None
        if self._monitor.errors:
            stage, msg = self._monitor.errors.pop(0)
            if stage < 0:
                raise PipelineError(msg)
            raise StageFailedError(stage, msg)

    def _check_alive(self) -> None:
        assert self._monitor is not None
        self._check_processes()
        self._check_errors()
        now = time.monotonic()
        for s in self.stages:
            silent = now - self._monitor.last_hb.get(s.index, 0.0)
            if s.alive and silent > self.stage_timeout_s:
                self._stage_lost(
                    s,
                    f"no heartbeat from {s.endpoint} for {silent:.1f}s (unreachable, hung or dead)",
                )

    def _ensure_open(self) -> None:
        if self._broken is not None:
            raise PipelineError(
                f"pipeline engine is unusable after an earlier failure: {self._broken}"
            )
        if self._closed:
            raise PipelineError("pipeline engine is closed")

    # -- messaging ----------------------------------------------------------------------
    def _route_header(self, hops: Sequence[Hop]) -> list[list[Any]]:
        """The route as it travels: [endpoint, public key, start, end] per hop."""
        return [
            [self.stages[h.stage].endpoint, self.stages[h.stage].public_key, h.start, h.end]
            for h in hops
        ]

    def _send(
        self,
        header: dict[str, Any],
        tensors: Sequence[torch.Tensor] = (),
        hops: Sequence[Hop] | None = None,
    ) -> None:
        """Send a message along `hops` (default: the route a new microbatch would get)."""
        assert self._routes is not None
        route = tuple(hops) if hops is not None else self._routes.best()
        header = {
            **header,
            "s": self.session,
            "times": [],
            "sent": time.monotonic(),
            "route": self._route_header(route),
            "hop": 0,
        }
        self._sender(route[0].stage).send(wire.encode(header, list(tensors)))

    def _drop(self, mb: _Microbatch) -> None:
        """Tell the live stages of a lost microbatch's route to forget it (no forwarding)."""
        for h in mb.hops:
            s = self.stages[h.stage]
            if s.alive and s.ctrl is not None:
                try:
                    s.ctrl.send_multipart(
                        wire.encode({"t": "drop", "mb": mb.id, "s": self.session}),
                        flags=zmq.NOBLOCK,
                    )
                except zmq.ZMQError:
                    pass

    def _next_result(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The next result; a lost stage raises StageFailedError (rerouting is off here)."""
        got = self._wait_result()
        if got is None:  # only with rerouting on, which its caller handles
            raise PipelineError("a stage was lost while rerouting was on")
        return got

    def _wait_result(self) -> tuple[dict[str, Any], list[torch.Tensor]] | None:
        """Wait for the next result from a last stage, watching every stage's health.

        None (only while rerouting is on) means a stage was lost: see `self._lost`.
        """
        deadline = time.monotonic() + self.progress_timeout_s
        next_check = 0.0
        while True:
            now = time.monotonic()
            if now >= next_check:
                self._check_alive()
                if self._lost:
                    return None
                next_check = now + 0.1
            if now > deadline:
                raise PipelineError(f"no pipeline progress for {self.progress_timeout_s:.0f}s")
            if not self._pull.poll(100):
                continue
            h, tensors = wire.decode(self._pull.recv_multipart(copy=False))
            if h.get("t") == "result" and h.get("s") == self.session:
                return h, tensors

    def _run_guarded(self, fn: Any, *args: Any) -> Any:
        """Any failure mid-run leaves stage state unknown: close everything, then re-raise."""
        self._ensure_open()
        try:
            return fn(*args)
        except BaseException as exc:  # KeyboardInterrupt included: never leave processes behind
            self._broken = exc
            self.close()
            raise

    # -- calibration --------------------------------------------------------------------
    def calibrate(self, steps: int = 4) -> dict[str, float]:
        """Time one lone microbatch (1 row) through the ring: per-stage time and per-hop latency.

        With nothing else in flight, round trip - compute = hops * (one-way hop latency).
        """
        return self._run_guarded(self._calibrate, steps)

    def _calibrate(self, steps: int) -> dict[str, float]:
        assert self._routes is not None
        mb = next(self._mb_ids)
        route = self._routes.best()
        hops = len(route) + 1
        prompt = [i % self.vocab_size for i in range(1, 9)]
        ids, _, _ = left_pad([prompt], self.pad_id)
        self._send(
            {"t": "prefill", "mb": mb, "lens": [len(prompt)], "sp": [[0.0, 1.0, 0, steps + 1]]},
            [ids],
            route,
        )
        per_hop: list[float] = []
        stage_samples: list[list[float]] = []
        for i in range(steps + 1):
            h, (tok, _) = self._next_result()
            rtt = time.monotonic() - float(h["sent"])
            if i > 0:  # decode steps only: prefill is not what the pipe runs in steady state
                per_hop.append(max(0.0, rtt - sum(h["times"])) / hops)
                stage_samples.append([float(t) for t in h["times"]])
            if i < steps:
                self._send({"t": "decode", "mb": mb}, [tok.view(-1, 1)], route)
        self._send({"t": "free", "mb": mb}, (), route)
        per_hop.sort()
        self.timings.set_hop_latency(per_hop[len(per_hop) // 2])
        for sample in stage_samples:
            self._observe(route, sample)
        return self.stats()

    def _observe(self, route: Sequence[Hop], times: Sequence[float]) -> None:
        assert self._routes is not None
        self.timings.observe_at([h.stage for h in route], times)
        self._routes.observe(route, times)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise PipelineError(f"mode must be one of {MODES}, got {value!r}")
        self._mode = value

    def set_link_latency(self, link_latency_ms: float, calibrate: bool = True) -> dict[str, Any]:
        """Change the injected one-way latency on every hop, between runs, then re-measure.

        Sent in-band along the ring, so each stage switches in order with the data.
        """
        if not (isinstance(link_latency_ms, int | float) and 0 <= link_latency_ms < 60_000):
            raise PipelineError(f"link_latency_ms must be in [0, 60000), got {link_latency_ms!r}")
        return self._run_guarded(self._set_link_latency, float(link_latency_ms), calibrate)

    def _set_link_latency(self, ms: float, calibrate: bool) -> dict[str, Any]:
        mb = next(self._mb_ids)
        # A tour of every live stage, in order, then back: each switches in turn.
        tour = [Hop(s.index, *s.layers) for s in self.stages if s.alive]
        self._send({"t": "latency", "mb": mb, "latency_ms": ms}, (), tour)
        for sender in self._senders.values():
            sender.delay_s = ms / 1000.0
        if self._routes is not None:
            self._routes.hop_latency_s = ms / 1000.0
        while int(self._next_result()[0]["mb"]) != mb:
            pass
        self.link_latency_ms = ms
        self.timings = PipelineTimings(self.num_stages, configured_latency_s=ms / 1000.0)
        return self._calibrate(4) if calibrate else self.stats()

    def stats(self) -> dict[str, Any]:
        """What the scheduler currently believes (for logs and benchmarks)."""
        return {
            "stage_ms": [round(t * 1000, 3) for t in self.timings.stage_s],
            "bottleneck_stage_ms": round((self.timings.bottleneck_s or 0) * 1000, 3),
            "hop_latency_ms": round(self.timings.link_latency_s * 1000, 3),
            "driver_ms": round(self.timings.driver_s * 1000, 3),
            "in_flight": self._target(),
        }

    # -- generate -----------------------------------------------------------------------
    def _target(self) -> int:
        """Microbatches to keep in flight now: the scheduler's count, floored at
        `min_in_flight` in microbatch mode (e.g. to oversubscribe CPU cores shared by stages).
        A swarm runs the count over the route a microbatch would take now, times the number
        of chains that can run side by side (replicas of its least-replicated layer)."""
        if self.swarm and self._routes is not None and self._routes.covers():
            chain = [h.stage for h in self._routes.best()]
            n = self.timings.in_flight(
                self.mode, self.max_in_flight, chain=chain, width=self._routes.width
            )
            self._routes.slots = max(1, n // max(1, self._routes.width))
        else:
            n = self.timings.in_flight(self.mode, self.max_in_flight)
        return (
            max(n, min(self.min_in_flight, self.max_in_flight)) if self.mode == "microbatch" else n
        )

    def _pick_microbatch_size(self, pending: int) -> int:
        if self.microbatch_size is not None:
            return self.microbatch_size
        n = self._target()
        return max(1, min(self.max_microbatch_size, math.ceil(pending / n)))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        self._ensure_open()
        reqs = list(requests)
        for i, r in enumerate(reqs):
            self.validate_request(i, r)
        if not reqs:
            return []
        return self._run_guarded(self._generate, reqs)

    def _generate(self, reqs: list[GenerationRequest]) -> list[GenerationOutput]:
        self._reroute = True
        try:
            return self._generate_routed(reqs)
        finally:
            self._reroute = False
            self._lost.clear()

    def _generate_routed(self, reqs: list[GenerationRequest]) -> list[GenerationOutput]:
        assert self._routes is not None
        routes = self._routes
        tokens: list[list[int]] = [[] for _ in reqs]
        logprobs: list[list[float]] = [[] for _ in reqs]
        reasons: list[str] = ["length"] * len(reqs)
        texts: list[str | None] = [None] * len(reqs)  # set where a stop string cut the text
        queue = collections.deque(i for i, r in enumerate(reqs) if r.max_tokens > 0)
        size = self._pick_microbatch_size(len(queue))
        inflight: dict[int, _Microbatch] = {}
        self.last_run: dict[str, Any] = {
            "microbatch_size": size,
            "max_in_flight": 0,  # most microbatches actually in flight at once
            "target_max": 0,  # largest count the scheduler asked for during the run
            "microbatches": 0,
            "restarted": 0,  # microbatches restarted on another route after a stage was lost
            "routes": {},  # route (stage indices) -> microbatches admitted on it
            "hops": {},  # route -> its hops [(stage, start, end), ...]
            "step_s": {},  # stage index -> each decode step's time there (for calibration)
        }
        while queue or inflight:
            target = self._target()
            self.last_run["target_max"] = max(self.last_run["target_max"], target)
            while queue and len(inflight) < target:
                rows = [queue.popleft() for _ in range(min(size, len(queue)))]
                mb = _Microbatch(next(self._mb_ids), rows)
                mb.hops = routes.acquire(mb.id, max(reqs[r].max_tokens for r in rows))
                key = "-".join(str(h.stage) for h in mb.hops)
                self.last_run["routes"][key] = self.last_run["routes"].get(key, 0) + 1
                self.last_run["hops"][key] = [(h.stage, h.start, h.end) for h in mb.hops]
                inflight[mb.id] = mb
                ids, _, _ = left_pad([reqs[r].prompt_ids for r in rows], self.pad_id)
                sp = [
                    [reqs[r].temperature, reqs[r].top_p, reqs[r].seed, reqs[r].max_tokens]
                    for r in rows
                ]
                self._send(
                    {
                        "t": "prefill",
                        "mb": mb.id,
                        "lens": [len(reqs[r].prompt_ids) for r in rows],
                        "sp": sp,
                    },
                    [ids],
                    mb.hops,
                )
                self.last_run["microbatches"] += 1
            self.last_run["max_in_flight"] = max(self.last_run["max_in_flight"], len(inflight))
            got = self._wait_result()
            if got is None:  # a stage was lost: restart its microbatches from their prompts
                lost, self._lost = self._lost, []
                for mb_id in sorted(lost, reverse=True):
                    lost_mb = inflight.pop(mb_id, None)
                    if lost_mb is None:
                        continue
                    self._drop(lost_mb)
                    for r in lost_mb.rows:
                        tokens[r], logprobs[r] = [], []
                    queue.extendleft(reversed(lost_mb.rows))
                    self.last_run["restarted"] += 1
                continue
            h, tensors = got
            t0 = time.perf_counter()
            mb_or_none = inflight.get(int(h["mb"]))
            if mb_or_none is None or h.get("kind") not in ("prefill", "decode"):
                continue  # e.g. the calibration probe's tail, or a restarted microbatch's
            mb = mb_or_none
            if h["kind"] == "decode":
                self._observe(mb.hops, h["times"])
                for hop, t in zip(mb.hops, h["times"], strict=False):
                    self.last_run["step_s"].setdefault(hop.stage, []).append(float(t))
            routes.step(mb.id)
            toks, lps = tensors
            keep: list[int] = []
            for j, r in enumerate(mb.rows):
                tok = int(toks[j])
                tokens[r].append(tok)
                logprobs[r].append(float(lps[j]))
                if tok in self.stop_token_ids:
                    reasons[r] = "stop"
                    continue
                if reqs[r].stop:
                    text, stopped = self.output_text(tokens[r], reqs[r].stop)
                    if stopped:
                        reasons[r], texts[r] = "stop", text
                        continue
                if len(tokens[r]) < reqs[r].max_tokens:
                    keep.append(j)
            if not keep:
                del inflight[mb.id]
                routes.release(mb.id)
                self._send({"t": "free", "mb": mb.id}, (), mb.hops)
            else:
                header: dict[str, Any] = {"t": "decode", "mb": mb.id}
                if len(keep) < len(mb.rows):
                    header["keep"] = keep
                self._send(header, [toks[keep].view(-1, 1)], mb.hops)
                mb.rows = [mb.rows[j] for j in keep]
            self.timings.observe_driver(time.perf_counter() - t0)
        return [
            GenerationOutput(
                token_ids=tuple(tokens[i]),
                text=self.decode(tokens[i]) if texts[i] is None else str(texts[i]),
                logprobs=tuple(logprobs[i]),
                finish_reason=reasons[i],
            )
            for i in range(len(reqs))
        ]

    # -- score --------------------------------------------------------------------------
    def score(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[ScoreResult]:
        self._ensure_open()
        rows = [(list(p), list(o)) for p, o in self.validate_score_inputs(prompt_ids, output_ids)]
        if not rows:
            return []
        return self._run_guarded(self._score, rows)

    def _score(self, rows: list[tuple[list[int], list[int]]]) -> list[ScoreResult]:
        assert self._routes is not None
        size = self._pick_microbatch_size(len(rows))
        target = self._target()
        chunks = [list(range(i, min(i + size, len(rows)))) for i in range(0, len(rows), size)]
        results: dict[int, ScoreResult] = {}
        pending: dict[int, list[int]] = {}
        nxt = 0
        while nxt < len(chunks) or pending:
            while nxt < len(chunks) and len(pending) < target:
                idx = chunks[nxt]
                nxt += 1
                mb = next(self._mb_ids)
                pending[mb] = idx
                full = [rows[i][0] + rows[i][1] for i in idx]
                ids, _, _ = left_pad(full, self.pad_id)
                hops = self._routes.acquire(mb, 1)
                self._send(
                    {
                        "t": "score",
                        "mb": mb,
                        "lens": [len(f) for f in full],
                        "targets": [rows[i][1] for i in idx],
                    },
                    [ids],
                    hops,
                )
            h, (lp, am) = self._next_result()
            idx_or_none = pending.pop(int(h["mb"]), None)
            if idx_or_none is None:
                continue
            self._routes.release(int(h["mb"]))
            off = 0
            for i in idx_or_none:
                n = len(rows[i][1])
                results[i] = ScoreResult(
                    logprobs=tuple(float(x) for x in lp[off : off + n]),
                    argmax_ids=tuple(int(x) for x in am[off : off + n]),
                )
                off += n
        return [results[i] for i in range(len(rows))]

    # -- teardown -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop stage processes we started (release hand-started ones) and free sockets."""
        if self._closed and not self.stages and self._ctx is None:
            return
        self._closed = True
        _LIVE.discard(self)
        for sender in self._senders.values():
            sender.close()
        self._senders = {}
        self._data = None
        for s in self.stages:
            if s.ctrl is not None:
                try:
                    kind = "shutdown" if s.proc is not None else "release"
                    s.ctrl.send_multipart(wire.encode({"t": kind, "s": self.session}),
                                          flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        deadline = time.monotonic() + 2.0
        for s in self.stages:
            if s.proc is None:
                continue
            try:
                s.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.terminate()
                try:
                    s.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait(timeout=5.0)
        for s in self.stages:
            if s.ctrl is not None:
                s.ctrl.close(linger=0)
                s.ctrl = None
        self.stages = []
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        if self._pull is not None:
            self._pull.close(linger=0)
            self._pull = None
        if self._curve is not None:
            self._curve.close()
            self._curve = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None

    @property
    def stage_pids(self) -> list[int | None]:
        """Process ids of the stages (local or, as reported, remote)."""
        return [s.pid for s in self.stages]

    def __enter__(self) -> PipelineEngine:
        return self

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _kv_bytes(config: Any) -> int:
    """KV cache bytes per token per layer (fp32), for the router's load model."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * kv_heads * head_dim * 4


def _layer_bytes(config: Any) -> int:
    """Weight bytes of one decoder layer (fp32): attention projections plus the MLP."""
    h = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    kv = _kv_bytes(config) // 8
    attn = 2 * h * heads * head_dim + 2 * h * kv
    mlp = 3 * h * int(config.intermediate_size)
    return 4 * (attn + mlp)
