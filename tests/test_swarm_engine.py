"""The pipelined engine as a swarm: routed microbatches over replicas, CURVE-authenticated.

Real stage processes (`python -m market.engine.pipeline.stage`, one torch thread each) of a
tiny 8-layer model, started once for the module and reused by every case; fp32 greedy
outputs are compared token for token with the single-process engine. The case that kills
stages runs last.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from market.engine.base import GenerationRequest
from market.engine.pipeline.auth import stage_keypair, write_allow_file
from market.engine.pipeline.engine import PipelineEngine, StageRef
from market.engine.pipeline.errors import PipelineError, StageFailedError
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model

pytestmark = pytest.mark.timeout(240)

PROMPTS = [(5, 6, 7, 8), (11, 12), (13, 14, 15, 16, 17, 18), (30,), (40, 41, 42), (250, 3)]
MAX_TOKENS = [10, 14, 6, 12, 9, 11]
# name -> (layers, extra stage flags); m0..m3: two replicas of each half; m4 overlaps both
# halves (routes over it use a sub-range of someone's layers); m5 tampers.
STAGES = {
    "m0": ("0:4", []),
    "m1": ("0:4", []),
    "m2": ("4:8", []),
    "m3": ("4:8", []),
    "m4": ("0:6", []),
    "m5": ("4:8", ["--tamper", "5.0"]),
}


def requests() -> list[GenerationRequest]:
    return [GenerationRequest(p, m) for p, m in zip(PROMPTS, MAX_TOKENS, strict=True)]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Swarm:
    model_dir: Path
    refs: dict[str, StageRef]
    procs: dict[str, subprocess.Popen]
    allow_files: list[Path]
    members: list[str]  # public keys the allow files list (stages and the driver)
    driver_secret: str
    expected: list[tuple[int, ...]]

    def engine(self, names: list[str], **kw: object) -> PipelineEngine:
        opts: dict[str, object] = dict(
            driver_host="127.0.0.1", stage_timeout_s=3.0, startup_timeout_s=60.0
        )
        opts.update(kw)
        opts.setdefault("curve_secret", self.driver_secret)
        return PipelineEngine(
            self.model_dir,
            stages=[self.refs[n] for n in names],
            **opts,  # type: ignore[arg-type]
        )


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("swarm")
    model_dir = root / "tiny8"
    create_model(model_dir, name="quarry-swarm-test", layers=8, hidden=64, seed=1)
    keys = {name: stage_keypair(bytes([i + 1]) * 32) for i, name in enumerate(STAGES)}
    driver_public, driver_secret = stage_keypair(b"\x77" * 32)
    members = [pub for pub, _ in keys.values()] + [driver_public]
    procs: dict[str, subprocess.Popen] = {}
    refs: dict[str, StageRef] = {}
    allow_files: list[Path] = []
    try:
        for name, (layers, extra) in STAGES.items():
            public, secret = keys[name]
            secret_file = root / f"{name}.key"
            secret_file.write_text(secret + "\n")
            allow = write_allow_file(root / f"{name}.allow", members)
            allow_files.append(allow)
            endpoint = f"tcp://127.0.0.1:{_port()}"
            cmd = [sys.executable, "-m", "market.engine.pipeline.stage", "--model",
                   str(model_dir), "--layers", layers, "--listen", endpoint,
                   "--curve-secret-file", str(secret_file), "--allow-file", str(allow), *extra]
            with open(root / f"{name}.log", "w") as log:  # not a pipe: nobody drains it
                procs[name] = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            a, b = (int(x) for x in layers.split(":"))
            refs[name] = StageRef(name, endpoint, (a, b), public)
        expected = [o.token_ids for o in TorchEngine(model_dir).generate(requests())]
        deadline = time.monotonic() + 120
        for name, proc in procs.items():  # each logs one line once it listens
            log_path = root / f"{name}.log"
            while "listening on" not in log_path.read_text():
                text = log_path.read_text()
                assert proc.poll() is None, f"stage {name} exited: {text}"
                assert time.monotonic() < deadline, f"stage {name} did not start: {text}"
                time.sleep(0.1)
        yield Swarm(model_dir, refs, procs, allow_files, members, driver_secret, expected)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("router", ["parallax", "wsrr"])
def test_replicas_are_all_used_and_outputs_match(swarm: Swarm, router: str) -> None:
    with swarm.engine(["m0", "m1", "m2", "m3"], router=router, microbatch_size=1) as engine:
        out = engine.generate(requests())
        assert [o.token_ids for o in out] == swarm.expected
        routes = engine.last_run["routes"]
        if router == "parallax":
            # pinned load spreads microbatches over more than one chain. WS-RR sends them
            # down the shortest path while its slots have room, so whether it uses a second
            # chain depends on the measured stage times (on a busy machine one chain can look
            # fastest throughout): only its outputs are checked.
            assert len(routes) >= 2, routes
            used = {int(i) for key in routes for i in key.split("-")}
            assert len(used) >= 3, routes
        assert routes, routes


def test_uneven_overlapping_split_matches(swarm: Swarm) -> None:
    # m4 holds 0:6 and m2 4:8: a route runs a sub-range of one of them
    with swarm.engine(["m4", "m2"], microbatch_size=2) as engine:
        assert [s.layers for s in engine.stages] == [(0, 6), (4, 8)]
        out = engine.generate(requests())
        assert [o.token_ids for o in out] == swarm.expected
        (route,) = engine.last_run["routes"]
        assert route == "0-1"


def test_a_new_driver_keeps_its_stages_when_the_old_one_closes(swarm: Swarm) -> None:
    """A head re-planning connects a new pipeline to stages the old one used, then closes
    the old one: the old one's release must not release the stages from the new driver."""
    old = swarm.engine(["m0", "m2"], microbatch_size=2)
    try:
        assert [o.token_ids for o in old.generate(requests())] == swarm.expected
        with swarm.engine(["m0", "m2"], microbatch_size=2) as new:
            old.close()
            time.sleep(3.5)  # past stage_timeout_s: the new driver still gets heartbeats
            assert [o.token_ids for o in new.generate(requests())] == swarm.expected
    finally:
        old.close()


