"""The market service's settings: a TOML file's `[market]` table, then `QUARRY_*` variables.

Every process of one market (the FastAPI app and each Celery worker) reads the same
settings, so they share one store directory, one SQLite board and one Redis.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from market.config import deployment_path, quarry_home
from market.errors import ConfigError
from market.store import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_REQUEST_BYTES


@dataclass(frozen=True)
class MarketSettings:
    """Where the market keeps its state and how often its background work runs."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    deployment: Path = field(default_factory=deployment_path)
    store_dir: Path = field(default_factory=lambda: quarry_home() / "store")
    db_path: Path = field(default_factory=lambda: quarry_home() / "board.sqlite")
    host: str = "127.0.0.1"
    port: int = 8600
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # The account that sends settlement transactions (finalize, reclaim, refund, settle
    # unanswered challenges, expire disputes, report absences); anyone may. Empty: the sweeps
    # only report what is due.
    settler_key: str = ""
    index_interval_s: float = 1.0
    sweep_interval_s: float = 2.0
    heartbeat_ttl_s: float = 30.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_env(self) -> dict[str, str]:
        """The variables that give a child process (a worker) these same settings."""
        return {f"QUARRY_{f.name.upper()}": str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def load(cls, config: Path | None = None, **overrides: Any) -> MarketSettings:
        """Defaults, then the TOML file's `[market]` table, then `QUARRY_<FIELD>` variables,
        then `overrides` (command-line flags that were given)."""
        values: dict[str, Any] = {}
        if config is not None:
            try:
                table = tomllib.loads(Path(config).read_text()).get("market", {})
            except OSError as exc:
                raise ConfigError(f"cannot read config {config}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config {config} is not valid TOML: {exc}") from exc
            values.update(table)
        for f in fields(cls):
            env = os.environ.get(f"QUARRY_{f.name.upper()}")
            if env is not None:
                values[f.name] = env
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown market setting(s): {', '.join(unknown)}")
        settings = cls()
        typed: dict[str, Any] = {}
        for name, value in values.items():
            default = getattr(settings, name)
            try:
                typed[name] = Path(value) if isinstance(default, Path) else type(default)(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"market setting {name}={value!r}: {exc}") from exc
        return replace(settings, **typed)
