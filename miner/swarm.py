"""A miner as a swarm member: one model served across several miners' GPUs (`[miner] swarm =
true`; `miner run` then runs this instead of the single-miner loop alone).

Every member, every `heartbeat_interval_s`:

1. sends the signed join/heartbeat (`MarketAPI.swarm_join`): its memory cap, declared speed
   (`tflops`), stage endpoint, CURVE public key (`stage_keypair` of its Ethereum key, so the
   market binds the key to its address), ask, and the round-trip times it measured to the
   other members' stage endpoints (TCP connect time);
2. fetches the plan (`MarketAPI.swarm_plan`) and, on a new version, checks it before loading
   anything (`check_plan`: every layer covered, its own range within its memory cap, the
   consent terms naming the plan's members and head); a bad plan is logged and ignored;
3. runs its stage process (`python -m market.engine.pipeline.stage`) for its range: kept on
   an unchanged range, restarted on a changed one, stopped on standby; the stage's allow
   file (the CURVE public keys that may connect) is rewritten to the plan members' keys,
   which the stage re-reads without a restart;
4. signs the plan's `SwarmConsent` with its current on-chain nonce and posts it; it signs
   again when its nonce moved (a registration used it) while the plan is unregistered.

The head (the plan names it) also waits for every consent, registers the swarm on-chain
(`GPURegistry.register_swarm`), reports the id (`MarketAPI.swarm_registered`), and then
works as a single miner does (`miner.worker.Worker`, unchanged) with two differences: it
claims with `claim_shard_for_swarm` for the registered swarm, and its engine is a
`SwarmEngine`: a `PipelineEngine` over the members' stages (their endpoints, ranges and
public keys; the head's own CURVE secret), rebuilt whenever the plan changes. On a
re-plan the head claims nothing until the new swarm is registered; shards the old swarm
claimed run on (they are paid by the old swarm's fixed shares) over the new plan's stages.
A batch that fails because a stage died or the plan moved under it is run again once on
the newest plan (outputs are deterministic from the requests' seeds); when that fails
too, the worker's standard rule applies: the shards fail, their claims expire and are
reclaimed with the standard penalty, and the head goes on with the next shard.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from market.engine.base import GenerationOutput, GenerationRequest, ScoreResult
from market.engine.text import TextEngine
from market.errors import QuarryError
from market.marketapi import MarketAPI, MarketError
from market.protocol.precision import Precision
from miner.worker import ClaimUnavailable

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.client import TxResult
    from market.chain.deploy import Quarry
    from market.local.processes import ManagedProcess
    from market.model.manifest import Manifest
    from market.protocol.eip712 import SwarmConsent
    from market.scheduler.cluster import ModelSpec
    from miner.config import MinerConfig
    from miner.register import ServedModel
    from miner.worker import Worker

log = logging.getLogger("miner")

RTT_TIMEOUT_S = 1.0
"""A member whose stage does not accept a TCP connection within this is reported at it."""
STAGE_MODULE = "market.engine.pipeline.stage"
ENGINE_RETRY_WAIT_S = 30.0
"""How long a batch that failed on a dead or moved stage waits for a newer plan's pipeline
before it is given up (the claim's standard rule then applies)."""

WARM_ATTEMPTS = 10
"""Connections the head tries to a new plan's stages (members restart theirs meanwhile)."""


class PlanError(QuarryError):
    """The market's plan cannot be served as given (a gap, a range over the memory cap...)."""


class SwarmUnavailable(ClaimUnavailable):
    """The head has no registered swarm to claim for right now (forming, or re-planning)."""


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlanMember:
    address: str
    endpoint: str
    public_key: str
    layers: tuple[int, int]
    memory_mib: int


@dataclass(frozen=True)
class SwarmPlan:
    """`GET /swarms/{model_id}/plan`, typed."""

    model_id: bytes
    version: int
    algorithm: str
    num_layers: int
    head: str
    members: tuple[PlanMember, ...]
    standby: tuple[str, ...]
    terms: Mapping[str, Any]
    swarm_id: int | None
    raw: Mapping[str, Any]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SwarmPlan:
        from eth_utils import to_checksum_address

        try:
            members = tuple(
                PlanMember(to_checksum_address(m["address"]), str(m["endpoint"]),
                           str(m["public_key"]), (int(m["layers"][0]), int(m["layers"][1])),
                           int(m["memory_mib"]))
                for m in d["members"])
            swarm_id = d.get("swarm_id")
            return cls(bytes.fromhex(str(d["model_id"]).removeprefix("0x")), int(d["version"]),
                       str(d["algorithm"]), int(d["num_layers"]), to_checksum_address(d["head"]),
                       members, tuple(to_checksum_address(a) for a in d.get("standby", ())),
                       dict(d["terms"] or {}), None if swarm_id is None else int(swarm_id), dict(d))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PlanError(f"malformed swarm plan: {type(exc).__name__}: {exc}") from exc

    def member(self, address: str) -> PlanMember | None:
        return next((m for m in self.members if m.address == address), None)

    def consent(self) -> SwarmConsent:
        """The SwarmConsent of the plan's terms (nonce 0: each member signs with its own)."""
        from market.protocol.messages import swarm_terms_consent

        if not self.terms:
            raise PlanError(f"swarm plan {self.version} has no consent terms (a swarm needs 2 "
                            "to 16 serving members)")
        try:
            return swarm_terms_consent(self.terms)
        except (QuarryError, KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"swarm plan {self.version}: malformed terms: {exc}") from exc


def check_plan(plan: SwarmPlan, me: str, *, model_id: bytes, model: ModelSpec,
               memory_mib: int, ask: int = 0) -> PlanMember | None:
    """This member's entry of `plan` (None on standby) after checking what serving it
    relies on: the planner's own rules (`market.scheduler.live.check_plan`: every layer
    covered, its range within what `memory_mib` holds with the KV room the market reserves)
    and the consent terms it is about to sign (the plan's model, members and head, each
    member's share = the layers it serves, a price of at least this member's `ask`): the
    market is not trusted, so terms that would move pay are refused here, before signing.
    PlanError naming the first problem otherwise."""
    from market.scheduler.live import check_plan as planner_check

    v = f"swarm plan {plan.version}"
    if plan.model_id != model_id:
        raise PlanError(f"{v} is for model 0x{plan.model_id.hex()}, this member serves "
                        f"0x{model_id.hex()}")
    try:
        planner_check(plan.raw, model, me, memory_mib)
    except QuarryError as exc:
        raise PlanError(f"{v}: {exc}") from exc
    if plan.member(plan.head) is None:
        raise PlanError(f"{v}: head {plan.head} is not a member")
    consent = plan.consent()
    listed = sorted((m.address for m in plan.members), key=lambda a: int(a, 16))
    if list(consent.members) != listed or consent.head != plan.head \
            or consent.model_id != model_id:
        raise PlanError(f"{v}: its consent terms do not name the plan's members, head and "
                        "model")
    served = {m.address: m.layers[1] - m.layers[0] for m in plan.members}
    if list(consent.shares) != [served[m] for m in consent.members]:
        raise PlanError(f"{v}: its consent shares {list(consent.shares)} are not the layers "
                        f"each member serves {[served[m] for m in consent.members]}")
    if consent.price_per_token < ask:
        raise PlanError(f"{v}: its consent price {consent.price_per_token} wei/token is below "
                        f"this member's ask of {ask}")
    return plan.member(me)


def measure_rtts(endpoints: Mapping[str, str],
                 timeout_s: float = RTT_TIMEOUT_S) -> dict[str, float]:
    """Seconds to open a TCP connection to each `tcp://host:port` (address -> endpoint);
    one that does not answer counts as `timeout_s`."""
    out: dict[str, float] = {}
    for address, endpoint in endpoints.items():
        u = urlsplit(endpoint)
        start = time.perf_counter()
        try:
            with socket.create_connection((u.hostname or "127.0.0.1", u.port or 0), timeout_s):
                out[address] = time.perf_counter() - start
        except OSError:
            out[address] = timeout_s
    return out


def measure_tflops() -> float:
    """This machine's fp32 matmul speed, TFLOP/s (a few small products on the configured
    device's CPU fallback): the speed a member declares when `tflops` is not set."""
    import torch

    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    start = time.perf_counter()
    reps = 8
    for _ in range(reps):
        torch.mm(a, b)
    return max(1e-6, 2 * n**3 * reps / (time.perf_counter() - start) / 1e12)


# ---------------------------------------------------------------------------- the stage
class StageProcess:
    """This member's stage process: started for a layer range, kept while the range stays,
    restarted when it moves; its CURVE secret and allow file live in `state_dir`."""

    def __init__(self, model_dir: Path, listen: str, secret: str, state_dir: Path,
                 extra_args: Sequence[str] = ()) -> None:
        self.model_dir = model_dir
        self.listen = listen
        self.extra_args = list(extra_args)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.secret_file = state_dir / "stage-curve.secret"
        self.allow_file = state_dir / "stage-allow.txt"
        self.log_path = state_dir / "stage.log"
        _write_private(self.secret_file, secret + "\n")
        self.proc: ManagedProcess | None = None
        self.layers: tuple[int, int] | None = None

    def allow(self, public_keys: Sequence[str]) -> None:
        """Only these keys may connect (the stage re-reads the file when it changes)."""
        text = "".join(f"{k}\n" for k in sorted(set(public_keys)))
        if not self.allow_file.exists() or self.allow_file.read_text() != text:
            _write_private(self.allow_file, text)

    def serve(self, layers: tuple[int, int] | None) -> bool:
        """Run the stage for `layers` (None: none); True when it was (re)started."""
        if layers == self.layers and (layers is None or self.alive()):
            return False
        self.stop()
        if layers is None:
            return False
        from market.local.processes import spawn

        cmd = [sys.executable, "-m", STAGE_MODULE, "--model", str(self.model_dir),
               "--layers", f"{layers[0]}:{layers[1]}", "--listen", self.listen,
               "--curve-secret-file", str(self.secret_file),
               "--allow-file", str(self.allow_file), *self.extra_args]
        self.proc = spawn(cmd, name=f"stage {layers[0]}:{layers[1]}", log_path=self.log_path)
        self.layers = layers
        log.info("stage for layers %d:%d started on %s (log %s)", *layers, self.listen,
                 self.log_path)
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            log.info("stage for layers %d:%d stopped", *(self.layers or (0, 0)))
        self.proc, self.layers = None, None


STAGE_FLAGS = {"device": "--device", "dtype": "--dtype",
               "attn_implementation": "--attn-implementation", "threads_per_stage": "--threads"}
"""`[miner.engine_options]` keys a member's own stage process takes as flags too."""


def stage_args(engine_options: Mapping[str, Any]) -> list[str]:
    """The stage command's flags for the configured engine options (device, dtype...)."""
    return [arg for key, flag in STAGE_FLAGS.items() if key in engine_options
            for arg in (flag, str(engine_options[key]))]


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (a CURVE secret; the allow file alike)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- the engine
class SwarmEngine(TextEngine):
    """The head's engine: a PipelineEngine over the current plan's stages, built on first
    use after each plan change. Tokenizing and request checks are the model's own (the
    head has the model directory), so shards are checked before any stage is up."""

    def __init__(self, model_dir: Path, manifest: Manifest, curve_secret: str, *,
                 router: str = "parallax", driver_host: str = "127.0.0.1",
                 retry_wait_s: float = ENGINE_RETRY_WAIT_S, **options: Any) -> None:
        from transformers import AutoTokenizer

        from market.engine.pipeline.parts import load_config

        self.model_dir = Path(model_dir)
        self.manifest = manifest
        config = load_config(self.model_dir)
        self.vocab_size = int(config.vocab_size)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.curve_secret = curve_secret
        self.router = router
        self.driver_host = driver_host
        self.retry_wait_s = retry_wait_s
        self.options = {"startup_timeout_s": 30.0, **options}
        self._lock = threading.Condition()
        self._build = threading.Lock()
        # Held while a batch runs: a stage serves one driver session at a time, so a new
        # plan's pipeline says hello (and the old one is closed) only between batches.
        self._batch = threading.Lock()
        self._retired: list[Any] = []  # replaced pipelines, closed before the next connects
        self.building: int | None = None  # the plan version of the pipeline built last
        self._plan: SwarmPlan | None = None
        self._engine: Any = None
        self._engine_version: int | None = None

    def use(self, plan: SwarmPlan, warm: bool = False) -> None:
        """Serve the next batches over `plan`'s stages; `warm`: connect to them now, in the
        background (the head: a member killed later then fails a batch within the stage
        timeout, rather than a connection attempt within the startup timeout)."""
        with self._lock:
            self._plan = plan
            self._lock.notify_all()
        if warm:
            threading.Thread(target=self._warm, args=(plan.version,), name="swarm-engine-warm",
                             daemon=True).start()

    def _warm(self, version: int) -> None:
        """Connect to plan `version`'s stages, trying again while members are still
        (re)starting theirs; given up once the plan moves (the first batch tries too)."""
        from market.engine.pipeline.errors import PipelineError

        for attempt in range(WARM_ATTEMPTS):
            with self._lock:
                if self._plan is None or self._plan.version != version:
                    return
            try:
                with self._batch:
                    self._current()
                return
            except (PipelineError, SwarmUnavailable) as exc:
                if attempt == WARM_ATTEMPTS - 1:
                    log.warning("swarm engine: cannot reach plan %d's stages: %s", version, exc)
                time.sleep(1.0)

    def _current(self) -> tuple[Any, int]:
        """(the PipelineEngine of the newest plan, its version), built here when the plan
        moved, one build at a time, with `_batch` held (no batch running): the engine it
        replaces is closed first, so the stages it shares with the new one are released
        before the new one says hello. A failed build's plan is in `building`."""
        with self._build:
            with self._lock:
                plan = self._plan
                if plan is None:
                    raise SwarmUnavailable("no swarm plan yet")
                if self._engine is not None and self._engine_version == plan.version:
                    return self._engine, plan.version
                if self._engine is not None:
                    self._retired.append(self._engine)
                self._engine, self._engine_version = None, None
                self.building = plan.version
            self._close_retired()
            return self._connect(plan), plan.version

    def _close_retired(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, []
        for engine in retired:
            engine.close()

    def _connect(self, plan: SwarmPlan) -> Any:
        from market.engine.pipeline.engine import PipelineEngine, StageRef

        stages = [StageRef(name=m.address, endpoint=m.endpoint, layers=m.layers,
                           public_key=m.public_key) for m in plan.members]
        engine = PipelineEngine(self.model_dir, stages=stages, curve_secret=self.curve_secret,
                                router=self.router, driver_host=self.driver_host,
                                manifest=self.manifest, verify_manifest=False, **self.options)
        with self._lock:
            self._engine, self._engine_version = engine, plan.version
        log.info("swarm engine: pipeline over plan %d (%s)", plan.version, ", ".join(
            f"{m.address[:10]} {m.layers[0]}:{m.layers[1]}" for m in plan.members))
        return engine

    def _newer_plan(self, than: int | None) -> bool:
        """Wait up to `retry_wait_s` for a plan other than version `than`."""
        with self._lock:
            return self._lock.wait_for(lambda: self._plan is not None
                                       and self._plan.version != than, self.retry_wait_s)

    def _connected(self) -> tuple[Any, int]:
        """`_current()`, tried again for up to `retry_wait_s` while it cannot connect: the
        members restart their stages for a new plan within seconds of it."""
        from market.engine.pipeline.errors import PipelineError

        deadline = time.monotonic() + self.retry_wait_s
        while True:
            try:
                return self._current()
            except PipelineError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)

    def _run(self, call: Callable[[Any], Any]) -> Any:
        """`call(pipeline)`; when a stage fails (or the pipeline cannot be connected), once
        more on the next plan's pipeline (the plan moves when a member leaves or joins)."""
        with self._batch:
            return self._run_batch(call)

    def _run_batch(self, call: Callable[[Any], Any]) -> Any:
        from market.engine.pipeline.errors import PipelineError

        self._close_retired()
        engine, version = None, None
        try:
            engine, version = self._connected()
            return call(engine)
        except PipelineError as exc:  # StageFailedError among them
            failed = version if version is not None else self.building
            with self._lock:
                if engine is not None and self._engine is engine:
                    self._engine, self._engine_version = None, None
                if engine is not None:
                    self._retired.append(engine)
            self._close_retired()
            log.warning("swarm engine: the pipeline of plan %s failed (%s); waiting up to "
                        "%.0f s for the next plan", failed, exc, self.retry_wait_s)
            if not self._newer_plan(failed):
                raise
        return call(self._connected()[0])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        return list(self._run(lambda e: e.generate(requests)))

    def score(self, *args: Any, **kwargs: Any) -> list[ScoreResult]:
        return list(self._run(lambda e: e.score(*args, **kwargs)))

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._retired.append(self._engine)
            self._engine = None
        self._close_retired()


# ---------------------------------------------------------------------------- the member
class SwarmMember:
    """One swarm member's runtime: the control loop (join, plan, stage, consent; the head
    also registers) in a background thread, and, while this member is the head of a
    registered swarm, the worker loop in the calling thread."""

    def __init__(self, *, account: LocalAccount, quarry: Quarry, market: MarketAPI,
                 model: ServedModel, memory_mib: int, tflops: float, price_per_token: int,
                 stage_host: str, stage_port: int, state_dir: Path,
                 heartbeat_interval_s: float = 5.0, router: str = "parallax",
                 worker_options: Mapping[str, Any] | None = None,
                 engine_options: Mapping[str, Any] | None = None) -> None:
        from market.engine.pipeline.auth import stage_keypair
        from market.scheduler.live import model_spec_from_architecture

        self.account = account
        self.address = account.address
        self.q = quarry
        self.market = market
        self.model = model
        self.model_id = model.model_id
        self.memory_mib = memory_mib
        self.tflops = tflops
        self.price_per_token = price_per_token
        self.endpoint = f"tcp://{stage_host}:{stage_port}"
        self.heartbeat_interval_s = heartbeat_interval_s
        self.public_key, secret = stage_keypair(bytes(account.key))
        self.spec = model_spec_from_architecture(model.manifest.name,
                                                 model.manifest.architecture)
        options = dict(engine_options or {})
        self.stage = StageProcess(model.path, self.endpoint, secret,
                                  state_dir / "swarm" / self.address, stage_args(options))
        self.engine = SwarmEngine(model.path, model.manifest, secret, router=router,
                                  driver_host=stage_host, **options)
        self.plan: SwarmPlan | None = None
        self.swarm_id: int | None = None  # the registered swarm this head claims for
        self.signed: tuple[int, int] | None = None  # (plan version, nonce) consented
        self._rejected: int | None = None  # a plan version refused by check_plan
        self._registered: dict[int, int] = {}  # plan version -> the swarm this head registered
        self._stop = threading.Event()
        self._is_head = threading.Event()
        self._lock = threading.Lock()
        self.worker = self._worker(dict(worker_options or {}))

    @classmethod
    def from_config(cls, cfg: MinerConfig, **worker_options: Any) -> SwarmMember:
        """Connect and check the registration; the config names one model and a stage port."""
        from market.connect import connect
        from miner.archive import default_state_dir
        from miner.register import hardware_for, load_models

        cfg.require("key", "model_dirs", "stage_port", "price_per_token")
        models = load_models(cfg.model_dirs)
        if len(models) != 1:
            raise QuarryError(f"a swarm member serves one model; model_dirs lists {len(models)}")
        account = cfg.account()
        q, market = connect(cfg)
        try:
            if not q.gpu.is_registered(account.address):
                raise QuarryError(f"miner {account.address} is not registered; run `miner "
                                  "register` first")
            if models[0].model_id not in q.gpu.models_of(account.address):
                raise QuarryError(f"model {models[0].manifest.name} is not in this miner's "
                                  "on-chain registration; rerun `miner register`")
            memory = cfg.memory_mib or hardware_for(cfg).memory_mib
            tflops = cfg.tflops or measure_tflops()
            assert cfg.stage_port is not None and cfg.price_per_token is not None
            options = {"max_batch": cfg.max_batch, "poll_interval_s": cfg.poll_interval_s,
                       "max_shards_in_flight": cfg.max_shards_in_flight,
                       "heartbeat_interval_s": cfg.heartbeat_interval_s,
                       "auto_withdraw": cfg.auto_withdraw, "state_dir": cfg.state_dir,
                       **worker_options}
            return cls(account=account, quarry=q, market=market, model=models[0],
                       memory_mib=memory, tflops=tflops,
                       price_per_token=int(cfg.price_per_token), stage_host=cfg.stage_host,
                       stage_port=cfg.stage_port,
                       state_dir=cfg.state_dir or default_state_dir(),
                       heartbeat_interval_s=cfg.heartbeat_interval_s,
                       router=cfg.swarm_router, worker_options=options,
                       engine_options=cfg.engine_kwargs())
        except BaseException:
            market.close()
            raise

    def _worker(self, options: dict[str, Any]) -> Worker:
        from miner.worker import Worker

        return Worker(account=self.account, quarry=self.q, engines={self.model_id: self.engine},
                      store=self.market, market=self.market, engine_kind="swarm",
                      claim=self._claim, precision_of=self._precision, **options)

    def _precision(self, model_id: bytes) -> Precision | None:
        """The precision this head's claims are made in: its registered swarm's (the least
        exact of its members' declarations); `SwarmUnavailable` while none is registered."""
        swarm_id = self.swarm_id
        if swarm_id is None:
            raise SwarmUnavailable("the swarm is being formed (waiting for consents and its "
                                   "registration)")
        return self.q.gpu.swarm_precision(swarm_id)

    def _claim(self, task_id: int, shard: int) -> TxResult:
        """The worker's claim: for the registered swarm this member heads."""
        swarm_id = self.swarm_id
        if swarm_id is None:
            raise SwarmUnavailable("the swarm is being formed (waiting for consents and its "
                                   "registration)")
        return self.q.tasks.claim_shard_for_swarm(self.account, task_id, shard, swarm_id)

    # -------------------------------------------------------------------- control loop
    def tick(self, api: MarketAPI) -> None:
        """One round: heartbeat, plan, stage, consent; the head registers."""
        plan = self.plan
        others = {} if plan is None else {m.address: m.endpoint for m in plan.members
                                          if m.address != self.address}
        api.swarm_join(self.account, model_id="0x" + self.model_id.hex(),
                       memory_mib=self.memory_mib, tflops=self.tflops, endpoint=self.endpoint,
                       public_key=self.public_key, rtts=measure_rtts(others),
                       price_per_token=self.price_per_token)
        try:
            got = SwarmPlan.from_json(api.swarm_plan("0x" + self.model_id.hex()))
        except MarketError as exc:
            if exc.status in (404, 409):  # no members yet, or they cannot cover the model
                log.debug("no swarm plan yet: %s", exc)
                return
            raise
        if got.version == self._rejected:
            return
        if plan is None or got.version != plan.version:
            try:
                mine = check_plan(got, self.address, model_id=self.model_id, model=self.spec,
                                  memory_mib=self.memory_mib, ask=self.price_per_token)
            except PlanError as exc:
                self._rejected = got.version
                log.error("refusing %s", exc)
                return
            self._adopt(got, mine)
        self.plan = got
        mine = got.member(self.address)
        if mine is None:
            return
        self.stage.serve(mine.layers)  # again if it died
        self._consent(api, got)
        if got.head == self.address:
            self._head(api, got)
        else:
            self._set_head(False)

    def _adopt(self, plan: SwarmPlan, mine: PlanMember | None) -> None:
        log.info("swarm plan %d (%s): %s", plan.version, plan.algorithm,
                 "standby (no layers)" if mine is None else
                 f"layers {mine.layers[0]}:{mine.layers[1]}, head {plan.head}")
        self.stage.allow([m.public_key for m in plan.members])
        self.stage.serve(None if mine is None else mine.layers)
        with self._lock:
            self.swarm_id = None  # a new plan is a new swarm: no claims until registered
        if mine is None:
            self._set_head(False)
        else:
            self.engine.use(plan, warm=plan.head == self.address)

    def _consent(self, api: MarketAPI, plan: SwarmPlan) -> None:
        """Sign the plan's terms with this member's current nonce (again if it moved)."""
        if plan.swarm_id is not None:
            return
        nonce = self.q.gpu.nonces(self.address)
        if self.signed == (plan.version, nonce):
            return
        if self.signed is not None and self.signed[0] == plan.version \
                and self._registered_on_chain(plan):
            return  # the nonce moved because this plan's swarm was registered
        gpu = self.q.gpu
        signature = plan.consent().with_nonce(nonce).sign(self.account.key, gpu.chain.chain_id,
                                                          gpu.address)
        api.swarm_consent(self.account, "0x" + self.model_id.hex(), plan.version, nonce,
                          "0x" + bytes(signature).hex())
        self.signed = (plan.version, nonce)
        log.info("consented to swarm plan %d (nonce %d)", plan.version, nonce)

    def _registered_on_chain(self, plan: SwarmPlan) -> bool:
        """Whether the latest swarm on-chain has exactly this plan's terms."""
        gpu = self.q.gpu
        count = gpu.swarm_count()
        if count == 0:
            return False
        info, consent = gpu.swarm_info(count), plan.consent()
        return (info.model_id, info.head, info.members, info.shares, info.price_per_token) == (
            consent.model_id, consent.head, consent.members, consent.shares,
            consent.price_per_token)

    def _head(self, api: MarketAPI, plan: SwarmPlan) -> None:
        """Register the plan's swarm once every member consented; then claim for it."""
        swarm_id = plan.swarm_id or self._registered.get(plan.version)
        if plan.swarm_id is None and swarm_id is not None:  # registered; the report was lost
            api.swarm_registered(self.account, "0x" + self.model_id.hex(), plan.version,
                                 swarm_id)
        if swarm_id is None:
            got = api.swarm_consents("0x" + self.model_id.hex(), plan.version)
            if not got.get("complete"):
                return
            consent = plan.consent()
            sigs = got["signatures"]
            try:
                signatures = [bytes.fromhex(str(sigs[m]["signature"]).removeprefix("0x"))
                              for m in consent.members]
            except KeyError as exc:
                raise PlanError(f"swarm plan {plan.version}: no consent from {exc}") from exc
            swarm_id, _ = self.q.gpu.register_swarm(self.account, consent, signatures)
            self._registered[plan.version] = swarm_id
            log.info("registered swarm %d for plan %d on-chain", swarm_id, plan.version)
            api.swarm_registered(self.account, "0x" + self.model_id.hex(), plan.version,
                                 swarm_id)
        info = self.q.gpu.swarm_info(swarm_id)
        if info.head != self.address or not info.active:
            return
        with self._lock:
            self.swarm_id = swarm_id
        self._set_head(True)

    def _set_head(self, head: bool) -> None:
        if head and not self._is_head.is_set():
            log.info("heading swarm %s: claiming shards for it", self.swarm_id)
            self._is_head.set()
        elif not head and self._is_head.is_set():
            log.info("no longer the swarm's head: claiming stops")
            self._is_head.clear()
            self.worker.request_stop()

    def _control(self) -> None:
        api = MarketAPI(self.market.url, timeout=10.0)
        warned = ""
        try:
            while not self._stop.is_set():
                try:
                    self.tick(api)
                    warned = ""
                except QuarryError as exc:  # the market or chain did not answer: next round
                    if str(exc) != warned:
                        log.warning("swarm round failed: %s", exc)
                        warned = str(exc)
                self._stop.wait(self.heartbeat_interval_s)
        finally:
            api.close()

    # -------------------------------------------------------------------- run
    def request_stop(self) -> None:
        self._stop.set()
        self._is_head.set()  # wake the waiting loop
        self.worker.request_stop()

    def run(self) -> Any:
        """Serve until Ctrl-C (or `request_stop`): the control loop in a background thread,
        the worker loop here while this member heads a registered swarm."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        control = threading.Thread(target=self._control, name="swarm-control", daemon=True)
        control.start()
        try:
            while not self._stop.is_set():
                if not self._is_head.wait(self.worker.poll_interval_s):
                    self._answer_for_past_shards()
                    continue
                if self._stop.is_set():
                    break
                if previous is not None:  # the worker installs its own Ctrl-C handler
                    signal.signal(signal.SIGINT, previous)
                self.worker.run()
                if previous is not None:
                    signal.signal(signal.SIGINT, lambda *_: self.request_stop())
                if self.worker._stop.is_set() and self._is_head.is_set():
                    self._stop.set()  # Ctrl-C in the worker: the member leaves
        finally:
            self._stop.set()
            control.join(timeout=self.heartbeat_interval_s + 15)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return self.worker.summary

    def _answer_for_past_shards(self) -> None:
        """Not the head (now): shards it submitted as head still need their availability
        challenges answered and their finalization, as the worker loop does."""
        w = self.worker
        if w.pending or w.open_challenges:
            w._safely("answering availability challenges", w.answer_challenges, 0)
            w._safely("collecting payments", w.collect, 0)

    def close(self) -> None:
        self.stage.stop()
        self.worker.close()  # closes the engine and the market client
