"""Admission control (`market.admission`, `market.service.kept`): what strangers cost the
market is bounded by limits in its settings, not by how hard they ask.

Eight connections asking for `/ui`, `/ui/tx`, `/metrics` or swarm joins as fast as they
were answered raised an unrelated client's `GET /jobs` median 2 to 8 times, however cheap
each answer had become. Now each of those surfaces has a rate (with a burst) and a number
at once, read from the market's settings, past which a 429 with Retry-After answers before
any work, held for the wait it names; a swarm join is limited per signing miner as well.

The unit tests drive the middleware and the buckets directly (a fake clock, no sleeping);
the live ones run a real `market serve` (LocalStack: Redis, Anvil, the market) with very
low limits, so that no assertion depends on how long anything takes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from market.admission import Admission, Limit, Limiter, Rule, SignedLimiter, retry_after
from market.guards import Message, Receive, Scope, Send
from market.service.kept import KeptResponses

# ---------------------------------------------------------------- buckets


def test_a_bucket_lets_its_burst_through_then_one_per_interval() -> None:
    now = [100.0]
    bucket = Limiter(Limit(2.0, 4), clock=lambda: now[0])
    assert [bucket.wait() for _ in range(4)] == [0.0] * 4
    assert bucket.wait() == pytest.approx(0.5)  # nothing taken by a refusal
    assert bucket.wait() == pytest.approx(0.5)
    now[0] += 0.5
    assert bucket.wait() == 0.0 and bucket.wait() == pytest.approx(0.5)
    now[0] += 60  # idle: full again, no more than the burst
    assert [bucket.wait() for _ in range(5)].count(0.0) == 4
    assert bucket.wait("another key") == 0.0  # each key its own bucket


def test_a_bucket_forgets_its_longest_idle_keys_past_its_bound() -> None:
    bucket = Limiter(Limit(1.0, 1), clock=lambda: 0.0, max_keys=3)
    for key in "abcd":
        assert bucket.wait(key) == 0.0
    assert bucket.wait("b") > 0 and bucket.wait("d") > 0
    assert bucket.wait("a") == 0.0  # dropped, so full again


def test_replayed_signed_messages_take_no_token_of_their_signer() -> None:
    bucket = SignedLimiter(Limit(1.0, 2), clock=lambda: 0.0)
    assert bucket.wait_signed("m", 10) == 0.0 and bucket.wait_signed("m", 11) == 0.0
    assert bucket.wait_signed("m", 12) == pytest.approx(1.0)  # newer: over the limit
    assert bucket.wait_signed("m", 11) == 0.0  # a replay passes, taking nothing
    assert bucket.wait_signed("m", 12) == pytest.approx(1.0)  # so the signer's bucket stays


def test_limits_from_rates_and_retry_after_in_whole_seconds() -> None:
    assert Limit.over(10.0, 2.0, 4) == Limit(10.0, 20, 4)
    assert Limit.over(0.01, 2.0).burst == 1
    assert [retry_after(w) for w in (0.01, 1.0, 1.2, 99.5)] == ["1", "1", "2", "100"]
    with pytest.raises(ValueError):
        Limit(0.0)


# ---------------------------------------------------------------- the middlewares


async def call(app: Any, path: str, query: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    """One GET through an ASGI app: status, headers, body."""
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query,
             "headers": []}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return (sent[0]["status"], dict(sent[0].get("headers", [])),
            b"".join(m.get("body", b"") for m in sent[1:]))


def test_past_its_number_at_once_a_kind_is_refused_before_the_app() -> None:
    async def scenario() -> None:
        gate, entered = asyncio.Event(), []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            entered.append(scope["path"])
            if scope["path"] == "/slow":
                await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        refused: list[str] = []
        door = Admission(app, [Rule("slow things", "/slow", Limit(1000.0, 1000, 1))],
                         on_refused=refused.append, hold_s=0.0)
        first = asyncio.create_task(call(door, "/slow"))
        while not entered:
            await asyncio.sleep(0)
        status, headers, body = await call(door, "/slow")
        assert status == 429 and headers[b"retry-after"] == b"1"
        assert b"too many requests for slow things (1 are being answered" in body
        assert (await call(door, "/other"))[0] == 200  # other paths pass
        gate.set()
        assert (await first)[0] == 200
        assert (await call(door, "/slow"))[0] == 200  # once the first is out
        assert entered == ["/slow", "/other", "/slow"] and refused == ["slow things"]

    asyncio.run(scenario())


def test_every_429_is_held_for_its_retry_after_before_it_is_sent() -> None:
    """A caller that ignores Retry-After gets its answer no sooner than it names (up to
    `hold_s`): the refusal it would repeat at once costs the server a sleeping coroutine."""
    async def scenario() -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"retry-after", b"7")]})
            await send({"type": "http.response.body", "body": b"later"})

        door = Admission(app, [Rule("tiny", "/tiny", Limit(0.001, 1))], hold_s=3600.0,
                         max_held=2)
        mine = asyncio.create_task(call(door, "/tiny"))  # takes the one token: the app's 429
        theirs = asyncio.create_task(call(door, "/tiny"))  # refused by the door
        while door.held < 2:
            await asyncio.sleep(0)
        assert not mine.done() and not theirs.done()
        # past `max_held`, answers go at once
        status, headers, _ = await call(door, "/tiny")
        assert status == 429 and int(headers[b"retry-after"]) > 900
        mine.cancel()
        theirs.cancel()

    asyncio.run(scenario())


def test_kept_pages_are_served_without_the_route() -> None:
    async def scenario() -> None:
        calls: list[bytes] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            calls.append(scope["query_string"])
            status = 500 if scope["query_string"] == b"broken" else 200
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"page %d" % len(calls)})

        kept = KeptResponses(app, ["/ui"], kept_s=3600.0)
        assert await call(kept, "/ui") == (200, {}, b"page 1")
        assert await call(kept, "/ui") == (200, {}, b"page 1")
        assert (await call(kept, "/ui", b"refresh=0"))[2] == b"page 2"
        assert (await call(kept, "/ui", b"broken"))[0] == 500  # errors are not kept
        assert (await call(kept, "/ui", b"broken"))[2] == b"page 4"
        assert (await call(kept, "/jobs"))[2] == b"page 5"  # not a kept path
        assert (await call(kept, "/jobs"))[2] == b"page 6"
        assert kept.served == 1
        stale = KeptResponses(app, ["/ui"], kept_s=0.0)
        assert (await call(stale, "/ui"))[2] != (await call(stale, "/ui"))[2]

    asyncio.run(scenario())


# ---------------------------------------------------------------- a real market

LIMITS = {
    # a token every 100 s with bursts of 3: nothing refills while a test runs
    "ui_per_s": 0.01, "ui_tx_per_s": 0.01, "metrics_per_s": 0.01,
    "swarm_joins_per_miner_per_s": 0.01, "limit_burst_s": 300.0,
    "swarm_joins_per_s": 1.0,  # 300 at once: these tests meet only the per-miner limit
    "limited_at_once": 16,  # nor the number at once (the unit test above has it)
}
BURST = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from market.local.stack import LocalStack

    with LocalStack(home=tmp_path_factory.mktemp("admission"), workers=0,
                    market_settings=LIMITS) as s:
        yield s


def test_a_burst_past_the_limits_gets_429s_with_retry_after_while_jobs_answers(
        stack: Any) -> None:
    url = stack.market_url
    with ThreadPoolExecutor(24) as pool:
        ui = [pool.submit(httpx.get, f"{url}/ui?refresh=0", timeout=60) for _ in range(12)]
        tx = [pool.submit(httpx.get, f"{url}/ui/tx/0x{i:064x}", timeout=60)
              for i in range(12)]
        jobs = [httpx.get(f"{url}/jobs", timeout=60) for _ in range(5)]  # meanwhile
        answers = {"GET /ui": [f.result() for f in ui], "GET /ui/tx/{hash}":
                   [f.result() for f in tx]}
    assert [r.status_code for r in jobs] == [200] * 5
    for name, replies in answers.items():
        statuses = Counter(r.status_code for r in replies)
        assert sum(statuses[s] for s in (200, 404)) <= BURST, (name, statuses)
        assert statuses[429] >= len(replies) - BURST, (name, statuses)
        for r in replies:
            if r.status_code == 429:
                # the setting's rate, not the default's: the next token is ~100 s away
                assert int(r.headers["retry-after"]) > 50, r.headers
                assert f"too many requests for {name} (over the rate; at most 0.01 a " \
                       "second, bursts of 3, 16 at once)" in r.json()["detail"]
    samples = httpx.get(f"{url}/metrics", timeout=60)
    assert samples.status_code == 200
    refused = {line.split('"')[1]: float(line.split()[-1]) for line in samples.text.splitlines()
               if line.startswith("quarry_market_refused_requests_total{")}
    assert refused["GET /ui"] >= 12 - BURST and refused["GET /ui/tx/{hash}"] >= 12 - BURST
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200


def test_a_miners_joins_past_its_limit_get_429s_and_replays_take_none_of_them(
        stack: Any) -> None:
    from market.chain.client import anvil_account
    from market.chain.contracts import GpuSpec
    from market.marketapi import MarketAPI
    from market.model.create import llama_config
    from market.protocol.messages import swarm_join

    url = stack.market_url
    arch = llama_config(layers=8, hidden=64, vocab_size=300, heads=2, kv_heads=1,
                        intermediate=192, max_positions=256)
    with MarketAPI(url) as api:
        model_id = api.register_model({"format": "quarry-manifest/1", "name": "admitted",
                                       "architecture": arch,
                                       "files": {"model.safetensors": "ab" * 32}})
    member, other = anvil_account(12), anvil_account(13)
    for account in (member, other):
        stack.quarry.gpu.register(account, [bytes.fromhex(model_id[2:])],
                                  GpuSpec("RTX 4090", 24576, 1), "http://127.0.0.1:1", 10**9,
                                  10**18)
    now = int(time.time())

    def join(account: Any, timestamp: int) -> httpx.Response:
        body = swarm_join(account, model_id, timestamp=timestamp, memory_mib=8, tflops=1.0,
                          endpoint="tcp://127.0.0.1:9500", public_key="7" * 40,
                          price_per_token=10**9)
        return httpx.post(f"{url}/swarms/{model_id}/members", json=body, timeout=60)

    replies = [join(member, now - 10 + k) for k in range(BURST + 2)]
    assert [r.status_code for r in replies] == [200] * BURST + [429, 429]
    for r in replies[BURST:]:
        assert int(r.headers["retry-after"]) > 50
        assert f"{member.address} joins more often than 0.01 a second, bursts of 3" in \
            r.json()["detail"]
    # a replay of a join let through (anyone may send it again) takes none of the member's
    # tokens: it is answered as before, and the member's next new join is still refused
    assert join(member, now - 10).status_code == 200
    assert join(member, now - 10 + BURST).status_code == 429
    assert join(other, now).status_code == 200  # each miner its own bucket
