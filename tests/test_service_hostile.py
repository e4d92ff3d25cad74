"""Hostile input against the market, as found from outside (issue: the market service,
hardened), each reproduced first:

- 80,000 nested arrays (160 KB) posted to any JSON endpoint segfaulted `market serve`
  (eth-account's py_ecc raises the recursion limit to 100,000, so the JSON parser overran
  the C stack); the same bytes as a result document or a batch line crashed whoever parsed
  them. Now refused before parsing, with the process alive.
- bodies of any size were read and parsed whole; a heartbeat's status of any size stored.
- path and query integers past 2^63 gave 500 (SQLite overflow); `POST /tasks/-1/offer` gave
  503 (a chain error taken for an outage).

The live part runs a real `market serve` process (LocalStack: Redis, Anvil, the market).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.jsonsafe import JsonTooDeep, loads, nesting_depth
from market.protocol.errors import RequestError
from market.protocol.requests import parse_jsonl
from market.protocol.results import ResultFormatError, ShardResult

DEEP = b"[" * 80_000 + b"]" * 80_000  # 160 KB


def test_the_crash_is_real_without_the_guard() -> None:
    """What the guard prevents: with eth-account imported, plain json.loads of DEEP kills
    the interpreter (SIGSEGV), it does not raise."""
    code = ("import eth_account, json, sys\n"
            "json.loads(sys.stdin.buffer.read())\n")
    proc = subprocess.run([sys.executable, "-c", code], input=DEEP, capture_output=True,
                          timeout=60)
    assert proc.returncode < 0 or proc.returncode >= 128, proc.returncode


def test_nesting_is_measured_without_recursion() -> None:
    assert nesting_depth(b'{"a": [1, {"b": "[[[["}], "c": "\\"]]"}') == 3
    assert nesting_depth(b"[]") == 1 and nesting_depth(b"7") == 0
    assert nesting_depth(DEEP) == 80_000
    with pytest.raises(JsonTooDeep, match="nested 80000 levels deep, over the limit of 64"):
        loads(DEEP)
    assert loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(RequestError, match="line 1.*nested 80000 levels"):
        parse_jsonl(DEEP + b"\n")
    with pytest.raises(ResultFormatError, match="result document is nested 80000 levels"):
        ShardResult.from_bytes(DEEP)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet='[]{}"\\ab'), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_nesting_depth_agrees_with_the_parsed_document(value: object) -> None:
    """Strings full of brackets, quotes and escapes never count; the scan's depth is the
    parsed value's."""
    assert nesting_depth(json.dumps(value)) == _depth(value)


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from market.local.stack import LocalStack

    with LocalStack(home=tmp_path_factory.mktemp("hostile"), workers=0) as stack:
        yield stack.market_url


