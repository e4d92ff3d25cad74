"""A swarm member's own checks, without a chain: the plan it is given (every layer covered,
its range within its memory cap, terms naming the plan's members), its stage's allow file,
the RTTs it reports, and its settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from eth_utils import to_checksum_address

BIN = Path(sys.executable).parent


def test_member_refuses_bad_plans(model_dir_only: Path) -> None:
    """check_plan: a gap, a range over the cap, terms that do not match (unit, no chain)."""
    from market.model.manifest import load_manifest
    from miner.swarm import PlanError, SwarmPlan, check_plan, layer_bytes

    mid = load_manifest(model_dir_only).model_id
    per_layer = layer_bytes(model_dir_only)
    a, b = "0x" + "0a" * 20, "0x" + "0b" * 20

    def plan(ranges: dict[str, tuple[int, int]], head: str = a) -> SwarmPlan:
        members = sorted(ranges, key=lambda x: int(x, 16))
        return SwarmPlan.from_json({
            "model_id": "0x" + mid.hex(), "version": 3, "algorithm": "parallax",
            "num_layers": 8, "head": head, "standby": [],
            "members": [{"address": m, "endpoint": "tcp://127.0.0.1:1", "public_key": "k",
                         "layers": list(ranges[m]), "memory_mib": 1} for m in members],
            "terms": {"model_id": "0x" + mid.hex(), "head": head, "members": members,
                      "shares": [ranges[m][1] - ranges[m][0] for m in members],
                      "price_per_token": 1, "deadline": 1},
            "swarm_id": None})

    cap = (5 * per_layer) // 2**20 + 1  # five layers fit, six do not
    kw = {"model_id": mid, "num_layers": 8, "bytes_per_layer": per_layer, "memory_mib": cap}
    mine = check_plan(plan({a: (0, 4), b: (4, 8)}), to_checksum_address(a), **kw)
    assert mine is not None and mine.layers == (0, 4)
    with pytest.raises(PlanError, match="layer 5 uncovered"):
        check_plan(plan({a: (0, 5), b: (6, 8)}), to_checksum_address(a), **kw)
    with pytest.raises(PlanError, match="over its memory cap"):
        check_plan(plan({a: (0, 6), b: (6, 8)}), to_checksum_address(a), **kw)
    with pytest.raises(PlanError, match="outside 0:8"):
        check_plan(plan({a: (0, 4), b: (4, 9)}), to_checksum_address(a), **kw)
    with pytest.raises(PlanError, match="is not a member"):
        check_plan(plan({a: (0, 4), b: (4, 8)}, head="0x" + "0c" * 20),
                   to_checksum_address(a), **kw)
    assert check_plan(plan({a: (0, 4), b: (4, 8)}), "0x" + "0d" * 20, **kw) is None  # standby


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
