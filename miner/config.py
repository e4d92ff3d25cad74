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
    # test_mode = "random"                # CHEATS ON PURPOSE (tests/benchmarks only):
                                          # substitute | perturb | random | wrong-prompt

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
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from market.errors import ConfigError

ENV_PREFIX = "QUARRY_MINER_"
ENGINES = ("torch", "pipeline", "vllm")
DEFAULT_MARKET_URL = "http://127.0.0.1:8600"

_UNITS = {"wei": 0, "gwei": 9, "ether": 18, "eth": 18}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_HEX_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")


def parse_wei(value: Any, name: str) -> int:
    """An amount in wei from an integer or a string like "1500", "0.5ether", "2 gwei"."""
    if isinstance(value, bool):
        raise ConfigError(f"miner setting {name}: {value!r} is not an amount")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"miner setting {name}: {value} is negative")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"miner setting {name}: {value!r} is not an amount (give wei, or a "
                          "string such as \"0.5ether\" or \"2gwei\")")
    m = _AMOUNT.match(value)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in ("", *_UNITS):
        raise ConfigError(f"miner setting {name}: {value!r} is not an amount (give wei, or a "
                          f"number with a unit: {', '.join(_UNITS)})")
    try:
        wei = Decimal(m.group(1)) * (Decimal(10) ** _UNITS.get(unit, 0))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ConfigError(f"miner setting {name}: {value!r}: {exc}") from exc
    if wei != wei.to_integral_value():
        raise ConfigError(f"miner setting {name}: {value!r} is not a whole number of wei")
    return int(wei)


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
    test_mode: str | None = None  # a miner.cheats mode: this miner cheats on purpose

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: Path | str | None = None, **overrides: Any) -> MinerConfig:
        """Defaults, then `[miner]` of the TOML file at `path`, then `QUARRY_MINER_<FIELD>`
        variables, then `overrides` (flags; None means "not given")."""
        table: dict[str, Any] = {}
        if path is not None:
            path = Path(path).expanduser()
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigError(f"cannot read miner config {path}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"miner config {path} is not valid TOML: {exc}") from exc
            if "miner" not in data:
                raise ConfigError(f"miner config {path} has no [miner] table")
            if not isinstance(data["miner"], dict):
                raise ConfigError(f"miner config {path}: 'miner' must be a table")
            table = data["miner"]
        known = {f.name for f in fields(cls)}
        later: dict[str, Any] = {}
        for name in known:
            env = os.environ.get(ENV_PREFIX + name.upper())
            if env is not None:
                later[name] = _from_env(name, env)
        later.update({k: v for k, v in overrides.items() if v is not None})
        unknown = sorted((set(table) | set(later)) - known)
        if unknown:
            raise ConfigError(f"unknown miner setting(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        # Paths in the file are relative to the file; from the environment or flags, to cwd.
        base = path.parent if path is not None else None
        typed = {k: _convert(k, v, base) for k, v in table.items()}
        typed.update({k: _convert(k, v, None) for k, v in later.items()})
        return replace(cls(), **typed)

    # ------------------------------------------------------------------ checks
    def require(self, *names: str) -> None:
        """Raise ConfigError naming the first of `names` this command needs but lacks."""
        for name in names:
            if name == "key":
                if not self.key and self.key_file is None:
                    raise _missing("key", "key (hex private key) or key_file")
                continue
            value = getattr(self, name)
            if value is None or value == "" or value == ():
                raise _missing(name, name)

    def private_key(self) -> str:
        """The hex private key, read from `key_file` when `key` is not given inline."""
        self.require("key")
        if self.key:
            return _check_key(self.key, "key")
        assert self.key_file is not None
        try:
            text = self.key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"miner setting key_file: cannot read {self.key_file}: "
                              f"{exc.strerror}") from exc
        return _check_key(text, f"key_file ({self.key_file})")

    def account(self) -> Any:
        """The miner's LocalAccount (imports eth-account, so only commands that sign call it)."""
        from eth_account import Account

        return Account.from_key(self.private_key())


def _missing(name: str, what: str) -> ConfigError:
    return ConfigError(
        f"missing miner setting {what}: set it under [miner] in the config file (--config), "
        f"in {ENV_PREFIX}{name.upper()}, or with its flag")


def _check_key(value: str, name: str) -> str:
    value = value.strip()
    if not _HEX_KEY.match(value):
        raise ConfigError(f"miner setting {name}: not a hex private key (64 hex digits)")
    return value if value.startswith("0x") else "0x" + value


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


def _path(value: Any, name: str, base: Path | None) -> Path:
    if not isinstance(value, str | Path) or not str(value):
        raise ConfigError(f"miner setting {name}: {value!r} is not a path")
    p = Path(value).expanduser()
    return base / p if base is not None and not p.is_absolute() else p


def _url(value: Any, name: str) -> str:
    if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
        raise ConfigError(f"miner setting {name}: {value!r} is not an http(s) URL")
    return value.rstrip("/")


def _number(value: Any, name: str, kind: type, low: float) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"miner setting {name}: {value!r} is not a number")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"miner setting {name}: {value!r} is not "
                          f"{'an integer' if kind is int else 'a number'}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ConfigError(f"miner setting {name}: {value!r} is not an integer")
    if number < low:
        raise ConfigError(f"miner setting {name}: {value!r} must be at least {low}")
    return number


def _convert(name: str, value: Any, base: Path | None) -> Any:
    """One setting, typed and checked; paths in a config file are relative to that file."""
    if name == "key":
        if not isinstance(value, str):
            raise ConfigError("miner setting key: must be a hex string")
        return _check_key(value, "key") if value else ""
    if name in ("key_file", "deployment"):
        return _path(value, name, base)
    if name == "market_url":
        return _url(value, name)
    if name == "rpc_url":
        return _url(value, name) if value else None
    if name == "model_dirs":
        if isinstance(value, str | Path):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError("miner setting model_dirs: must be a list of directories")
        return tuple(_path(v, "model_dirs", base) for v in value)
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
        number = _number(value, name, float, 0.0)
        if number <= 0:
            raise ConfigError(f"miner setting {name}: must be greater than 0")
        return number
    if name == "max_batch":
        return _number(value, name, int, 1)
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
    return GpuOverride(name.strip(), _number(value["memory_mib"], "gpu.memory_mib", int, 1),
                       _number(value["count"], "gpu.count", int, 1))
