"""The miner's configuration: a TOML file's `[miner]` table, then `QUARRY_MINER_*` variables,
then command-line flags (each later source overrides the earlier).

    [miner]
    key_file = "~/.quarry/miner.key"      # or key = "0x..." (hex private key)
    market_url = "http://127.0.0.1:8600"
    # rpc_url = "http://127.0.0.1:8545"   # default: the market's /deployment
    # deployment = ".quarry/deployment.json"  # fallback when the market is unreachable
    model_dirs = ["models/quarry-tiny"]
    engine = "torch"                      # torch | pipeline | vllm
    # precision = "bf16"                  # fp32 | fp16 | bf16 | fp8 | int8: declared for
                                          # every model (clients may require one) and the
                                          # engine's dtype; default fp32 on CPU, bf16 on GPU
    price_per_token = "1gwei"             # wei per output token
    stake = "0.5ether"                    # total stake to hold in GPURegistry
    endpoint = "http://203.0.113.7:9100"  # advertised on-chain
    poll_interval_s = 2.0
    max_batch = 8
    max_shards_in_flight = 4              # shards of one task claimed together and
                                          # generated as one stream (batches run across
                                          # their boundaries); 1: one shard at a time
    auto_withdraw = false
    # state_dir = "~/.quarry/miner"       # default $QUARRY_HOME/miner: copies of submitted
                                          # results, to answer availability challenges
    # test_mode = "random"                # CHEATS ON PURPOSE (tests/benchmarks only):
                                          # any mode of miner/cheats.py
    # metrics_port = 9101                 # `miner run` serves Prometheus metrics at
                                          # http://metrics_host:port/metrics (0: any port)
    # metrics_host = "127.0.0.1"

    # swarm = true                        # serve the model as a member of a swarm (one
                                          # model across several miners: miner/swarm.py)
    # memory_mib = 12000                  # swarm: the most memory its layers may take
                                          # (default: the GPU's memory)
    # stage_port = 9500                   # swarm: where its pipeline stage listens
    # stage_host = "127.0.0.1"            # swarm: the host other members reach it at
    # tflops = 80.0                       # swarm: the speed it declares (default: measured)
    # swarm_router = "parallax"           # swarm head: parallax | wsrr (per-microbatch routes)

    [miner.engine_options]                # passed to the engine's constructor
    device = "cuda"
    # threads = 4                         # torch CPU threads (default on a CPU: the count
                                          # that decodes the model fastest, timed at load)

    [miner.gpu]                           # optional: overrides what torch detects
    name = "NVIDIA H100"
    memory_mib = 81920
    count = 1

Environment variables are `QUARRY_MINER_<FIELD>` (e.g. `QUARRY_MINER_KEY`); list fields take
a comma-separated value, table fields a JSON object. Loading only checks what is given;
each command then `require`s the fields it needs, so `miner status` needs no model.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator
from pydantic_settings import NoDecode

from market.errors import ConfigError
from market.protocol.precision import Precision, PrecisionError, parse_precision
from market.roleconfig import (
    Host,
    KeyedSettings,
    OptionalPort,
    OptionalUrl,
    SettingPath,
    Table,
    Url,
    Wei,
    comma_list,
    parse_wei,
)

ROLE = "miner"
ENGINES = ("torch", "pipeline", "vllm")
SWARM_ROUTERS = ("parallax", "wsrr")
DEFAULT_MARKET_URL = "http://127.0.0.1:8600"
__all__ = ["ENGINES", "SWARM_ROUTERS", "GpuOverride", "MinerConfig", "parse_wei"]


def _one_of(value: Any, choices: tuple[str, ...]) -> str:
    """`value` as one of `choices` (case and spaces ignored), else a ValueError naming them."""
    kind = str(value).strip().lower()
    if kind not in choices:
        raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
    return kind


class GpuOverride(Table):
    """A GPU spec given in the config instead of the one torch detects."""

    name: Annotated[str, Field(min_length=1)]
    memory_mib: Annotated[int, Field(ge=1)]
    count: Annotated[int, Field(ge=1)]

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value


class MinerConfig(KeyedSettings):
    """Everything the miner commands read. Amounts are wei, intervals seconds."""

    role = ROLE

    market_url: Url = DEFAULT_MARKET_URL
    rpc_url: OptionalUrl = None
    deployment: SettingPath | None = None
    model_dirs: Annotated[tuple[SettingPath, ...], NoDecode, BeforeValidator(comma_list)] = ()
    engine: str = "torch"
    engine_options: dict[str, Any] = Field(default_factory=dict)
    precision: Precision | None = None  # None: from the engine's dtype (served_precision)
    price_per_token: Annotated[Wei, Field(ge=1)] | None = None
    stake: Wei | None = None
    endpoint: Annotated[str, Field(min_length=1)] = ""
    gpu: GpuOverride | None = None
    poll_interval_s: Annotated[float, Field(gt=0)] = 2.0
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 5.0
    max_batch: Annotated[int, Field(ge=1)] = 8
    max_shards_in_flight: Annotated[int, Field(ge=1)] = 4  # miner.worker.MAX_SHARDS_IN_FLIGHT
    auto_withdraw: bool = False
    state_dir: SettingPath | None = None  # None: $QUARRY_HOME/miner (miner.archive)
    test_mode: str | None = None  # a miner.cheats mode: this miner cheats on purpose
    metrics_port: OptionalPort = None  # None: no metrics server (market.metrics)
    metrics_host: Host = "127.0.0.1"
    # swarm membership (miner/swarm.py)
    swarm: bool = False
    memory_mib: Annotated[int, Field(ge=1)] | None = None  # None: the GPU's memory
    stage_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    stage_host: Host = "127.0.0.1"
    tflops: Annotated[float, Field(gt=0)] | None = None  # None: measured at start
    swarm_router: str = "parallax"

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: Any) -> str:
        return _one_of(value, ENGINES)

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: Any) -> Precision | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        try:
            return parse_precision(value)
        except PrecisionError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("swarm_router", mode="before")
    @classmethod
    def _router(cls, value: Any) -> str:
        return _one_of(value, SWARM_ROUTERS)

    @field_validator("endpoint", mode="before")
    @classmethod
    def _endpoint(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("test_mode", mode="before")
    @classmethod
    def _test_mode(cls, value: Any) -> str | None:
        from miner.cheats import CHEAT_MODES  # only a miner asked to cheat loads this

        mode = str(value).strip().lower() if value is not None else ""
        if mode == "":  # an empty variable or setting: an honest miner
            return None
        if mode not in CHEAT_MODES:
            raise ValueError(f"{value!r} is not a test mode; valid modes: "
                             f"{', '.join(CHEAT_MODES)}")
        return mode

    def served_precision(self) -> Precision:
        """The precision this miner declares for its models and its engine computes in:
        `precision` when set; else the `dtype` engine option's; else fp32 on a CPU and bf16
        on a GPU (the torch engine's default, `market.model.loading.resolve_dtype`)."""
        dtype = self.engine_options.get("dtype")
        if self.precision is not None:
            if dtype is not None and _precision_of_dtype(dtype) is not self.precision:
                raise ConfigError(f"miner settings precision {self.precision.label} and "
                                  f"engine_options.dtype {dtype!r} disagree; drop the dtype "
                                  "(the precision sets it)")
            return self.precision
        if dtype is not None:
            return _precision_of_dtype(dtype)
        from market.model.loading import resolve_device

        device = resolve_device(self.engine_options.get("device"))
        return Precision.FP32 if device.type == "cpu" else Precision.BF16

    def engine_kwargs(self) -> dict[str, Any]:
        """`engine_options` with the dtype of `served_precision()`: the engine computes in
        the precision the miner declared (`Precision.torch_dtype_name`)."""
        return {**self.engine_options, "dtype": self.served_precision().torch_dtype_name}


def _precision_of_dtype(dtype: Any) -> Precision:
    try:
        return parse_precision(str(dtype))
    except PrecisionError:
        raise ConfigError(f"miner setting engine_options.dtype {dtype!r} names no precision; "
                          "set precision (fp32, fp16, bf16, fp8 or int8) instead") from None
