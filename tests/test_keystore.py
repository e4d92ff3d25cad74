"""Keys as wallets hold them: every role's `key_file` may be an encrypted Ethereum keystore
(eth-account's `Account.encrypt` JSON), unlocked with `QUARRY_<ROLE>_KEY_PASSPHRASE` or a
prompt; a raw key readable by other users gets a warning."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from client.config import ClientConfig
from market.errors import ConfigError
from market.roleconfig import KeyedSettings
from miner.config import MinerConfig
from verifier.config import VerifierConfig

KEY = "0x" + "4c" * 32
ADDRESS = Account.from_key(KEY).address
PASSPHRASE = "correct horse battery staple"


def write_keystore(path: Path, passphrase: str = PASSPHRASE) -> Path:
    """A keystore as wallets export it (scrypt, with a small cost so the test is quick)."""
    path.write_text(json.dumps(Account.encrypt(KEY, passphrase, kdf="scrypt", iterations=2**10)))
    return path


def clear_passphrases(monkeypatch: pytest.MonkeyPatch) -> None:
    for role in ("MINER", "VERIFIER", "CLIENT"):
        monkeypatch.delenv(f"QUARRY_{role}_KEY_PASSPHRASE", raising=False)
        monkeypatch.delenv(f"QUARRY_{role}_KEY", raising=False)
        monkeypatch.delenv(f"QUARRY_{role}_KEY_FILE", raising=False)


@pytest.mark.parametrize("cls", [MinerConfig, VerifierConfig, ClientConfig])
def test_every_role_unlocks_a_keystore_with_its_passphrase_variable(
        cls: type[KeyedSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_passphrases(monkeypatch)
    keystore = write_keystore(tmp_path / f"{cls.role}.json")
    monkeypatch.setenv(f"QUARRY_{cls.role.upper()}_KEY_PASSPHRASE", PASSPHRASE)
    cfg = cls.load(key_file=str(keystore))
    assert cfg.private_key() == KEY
    assert cfg.account().address == ADDRESS


def test_wrong_missing_and_malformed_keystores_are_one_line_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_passphrases(monkeypatch)
    keystore = write_keystore(tmp_path / "wallet.json")
    cfg = ClientConfig.load(key_file=str(keystore))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(ConfigError, match="set QUARRY_CLIENT_KEY_PASSPHRASE or run from a "
                                          "terminal"):
        cfg.private_key()
    monkeypatch.setenv("QUARRY_CLIENT_KEY_PASSPHRASE", "not it")
    with pytest.raises(ConfigError, match="cannot unlock keystore .*wallet.json: wrong "
                                          "passphrase"):
        cfg.private_key()
    bad = tmp_path / "bad.json"
    bad.write_text('{"address": "00"}')
    with pytest.raises(ConfigError, match="neither a hex key nor an Ethereum keystore"):
        ClientConfig.load(key_file=str(bad)).private_key()


def test_a_terminal_is_asked_for_the_passphrase(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    clear_passphrases(monkeypatch)
    keystore = write_keystore(tmp_path / "miner.json", passphrase="asked")
    asked: list[str] = []

    def getpass(prompt: str) -> str:
        asked.append(prompt)
        return "asked"

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("getpass.getpass", getpass)
    assert MinerConfig.load(key_file=str(keystore)).private_key() == KEY
    assert asked == [f"passphrase for {keystore}: "]


def test_a_raw_key_readable_by_others_is_warned_about(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    clear_passphrases(monkeypatch)
    private = tmp_path / "private.key"
    private.write_text(KEY + "\n")
    private.chmod(0o600)
    shared = tmp_path / "shared.key"
    shared.write_text(KEY + "\n")
    shared.chmod(0o644)
    toml = tmp_path / "client.toml"
    toml.write_text(f'[client]\nkey = "{KEY}"\n')
    toml.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="market.roleconfig"):
        assert ClientConfig.load(key_file=str(private)).private_key() == KEY
        assert not caplog.records
        assert ClientConfig.load(key_file=str(shared)).private_key() == KEY
        assert ClientConfig.load(toml).private_key() == KEY
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert str(shared) in warned[0] and "readable by other users" in warned[0]
    assert str(toml) in warned[1] and "raw private key (`key`)" in warned[1]


def test_the_devnets_public_keys_in_a_readable_config_are_not_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """examples/config/ holds the devnet's keys, which everyone knows: no warning."""
    from market.chain.client import anvil_account

    example = Path(__file__).resolve().parent.parent / "examples" / "config" / "client.toml"
    config = tmp_path / "client.toml"
    config.write_text(example.read_text())
    config.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="market.roleconfig"):
        key = ClientConfig.load(config).private_key()
    assert key.lower() == "0x" + bytes(anvil_account(1).key).hex()
    assert not caplog.records


@pytest.mark.chain
def test_miner_cli_reads_a_keystore(devnet: Any, deployment_file: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`miner status` as a user runs it: a keystore path in the config, the passphrase in
    the environment; without it (no terminal) one line and exit 1."""
    clear_passphrases(monkeypatch)
    keystore = write_keystore(tmp_path / "miner.json")
    cfg = tmp_path / "miner.toml"
    rpc = devnet.deployment.rpc_url
    cfg.write_text(f'[miner]\nkey_file = "{keystore.name}"\nrpc_url = "{rpc}"\n')
    cmd = [sys.executable, "-m", "miner.cli", "status", "--config", str(cfg), "--json"]
    env = {**os.environ, "QUARRY_MINER_KEY_PASSPHRASE": PASSPHRASE}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["address"] == ADDRESS
    env.pop("QUARRY_MINER_KEY_PASSPHRASE")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "is an encrypted keystore; set QUARRY_MINER_KEY_PASSPHRASE" in line
