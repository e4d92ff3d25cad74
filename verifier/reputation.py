"""Miner reputation per epoch: PlanetServe's moving average plus a sliding-window punishment.

Each challenged epoch t a miner has an epoch score S_t (the mean of its challenges' scores,
in bps). With R in bps:

1. Moving average: `E = a * R_{t-1} + (1 - a) * S_t`.
2. Window: the last `window` epoch scores (oldest first). A score below
   `abnormal_below_bps` is abnormal; k is the number of abnormal scores in the window.
3. Punishment (the paper's formula was lost; this is ours): when `k / window >
   abnormal_fraction`, with `tolerated = floor(abnormal_fraction * window)` abnormal epochs
   forgiven, `R_t = E * (1 - rate) ** (k - tolerated)`, where `rate` is the chosen level's
   entry of `penalty_rates` (lenient, stricter, aggressive). So the punishment grows
   geometrically with every abnormal epoch beyond the tolerated ones, and applies again
   each epoch while the window holds them: punishment is stronger than reward. Otherwise
   `R_t = E`.

A miner is untrusted below `untrusted_below_bps`. Every product is computed exactly (the
float parameters are read as the decimals they print as, via `Fraction(repr(x))`) and
rounded half up once per step, so every verifier computes the same integer from the same
inputs, on any platform.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

from market.errors import ConfigError

BPS = 10_000
PENALTY_LEVELS = ("lenient", "stricter", "aggressive")


def _exact(x: float) -> Fraction:
    return Fraction(repr(float(x)))


def _round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class ReputationParams:
    """Every reputation constant. Epoch scores are 10000 (the miner's challenge outputs pass
    `verifier.scoring.judge`) or 0 (they fail, or the signed answer is invalid): a failure is
    evidence at the 1e-6 level, not noise, so scores are not graded. A missing answer is no
    score at all: the committee reports the miner unavailable (`MISSED_BPS`) and its record
    stays as it was (GPURegistry counts the misses; see `verifier.committee`).

    - `abnormal_below_bps = 9150`: any failed epoch is abnormal (the threshold dates from
      graded scores; with pass/fail scores any value in (0, 10000] acts the same).
    - `alpha = 0.7`: a failed epoch takes a new miner (5000) to 3500, under the untrusted
      line, at once; an honest one climbs 5000, 6500, 7550, ...
    - `penalty_rates = (0.3, 0.5, 0.7)`, default `stricter`: the punishment for abnormal
      epochs beyond the tolerated one. A fault found on-chain skips all of this and puts
      the miner under the untrusted line (`update(fault=True)`). `benchmarks/detection.py`
      (12 epochs of challenges drawn like client jobs, audited client traffic, every mode
      of `miner.cheats`) has every cheat untrusted within 3 epochs on all three levels and
      no honest epoch flagged.
    """

    alpha: float = 0.7
    window: int = 5
    abnormal_below_bps: int = 9150
    abnormal_fraction: float = 0.2
    penalty: str = "stricter"
    penalty_rates: tuple[float, float, float] = field(default=(0.3, 0.5, 0.7))
    untrusted_below_bps: int = 4000
    initial_bps: int = 5000

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, need: str) -> ConfigError:
            return ConfigError(f"reputation setting {name}: {value!r} is not {need}")

        if not _is_number(self.alpha) or not 0 <= self.alpha < 1:
            raise bad("alpha", self.alpha, "a number in [0, 1)")
        if not _is_int(self.window) or self.window < 1:
            raise bad("window", self.window, "an integer >= 1")
        for name in ("abnormal_below_bps", "untrusted_below_bps", "initial_bps"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value <= BPS:
                raise bad(name, value, f"an integer in [0, {BPS}] (bps)")
        if not _is_number(self.abnormal_fraction) or not 0 <= self.abnormal_fraction < 1:
            raise bad("abnormal_fraction", self.abnormal_fraction, "a number in [0, 1)")
        if self.penalty not in PENALTY_LEVELS:
            raise bad("penalty", self.penalty, f"one of {', '.join(PENALTY_LEVELS)}")
        rates = self.penalty_rates
        if (isinstance(rates, str | bytes | Mapping) or not hasattr(rates, "__len__")
                or len(rates) != len(PENALTY_LEVELS)
                or not all(_is_number(r) and 0 <= r <= 1 for r in rates)):
            raise bad("penalty_rates", rates,
                      "three numbers in [0, 1] (lenient, stricter, aggressive)")
        if not rates[0] <= rates[1] <= rates[2]:
            raise bad("penalty_rates", rates, "non-decreasing (lenient <= stricter <= "
                      "aggressive)")
        object.__setattr__(self, "penalty_rates", tuple(float(r) for r in rates))

    @property
    def rate(self) -> float:
        """The penalty rate of the chosen level."""
        return self.penalty_rates[PENALTY_LEVELS.index(self.penalty)]

    @property
    def tolerated(self) -> int:
        """How many abnormal epochs the window holds before the punishment starts."""
        return math.floor(_exact(self.abnormal_fraction) * self.window)

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> ReputationParams:
        """From a TOML `[verifier.reputation]` table; ConfigError names an unknown or bad key."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"[verifier.reputation] must be a table, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise ConfigError(f"unknown reputation setting(s): {', '.join(unknown)} "
                              f"(known: {', '.join(names)})")
        values = dict(d)
        if "penalty_rates" in values:
            rates = values["penalty_rates"]
            if isinstance(rates, list | tuple):
                values["penalty_rates"] = tuple(rates)
        return cls(**values)

    def with_penalty(self, penalty: str) -> ReputationParams:
        """The same constants with another penalty level."""
        return ReputationParams(**{**{f.name: getattr(self, f.name) for f in fields(self)},
                                   "penalty": penalty})


