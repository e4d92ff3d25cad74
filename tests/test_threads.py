"""The engines' CPU thread decision (`market.engine.threads`): the count that runs a step
fastest wins only by a clear margin, a given count is kept, a bad one is refused by name."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from market.engine import threads
from market.engine.threads import (
    ThreadsError,
    candidates,
    check_threads,
    pick_threads,
    set_threads,
    usable_cpus,
)
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model


@pytest.fixture(autouse=True)
def threads_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each case starts in a process that has chosen no count and picked none (nor was it
    started with OMP_NUM_THREADS)."""
    monkeypatch.delenv(threads.OMP_ENV, raising=False)
    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.setattr(threads, "_PICKED", {})
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_candidates_double_up_to_the_cpus() -> None:
    assert candidates(1) == [1]
    assert candidates(2) == [1, 2]
    assert candidates(6) == [1, 2, 4, 6]
    assert candidates(8) == [1, 2, 4, 8]


def step_taking(seconds: dict[int, float]) -> object:
    """A step that sleeps as long as `seconds` says for the thread count torch has now."""
    return lambda: time.sleep(seconds[torch.get_num_threads()])


def test_the_fastest_count_wins_by_a_clear_margin_only() -> None:
    # the best of 3 rounds: a sleep that overshoots once (a loaded machine) does not decide
    assert pick_threads(step_taking({1: 0.2, 2: 0.1, 4: 0.03}), cpus=4) == 4
    assert torch.get_num_threads() == 4  # left set
    # 4 beats 2 by under 10%: fewer threads leave cores to the rest of the miner
    assert pick_threads(step_taking({1: 0.2, 2: 0.1, 4: 0.098}), cpus=4) == 2
    assert pick_threads(step_taking({1: 0.01, 2: 0.03}), cpus=2) == 1
    assert torch.get_num_threads() == 1


def test_a_bad_count_is_refused_by_name() -> None:
    assert check_threads(None) is None and check_threads(3) == 3
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ThreadsError, match="threads must be a positive integer"):
            check_threads(bad)


def test_omp_num_threads_is_the_process_choice_and_a_bad_one_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "tiny"
    create_model(d, layers=1, hidden=64)
    monkeypatch.setenv(threads.OMP_ENV, "1")
    assert TorchEngine(d, device="cpu").threads == 1 == torch.get_num_threads()
    assert threads._CHOSEN == 1  # engines loaded later keep it, untimed
    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.setenv(threads.OMP_ENV, "2,1")  # OpenMP's nested levels: the first is ours
    assert TorchEngine(d, device="cpu").threads == 2 == torch.get_num_threads()
    monkeypatch.setattr(threads, "_CHOSEN", None)
    for bad in ("0", "two", "-1", "1.5", ",2"):
        monkeypatch.setenv(threads.OMP_ENV, bad)
        with pytest.raises(ThreadsError, match=f"OMP_NUM_THREADS must be a positive integer, "
                                               f"got '{bad}'"):
            TorchEngine(d, device="cpu")
    monkeypatch.setenv(threads.OMP_ENV, "")  # set but empty: unset
    assert TorchEngine(d, device="cpu").threads in candidates(usable_cpus())


def test_the_torch_engine_takes_a_count_or_the_process_choice_or_picks_one(
        tmp_path: Path) -> None:
    d = tmp_path / "tiny"
    create_model(d, layers=1, hidden=64)
    torch.set_num_threads(2)  # as torch starts: not a choice
    picked = TorchEngine(d, device="cpu")
    assert picked.threads in candidates(usable_cpus())
    assert torch.get_num_threads() == picked.threads
    torch.set_num_threads(3)  # another engine of that width takes the same count, untimed
    assert TorchEngine(d, device="cpu").threads == picked.threads == torch.get_num_threads()
    set_threads(3)  # a process's choice (a verifier's --threads): engines keep it
    assert TorchEngine(d, device="cpu").threads == 3 == torch.get_num_threads()
    given = TorchEngine(d, device="cpu", threads=1)  # an engine's own count becomes it
    assert given.threads == 1 and torch.get_num_threads() == 1
    assert TorchEngine(d, device="cpu").threads == 1
    with pytest.raises(ThreadsError, match="got 0"):
        TorchEngine(d, device="cpu", threads=0)
