"""The client's settings: a TOML file's `[client]` table, then `QUARRY_CLIENT_*`, then flags.

    [client]
    market_url = "http://127.0.0.1:8600"
    rpc_url = "http://127.0.0.1:8545"     # optional: default is the market deployment's RPC
    key_file = "~/.quarry/client.key"     # or: key = "0x..." (a file keeps it out of ps)

Environment: QUARRY_CLIENT_MARKET_URL, QUARRY_CLIENT_RPC_URL, QUARRY_CLIENT_KEY,
QUARRY_CLIENT_KEY_FILE. Kept free of web3 so the CLI starts fast.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from market.errors import ConfigError

DEFAULT_MARKET_URL = "http://127.0.0.1:8600"
_KEYS = ("market_url", "rpc_url", "key", "key_file")


def format_eth(wei: int) -> str:
    """Wei as an exact decimal ETH amount (no float rounding): 27000000000 -> 0.000000027 ETH."""
    whole, frac = divmod(int(wei), 10**18)
    return f"{whole}.{frac:018d}".rstrip("0").rstrip(".") + " ETH"


@dataclass(frozen=True)
class ClientConfig:
    market_url: str
    rpc_url: str | None
    private_key: str

    def connect(self) -> Any:
        """A connected `client.sdk.Client` (imports web3 only now)."""
        from client.sdk import Client

        return Client(self.rpc_url, self.private_key, self.market_url)


def _read_key_file(path: Path) -> str:
    try:
        key = path.expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read client key file {path}: {exc.strerror}") from exc
    if not key:
        raise ConfigError(f"client key file {path} is empty")
    return key


def load_config(config: Path | str | None = None, **flags: Any) -> ClientConfig:
    """Defaults, then the TOML file's `[client]` table, then `QUARRY_CLIENT_<KEY>` variables,
    then `flags` that were given (None means not given). A key given at a later level
    replaces a key or key file from an earlier one."""
    values: dict[str, Any] = {}

    def set_value(name: str, value: Any, where: str) -> None:
        if name not in _KEYS:
            raise ConfigError(f"{where}: unknown client setting {name!r} "
                              f"(known: {', '.join(_KEYS)})")
        if name in ("key", "key_file"):  # the later level's key wins, whichever form
            values.pop("key", None)
            values.pop("key_file", None)
        values[name] = value

    if config is not None:
        path = Path(config).expanduser()
        try:
            table = tomllib.loads(path.read_text()).get("client", {})
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
        if not isinstance(table, dict):
            raise ConfigError(f"config {path}: [client] must be a table")
        for name, value in table.items():
            if not isinstance(value, str):
                raise ConfigError(f"config {path}: client.{name} must be a string")
            set_value(name, value, f"config {path}")
    for name in _KEYS:
        env = os.environ.get(f"QUARRY_CLIENT_{name.upper()}")
        if env:
            set_value(name, env, f"QUARRY_CLIENT_{name.upper()}")
    for name, value in flags.items():
        if value is not None:
            set_value(name, str(value), f"--{name.replace('_', '-')}")

    if "key" in values:
        key = values["key"].strip()
    elif "key_file" in values:
        key = _read_key_file(Path(values["key_file"]))
    else:
        raise ConfigError("no client key: set key or key_file in the [client] table of --config, "
                          "QUARRY_CLIENT_KEY or QUARRY_CLIENT_KEY_FILE, or pass --key-file")
    return ClientConfig(
        market_url=values.get("market_url") or DEFAULT_MARKET_URL,
        rpc_url=values.get("rpc_url") or None,
        private_key=key,
    )
