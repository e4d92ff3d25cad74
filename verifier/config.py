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
    scoring_precision = "fp32"            # the scoring workers' precision: fp32 or bf16
    audit_rate_bps = 1000                 # base share of client shards re-scored (audits)
    state_dir = "~/.quarry/verifier"      # what this verifier signed (never equivocate)
    # metrics_port = 9102                 # `verifier run` serves Prometheus metrics at
                                          # http://metrics_host:port/metrics (0: any port)
    # metrics_host = "127.0.0.1"

    [verifier.reputation]                 # verifier.reputation.ReputationParams
    alpha = 0.5
    penalty = "stricter"

`test_mode` ("lie" or "withhold") makes a Byzantine verifier for tests; never set it otherwise.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from market.protocol.precision import PrecisionError, parse_precision
from market.roleconfig import Host, KeyedSettings, OptionalPort, OptionalUrl, SettingPath, Url, Wei

ROLE = "verifier"
DEFAULT_MARKET_URL = "http://127.0.0.1:8600"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TEST_MODES = ("lie", "withhold")
Bps = Annotated[int, Field(ge=0, le=10_000)]


class VerifierConfig(KeyedSettings):
    """Everything the verifier commands read. Amounts are wei, intervals seconds."""

    role = ROLE

    market_url: Url = DEFAULT_MARKET_URL
    rpc_url: OptionalUrl = None
    deployment: SettingPath | None = None
    model_dir: SettingPath | None = None
    stake: Wei | None = None
    redis_url: Url = DEFAULT_REDIS_URL
    scoring_workers: Annotated[int, Field(ge=0)] = 1
    poll_interval_s: Annotated[float, Field(gt=0)] = 1.0
    # sampled evidence grows with the tokens (detection.py)
    challenge_requests: Annotated[int, Field(ge=1)] = 16
    challenge_max_tokens: Annotated[int, Field(ge=1)] = 64
    tolerance_bps: Bps = 500
    # the reference's own precision; verifier.error_models has each pair's calibration
    scoring_precision: str = "fp32"
    audit_rate_bps: Bps = 1000  # the base of verifier.audits.audit_rate (DEFAULT_AUDIT_RATE_BPS)
    state_dir: SettingPath | None = None
    test_mode: str = ""
    reputation: dict[str, Any] = Field(default_factory=dict)
    metrics_port: OptionalPort = None  # None: no metrics server (market.metrics)
    metrics_host: Host = "127.0.0.1"

    @field_validator("scoring_precision", mode="before")
    @classmethod
    def _scoring_precision(cls, value: Any) -> str:
        from verifier.scoring import VERIFIER_PRECISIONS

        try:
            precision = parse_precision(value)
        except PrecisionError as exc:
            raise ValueError(str(exc)) from exc
        if precision not in VERIFIER_PRECISIONS:
            names = " or ".join(p.label for p in VERIFIER_PRECISIONS)
            raise ValueError(f"verifiers score in {names}, not {precision.label}")
        return precision.label

    @field_validator("test_mode", mode="before")
    @classmethod
    def _test_mode(cls, value: Any) -> str:
        mode = str(value).strip().lower()
        if mode and mode not in TEST_MODES:
            raise ValueError(f"{value!r} is not one of {', '.join(TEST_MODES)}")
        return mode

    def reputation_params(self) -> Any:
        from verifier.reputation import ReputationParams

        return ReputationParams.from_mapping(self.reputation)
