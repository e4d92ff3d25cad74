"""Reputation logic: the moving average, the sliding-window punishment at each level, integer
determinism, and configuration errors named by key."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from market.errors import ConfigError
from verifier.reputation import PENALTY_LEVELS, MinerRecord, ReputationParams, update

PARAMS = ReputationParams(alpha=0.5, window=5, abnormal_below_bps=5000, abnormal_fraction=0.2,
                          penalty="stricter", penalty_rates=(0.1, 0.25, 0.5),
                          untrusted_below_bps=4000, initial_bps=5000)


def run(scores: list[int | None], params: ReputationParams = PARAMS) -> list[MinerRecord]:
    record = MinerRecord.initial(params)
    out = []
    for s in scores:
        record = update(record, s, params)
        out.append(record)
    return out


def test_moving_average_without_abnormal_scores() -> None:
    records = run([10000, 9000, 8000])
    assert [r.reputation_bps for r in records] == [7500, 8250, 8125]
    assert records[-1].window == (10000, 9000, 8000)
    p = ReputationParams(alpha=0.8)
    assert update(MinerRecord(5000), 10000, p).reputation_bps == 6000
    assert update(MinerRecord(5000), 3, p).reputation_bps == 4001  # 4000.6 rounds half up
    assert update(MinerRecord(5001), 0, ReputationParams(alpha=0.5)).reputation_bps == 2501


def test_one_abnormal_epoch_is_tolerated_two_are_punished() -> None:
    # 1/5 abnormal is not > 0.2: plain average. 2/5 is: one step of (1 - 0.25).
    first, second = run([10000, 1000, 1000])[1:]
    assert first.reputation_bps == 4250  # (7500 + 1000) / 2
    assert second.reputation_bps == round((4250 + 1000) / 2 * 0.75)
    assert second.abnormal(PARAMS) == 2 and not second.trusted(PARAMS)


def test_punishment_grows_with_the_abnormal_count() -> None:
    records = run([0] * 6)
    expected, rep = [], 5000
    for k in range(1, 7):
        abnormal = min(k, 5)
        value = Fraction(rep, 2)
        if abnormal > 1:
            value *= Fraction(3, 4) ** (abnormal - 1)
        rep = int(value + Fraction(1, 2))
        expected.append(rep)
    assert [r.reputation_bps for r in records] == expected
    assert records[-1].window == (0,) * 5


@pytest.mark.parametrize("level", PENALTY_LEVELS)
def test_levels_order_the_punishment(level: str) -> None:
    cheat = [1000, 1000, 1000, 1000]
    reps = {lv: run(cheat, PARAMS.with_penalty(lv))[-1].reputation_bps for lv in PENALTY_LEVELS}
    assert reps["lenient"] > reps["stricter"] > reps["aggressive"]
    assert PARAMS.with_penalty(level).rate == PARAMS.penalty_rates[PENALTY_LEVELS.index(level)]


def test_window_slides_and_recovery_follows() -> None:
    records = run([0, 0, 10000, 10000, 10000, 10000, 10000, 10000])
    assert records[1].abnormal(PARAMS) == 2
    assert records[5].window == (0, 10000, 10000, 10000, 10000)
    assert records[5].abnormal(PARAMS) == 1
    reps = [r.reputation_bps for r in records]
    assert reps[5:] == sorted(reps[5:]) and reps[-1] > reps[4]
    assert records[-1].trusted(PARAMS)
    # After the window clears, recovery is the plain average: 1 - alpha of the gap per epoch.
    assert reps[-1] == round((reps[-2] + 10000) / 2)


def test_unchallenged_epoch_changes_nothing() -> None:
    record = MinerRecord(6123, (9000, 100))
    assert update(record, None, PARAMS) is record
    assert run([None, None])[-1] == MinerRecord(5000, ())


@given(st.lists(st.integers(0, 10000), min_size=1, max_size=12),
       st.sampled_from(PENALTY_LEVELS), st.sampled_from([0.0, 0.3, 0.5, 0.7, 0.95]))
def test_bounds_and_determinism(scores: list[int], level: str, alpha: float) -> None:
    params = ReputationParams(alpha=alpha, penalty=level)
    a, b = run(scores, params), run(scores, params)
    assert a == b
    for r in a:
        assert isinstance(r.reputation_bps, int) and 0 <= r.reputation_bps <= 10000
        assert len(r.window) <= params.window
    # A higher score never yields a lower reputation.
    prev = a[-2] if len(a) > 1 else MinerRecord.initial(params)
    low, high = (update(prev, s, params).reputation_bps for s in (0, 10000))
    assert low <= a[-1].reputation_bps <= high


def test_from_mapping() -> None:
    p = ReputationParams.from_mapping({"alpha": 0.6, "penalty": "aggressive",
                                       "penalty_rates": [0.1, 0.2, 0.3], "window": 4})
    assert (p.alpha, p.penalty, p.penalty_rates, p.window, p.rate) == (
        0.6, "aggressive", (0.1, 0.2, 0.3), 4, 0.3)
    assert ReputationParams.from_mapping({}) == ReputationParams()
    cases = [
        ({"alpha_": 0.5}, "unknown reputation setting.*alpha_"),
        ({"alpha": 1.0}, "alpha: 1.0 is not a number in \\[0, 1\\)"),
        ({"alpha": "0.5"}, "alpha: '0.5'"),
        ({"window": 0}, "window: 0"),
        ({"abnormal_below_bps": 10001}, "abnormal_below_bps: 10001"),
        ({"untrusted_below_bps": 40.5}, "untrusted_below_bps: 40.5"),
        ({"initial_bps": True}, "initial_bps: True"),
        ({"abnormal_fraction": 1}, "abnormal_fraction: 1"),
        ({"penalty": "harsh"}, "penalty: 'harsh' is not one of lenient, stricter, aggressive"),
        ({"penalty_rates": [0.1, 0.2]}, "penalty_rates"),
        ({"penalty_rates": [0.5, 0.2, 0.3]}, "penalty_rates.*non-decreasing"),
        ({"penalty_rates": [0.1, 0.2, 1.5]}, "penalty_rates"),
    ]
    for mapping, message in cases:
        with pytest.raises(ConfigError, match=message):
            ReputationParams.from_mapping(mapping)
    with pytest.raises(ConfigError, match="must be a table"):
        ReputationParams.from_mapping([("alpha", 0.5)])  # type: ignore[arg-type]


def test_bad_update_input_is_named() -> None:
    with pytest.raises(ConfigError, match="score_bps must be an integer in \\[0, 10000\\]"):
        update(MinerRecord(5000), 10001, PARAMS)
    with pytest.raises(ConfigError, match="score_bps"):
        update(MinerRecord(5000), 0.5, PARAMS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prev.reputation_bps"):
        update(MinerRecord(-1), 100, PARAMS)
    with pytest.raises(ConfigError, match="prev must be a MinerRecord"):
        update(5000, 100, PARAMS)  # type: ignore[arg-type]


def test_default_constants_catch_cheaters_and_spare_honest_miners() -> None:
    """The defaults' documented behaviour (see ReputationParams and benchmarks/detection.py):
    epoch scores are pass (10000) or fail (0)."""
    p = ReputationParams()
    assert not run([0], p)[-1].trusted(p)  # a new miner failing once: untrusted at once
    honest = run([10000] * 12, p)
    assert all(r.abnormal(p) == 0 and r.trusted(p) for r in honest)
    assert [r.reputation_bps for r in honest[:3]] == [6500, 7550, 8285]
    assert honest[-1].reputation_bps > 9900
    # An established miner failing once stays trusted (0.7 of its reputation); twice within
    # the window it is punished under the line.
    assert update(honest[-1], 0, p).trusted(p)
    assert not update(update(honest[-1], 0, p), 0, p).trusted(p)


def test_a_fault_found_on_chain_is_untrusted_at_once() -> None:
    """A lost dispute, an unanswered availability challenge, a proven billing fault: proof,
    not noise, so whatever the reputation was it lands under the untrusted line, and the
    epoch counts as a 0 in the window."""
    p = ReputationParams()
    best = MinerRecord(10_000, (10_000,) * 5)
    after = update(best, 10_000, p, fault=True)
    assert after.reputation_bps == p.untrusted_below_bps - 1 and not after.trusted(p)
    assert after.window[-1] == 0
    assert update(MinerRecord(1000), None, p, fault=True).reputation_bps < 1000
    # a passing epoch afterwards (a re-challenge) makes it trusted again
    assert update(after, 10_000, p).trusted(p)
