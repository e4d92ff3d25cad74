"""One settings loader for every role (market, miner, verifier, client), on pydantic-settings.

Each source overrides the one before: the class's defaults, the TOML file's `[<role>]` table,
`QUARRY_<ROLE>_<FIELD>` environment variables, then the command-line flags that were given.
A bad value is refused with a `ConfigError` that names the setting and where it came from
(`miner setting engine (from /etc/miner.toml [miner]): ...`), so a CLI prints one line.

Typed values shared by the roles: hex private keys checked on secp256k1 (`Key`), wei
amounts with units (`Wei`: "1500", "0.5ether", "2 gwei"), URLs (`Url`, `OptionalUrl`), ports
(`OptionalPort`), hosts (`Host`) and paths (`SettingPath`; relative ones in a config file
are relative to that file).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tomllib
import typing
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from market.errors import ConfigError

log = logging.getLogger(__name__)

_UNITS = {"wei": 0, "gwei": 9, "ether": 18, "eth": 18}
_AMOUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")
_HEX_KEY = re.compile(r"(0x)?[0-9a-fA-F]{64}")
_URL = re.compile(r"^(https?|redis)://[^\s/]+")
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
KEY_FORMS = ("key", "key_file")  # two ways to give one key: the later source's form wins


# ---------------------------------------------------------------- typed values
def wei(value: Any) -> int:
    """An amount in wei from an integer or a string like "1500", "0.5ether", "2 gwei"."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an amount")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    m = _AMOUNT.fullmatch(value) if isinstance(value, str) else None
    unit = m.group(2).lower() if m else ""
    if not m or unit not in ("", *_UNITS):
        raise ValueError(f"{value!r} is not an amount (give wei, or a number with a unit "
                         f"such as \"0.5ether\": {', '.join(_UNITS)})")
    try:
        amount = Decimal(m.group(1)) * (Decimal(10) ** _UNITS.get(unit, 0))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{value!r}: {exc}") from exc
    if amount != amount.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of wei")
    return int(amount)


def parse_wei(value: Any, name: str, role: str = "miner") -> int:
    """`wei` for callers outside a settings class: errors name the setting."""
    try:
        return wei(value)
    except ValueError as exc:
        raise ConfigError(f"{role} setting {name}: {exc}") from None


def hex_key(value: Any) -> str:
    """A hex private key with its 0x prefix: 64 hex digits naming a secp256k1 scalar in
    [1, n-1] (zero and values from the curve order up sign nothing); "" means not given."""
    if not isinstance(value, str):
        raise ValueError("must be a hex string")
    value = value.strip()
    if not value:
        return ""
    if not _HEX_KEY.fullmatch(value):
        raise ValueError("not a hex private key (64 hex digits)")
    if not 0 < int(value.removeprefix("0x"), 16) < SECP256K1_ORDER:
        raise ValueError("64 hex digits, but not a valid secp256k1 private key (it must be "
                         "between 1 and the curve order - 1)")
    return value if value.startswith("0x") else "0x" + value


def check_key(value: str, name: str, role: str) -> str:
    """`hex_key` for a key read from elsewhere (a key file): errors name where."""
    try:
        key = hex_key(value)
    except ValueError as exc:
        raise ConfigError(f"{role} setting {name}: {exc}") from None
    if not key:
        raise ConfigError(f"{role} setting {name}: empty, not a hex private key")
    return key


def url(value: Any) -> str:
    if not isinstance(value, str) or not _URL.match(value):
        raise ValueError(f"{value!r} is not a URL (http://, https:// or redis://)")
    return value.rstrip("/")


def optional_url(value: Any) -> str | None:
    """A URL, or None for nothing or an empty value (an empty variable unsets it)."""
    return None if value is None or value == "" else url(value)


def optional_port(value: Any) -> int | None:
    """A TCP port, 0 to 65535 (0: any free one), or None for nothing or an empty value."""
    if value is None or value == "":
        return None
    try:
        port = None if isinstance(value, bool | float) else int(value)
    except (TypeError, ValueError):
        port = None
    if port is None or not 0 <= port <= 65535:
        raise ValueError(f"{value!r} is not a port number (0 to 65535)")
    return port


