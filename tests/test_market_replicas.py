"""The market past one machine (issue 34): two `market serve` replicas and two Celery
workers on one PostgreSQL board, every part real (LocalStack's Redis, Anvil and workers,
a second replica beside its market, the session's private PostgreSQL).

A client stores its input through one replica and a miner reads it, heartbeats and long
polls through the other; the indexing worker is killed mid-index (frozen while it holds the
index lock, then SIGKILL) and the survivor indexes what follows; the replica holding a long
poll is killed and the poll goes on at the other. At the end the PostgreSQL board holds
exactly what a fresh SQLite board indexed from the chain holds: nothing lost, nothing
applied twice.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from market.chain.client import anvil_account
from market.chain.contracts import GpuSpec
from market.local import processes
from market.local.stack import LocalStack
from market.marketapi import MarketAPI, MarketError
from market.service.board import Board

pytestmark = pytest.mark.chain

MODEL_ID = bytes.fromhex("33" * 32)
MODEL_HEX = "0x" + MODEL_ID.hex()
CLIENT = anvil_account(1)
MINER = anvil_account(3)
INDEX_LOCK = "quarry:lock:index"  # market.service.worker.INDEX_LOCK


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory,
             postgres_server: Any) -> Iterator[tuple[LocalStack, processes.ManagedProcess]]:
    url = postgres_server.create_database("replicas")
    with LocalStack(home=tmp_path_factory.mktemp("replicas"), workers=2,
                    index_interval_s=0.1, sweep_interval_s=5.0,
                    market_settings={"database_url": url}) as stack:
        stack.quarry.gpu.register(MINER, [MODEL_ID], GpuSpec("test GPU", 1024, 1),
                                  "http://127.0.0.1:9302", 10**9, 10**18)
        second = processes.start_market(
            stack.settings.replace(port=processes.free_port()),
            log_path=stack.logs / "market2.log", env={"QUARRY_HOME": str(stack.home)})
        try:
            yield stack, second
        finally:
            second.stop()
    postgres_server.drop_database(url)


def _post_task(stack: LocalStack, input_uri: str) -> int:
    q = stack.quarry
    task_id, _ = q.tasks.create_task(
        CLIENT, model_id=MODEL_ID, input_root=b"\x01" * 32, input_uri=input_uri,
        num_requests=2, shard_size=1, max_tokens_per_request=8, price_per_token=10**9,
        deadline=q.chain.timestamp() + 100_000, allow_probation=True)  # a new miner's
    return int(task_id)


def _kill_a_worker_mid_index(stack: LocalStack) -> None:
    """SIGSTOP the workers in turn until one is caught holding the index lock, then
    SIGKILL it (its open transaction, if any, dies with its connection)."""
    redis = Redis.from_url(stack.redis_url)
    for _ in range(2000):
        for proc in stack.workers:
            os.kill(proc.pid, signal.SIGSTOP)
            token = redis.get(INDEX_LOCK)
            if token is not None and all(
                    not threading.Event().wait(0.05) and redis.get(INDEX_LOCK) == token
                    for _ in range(10)):
                os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=30)
                stack.workers.remove(proc)
                return
            os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError("no worker was ever caught holding the index lock")


@pytest.mark.timeout(180)
def test_two_replicas_and_two_workers_share_one_postgres_board(
        replicas: tuple[LocalStack, processes.ManagedProcess], tmp_path: Path) -> None:
    stack, second = replicas
    second_url = f"http://127.0.0.1:{second.port}"
    with MarketAPI(stack.market_url) as client_side, MarketAPI(second_url) as miner_side:
        # The client's input, stored through one replica, read back through the other.
        uri = client_side.put(b'{"prompt": "hello"}\n')
        assert miner_side.get(uri) == b'{"prompt": "hello"}\n'

        # A long poll on the miner's replica wakes for a task indexed by either worker.
        found: list[Any] = []
        poll = threading.Thread(target=lambda: found.append(
            miner_side.open_shards(MODEL_HEX, MINER.address, wait_seconds=30)))
        poll.start()
        first = _post_task(stack, uri)
        poll.join(60)
        assert sorted((s["taskId"], s["shard"]) for s in found[0]) == [(first, 0), (first, 1)]

        # The miner's heartbeat through its replica is what the client's replica shows.
        stack.wait_until(lambda: any(m["address"] == MINER.address
                                     for m in client_side.miners()), "the miner indexed")
        miner_side.heartbeat(MINER, {"load": 1})
        seen = next(m for m in client_side.miners() if m["address"] == MINER.address)
        assert seen["alive"] and seen["status"] == {"load": 1}

        # A worker dies mid-index; the other indexes the next tasks.
        _kill_a_worker_mid_index(stack)
        later = [_post_task(stack, uri) for _ in range(2)]
        stack.wait_until(lambda: all(j["taskId"] in later for j in client_side.jobs()[-2:]),
                         "the surviving worker indexed the tasks after the kill", timeout=60)

        # The replica holding a long poll dies; the poll goes on at the other replica.
        failed: list[BaseException] = []

        def long_poll() -> None:
            try:
                miner_side.open_shards("0x" + "44" * 32, MINER.address, wait_seconds=30)
            except MarketError as exc:
                failed.append(exc)

        poll = threading.Thread(target=long_poll)
        poll.start()
        second.stop()
        poll.join(60)
        assert failed, "the long poll outlived its replica"
        shards = client_side.open_shards(MODEL_HEX, MINER.address, wait_seconds=1)
        assert {(s["taskId"], s["shard"]) for s in shards} == {
            (t, k) for t in (first, *later) for k in (0, 1)}

        # Nothing lost, nothing applied twice: the same rows as a board indexed afresh.
        stack.wait_until(lambda: Board(stack.settings.database_url).cursor()
                         >= stack.quarry.chain.w3.eth.block_number, "the board at the head")
        fresh = Board(tmp_path / "fresh.sqlite")
        fresh.index(stack.quarry)
        shared = Board(stack.settings.database_url)
        assert shared.dump() == fresh.dump()
        assert [j["taskId"] for j in shared.jobs()] == [first, *later]
