"""A swarm member's own checks, without a chain: the plan it is given (every layer covered,
its range within its memory cap, terms naming the plan's members), its stage's allow file,
the RTTs it reports, and its settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eth_utils import to_checksum_address

BIN = Path(sys.executable).parent


def test_member_refuses_bad_plans(model_dir_only: Path) -> None:
    """check_plan: a gap, a range over the cap, a range outside the model, a head that is no
    member, terms that name other members; a plan without this member is standby."""
    from market.model.manifest import load_manifest
    from market.scheduler.live import model_spec_from_architecture
    from miner.swarm import PlanError, SwarmPlan, check_plan

    manifest = load_manifest(model_dir_only)
    mid = manifest.model_id
    a, b = (to_checksum_address("0x" + x * 20) for x in ("0a", "0b"))

    def plan(ranges: dict[str, tuple[int, int]], head: str = a,
             terms_members: list[str] | None = None, shares: list[int] | None = None,
             price: int = 1) -> SwarmPlan:
        members = sorted(ranges, key=lambda x: int(x, 16))
        return SwarmPlan.from_json({
            "model_id": "0x" + mid.hex(), "version": 3, "algorithm": "parallax",
            "num_layers": 8, "head": head, "standby": [],
            "members": [{"address": m, "endpoint": "tcp://127.0.0.1:1", "public_key": "k",
                         "layers": list(ranges[m]), "memory_mib": 5} for m in members],
            "terms": {"model_id": "0x" + mid.hex(), "head": head,
                      "members": terms_members or members,
                      "shares": shares or [ranges[m][1] - ranges[m][0] for m in members],
                      "price_per_token": price, "deadline": 1},
            "swarm_id": None})

    # 5 MiB hold 2 layers of this model with the KV room the market reserves, not 3
    kw: dict[str, Any] = {"model_id": mid, "memory_mib": 5,
          "model": model_spec_from_architecture(manifest.name, manifest.architecture)}
    mine = check_plan(plan({a: (0, 2), b: (2, 8)}), a, **kw)
    assert mine is not None and mine.layers == (0, 2)
    with pytest.raises(PlanError, match="uncovered"):
        check_plan(plan({a: (0, 2), b: (3, 8)}), a, **kw)
    with pytest.raises(PlanError, match="hold 2"):
        check_plan(plan({a: (0, 3), b: (3, 8)}), a, **kw)
    with pytest.raises(PlanError, match="outside"):
        check_plan(plan({a: (0, 2), b: (2, 9)}), a, **kw)
    with pytest.raises(PlanError, match="is not a member"):
        check_plan(plan({a: (0, 2), b: (2, 8)}, head=to_checksum_address("0x" + "0c" * 20)),
                   a, **kw)
    c = to_checksum_address("0x" + "0c" * 20)
    with pytest.raises(PlanError, match="consent terms"):
        check_plan(plan({a: (0, 2), b: (2, 8)}, terms_members=[a, c]), a, **kw)
    assert check_plan(plan({a: (0, 2), b: (2, 8)}), "0x" + "0d" * 20, **kw) is None  # standby
    # An untrusted market's terms that move pay: a's 2 layers paid as 1, or under a's ask.
    with pytest.raises(PlanError, match="not the layers each member serves"):
        check_plan(plan({a: (0, 2), b: (2, 8)}, shares=[1, 7]), a, **kw)
    with pytest.raises(PlanError, match="below this member's ask"):
        check_plan(plan({a: (0, 2), b: (2, 8)}, price=5), a, ask=6, **kw)
    assert check_plan(plan({a: (0, 2), b: (2, 8)}, price=6), a, ask=6, **kw) is not None


@pytest.fixture(scope="module")
def model_dir_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market.model.create import create_model

    path = tmp_path_factory.mktemp("swarm-model") / "model"
    create_model(path, layers=8, hidden=64)
    return path


def test_swarm_config_is_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text('[miner]\nswarm = true\nstage_port = 70000\n')
    out = subprocess.run([str(BIN / "miner"), "run", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "stage_port" in out.stderr


def test_rtts_are_tcp_connect_times_and_a_silent_member_counts_as_the_timeout() -> None:
    import socket

    from miner.swarm import measure_rtts

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        up, down = (f"tcp://127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        rtts = measure_rtts({"up": up, "down": down}, timeout_s=0.5)
    assert 0 < rtts["up"] < 0.5
    assert rtts["down"] == 0.5


def test_stage_files_are_private_and_the_allow_file_lists_the_plan_keys(tmp_path: Path) -> None:
    from miner.swarm import StageProcess

    stage = StageProcess(tmp_path / "model", "tcp://127.0.0.1:1", "SECRET", tmp_path / "s")
    stage.allow(["k2", "k1", "k2"])
    assert stage.allow_file.read_text() == "k1\nk2\n"
    assert stage.secret_file.read_text() == "SECRET\n"
    assert {p.stat().st_mode & 0o777 for p in (stage.allow_file, stage.secret_file)} == {0o600}
    assert stage.serve(None) is False and not stage.alive()


def _plan(version: int) -> Any:
    from miner.swarm import SwarmPlan

    a, b = (to_checksum_address("0x" + x * 20) for x in ("0a", "0b"))
    return SwarmPlan.from_json({
        "model_id": "0x" + "11" * 32, "version": version, "algorithm": "parallax",
        "num_layers": 8, "head": a, "standby": [],
        "members": [{"address": m, "endpoint": "tcp://127.0.0.1:1", "public_key": "k",
                     "layers": r, "memory_mib": 5} for m, r in ((a, [0, 4]), (b, [4, 8]))],
        "terms": {}, "swarm_id": None})


class _FakePipeline:
    """Stands in for a PipelineEngine: fails its first generate when told to."""

    def __init__(self, version: int, fail: bool) -> None:
        self.version, self.fail, self.closed = version, fail, False

    def generate(self, requests: list[Any]) -> list[Any]:
        from market.engine.pipeline.errors import StageFailedError

        if self.fail:
            raise StageFailedError(0, f"a stage of plan {self.version} died")
        return [f"plan {self.version}: {r}" for r in requests]

    def close(self) -> None:
        self.closed = True


def test_swarm_engine_reruns_a_failed_batch_on_the_next_plan_only(
        model_dir_only: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose stage dies runs again on the next plan's pipeline (the plan moves when
    the member's heartbeat lapses); with no next plan in time, the failure is raised (the
    worker then fails the shard: its claim expires by the standard rule)."""
    import threading

    from market.engine.pipeline.errors import StageFailedError
    from market.model.manifest import load_manifest
    from miner.swarm import SwarmEngine

    engine = SwarmEngine(model_dir_only, load_manifest(model_dir_only), "secret",
                         retry_wait_s=5.0)
    built: list[_FakePipeline] = []

    def connect(plan: Any) -> _FakePipeline:
        fake = _FakePipeline(plan.version, fail=plan.version == 1)
        built.append(fake)
        with engine._lock:
            engine._engine, engine._engine_version = fake, plan.version
        return fake

    monkeypatch.setattr(engine, "_connect", connect)
    engine.use(_plan(1))
    threading.Timer(0.3, engine.use, args=(_plan(2),)).start()
    assert engine.generate(["x"]) == ["plan 2: x"]  # type: ignore[list-item]
    assert [p.version for p in built] == [1, 2] and built[0].closed

    engine.retry_wait_s = 0.2
    engine.use(_plan(1))  # a plan that fails, and none after it
    with pytest.raises(StageFailedError, match="plan 1"):
        engine.generate(["y"])  # type: ignore[list-item]
    engine.close()
    assert all(p.closed for p in built)


def test_stage_takes_the_engine_options_it_understands() -> None:
    from miner.swarm import stage_args

    assert stage_args({"device": "cuda", "dtype": "bfloat16", "max_microbatch_size": 8}) == [
        "--device", "cuda", "--dtype", "bfloat16"]