def host(value: Any) -> str:
    """A host name or address to bind or advertise, surrounding spaces dropped."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{value!r} is not a host name or address")
    return value.strip()


def path(value: Any) -> Path:
    if not isinstance(value, str | Path) or not str(value):
        raise ValueError(f"{value!r} is not a path")
    return Path(value).expanduser()


class _FileRelative:
    """Marks a path setting whose relative value in a config file is relative to the file."""


Key = Annotated[str, BeforeValidator(hex_key)]
Wei = Annotated[int, BeforeValidator(wei)]
Url = Annotated[str, BeforeValidator(url)]
OptionalUrl = Annotated[str | None, BeforeValidator(optional_url)]
OptionalPort = Annotated[int | None, BeforeValidator(optional_port)]
Host = Annotated[str, BeforeValidator(host)]
SettingPath = Annotated[Path, BeforeValidator(path), _FileRelative()]


# ---------------------------------------------------------------- sources
def _is_path_setting(annotation: Any) -> bool:
    if any(isinstance(m, _FileRelative) for m in getattr(annotation, "__metadata__", ())):
        return True
    return any(_is_path_setting(arg) for arg in typing.get_args(annotation))


class TableSource(PydanticBaseSettingsSource):
    """The `[<role>]` table of a TOML file, relative paths resolved against the file."""

    def __init__(self, settings_cls: type[BaseSettings], role: str, file: Path) -> None:
        super().__init__(settings_cls)
        self.role, self.file = role, Path(file).expanduser()
        self.label = f"{self.file} [{role}]"

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # pragma: no cover - __call__ reads the whole table

    def __call__(self) -> dict[str, Any]:
        role, file = self.role, self.file
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read {role} config {file}: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{role} config {file} is not valid TOML: {exc}") from exc
        if role not in data:
            raise ConfigError(f"{role} config {file} has no [{role}] table")
        table = data[role]
        if not isinstance(table, dict):
            raise ConfigError(f"{role} config {file}: '{role}' must be a table")
        fields = self.settings_cls.model_fields
        paths = {name for name, f in fields.items() if _is_path_setting(f.annotation)
                 or any(isinstance(m, _FileRelative) for m in f.metadata)}
        return {name: self._relative(value) if name in paths else value
                for name, value in table.items()}

    def _relative(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._relative(v) for v in value]
        if not isinstance(value, str) or not value:
            return value  # the field's validator names what is wrong
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.file.parent / p


class EnvSource(EnvSettingsSource):
    """`QUARRY_<ROLE>_<FIELD>` variables; a table setting takes a JSON object, a list one
    a comma-separated value."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{self.env_prefix}{field_name.upper()} must be a JSON object: "
                              f"{exc}") from None


def comma_list(value: Any) -> Any:
    """A comma-separated string (as an environment variable gives it) as a list."""
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    return value


