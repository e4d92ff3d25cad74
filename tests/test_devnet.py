"""`market devnet up|status|down` as a user runs them: subprocesses, a private QUARRY_HOME,
and no Anvil left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from market.chain.devnet import free_port, pid_alive

pytestmark = [pytest.mark.chain, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def market_cmd() -> list[str]:
    """The installed `market` console script, exactly what a user types."""
    script = Path(sys.executable).parent / "market"
    assert script.exists(), f"{script} missing: is the package installed (pip install -e .)?"
    return [str(script)]


def run(cmd: list[str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUARRY_HOME": str(home)}
    return subprocess.run([*cmd, "devnet", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def wait_gone(pid: int) -> bool:
    for _ in range(100):  # a stopped Anvil is reaped by init; give it a moment
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def test_up_status_down(tmp_path: Path, market_cmd: list[str]) -> None:
    home = tmp_path / "home"
    port = free_port()
    pid = None
    try:
        up = run(market_cmd, home, "up", "--port", str(port))
        assert up.returncode == 0, up.stderr
        deployment = json.loads((home / "deployment.json").read_text())
        pid = deployment["anvilPid"]
        assert deployment["rpcUrl"] == f"http://127.0.0.1:{port}"
        assert deployment["chainId"] == 31337
        assert "chain id 31337" in up.stdout and deployment["rpcUrl"] in up.stdout
        for name, address in deployment["addresses"].items():
            assert f"{name}" in up.stdout and address in up.stdout
        assert (home / "anvil.log").exists()

        again = run(market_cmd, home, "up")
        assert again.returncode == 1
        assert "already running" in again.stderr and str(pid) in again.stderr

        status = run(market_cmd, home, "status", "--json")
        assert status.returncode == 0, status.stderr
        state = json.loads(status.stdout)
        assert state["answers"] and state["anvilRunning"] and state["anvilPid"] == pid
        assert state["addresses"] == deployment["addresses"]
        text = run(market_cmd, home, "status")
        assert text.returncode == 0 and "answers" in text.stdout

        down = run(market_cmd, home, "down")
        assert down.returncode == 0 and f"pid {pid}" in down.stdout
        assert wait_gone(pid)
        assert not (home / "deployment.json").exists()

        after = run(market_cmd, home, "status")
        assert after.returncode == 1 and "market devnet up" in after.stderr
        assert run(market_cmd, home, "down").returncode == 0  # idempotent
    finally:
        if pid is not None and pid_alive(pid):
            os.killpg(pid, 9)


def test_stale_deployment_is_reported_and_replaced(tmp_path: Path, market_cmd: list[str]) -> None:
    from market.chain.deployment import CONTRACT_NAMES, Deployment

    home = tmp_path / "home"
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    addr = "0x" + "12" * 20
    Deployment(31337, dead_url, {n: addr for n in CONTRACT_NAMES}, 0, addr,
               anvil_pid=None).save(home / "deployment.json")
    dead = run(market_cmd, home, "status")
    assert dead.returncode == 1 and "does NOT answer" in dead.stdout
    pid = None
    try:
        up = run(market_cmd, home, "up")
        assert up.returncode == 0, up.stderr
        pid = json.loads((home / "deployment.json").read_text())["anvilPid"]
        assert run(market_cmd, home, "status").returncode == 0
        assert run(market_cmd, home, "down").returncode == 0
        assert wait_gone(pid)
    finally:
        if pid is not None and pid_alive(pid):
            os.killpg(pid, 9)


def test_port_in_use_is_a_clear_error(tmp_path: Path, market_cmd: list[str],
                                      devnet_session) -> None:
    taken = devnet_session.anvil.port
    result = run(market_cmd, tmp_path / "home", "up", "--port", str(taken))
    assert result.returncode == 1
    assert f"port {taken} is already in use" in result.stderr
    assert not (tmp_path / "home" / "deployment.json").exists()
