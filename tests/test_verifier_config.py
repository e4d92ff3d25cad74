"""The `[verifier]` config: file, environment and flags in that order, and one clear error
per bad setting; plus the CLI's one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from market.errors import ConfigError
from verifier.config import VerifierConfig

BIN = Path(sys.executable).parent


def test_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "v.toml"
    cfg.write_text('[verifier]\nmodel_dir = "models/tiny"\nstake = "0.2ether"\n'
                   "tolerance_bps = 300\n[verifier.reputation]\npenalty = \"aggressive\"\n")
    monkeypatch.setenv("QUARRY_VERIFIER_TOLERANCE_BPS", "400")
    c = VerifierConfig.load(cfg, poll_interval_s=0.5)
    assert c.model_dir == tmp_path / "models/tiny"  # relative to the file
    assert c.stake == 2 * 10**17 and c.tolerance_bps == 400 and c.poll_interval_s == 0.5
    assert c.reputation_params().penalty == "aggressive"


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("bogus", 1, "unknown verifier setting"),
    ("test_mode", "evil", "test_mode"),
    ("tolerance_bps", 20_000, "tolerance_bps .*less than or equal to 10000"),
    ("stake", "lots", "not an amount"),
    ("redis_url", "localhost", "not a URL"),
    ("scoring_precision", "int8", "verifiers score in fp32 or bf16, not int8"),
    ("scoring_precision", "fp4", "unknown precision"),
    ("greedy_margin", 0.1, "unknown verifier setting"),  # the error model replaced it
])
def test_bad_settings_are_named(setting: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        VerifierConfig.load(None, **{setting: value})


def test_missing_key_is_named() -> None:
    with pytest.raises(ConfigError, match="missing verifier setting key"):
        VerifierConfig.load(None).require("key")


@pytest.mark.parametrize("command", ["run", "register", "exit", "withdraw"])
def test_a_command_without_its_settings_prints_one_line(tmp_path: Path, command: str) -> None:
    out = subprocess.run([str(BIN / "verifier"), command, "--key-file", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "model_dir" in out.stderr or "key" in out.stderr
