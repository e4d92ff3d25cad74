"""The market service's settings: a TOML file's `[market]` table, then `QUARRY_MARKET_*`
variables, then flags (`market.roleconfig`, the loader every role shares).

Every process of one market (the FastAPI apps and each Celery worker) reads the same
settings, so they share one store (the directory `store_dir`, or the bucket `store_url`),
one board (the SQLite file `db_path`, or the PostgreSQL database `database_url`) and one
Redis; `to_env` hands them to child processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from market.config import deployment_path, quarry_home
from market.roleconfig import Key, RoleSettings, SettingPath, Url
from market.store import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    ContentStore,
    LocalStore,
)


def postgres_url(value: Any) -> str:
    """Empty (the SQLite board at `db_path`) or a `postgresql://` URL."""
    from market.service.boardsql import is_postgres

    text = "" if value is None else str(value).strip()
    if text and not is_postgres(text):
        raise ValueError(f"{text!r} is not a PostgreSQL URL (postgresql://user@host/db)")
    return text


def bucket_url(value: Any) -> str:
    """Empty (the local `store_dir`) or an `s3://bucket/prefix` address."""
    text = "" if value is None else str(value).strip()
    if text and not (text.startswith("s3://") and len(text) > len("s3://")):
        raise ValueError(f"{text!r} is not a bucket address (s3://bucket/prefix)")
    return text


Seconds = Annotated[float, Field(gt=0)]
PerSecond = Annotated[float, Field(gt=0)]


class MarketSettings(RoleSettings):
    """Where the market keeps its state and how often its background work runs."""

    role = "market"

    redis_url: Url = "redis://127.0.0.1:6379/0"
    deployment: SettingPath = Field(default_factory=deployment_path)
    store_dir: SettingPath = Field(default_factory=lambda: quarry_home() / "store")
    # Replicas on several hosts share a bucket instead: s3://bucket/prefix (credentials from
    # boto3's usual chain); store_endpoint_url names an S3-compatible service (MinIO...).
    store_url: Annotated[str, BeforeValidator(bucket_url)] = ""
    store_endpoint_url: str = ""
    db_path: SettingPath = Field(default_factory=lambda: quarry_home() / "board.sqlite")
    # Replicas on several hosts share a PostgreSQL board: postgresql://user:pass@host/db
    # (empty: the SQLite file above, for one host).
    database_url: Annotated[str, BeforeValidator(postgres_url), Field(repr=False)] = ""
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8600
    max_file_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_FILE_BYTES
    max_request_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_REQUEST_BYTES
    # The account that sends settlement transactions (finalize, reclaim, refund, settle
    # unanswered challenges, expire disputes, report absences); anyone may. Empty: the sweeps
    # only report what is due.
    settler_key: Annotated[Key, Field(repr=False)] = ""
    index_interval_s: Seconds = 1.0
    sweep_interval_s: Seconds = 2.0
    heartbeat_ttl_s: Seconds = 30.0
    # Swarms: a member silent this long has left (its next join re-admits it); the placement
    # algorithm of live plans; how long a plan's SwarmConsent terms stay signable on-chain.
    swarm_member_ttl_s: Seconds = 15.0
    swarm_algorithm: Literal["parallax", "cgbp", "petals"] = "parallax"
    swarm_consent_window_s: Annotated[int, Field(ge=60, le=30 * 86400)] = 3600
    # Admission (`market.admission`): how often anyone may ask for what the caller makes the
    # market pay for, in requests a second (all callers together unless said), with bursts
    # of `limit_burst_s` seconds' worth and at most `limited_at_once` of each kind inside at
    # once; past that a 429 with Retry-After, before any work. The rest of the API is not
    # limited.
    ui_per_s: PerSecond = 10.0  # GET /ui (drawn anew at most once a second in any case)
    ui_tx_per_s: PerSecond = 10.0  # GET /ui/tx/{hash}
    metrics_per_s: PerSecond = 2.0  # GET /metrics (Prometheus scrapes every 15 s or so)
    swarm_joins_per_s: PerSecond = 20.0  # POST /swarms/{modelId}/members
    # ... and from each signing miner (a member joins every `heartbeat_interval_s`, 5 s by
    # default; a join no newer than its last, in whole seconds, is ignored anyway)
    swarm_joins_per_miner_per_s: PerSecond = 2.0
    limit_burst_s: Seconds = 2.0
    limited_at_once: Annotated[int, Field(ge=1, le=16)] = 4

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def open_store(self) -> ContentStore:
        """The store these settings name: the bucket `store_url` (an S3-compatible service
        at `store_endpoint_url`, AWS when empty), else the directory `store_dir`."""
        if self.store_url:
            from market.s3store import S3Store

            return S3Store(self.store_url, self.max_file_bytes,
                           endpoint_url=self.store_endpoint_url or None)
        return LocalStore(self.store_dir, self.max_file_bytes)

    @property
    def board_location(self) -> Path | str:
        """Where the board lives: `database_url` when set, else the SQLite file."""
        return self.database_url or self.db_path

    @property
    def board_name(self) -> str:
        """The board for messages (a URL without its password)."""
        from market.service.boardsql import redacted

        return redacted(self.database_url) if self.database_url else str(self.db_path)

    @property
    def settler_address(self) -> str | None:
        """The settler key's address, or None when no key is set."""
        if not self.settler_key:
            return None
        from eth_account import Account

        return str(Account.from_key(self.settler_key).address)

    def to_env(self) -> dict[str, str]:
        """The `QUARRY_MARKET_*` variables that give a child process (a worker) these same
        settings."""
        return {f"{self.env_prefix()}{name.upper()}": str(getattr(self, name))
                for name in type(self).model_fields}


