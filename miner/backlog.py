"""Whether the miner is behind: what it is generating, how long that will take, and what
waits behind it (the heartbeat's `behind`, shown by `GET /miners` and the dashboard).

A busy miner cannot take a shard it has seen until its current stream is out. That is
worth saying when a shard offered to it (a directed job, or a committee challenge, which
looks the same) waits longer than the committee's answer window, or an open shard's task
would reach its deadline first: the market's operator, the committee and the miner's own
operator then see a slow miner, not a silent one. `Worker.run` serves shards offered to the
miner before other work (the market ranks them first, and it asks again between groups).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PACE_WEIGHT = 0.3
"""Weight of the newest batch in the seconds-per-output average."""
SHOWN = 5
"""Waiting shards the heartbeat lists (the market caps a heartbeat's status at 4096 bytes)."""


@dataclass(frozen=True)
class Seen:
    """An open shard the miner saw: whether it is offered to this miner, its task's
    deadline (chain time), and when it was first seen (monotonic)."""

    offered: bool
    deadline: int
    since: float


class Backlog:
    """The stream being generated (outputs left, seconds per output) and the shards seen
    but not started; safe to read from the heartbeat thread."""

    def __init__(self, answer_window_s: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.answer_window_s = answer_window_s
        self.clock = clock
        self.pace_s = 0.0  # seconds per output, batched as the engine runs them
        self.token_s = 0.0  # seconds per generated token, likewise
        self.left = 0
        self.generating: tuple[int, int] | None = None
        self._waiting: dict[tuple[int, int], Seen] = {}
        self._lock = threading.Lock()
        self._said: set[tuple[int, int]] = set()
        self._chain = (0, 0.0)  # (a chain time, the local clock when it was read)

    def batch(self, outputs: int, seconds: float, left: int, chain_now: int,
              tokens: int = 0) -> None:
        """One engine batch of `outputs` (`tokens` generated) took `seconds`; `left` outputs
        remain in the stream; `chain_now` is the chain's time as the generating loop knows
        it."""
        if outputs > 0:
            self.pace_s = _average(self.pace_s, seconds / outputs)
        if tokens > 0:
            self.token_s = _average(self.token_s, seconds / tokens)
        self.left = left
        self._chain = (chain_now, self.clock())

    def fits(self, requests: int, max_tokens: int, window_s: float) -> bool:
        """Whether `requests` outputs of up to `max_tokens` tokens, at the measured pace, end
        within `window_s` (True while nothing is measured yet)."""
        return self.token_s * requests * max_tokens <= window_s

    def chain_now(self) -> int:
        """The chain's time carried forward from the last batch by the local clock."""
        at, mono = self._chain
        return at + int(self.clock() - mono)

    def seen(self, shards: dict[tuple[int, int], tuple[bool, int]]) -> None:
        """The candidates of the latest poll: (task, shard) -> (offered, deadline)."""
        now = self.clock()
        with self._lock:
            old = self._waiting
            self._waiting = {k: old[k] if k in old else Seen(offered, deadline, now)
                             for k, (offered, deadline) in shards.items()}

    def also_seen(self, shards: dict[tuple[int, int], tuple[bool, int]]) -> None:
        """Shards seen while generating (the heartbeat's look at what is offered): added to
        what waits, none taken away; not while idle (the next poll takes them)."""
        if self.generating is None:
            return
        now = self.clock()
        with self._lock:
            for k, (offered, deadline) in shards.items():
                if k != self.generating and k not in self._waiting:
                    self._waiting[k] = Seen(offered, deadline, now)

    def started(self, task_id: int, shards: list[int]) -> None:
        """Generation of these shards begins: they wait no more."""
        with self._lock:
            for k in shards:
                self._waiting.pop((task_id, k), None)
        self.generating = (task_id, shards[0]) if shards else None

    def idle(self) -> None:
        self.left, self.generating = 0, None

    @property
    def seconds(self) -> float:
        """Estimated seconds until the stream being generated is out."""
        return self.left * self.pace_s

    def late(self, chain_now: int) -> list[tuple[tuple[int, int], str]]:
        """Waiting shards the miner will not reach in time, with why: offered ones whose wait
        plus the backlog passes the answer window, open ones whose task ends first."""
        if self.generating is None:
            return []
        ahead, mono = self.seconds, self.clock()
        with self._lock:
            waiting = list(self._waiting.items())
        out = []
        for key, s in waiting:
            if s.offered and mono - s.since + ahead > self.answer_window_s:
                out.append((key, f"offered to this miner {mono - s.since:.0f} s ago; "
                                  f"{ahead:.0f} s of work ahead of it (answer window "
                                  f"{self.answer_window_s} s)"))
            elif not s.offered and chain_now + ahead >= s.deadline:
                out.append((key, f"its task ends in {s.deadline - chain_now} s; {ahead:.0f} s "
                                 "of work ahead of it"))
        return out

    def newly_late(self, chain_now: int) -> list[tuple[tuple[int, int], str]]:
        """`late` entries not reported before (each is logged once)."""
        fresh = [(k, why) for k, why in self.late(chain_now) if k not in self._said]
        self._said.update(k for k, _ in fresh)
        return fresh

    def report(self) -> dict[str, Any] | None:
        """The heartbeat's `behind`: None unless the miner is generating with shards waiting
        behind it; `late` lists those it will not reach in time."""
        with self._lock:
            waiting = len(self._waiting)
            offered = sum(s.offered for s in self._waiting.values())
        if self.generating is None or not waiting:
            return None
        return {
            "generating": {"taskId": self.generating[0], "shard": self.generating[1]},
            "backlogSeconds": round(self.seconds, 1),
            "waiting": waiting,
            "offeredWaiting": offered,
            "late": [{"taskId": t, "shard": k, "reason": why}
                     for (t, k), why in self.late(self.chain_now())[:SHOWN]],
        }


def _average(old: float, new: float) -> float:
    return new if old == 0 else PACE_WEIGHT * new + (1 - PACE_WEIGHT) * old
