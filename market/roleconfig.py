"""What the role configs (`[miner]`, `[verifier]`) share: reading one TOML table plus
`QUARRY_<ROLE>_*` variables, and typed values (keys, wei amounts, URLs, paths, numbers) with
errors that name the setting.

Each source overrides the one before: defaults, the file's table, the environment, flags.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, TypeVar

from market.errors import ConfigError

T = TypeVar("T")

_UNITS = {"wei": 0, "gwei": 9, "ether": 18, "eth": 18}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_HEX_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")


def read_table(path: Path | str | None, role: str) -> tuple[dict[str, Any], Path | None]:
    """The `[role]` table of the TOML file at `path` (empty without a file) and the
    directory relative paths in it are resolved against."""
    if path is None:
        return {}, None
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {role} config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{role} config {path} is not valid TOML: {exc}") from exc
    if role not in data:
        raise ConfigError(f"{role} config {path} has no [{role}] table")
    if not isinstance(data[role], dict):
        raise ConfigError(f"{role} config {path}: '{role}' must be a table")
    return data[role], path.parent


def layered(
    role: str,
    known: Iterable[str],
    path: Path | str | None,
    overrides: Mapping[str, Any],
    from_env: Callable[[str, str], Any],
) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """(file values, environment-and-flag values, file directory), unknown names refused."""
    table, base = read_table(path, role)
    known = set(known)
    prefix = f"QUARRY_{role.upper()}_"
    later: dict[str, Any] = {}
    for name in known:
        env = os.environ.get(prefix + name.upper())
        if env is not None:
            later[name] = from_env(name, env)
    later.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted((set(table) | set(later)) - known)
    if unknown:
        raise ConfigError(f"unknown {role} setting(s): {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(known))})")
    return table, later, base


def load_config(
    cls: type[T],
    role: str,
    path: Path | str | None,
    overrides: Mapping[str, Any],
    from_env: Callable[[str, str], Any],
    convert: Callable[[str, Any, Path | None], Any],
) -> T:
    """A role's frozen config dataclass from its defaults, the file, the environment and
    flags; paths in the file are relative to the file, others to the working directory."""
    table, later, base = layered(role, {f.name for f in fields(cls)},  # type: ignore[arg-type]
                                 path, overrides, from_env)
    typed = {k: convert(k, v, base) for k, v in table.items()}
    typed.update({k: convert(k, v, None) for k, v in later.items()})
    return replace(cls(), **typed)  # type: ignore[type-var]


def require_settings(cfg: Any, role: str, *names: str) -> None:
    """Raise ConfigError naming the first of `names` the command needs but `cfg` lacks."""
    for name in names:
        if name == "key":
            if not cfg.key and cfg.key_file is None:
                raise missing(role, "key", "key (hex private key) or key_file")
            continue
        value = getattr(cfg, name)
        if value is None or value == "" or value == ():
            raise missing(role, name, name)


def parse_wei(value: Any, name: str, role: str = "miner") -> int:
    """An amount in wei from an integer or a string like "1500", "0.5ether", "2 gwei"."""
    if isinstance(value, bool):
        raise ConfigError(f"{role} setting {name}: {value!r} is not an amount")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{role} setting {name}: {value} is negative")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{role} setting {name}: {value!r} is not an amount (give wei, or a "
                          "string such as \"0.5ether\" or \"2gwei\")")
    m = _AMOUNT.match(value)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in ("", *_UNITS):
        raise ConfigError(f"{role} setting {name}: {value!r} is not an amount (give wei, or a "
                          f"number with a unit: {', '.join(_UNITS)})")
    try:
        wei = Decimal(m.group(1)) * (Decimal(10) ** _UNITS.get(unit, 0))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ConfigError(f"{role} setting {name}: {value!r}: {exc}") from exc
    if wei != wei.to_integral_value():
        raise ConfigError(f"{role} setting {name}: {value!r} is not a whole number of wei")
    return int(wei)


SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def check_key(value: str, name: str, role: str = "miner") -> str:
    """A hex private key with its 0x prefix: 64 hex digits naming a secp256k1 scalar in
    [1, n-1] (zero and values from the curve order up sign nothing)."""
    value = value.strip()
    if not _HEX_KEY.match(value):
        raise ConfigError(f"{role} setting {name}: not a hex private key (64 hex digits)")
    if not 0 < int(value.removeprefix("0x"), 16) < SECP256K1_ORDER:
        raise ConfigError(f"{role} setting {name}: 64 hex digits, but not a valid secp256k1 "
                          "private key (it must be between 1 and the curve order - 1)")
    return value if value.startswith("0x") else "0x" + value


def read_key(key: str, key_file: Path | None, role: str) -> str:
    """The hex private key, inline or read from `key_file`."""
    if key:
        return check_key(key, "key", role)
    if key_file is None:
        raise missing(role, "key", "key (hex private key) or key_file")
    try:
        text = key_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{role} setting key_file: cannot read {key_file}: "
                          f"{exc.strerror}") from exc
    return check_key(text, f"key_file ({key_file})", role)


def missing(role: str, name: str, what: str) -> ConfigError:
    return ConfigError(
        f"missing {role} setting {what}: set it under [{role}] in the config file (--config), "
        f"in QUARRY_{role.upper()}_{name.upper()}, or with its flag")


def as_path(value: Any, name: str, base: Path | None, role: str = "miner") -> Path:
    """A path; relative ones in a config file are relative to that file."""
    if not isinstance(value, str | Path) or not str(value):
        raise ConfigError(f"{role} setting {name}: {value!r} is not a path")
    p = Path(value).expanduser()
    return base / p if base is not None and not p.is_absolute() else p


def as_url(value: Any, name: str, role: str = "miner") -> str:
    if not isinstance(value, str) or not re.match(r"^(https?|redis)://[^\s/]+", value):
        raise ConfigError(f"{role} setting {name}: {value!r} is not a URL")
    return value.rstrip("/")


def as_number(value: Any, name: str, kind: type, low: float, role: str = "miner") -> Any:
    """An int or float of at least `low`."""
    if isinstance(value, bool):
        raise ConfigError(f"{role} setting {name}: {value!r} is not a number")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{role} setting {name}: {value!r} is not "
                          f"{'an integer' if kind is int else 'a number'}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ConfigError(f"{role} setting {name}: {value!r} is not an integer")
    if number < low:
        raise ConfigError(f"{role} setting {name}: {value!r} must be at least {low}")
    return number
