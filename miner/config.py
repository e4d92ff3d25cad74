"""The miner's configuration: a TOML file's `[miner]` table, then `QUARRY_MINER_*` variables,
then command-line flags (each later source overrides the earlier).

    [miner]
    key_file = "~/.quarry/miner.key"      # or key = "0x..." (hex private key)
    market_url = "http://127.0.0.1:8600"
    # rpc_url = "http://127.0.0.1:8545"   # default: the market's /deployment
    # deployment = ".quarry/deployment.json"  # fallback when the market is unreachable
    model_dirs = ["models/quarry-tiny"]
    engine = "torch"                      # torch | pipeline | vllm
    price_per_token = "1gwei"             # wei per output token
    stake = "0.5ether"                    # total stake to hold in GPURegistry
    endpoint = "http://203.0.113.7:9100"  # advertised on-chain
    poll_interval_s = 2.0
    max_batch = 8
    auto_withdraw = false
    # state_dir = "~/.quarry/miner"       # default $QUARRY_HOME/miner: copies of submitted
                                          # results, to answer availability challenges
    # test_mode = "random"                # CHEATS ON PURPOSE (tests/benchmarks only):
                                          # any mode of miner/cheats.py

    [miner.engine_options]                # passed to the engine's constructor
    device = "cuda"

    [miner.gpu]                           # optional: overrides what torch detects
    name = "NVIDIA H100"
    memory_mib = 81920
    count = 1

Environment variables are `QUARRY_MINER_<FIELD>` (e.g. `QUARRY_MINER_KEY`); list fields take
a comma-separated value, table fields a JSON object. Loading only checks what is given;
each command then `require`s the fields it needs, so `miner status` needs no model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.errors import ConfigError
from market.roleconfig import (
    as_number,
    as_path,
    as_url,
    check_key,
    load_config,
    parse_wei,
    read_key,
    require_settings,
)

ROLE = "miner"
ENV_PREFIX = "QUARRY_MINER_"
ENGINES = ("torch", "pipeline", "vllm")
DEFAULT_MARKET_URL = "http://127.0.0.1:8600"


@dataclass(frozen=True)
class GpuOverride:
    """A GPU spec given in the config instead of the one torch detects."""

    name: str
    memory_mib: int
    count: int


@dataclass(frozen=True)
class MinerConfig:
    """Everything the miner commands read. Amounts are wei, intervals seconds."""

    key: str = ""
    key_file: Path | None = None
    market_url: str = DEFAULT_MARKET_URL
    rpc_url: str | None = None
    deployment: Path | None = None
    model_dirs: tuple[Path, ...] = ()
    engine: str = "torch"
    engine_options: dict[str, Any] = field(default_factory=dict)
    price_per_token: int | None = None
    stake: int | None = None
    endpoint: str = ""
    gpu: GpuOverride | None = None
    poll_interval_s: float = 2.0
    heartbeat_interval_s: float = 5.0
    max_batch: int = 8
    auto_withdraw: bool = False
    state_dir: Path | None = None  # None: $QUARRY_HOME/miner (miner.archive)
    test_mode: str | None = None  # a miner.cheats mode: this miner cheats on purpose

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: Path | str | None = None, **overrides: Any) -> MinerConfig:
        """Defaults, then `[miner]` of the TOML file at `path`, then `QUARRY_MINER_<FIELD>`
        variables, then `overrides` (flags; None means "not given")."""
        return load_config(cls, ROLE, path, overrides, _from_env, _convert)

    # ------------------------------------------------------------------ checks
    def require(self, *names: str) -> None:
        """Raise ConfigError naming the first of `names` this command needs but lacks."""
        require_settings(self, ROLE, *names)

    def private_key(self) -> str:
        """The hex private key, read from `key_file` when `key` is not given inline."""
        return read_key(self.key, self.key_file, ROLE)

    def account(self) -> Any:
        """The miner's LocalAccount (imports eth-account, so only commands that sign call it)."""
        from eth_account import Account

        return Account.from_key(self.private_key())


def _from_env(name: str, text: str) -> Any:
    """An environment value in the shape the TOML would have given."""
    if name in ("engine_options", "gpu"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be a JSON object: {exc}") from exc
    if name == "model_dirs":
        return [p.strip() for p in text.split(",") if p.strip()]
    if name == "auto_withdraw":
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{ENV_PREFIX}AUTO_WITHDRAW={text!r} is not a boolean")
    return text


def _convert(name: str, value: Any, base: Path | None) -> Any:
    """One setting, typed and checked; paths in a config file are relative to that file."""
    if name == "key":
        if not isinstance(value, str):
            raise ConfigError("miner setting key: must be a hex string")
        return check_key(value, "key", ROLE) if value else ""
    if name in ("key_file", "deployment", "state_dir"):
        return as_path(value, name, base)
    if name == "market_url":
        return as_url(value, name)
    if name == "rpc_url":
        return as_url(value, name) if value else None
    if name == "model_dirs":
        if isinstance(value, str | Path):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError("miner setting model_dirs: must be a list of directories")
        return tuple(as_path(v, "model_dirs", base) for v in value)
    if name == "engine":
        kind = str(value).strip().lower()
        if kind not in ENGINES:
            raise ConfigError(f"miner setting engine: {value!r} is not one of "
                              f"{', '.join(ENGINES)}")
        return kind
    if name == "engine_options":
        if not isinstance(value, dict):
            raise ConfigError("miner setting engine_options: must be a table")
        return dict(value)
    if name in ("price_per_token", "stake"):
        wei = parse_wei(value, name)
        if name == "price_per_token" and wei == 0:
            raise ConfigError("miner setting price_per_token: must be at least 1 wei")
        return wei
    if name == "endpoint":
        if not isinstance(value, str) or not value.strip():
            raise ConfigError("miner setting endpoint: must be a non-empty URL string")
        return value.strip()
    if name == "gpu":
        return _gpu(value)
    if name in ("poll_interval_s", "heartbeat_interval_s"):
        number = as_number(value, name, float, 0.0)
        if number <= 0:
            raise ConfigError(f"miner setting {name}: must be greater than 0")
        return number
    if name == "max_batch":
        return as_number(value, name, int, 1)
    if name == "auto_withdraw":
        if not isinstance(value, bool):
            raise ConfigError(f"miner setting auto_withdraw: {value!r} is not true or false")
        return value
    if name == "test_mode":
        from miner.cheats import CHEAT_MODES  # only a miner asked to cheat loads this

        mode = str(value).strip().lower()
        if mode == "":  # an empty variable or setting: an honest miner
            return None
        if mode not in CHEAT_MODES:
            raise ConfigError(f"miner setting test_mode: {value!r} is not a test mode; valid "
                              f"modes: {', '.join(CHEAT_MODES)}")
        return mode
    raise ConfigError(f"unknown miner setting {name}")  # pragma: no cover - checked before


def _gpu(value: Any) -> GpuOverride:
    if not isinstance(value, dict):
        raise ConfigError("miner setting gpu: must be a table {name, memory_mib, count}")
    extra = sorted(set(value) - {"name", "memory_mib", "count"})
    if extra:
        raise ConfigError(f"miner setting gpu: unknown key(s) {', '.join(extra)} "
                          "(expected name, memory_mib, count)")
    for key in ("name", "memory_mib", "count"):
        if key not in value:
            raise ConfigError(f"miner setting gpu.{key}: missing")
    name = value["name"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("miner setting gpu.name: must be a non-empty string")
    return GpuOverride(name.strip(), as_number(value["memory_mib"], "gpu.memory_mib", int, 1),
                       as_number(value["count"], "gpu.count", int, 1))
