"""The `[market]` settings (TOML, then QUARRY_MARKET_* env, then flags) through the loader
every role shares, their hand-over to child processes, and `market serve` on a busy port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from market.errors import ConfigError
from market.service.settings import MarketSettings

ROOT = Path(__file__).resolve().parent.parent
KEY = "0x" + "cd" * 32


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("QUARRY_MARKET_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path / "home"))


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "market.toml"
    cfg.write_text('[market]\nport = 8700\nstore_dir = "store"\ndb_path = "/abs/board.sqlite"\n'
                   f'settler_key = "{KEY[2:]}"\nsweep_interval_s = 5\n')
    s = MarketSettings.load(cfg)
    assert (s.port, s.sweep_interval_s, s.settler_key) == (8700, 5.0, KEY)
    assert s.store_dir == tmp_path / "store"  # relative to the file
    assert s.db_path == Path("/abs/board.sqlite")
    assert s.deployment == tmp_path / "home" / "deployment.json"  # the default
    assert KEY[4:] not in repr(s)  # the key never shows in a repr

    monkeypatch.setenv("QUARRY_MARKET_PORT", "8800")
    monkeypatch.setenv("QUARRY_MARKET_STORE_DIR", "elsewhere")
    monkeypatch.setenv("QUARRY_MARKET_REDIS_URL", "redis://10.0.0.1:6379/2")
    monkeypatch.setenv("QUARRY_PORT", "1")  # the old unprefixed name is not read
    s = MarketSettings.load(cfg)
    assert (s.port, s.store_dir, s.redis_url) == (8800, Path("elsewhere"),
                                                  "redis://10.0.0.1:6379/2")
    s = MarketSettings.load(cfg, port=8900, host=None, db_path=tmp_path / "b.sqlite")
    assert (s.port, s.host, s.db_path) == (8900, "127.0.0.1", tmp_path / "b.sqlite")


def test_to_env_gives_a_child_the_same_settings(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    s = MarketSettings.load(None, port=8611, settler_key=KEY, store_dir=tmp_path / "st",
                            index_interval_s=0.25)
    env = s.to_env()
    assert all(name.startswith("QUARRY_MARKET_") for name in env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert MarketSettings.load() == s
    assert s.replace(port=8612).port == 8612 and s.replace(port=8612).settler_key == KEY


@pytest.mark.parametrize(("source", "setting", "value", "message"), [
    ("file", "port", "70000", "market setting port (from {file} [market]): Input should be "
                              "less than or equal to 65535"),
    ("env", "port", "eighty", "market setting port (from QUARRY_MARKET_PORT): Input should be "
                              "a valid integer"),
    ("flag", "sweep_interval_s", "0", "market setting sweep_interval_s (from "
                                      "--sweep-interval-s): Input should be greater than 0"),
    ("env", "redis_url", "localhost", "market setting redis_url (from QUARRY_MARKET_REDIS_URL): "
                                      "'localhost' is not a URL"),
    ("file", "settler_key", "0x12", "market setting settler_key (from {file} [market]): not a "
                                    "hex private key"),
    ("file", "colour", "1", "unknown market setting colour (from {file} [market]"),
])
def test_errors_name_the_setting_and_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, setting: str, value: str,
    message: str,
) -> None:
    cfg = tmp_path / "market.toml"
    cfg.write_text(f'[market]\n{setting} = "{value}"\n' if source == "file" else "[market]\n")
    if source == "env":
        monkeypatch.setenv(f"QUARRY_MARKET_{setting.upper()}", value)
    flags = {setting: value} if source == "flag" else {}
    with pytest.raises(ConfigError) as info:
        MarketSettings.load(cfg, **flags)
    assert message.format(file=cfg) in str(info.value)


def test_serve_on_a_busy_port_says_so_in_one_line_before_starting_anything(
    tmp_path: Path,
) -> None:
    """`market serve` used to print that it was serving, create the board and start its
    ticker, and only then fail on the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_MARKET_")}
        env["QUARRY_HOME"] = str(tmp_path / "home")
        r = subprocess.run(
            [sys.executable, "-m", "market.cli", "serve", "--port", str(port),
             "--db-path", str(tmp_path / "board.sqlite"), "--store-dir", str(tmp_path / "store"),
             "--redis-url", "redis://127.0.0.1:1/0"],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("market: error: cannot listen on port") and str(port) in lines[0]
    assert "serving" not in r.stderr + r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no board, no store, no home


def test_a_bad_setting_ends_serve_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_MARKET_")}
    env |= {"QUARRY_HOME": str(tmp_path / "home"), "QUARRY_MARKET_HEARTBEAT_TTL_S": "-1"}
    r = subprocess.run([sys.executable, "-m", "market.cli", "serve"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "market: error: market setting heartbeat_ttl_s (from QUARRY_MARKET_HEARTBEAT_TTL_S): "
        "Input should be greater than 0, got '-1'"]