def test_stage_refs_are_checked(swarm: Swarm) -> None:
    with pytest.raises(PipelineError, match="layer 4 is missing"):
        swarm.engine(["m0", "m1"])
    wrong = StageRef("m0", swarm.refs["m0"].endpoint, (0, 5), swarm.refs["m0"].public_key)
    with pytest.raises(PipelineError, match="serves layers 0:4, its StageRef says 0:5"):
        PipelineEngine(
            swarm.model_dir,
            stages=[wrong, swarm.refs["m2"]],
            curve_secret=swarm.driver_secret,
            driver_host="127.0.0.1",
        )
    with pytest.raises(PipelineError, match="pass curve_secret"):
        swarm.engine(["m0", "m2"], curve_secret=None)
    with pytest.raises(PipelineError, match="router must be one of"):
        swarm.engine(["m0", "m2"], router="random")


def test_only_listed_curve_keys_get_through(swarm: Swarm) -> None:
    public, secret = stage_keypair(b"\x55" * 32)  # not in the stages' allow files
    with pytest.raises(StageFailedError, match="no answer .* CURVE key"):
        swarm.engine(["m0", "m2"], curve_secret=secret, startup_timeout_s=3.0)
    for allow in swarm.allow_files:  # the stages re-read their allow files
        write_allow_file(allow, [*swarm.members, public])
    try:
        with swarm.engine(["m0", "m2"], curve_secret=secret) as engine:
            out = engine.generate(requests()[:2])
            assert [o.token_ids for o in out] == swarm.expected[:2]
    finally:
        for allow in swarm.allow_files:
            write_allow_file(allow, swarm.members)


def test_a_tampering_member_changes_the_outputs(swarm: Swarm) -> None:
    with swarm.engine(["m0", "m5"]) as engine:
        out = engine.generate(requests())
    assert [o.token_ids for o in out] != swarm.expected


def test_killed_stage_is_routed_around_then_no_chain_is_left(swarm: Swarm) -> None:
    long = [GenerationRequest(p, 40) for p in PROMPTS]
    expected = [o.token_ids for o in TorchEngine(swarm.model_dir).generate(long)]
    engine = swarm.engine(["m0", "m1", "m2", "m3"], microbatch_size=1, stage_timeout_s=2.0)
    victim = swarm.procs["m1"]

    def kill_when_busy() -> None:  # once microbatches are in flight on both replicas
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if getattr(engine, "last_run", {}).get("microbatches", 0) >= 2:
                victim.kill()
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    try:
        out = engine.generate(long)
        killer.join()
        assert [o.token_ids for o in out] == expected
        assert engine.last_run["restarted"] >= 1
        assert not engine.stages[1].alive and engine.stages[0].alive

        swarm.procs["m0"].kill()  # the last holder of layers 0:4
        with pytest.raises(StageFailedError, match="no full chain") as info:
            engine.generate(long)
        assert info.value.stage == 0
    finally:
        engine.close()
