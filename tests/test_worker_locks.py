"""The workers' Redis locks against a real redis-server (issue 30, item 3).

redis-py keeps a lock's token per thread by default: the keeper thread that `redis_lock`
starts to extend the lock had no token, died on its first `reacquire()` with
`AttributeError: '_thread._local' object has no attribute 'token'`, and every lock lapsed at
its TTL while its holder still worked; a second worker then took it, so a task longer than
the TTL could run twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from market.local.processes import start_redis
from market.service.worker import redis_lock

TTL_S = 1


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    server = start_redis(Path(tmp_path_factory.mktemp("redis")))
    try:
        with redis.Redis.from_url(server.extra["url"]) as c:
            yield c
    finally:
        server.stop()


def test_a_held_lock_outlives_its_ttl_and_no_one_else_takes_it(
        client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The holder works for 4 TTLs; a contender trying all along never gets the lock, the
    key keeps the holder's token, and the keeper logs no failure."""
    name = "quarry:lock:test-held"
    contender_got: list[float] = []
    stop = threading.Event()
    tokens: set[bytes | None] = set()

    def contend() -> None:
        while not stop.is_set():
            with redis_lock(name, TTL_S, client) as held:
                if held:
                    contender_got.append(time.monotonic())
            tokens.add(client.get(name))
            stop.wait(0.1)

    with caplog.at_level(logging.WARNING, logger="quarry.worker"):
        with redis_lock(name, TTL_S, client) as held:
            assert held
            token = client.get(name)
            contender = threading.Thread(target=contend)
            contender.start()
            try:
                time.sleep(4 * TTL_S)  # the holder's work, four TTLs long
                assert client.get(name) == token
            finally:
                stop.set()
                contender.join()
    assert contender_got == [], "a second holder took the lock while the first worked"
    assert tokens == {token}
    assert not [r for r in caplog.records if "could not be extended" in r.getMessage()]
    assert client.get(name) is None  # released on exit
    with redis_lock(name, TTL_S, client) as held:
        assert held  # and free for the next holder


def test_a_lock_is_taken_once_at_a_time(client: redis.Redis) -> None:
    name = "quarry:lock:test-once"
    with redis_lock(name, TTL_S, client) as first, redis_lock(name, TTL_S, client) as second:
        assert (first, second) == (True, False)
