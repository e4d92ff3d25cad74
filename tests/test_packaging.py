"""Packaging: the ABIs shipped as package data, and a wheel that works outside the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from market.chain.artifacts import (
    ERRORS_FILE,
    all_error_abis,
    load_artifact,
    shipped_dir,
    shipped_files,
)
from market.chain.deployment import CONTRACT_NAMES
from market.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("market", "miner", "verifier", "client")


@pytest.fixture(scope="module")
def fresh_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hardhat compile of the contracts into a temporary directory (not the repo's
    `artifacts/`, which may be stale or shared), through a config that extends the repo's."""
    out = tmp_path_factory.mktemp("hardhat")
    config = out / "hardhat.config.js"
    config.write_text(
        f"const base = require({json.dumps(str(ROOT / 'hardhat.config.js'))});\n"
        "module.exports = { ...base, paths: { ...base.paths, "
        f"root: {json.dumps(str(ROOT))}, artifacts: {json.dumps(str(out / 'artifacts'))}, "
        f"cache: {json.dumps(str(out / 'cache'))} }} }};\n")
    subprocess.run(["npx", "hardhat", "--config", str(config), "compile", "--quiet"],
                   cwd=ROOT, check=True, timeout=300, capture_output=True)
    return out / "artifacts"


def test_shipped_abis_equal_a_fresh_compile(fresh_artifacts: Path) -> None:
    shipped = {p.name: p.read_text() for p in shipped_dir().iterdir() if p.name.endswith(".json")}
    expected = shipped_files(fresh_artifacts)
    assert sorted(shipped) == sorted(expected) == sorted(
        [f"{n}.json" for n in CONTRACT_NAMES] + [ERRORS_FILE])
    stale = [name for name in expected if shipped[name] != expected[name]]
    assert not stale, f"{stale} differ from a fresh compile: run `make compile` and commit"


def test_quarry_artifacts_overrides_the_shipped_abis(fresh_artifacts: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUARRY_ARTIFACTS", raising=False)
    shipped = load_artifact("TaskRegistry")
    assert Path(shipped.source).parent == Path(str(shipped_dir()))
    monkeypatch.setenv("QUARRY_ARTIFACTS", str(fresh_artifacts))
    override = load_artifact("TaskRegistry")
    assert Path(override.source).is_relative_to(fresh_artifacts)
    assert (override.abi, override.bytecode) == (shipped.abi, shipped.bytecode)
    # Any compiled contract loads from Hardhat's output, the shipped set is the five roles use.
    assert load_artifact("RegisterProxy").abi
    assert all_error_abis() == all_error_abis(fresh_artifacts)
    monkeypatch.delenv("QUARRY_ARTIFACTS")
    with pytest.raises(ConfigError, match=r"RegisterProxy.*QUARRY_ARTIFACTS"):
        load_artifact("RegisterProxy")


def test_unreadable_shipped_artifact_names_the_file(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    contract = tmp_path / "contracts" / "TaskRegistry.sol"
    contract.mkdir(parents=True)
    (contract / "TaskRegistry.json").write_text('{"abi": []}')  # no contractName
    monkeypatch.setenv("QUARRY_ARTIFACTS", str(tmp_path))
    with pytest.raises(ConfigError, match=r"TaskRegistry\.json.*contractName"):
        load_artifact("TaskRegistry")


def test_wheel_installed_outside_the_repo_loads_every_abi_and_runs_the_clis(
        tmp_path: Path) -> None:
    """Build the wheel offline (no build isolation, no dependencies), install it alone into a
    fresh venv, and run it from a directory outside the repository with the shared venv's
    site-packages on PYTHONPATH for its dependencies (a path entry, so the repo's editable
    install, a .pth hook there, is not loaded)."""
    # No PYTHONPATH from the caller: the repo (with its quarry.egg-info) must stay out of sight.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("QUARRY_", "PYTHON"))}
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "--quiet", "-w", str(wheels), str(src)],
                   env=clean, check=True, timeout=300, capture_output=True)
    (wheel,) = wheels.glob("quarry-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "--quiet", str(wheel)],
                   env=clean, check=True, timeout=300, capture_output=True)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {**clean, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    probe = (
        "import json, market, importlib.resources as r\n"
        "from market.chain.artifacts import load_artifact, all_error_abis\n"
        "from market.chain.deployment import CONTRACT_NAMES\n"
        "arts = [load_artifact(n) for n in CONTRACT_NAMES]\n"
        "print(json.dumps({'market': market.__file__, 'sources': [a.source for a in arts],\n"
        "  'bytecode': min(len(a.bytecode) for a in arts), 'errors': len(all_error_abis()),\n"
        "  'typed': [r.files(p).joinpath('py.typed').is_file()\n"
        "            for p in ('market', 'miner', 'verifier', 'client')]}))\n"
    )
    out = subprocess.run([str(python), "-c", probe], cwd=outside, env=env, timeout=120,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    installed = venv.resolve()
    assert Path(got["market"]).resolve().is_relative_to(installed)
    assert all(Path(s).resolve().is_relative_to(installed) for s in got["sources"])
    assert got["bytecode"] > 1000 and got["errors"] > 50
    assert got["typed"] == [True] * 4
    for cli in ("miner", "client"):
        run = subprocess.run([str(venv / "bin" / cli), "--help"], cwd=outside, env=env,
                             timeout=120, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("usage:"), run.stdout