# ---------------------------------------------------------------- the settings base
class RoleSettings(BaseSettings):
    """A role's settings: frozen, typed, unknown names refused. `load` layers the sources;
    constructing the class directly reads nothing but its arguments (tests, child code)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", case_sensitive=False,
                                      validate_default=False)
    role: ClassVar[str] = ""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # `load` has merged the file, the environment and the flags

    @classmethod
    def env_prefix(cls) -> str:
        return f"QUARRY_{cls.role.upper()}_"

    @classmethod
    def load(cls, config: Path | str | None = None, **flags: Any) -> Self:
        """Defaults, then `[<role>]` of the TOML file at `config`, then `QUARRY_<ROLE>_*`
        variables, then `flags` (None means "not given")."""
        layers: list[tuple[Mapping[str, Any], Any]] = []
        if config is not None:
            table = TableSource(cls, cls.role, Path(config))
            layers.append((table(), table.label))
        env = EnvSource(cls, env_prefix=cls.env_prefix(), case_sensitive=False)
        layers.append((env(), lambda name: f"{cls.env_prefix()}{name.upper()}"))
        layers.append(({k: v for k, v in flags.items() if v is not None},
                       lambda name: f"--{name.replace('_', '-')}"))
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for layer, label in layers:
            for name, value in layer.items():
                where = label(name) if callable(label) else label
                if name not in cls.model_fields:
                    raise ConfigError(f"unknown {cls.role} setting {name} (from {where}; known: "
                                      f"{', '.join(cls.model_fields)})")
                if name in KEY_FORMS:  # a later key or key file replaces an earlier one
                    for form in KEY_FORMS:
                        values.pop(form, None)
                values[name], origin[name] = value, where
        settings = cls.build(values, origin)
        if config is not None and values.get("key") and origin.get("key") == table.label \
                and not public_devnet_key(str(values["key"])):
            warn_if_shared(table.file, "a raw private key (`key`)")  # only once it is valid
        return settings

    @classmethod
    def build(cls, values: Mapping[str, Any], origin: Mapping[str, str]) -> Self:
        """Validate `values`; a ValidationError becomes one ConfigError line per problem
        that names the setting and its source."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError("; ".join(
                _describe(cls.role, err, origin) for err in exc.errors())) from None

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated like the original."""
        values = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self).build({**values, **changes}, {k: "replace()" for k in changes})

    def require(self, *names: str) -> None:
        """Raise ConfigError naming the first of `names` the command needs but lacks."""
        for name in names:
            value = getattr(self, name)
            if value is None or value == "" or value == ():
                raise self.missing(name, name)

    def missing(self, name: str, what: str) -> ConfigError:
        role = self.role
        return ConfigError(
            f"missing {role} setting {what}: set it under [{role}] in the config file "
            f"(--config), in {self.env_prefix()}{name.upper()}, or with its flag")


def _describe(role: str, err: Any, origin: Mapping[str, str]) -> str:
    loc = ".".join(str(part) for part in err["loc"])
    where = origin.get(str(err["loc"][0]) if err["loc"] else "", "default")
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, ValueError):
        message = str(cause)
    else:
        message = err["msg"]
        if err["type"] not in ("missing", "extra_forbidden"):
            message += f", got {err['input']!r}"
    return f"{role} setting {loc} (from {where}): {message}"


class KeyedSettings(RoleSettings):
    """A role that signs: its key inline (`key`) or in a file (`key_file`)."""

    key: Annotated[Key, Field(repr=False)] = ""  # never in a repr or a log line
    key_file: SettingPath | None = None

    def require(self, *names: str) -> None:
        for name in names:
            if name == "key" and not self.key and self.key_file is None:
                raise self.missing("key", "key (hex private key) or key_file")
            if name != "key":
                super().require(name)

    def private_key(self) -> str:
        """The hex private key: `key` inline, or `key_file`, which holds either a hex key or
        an encrypted Ethereum keystore (eth-account's `Account.encrypt` JSON, as wallets
        export them), unlocked with `QUARRY_<ROLE>_KEY_PASSPHRASE` or a prompt."""
        if self.key:
            return self.key
        if self.key_file is None:
            raise self.missing("key", "key (hex private key) or key_file")
        try:
            text = self.key_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{self.role} setting key_file: cannot read {self.key_file}: "
                              f"{exc.strerror}") from exc
        if text.lstrip().startswith("{"):
            return unlock_keystore(self.key_file, text, self.role)
        warn_if_shared(self.key_file, "a raw private key")
        return check_key(text, f"key_file ({self.key_file})", self.role)

    def account(self) -> Any:
        """The LocalAccount (imports eth-account, so only commands that sign call it)."""
        from eth_account import Account

        return Account.from_key(self.private_key())


PASSPHRASE_VAR = "QUARRY_{role}_KEY_PASSPHRASE"
"""Where a role finds its keystore's passphrase; without it a terminal is prompted. It is
not a setting: a passphrase never belongs in a config file."""
_unlocked: dict[tuple[Path, str], str] = {}


def unlock_keystore(path: Path, text: str, role: str) -> str:
    """The hex key in the encrypted keystore `text` (read from `path`); ConfigError on a
    malformed file, a missing or wrong passphrase. Unlocked once per process (scrypt is slow
    by design)."""
    import getpass

    from eth_account import Account

    cached = _unlocked.get((path.resolve(), text))
    if cached is not None:
        return cached
    try:
        keystore = json.loads(text)
        if not isinstance(keystore, dict) or "crypto" not in {k.lower() for k in keystore}:
            raise ValueError("no 'crypto' section")
    except ValueError as exc:
        raise ConfigError(f"{role} setting key_file: {path} is neither a hex key nor an "
                          f"Ethereum keystore ({exc})") from None
    var = PASSPHRASE_VAR.format(role=role.upper())
    passphrase = os.environ.get(var)
    if passphrase is None:
        if not sys.stdin.isatty():
            raise ConfigError(f"{role} setting key_file: {path} is an encrypted keystore; set "
                              f"{var} or run from a terminal to be asked for its passphrase")
        passphrase = getpass.getpass(f"passphrase for {path}: ")
    try:
        key = "0x" + bytes(Account.decrypt(keystore, passphrase)).hex()
    except ValueError as exc:
        reason = ("wrong passphrase" if "MAC mismatch" in str(exc) else str(exc))
        raise ConfigError(f"{role} setting key_file: cannot unlock keystore {path}: "
                          f"{reason}") from None
    _unlocked[(path.resolve(), text)] = key
    return key


def public_devnet_key(key: str) -> bool:
    """Whether `key` is one of the devnet's funded keys (Anvil's default mnemonic): public
    knowledge, so a file that others can read gives nothing away (examples/config/)."""
    global _devnet_keys
    if _devnet_keys is None:
        from market.chain.client import anvil_account  # eth-account: only on this path
        from market.chain.devnet import DEVNET_ACCOUNTS

        _devnet_keys = {bytes(anvil_account(i).key).hex() for i in range(DEVNET_ACCOUNTS)}
    return key.lower().removeprefix("0x") in _devnet_keys


_devnet_keys: set[str] | None = None


def warn_if_shared(path: Path, what: str) -> None:
    """Warn (once per path) when a file holding a secret is readable by other users: fine
    on a devnet, not for a key that holds real funds."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077 and path not in _warned:
        _warned.add(path)
        log.warning("%s holds %s and is readable by other users: chmod 600 it, or use an "
                    "encrypted keystore for a key that holds real funds", path, what)


_warned: set[Path] = set()


class Table(BaseModel):
    """A nested settings table: frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