def _alive(url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("path", ["/models", "/miners/heartbeat", "/tasks/1/offer",
                                  "/committee/messages"])
def test_deep_json_is_refused_and_the_market_lives(market: str, path: str) -> None:
    r = httpx.post(f"{market}{path}", content=DEEP,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert "nested 80000 levels deep, over the limit of 64" in r.json()["detail"]
    _alive(market)


def test_oversized_bodies_are_refused_before_parsing(market: str) -> None:
    big = json.dumps({"pad": "x" * (3 << 20)}).encode()
    r = httpx.post(f"{market}/models", content=big,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "over the 2097152-byte limit" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no content-length: cut off once past the limit
        yield b'{"pad": "'
        for _ in range(48):
            yield b"x" * 65536
        yield b'"}'

    r = httpx.post(f"{market}/models", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "passed the 2097152-byte limit" in r.json()["detail"]
    _alive(market)


def test_a_heartbeat_status_is_a_few_counters_not_a_store(market: str) -> None:
    from eth_account import Account

    from market.marketapi import MarketAPI, MarketError

    with MarketAPI(market) as api:
        with pytest.raises(MarketError, match="413.*status of 6.* bytes is over the 4096"):
            api.heartbeat(Account.create(), {"note": "x" * 6000})


@pytest.mark.parametrize(("method", "path", "field"), [
    ("GET", f"/jobs/{2**63}", "task_id"),
    ("GET", f"/jobs/{2**64}", "task_id"),
    ("GET", f"/committee/messages?afterId={2**64}", "afterId"),
    ("POST", "/tasks/-1/offer", "task_id"),
    ("POST", f"/tasks/{2**70}/offer", "task_id"),
])
def test_out_of_range_integers_are_4xx_not_5xx(market: str, method: str, path: str,
                                               field: str) -> None:
    r = httpx.request(method, f"{market}{path}", json={} if method == "POST" else None,
                      timeout=10)
    assert r.status_code == 422, (r.status_code, r.text)
    assert field in r.json()["detail"]
    _alive(market)


def test_hostile_documents_do_not_crash_their_readers(tmp_path: Path) -> None:
    """A miner publishing a 160 KB nested 'result document' (or a market answering with
    one) gets a named error from every reader, never a dead verifier or client."""
    from market.marketapi import MarketAPI, MarketError

    with pytest.raises(ResultFormatError):
        ShardResult.from_bytes(DEEP)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=DEEP))
    api = MarketAPI("http://market.invalid")
    api._http = httpx.Client(transport=transport, base_url="http://market.invalid")
    with pytest.raises(MarketError, match="nested 80000 levels"):
        api.models()


def test_store_addresses_match_whole_and_no_slash_redirects(market: str) -> None:
    """`$` let a trailing newline through (`GET /store/<uri>%0A` served the object), and
    `GET /store/` redirected to the POST-only `/store`."""
    uri = httpx.post(f"{market}/store", content=b"hostile third pass", timeout=10).json()["uri"]
    assert httpx.get(f"{market}/store/{uri}", timeout=10).content == b"hostile third pass"
    r = httpx.get(f"{market}/store/{uri}%0A", timeout=10)
    assert r.status_code == 400 and "is not a store address" in r.json()["detail"]
    r = httpx.get(f"{market}/store/", timeout=10)
    assert r.status_code == 404 and "location" not in r.headers
    samples = httpx.get(f"{market}/metrics", timeout=10).text
    stored = next(line for line in samples.splitlines()
                  if line.startswith("quarry_market_store_bytes "))
    assert float(stored.split()[1]) >= len(b"hostile third pass")
    _alive(market)


def test_dashboard_costs_are_not_the_readers_to_choose(market: str) -> None:
    """`/ui?refresh=0.001` redrew continuously; `/ui/tx/{random hash}` was an RPC call."""
    r = httpx.get(f"{market}/ui", params={"refresh": "0.001"}, timeout=10)
    assert r.status_code == 422 and "below the floor of 1 s" in r.json()["detail"]
    assert httpx.get(f"{market}/ui", params={"refresh": "0"}, timeout=10).status_code == 200
    r = httpx.get(f"{market}/ui/tx/0x{'ab' * 32}", timeout=10)
    assert r.status_code == 404 and "indexed no Quarry event" in r.json()["detail"]
    _alive(market)


def test_one_dashboard_draw_serves_every_reader(tmp_path: Path) -> None:
    """Each `/ui` was a full draw (about 115 ms of CPU and 8 RPC calls): now readers share
    the draw of the board's cursor."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from market.chain.devnet import free_port
    from market.service.app import create_app
    from market.service.settings import MarketSettings

    settings = MarketSettings(deployment=tmp_path / "missing.json", store_dir=tmp_path / "s",
                              db_path=tmp_path / "board.sqlite",
                              redis_url=f"redis://127.0.0.1:{free_port()}/0",
                              # every reader let in (`test_admission` has the limits)
                              ui_per_s=100.0, limited_at_once=8)
    app = create_app(settings)
    with TestClient(app) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.get("/ui?refresh=0").status_code, range(24)))
    assert answers == [200] * 24
    assert app.state.pages.draws == 1
