"""The [client] settings through the loader every role shares: file, then QUARRY_CLIENT_*,
then flags, a later key form replacing an earlier one, and errors that name the setting and
its source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client.config import DEFAULT_MARKET_URL, ClientConfig, format_eth
from market.errors import ConfigError

KEY1, KEY2 = "0x" + "01" * 32, "0x" + "02" * 32


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("QUARRY_CLIENT_"):
            monkeypatch.delenv(name)


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "client.key"
    key_file.write_text(KEY1 + "\n")
    config = tmp_path / "client.toml"
    config.write_text('[client]\nmarket_url = "http://m:1/"\nkey_file = "client.key"\n')
    c = ClientConfig.load(config)
    assert (c.market_url, c.rpc_url, c.private_key()) == ("http://m:1", None, KEY1)
    assert c.key_file == key_file  # relative to the config file
    monkeypatch.setenv("QUARRY_CLIENT_KEY", KEY2)  # env beats the file's key_file
    monkeypatch.setenv("QUARRY_CLIENT_RPC_URL", "http://r:2")
    c = ClientConfig.load(config)
    assert (c.rpc_url, c.private_key(), c.key_file) == ("http://r:2", KEY2, None)
    c = ClientConfig.load(config, market_url="http://flag:3", rpc_url=None,
                          key_file=str(key_file))  # the flag's key file beats env's key
    assert (c.market_url, c.rpc_url, c.private_key()) == ("http://flag:3", "http://r:2", KEY1)
    monkeypatch.delenv("QUARRY_CLIENT_KEY")
    assert ClientConfig.load(key_file=str(key_file)).market_url == DEFAULT_MARKET_URL


def test_errors_name_the_setting_and_the_source(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="missing client setting key .* QUARRY_CLIENT_KEY"):
        ClientConfig.load().private_key()
    bad = tmp_path / "bad.toml"
    bad.write_text('[client]\nkee = "x"\n')
    with pytest.raises(ConfigError, match=r"unknown client setting kee \(from .*bad.toml"):
        ClientConfig.load(bad)
    with pytest.raises(ConfigError, match="client setting key_file: cannot read"):
        ClientConfig.load(key_file=str(tmp_path / "nope")).private_key()
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(ConfigError, match="key_file .*empty"):
        ClientConfig.load(key_file=str(tmp_path / "empty.key")).private_key()
    monkeypatch.setenv("QUARRY_CLIENT_KEY", "0x" + "0" * 64)
    with pytest.raises(ConfigError, match=r"client setting key \(from QUARRY_CLIENT_KEY\): "
                                          "64 hex digits, but not a valid secp256k1"):
        ClientConfig.load()
    monkeypatch.delenv("QUARRY_CLIENT_KEY")
    with pytest.raises(ConfigError, match=r"client setting market_url \(from --market-url\): "
                                          "'m:1' is not a URL"):
        ClientConfig.load(market_url="m:1")


def test_format_eth() -> None:
    assert format_eth(27_000_000_000) == "0.000000027 ETH"
    assert format_eth(10**18) == "1 ETH" and format_eth(0) == "0 ETH"
