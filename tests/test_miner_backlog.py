"""The miner's `Backlog` (the heartbeat's `behind`), pure logic on a fake clock: a shard
offered to the miner is late once its wait plus the work ahead passes the committee's answer
window; an open shard, once its task would end first; nothing is reported while idle."""

from __future__ import annotations

from miner.backlog import Backlog


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_offered_shard_late_past_the_answer_window() -> None:
    clock = Clock()
    b = Backlog(answer_window_s=60, clock=clock)
    b.seen({(1, 0): (False, 10_000), (2, 0): (True, 10_000)})
    assert b.report() is None, "nothing generated yet: not behind"
    b.started(1, [0])
    b.batch(outputs=4, seconds=2.0, left=40, chain_now=1_000)  # 0.5 s per output: 20 s ahead
    report = b.report()
    assert report is not None
    assert (report["generating"], report["backlogSeconds"], report["waiting"],
            report["offeredWaiting"], report["late"]) == (
        {"taskId": 1, "shard": 0}, 20.0, 1, 1, [])
    clock.t += 45  # waited 45 s, 20 s of work ahead: past the 60 s window
    late = b.newly_late(b.chain_now())
    assert [k for k, _ in late] == [(2, 0)] and "answer window 60 s" in late[0][1]
    assert b.newly_late(b.chain_now()) == [], "each late shard is said once"
    assert [e["taskId"] for e in b.report()["late"]] == [2]  # type: ignore[index]
    b.started(2, [0])
    assert b.report() is None, "nothing waits behind it any more"
    b.idle()
    assert b.report() is None


def test_open_shard_late_when_its_task_ends_first() -> None:
    clock = Clock()
    b = Backlog(answer_window_s=60, clock=clock)
    b.seen({(3, 1): (False, 1_030), (4, 0): (False, 5_000)})
    b.started(9, [0])
    b.batch(outputs=2, seconds=4.0, left=20, chain_now=1_000)  # 40 s ahead
    assert [k for k, _ in b.late(b.chain_now())] == [(3, 1)]
    # The pace follows the newest batches: a faster engine leaves it in time again.
    for _ in range(20):
        b.batch(outputs=10, seconds=0.1, left=20, chain_now=1_000)
    assert b.seconds < 1 and b.late(b.chain_now()) == []


def test_shards_offered_while_generating_join_what_waits() -> None:
    """The heartbeat's look while busy adds offered shards (never the one generated); idle,
    it adds nothing: the next poll sees them."""
    clock = Clock()
    b = Backlog(answer_window_s=30, clock=clock)
    b.also_seen({(5, 0): (True, 10_000)})
    assert b.report() is None
    b.seen({(1, 1): (False, 10_000)})
    b.started(1, [0])
    b.also_seen({(1, 0): (True, 10_000), (5, 0): (True, 10_000)})
    b.batch(outputs=1, seconds=1.0, left=10, chain_now=1_000)  # 10 s ahead
    report = b.report()
    assert report is not None and (report["waiting"], report["offeredWaiting"]) == (2, 1)
    clock.t += 25  # 25 s waited + 10 s ahead > 30 s
    assert [k for k, _ in b.late(b.chain_now())] == [(5, 0)]


def test_what_fits_a_window_at_the_measured_pace() -> None:
    b = Backlog(answer_window_s=30)
    assert b.fits(1000, 1000, 1.0), "nothing measured yet: anything fits"
    b.batch(outputs=4, seconds=1.0, left=0, chain_now=0, tokens=100)  # 0.01 s per token
    assert b.fits(10, 10, 1.0) and not b.fits(11, 10, 1.0)