@dataclass(frozen=True)
class MinerRecord:
    """A miner's reputation and its last epoch scores."""

    reputation_bps: int
    window: tuple[int, ...] = ()  # last <= window epoch scores in bps, oldest first

    @classmethod
    def initial(cls, params: ReputationParams) -> MinerRecord:
        return cls(params.initial_bps, ())

    def trusted(self, params: ReputationParams) -> bool:
        return self.reputation_bps >= params.untrusted_below_bps

    def abnormal(self, params: ReputationParams) -> int:
        """How many scores in the window are abnormal."""
        return sum(s < params.abnormal_below_bps for s in self.window)


def _check_bps(name: str, value: Any) -> int:
    if not _is_int(value) or not 0 <= value <= BPS:
        raise ConfigError(f"{name} must be an integer in [0, {BPS}] bps, got {value!r}")
    return int(value)


def update(prev: MinerRecord, score_bps: int | None, params: ReputationParams, *,
           fault: bool = False) -> MinerRecord:
    """The record after one epoch. `score_bps=None`: not challenged, or not available (a
    confirmed missing answer): unchanged. `fault`: the chain found the miner at fault (a
    dispute lost, a billing fault proven): that is proof, not noise, so the epoch scores 0
    and the reputation lands under the untrusted line whatever it was (the miner may pay to
    be challenged again)."""
    if not isinstance(prev, MinerRecord):
        raise ConfigError(f"prev must be a MinerRecord, got {type(prev).__name__}")
    if not isinstance(params, ReputationParams):
        raise ConfigError(f"params must be ReputationParams, got {type(params).__name__}")
    if fault:
        score_bps = 0
    if score_bps is None:
        return prev
    score = _check_bps("score_bps", score_bps)
    rep = _check_bps("prev.reputation_bps", prev.reputation_bps)
    for s in prev.window:
        _check_bps("prev.window entry", s)
    window = (*prev.window, score)[-params.window:]
    alpha = _exact(params.alpha)
    value = alpha * rep + (1 - alpha) * score
    abnormal = sum(s < params.abnormal_below_bps for s in window)
    if Fraction(abnormal, params.window) > _exact(params.abnormal_fraction):
        value *= (1 - _exact(params.rate)) ** (abnormal - params.tolerated)
    reputation = min(BPS, max(0, _round_half_up(value)))
    if fault:
        reputation = min(reputation, max(0, params.untrusted_below_bps - 1))
    return MinerRecord(reputation, window)
