"""The verifier's configuration: a TOML file's `[verifier]` table, then `QUARRY_VERIFIER_*`
variables, then command-line flags (each later source overrides the earlier).

    [verifier]
    key_file = "~/.quarry/verifier.key"   # or key = "0x..."
    market_url = "http://127.0.0.1:8600"
    # rpc_url = "http://127.0.0.1:8545"   # default: the market's /deployment
    model_dir = "models/quarry-tiny"      # the reference model (its manifest is checked)
    stake = "0.1ether"                    # stake to hold in VerifierCommittee
    redis_url = "redis://127.0.0.1:6379/0"  # Celery broker of the scoring workers
    scoring_workers = 1                   # spawned by `verifier run`; 0: run `verifier worker`
    poll_interval_s = 1.0
    challenge_requests = 16               # requests per miner per epoch (greedy and sampled)
    challenge_max_tokens = 64
    tolerance_bps = 500                   # co-sign when |own score - leader's| <= this
    greedy_margin = 0.01                  # nats a greedy token may lose to the argmax by
    audit_rate_bps = 1000                 # share of client shards re-scored (audits)
    state_dir = "~/.quarry/verifier"      # what this verifier signed (never equivocate)

    [verifier.reputation]                 # verifier.reputation.ReputationParams
    alpha = 0.5
    penalty = "stricter"

`test_mode` ("lie" or "withhold") makes a Byzantine verifier for tests; never set it otherwise.
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
    load_config,
    parse_wei,
    read_key,
    require_settings,
)

ROLE = "verifier"
DEFAULT_MARKET_URL = "http://127.0.0.1:8600"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TEST_MODES = ("lie", "withhold")


@dataclass(frozen=True)
class VerifierConfig:
    """Everything the verifier commands read. Amounts are wei, intervals seconds."""

    key: str = ""
    key_file: Path | None = None
    market_url: str = DEFAULT_MARKET_URL
    rpc_url: str | None = None
    deployment: Path | None = None
    model_dir: Path | None = None
    stake: int | None = None
    redis_url: str = DEFAULT_REDIS_URL
    scoring_workers: int = 1
    poll_interval_s: float = 1.0
    challenge_requests: int = 16  # sampled evidence grows with the tokens (detection.py)
    challenge_max_tokens: int = 64
    tolerance_bps: int = 500
    greedy_margin: float = 0.01  # verifier.scoring.GREEDY_MARGIN; raise it for bf16 GPUs
    audit_rate_bps: int = 1000  # verifier.audits.DEFAULT_AUDIT_RATE_BPS
    state_dir: Path | None = None
    test_mode: str = ""
    reputation: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str | None = None, **overrides: Any) -> VerifierConfig:
        """Defaults, then `[verifier]` of the TOML file, then `QUARRY_VERIFIER_<FIELD>`
        variables, then `overrides` (flags; None means "not given")."""
        return load_config(cls, ROLE, path, overrides, _from_env, _convert)

    def require(self, *names: str) -> None:
        """Raise ConfigError naming the first of `names` this command needs but lacks."""
        require_settings(self, ROLE, *names)

    def account(self) -> Any:
        from eth_account import Account

        return Account.from_key(read_key(self.key, self.key_file, ROLE))

    def reputation_params(self) -> Any:
        from verifier.reputation import ReputationParams

        return ReputationParams.from_mapping(self.reputation)


def _from_env(name: str, text: str) -> Any:
    if name == "reputation":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"QUARRY_VERIFIER_REPUTATION must be a JSON object: {exc}") from exc
    return text


def _convert(name: str, value: Any, base: Path | None) -> Any:
    if name == "key":
        if not isinstance(value, str):
            raise ConfigError("verifier setting key: must be a hex string")
        return value
    if name in ("key_file", "deployment", "model_dir", "state_dir"):
        return as_path(value, name, base, ROLE)
    if name in ("market_url", "redis_url"):
        return as_url(value, name, ROLE)
    if name == "rpc_url":
        return as_url(value, name, ROLE) if value else None
    if name == "stake":
        return parse_wei(value, name, ROLE)
    if name == "poll_interval_s":
        number = as_number(value, name, float, 0.0, ROLE)
        if number <= 0:
            raise ConfigError("verifier setting poll_interval_s: must be greater than 0")
        return number
    if name in ("scoring_workers",):
        return as_number(value, name, int, 0, ROLE)
    if name in ("challenge_requests", "challenge_max_tokens"):
        return as_number(value, name, int, 1, ROLE)
    if name == "greedy_margin":
        return as_number(value, name, float, 0.0, ROLE)
    if name in ("tolerance_bps", "audit_rate_bps"):
        number = as_number(value, name, int, 0, ROLE)
        if number > 10_000:
            raise ConfigError(f"verifier setting {name}: {value!r} must be at most 10000")
        return number
    if name == "test_mode":
        mode = str(value).strip().lower()
        if mode and mode not in TEST_MODES:
            raise ConfigError(f"verifier setting test_mode: {value!r} is not one of "
                              f"{', '.join(TEST_MODES)}")
        return mode
    if name == "reputation":
        if not isinstance(value, dict):
            raise ConfigError("verifier setting reputation: must be a table")
        return dict(value)
    raise ConfigError(f"unknown verifier setting {name}")  # pragma: no cover - checked before
