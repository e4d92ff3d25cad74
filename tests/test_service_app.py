"""The market's FastAPI app served by a real uvicorn on a free port, exercised through
`MarketAPI` (the client miners and clients use) against the session Anvil: every endpoint,
the board it serves (indexed here as a worker would), and bad input (too large uploads,
unknown addresses and jobs, bad manifests, forged or stale heartbeats, no deployment)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from eth_account.messages import encode_defunct

from market.chain.devnet import free_port
from market.marketapi import MarketAPI, MarketError
from market.model.manifest import Manifest
from market.protocol.messages import heartbeat_message
from market.service.app import serve_in_thread
from market.service.board import Board
from market.service.settings import MarketSettings
from market.store import ContentNotFound, ContentTooLarge, content_uri

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.timeout(120)]

MAX_FILE = 4096
MODEL_HEX = "0x" + "11" * 32


@contextmanager
def serve(settings: MarketSettings) -> Iterator[str]:
    """Run the app in a uvicorn thread on a free port; stop it on exit."""
    with serve_in_thread(settings.replace(port=free_port())) as url:
        yield url


def settings_for(tmp_path: Path, deployment: Path, **kw: object) -> MarketSettings:
    return MarketSettings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        deployment=deployment, store_dir=tmp_path / "store", db_path=tmp_path / "board.sqlite",
        max_file_bytes=MAX_FILE, index_interval_s=60.0, **kw)  # type: ignore[arg-type]


@dataclass
class Market:
    api: MarketAPI
    url: str
    settings: MarketSettings
    board: Board  # the same file the app serves; the tests index it as a worker would


@pytest.fixture
def market(devnet: Devnet, deployment_file: Path, tmp_path: Path) -> Iterator[Market]:
    settings = settings_for(tmp_path, deployment_file)
    with serve(settings) as url, MarketAPI(url, timeout=10) as api:
        yield Market(api, url, settings, Board(settings.db_path))


def tiny_manifest(name: str = "tiny") -> dict:
    return {"format": "quarry-manifest/1", "name": name,
            "architecture": {"hidden_size": 8, "rope_theta": 10000.0},
            "files": {"model.safetensors": "cd" * 32, "tokenizer.json": "ef" * 32}}


def post_task(net: Devnet, n: int, shard_size: int, price: int | None = None) -> int:
    task_id, _ = net.q.tasks.create_task(
        net.client, model_id=net.MODEL_ID, input_root=b"\x01" * 32,
        input_uri=content_uri(b"requests"), num_requests=n, shard_size=shard_size,
        max_tokens_per_request=4, price_per_token=price or net.PRICE,
        deadline=net.chain.timestamp() + 3600)
    return task_id


def status_of(exc: pytest.ExceptionInfo) -> int | None:
    return getattr(exc.value, "status", None)


# -- tests --------------------------------------------------------------------------------


@pytest.mark.chain
def test_health_deployment_limits_and_docs(market: Market, devnet: Devnet) -> None:
    api = market.api
    health = api.health()
    assert health["ok"] is True and health["redis"] is False  # no Redis in this test
    assert health["chainId"] == devnet.chain.chain_id
    assert health["headBlock"] == devnet.chain.block_number()
    assert health["indexedBlock"] is None
    market.board.index(devnet.q)
    assert api.health()["indexedBlock"] == market.board.cursor()
    d = api.deployment()
    assert (d.addresses, d.chain_id, d.deploy_block) == (
        devnet.deployment.addresses, devnet.deployment.chain_id, devnet.deployment.deploy_block)
    assert api.limits() == {"maxFileBytes": MAX_FILE,
                            "maxRequestBytes": market.settings.max_request_bytes}
    asked: list[str] = []  # the limits are reused for LIMITS_TTL_S, unless asked afresh
    get = api._json
    api._json = lambda method, path, **kw: asked.append(path) or get(method, path, **kw)
    try:
        assert api.limits() == api.limits(fresh=True) and asked == ["/limits"]
    finally:
        del api._json
    docs = httpx.get(f"{market.url}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = httpx.get(f"{market.url}/openapi.json").json()
    assert spec["info"]["title"] == "Quarry market"
    assert set(spec["paths"]) >= {
        "/health", "/deployment", "/limits", "/store", "/store/{uri}", "/models",
        "/models/{model_id}", "/jobs", "/jobs/{task_id}", "/shards/open",
        "/miners/heartbeat", "/miners"}


@pytest.mark.chain
def test_store_round_trip_and_limits(market: Market) -> None:
    api = market.api
    data = b'{"custom_id": "a"}\n' * 10
    uri = api.put(data)
    assert uri == content_uri(data) and api.put(data) == uri  # idempotent
    assert api.get(uri) == data
    assert api.put(b"x" * MAX_FILE) == content_uri(b"x" * MAX_FILE)  # exactly the limit
    with pytest.raises(ContentTooLarge) as too_large:
        api.put(b"x" * (MAX_FILE + 1))
    assert (too_large.value.size, too_large.value.limit) == (MAX_FILE + 1, MAX_FILE)
    with pytest.raises(ContentTooLarge):  # far larger than the socket buffers
        api.put(b"x" * 2_000_000)
    with pytest.raises(ContentNotFound, match="holds no sha256:"):
        api.get(content_uri(b"never stored"))

    raw = httpx.Client(base_url=market.url, timeout=10)
    bad = raw.get("/store/sha256:xyz")
    assert bad.status_code == 400 and "not a store address" in bad.json()["detail"]
    # No content-length (chunked): refused once the stream passes the limit.
    chunked = raw.post("/store", content=iter([b"y" * 3000, b"y" * 3000]))
    assert chunked.status_code == 413 and "limit of 4096 bytes" in chunked.json()["detail"]
    small = raw.post("/store", content=iter([b"z" * 10]))
    assert small.status_code == 201 and small.json() == {"uri": content_uri(b"z" * 10),
                                                         "size": 10}
    raw.close()


@pytest.mark.chain
def test_models(market: Market, devnet: Devnet) -> None:
    api = market.api
    manifest = tiny_manifest()
    model_id = api.register_model(manifest)
    assert model_id == Manifest.from_dict(manifest).model_id_hex
    assert api.model(model_id) == Manifest.from_dict(manifest).to_dict()
    assert api.models() == [{"modelId": model_id, "name": "tiny", "miners": 0,
                             "minPricePerToken": None, "probationMiners": 0,
                             "hasManifest": True}]
    market.board.index(devnet.q)  # the conftest miners serve MODEL_ID on-chain
    served = {m["modelId"]: m for m in api.models()}[MODEL_HEX]
    assert served == {"modelId": MODEL_HEX, "name": None, "miners": 2,
                      "minPricePerToken": devnet.PRICE, "probationMiners": 0,
                      "hasManifest": False}

    with pytest.raises(MarketError, match="no manifest for model") as unknown:
        api.model("0x" + "99" * 32)
    assert status_of(unknown) == 404
    with pytest.raises(MarketError, match="not 32 bytes") as malformed:
        api.model("0x12")
    assert status_of(malformed) == 400
    with pytest.raises(MarketError, match="unsupported format") as bad:
        api.register_model({**manifest, "format": "other"})
    assert status_of(bad) == 400
    with pytest.raises(MarketError, match="'files' must map"):
        api.register_model({**manifest, "files": {"w.safetensors": "short"}})
    with pytest.raises(MarketError, match="hashes to"):
        api.register_model({**manifest, "modelId": "0x" + "00" * 32})
    not_object = httpx.post(f"{market.url}/models", json=[1, 2])
    assert not_object.status_code == 422 and "invalid request" in not_object.json()["detail"]


@pytest.mark.chain
def test_jobs_and_open_shards(market: Market, devnet: Devnet) -> None:
    api, board, net = market.api, market.board, devnet
    cheap = post_task(net, 4, 2)
    rich = post_task(net, 3, 1, price=2 * net.PRICE)
    assert api.jobs() == []  # nothing indexed yet
    with pytest.raises(MarketError, match=f"task {cheap} is not on the board") as missing:
        api.job(cheap)
    assert status_of(missing) == 404
    board.index(net.q)
    assert [j["taskId"] for j in api.jobs()] == [cheap, rich]
    assert [j["taskId"] for j in api.jobs(client=net.client.address)] == [cheap, rich]
    assert api.jobs(client=net.client2.address) == []
    job = api.job(cheap)
    assert job == board.job(cheap)
    assert job["allowProbation"] is False
    assert (job["disputes"], job["challenges"], job["billingFaults"]) == ([], [], [])
    assert [s["state"] for s in job["shards"]] == ["Open", "Open"]
    assert job["shardStates"]["Open"] == 2 and job["numShards"] == 2
    with pytest.raises(MarketError, match="client '0xzz' is not an address"):
        api.jobs(client="0xzz")

    # Ranked for a miner: the better paid task first, then the other.
    ranked = api.open_shards(MODEL_HEX, net.miner.address, limit=10)
    assert [(s["taskId"], s["pricePerToken"]) for s in ranked[:3]] == [
        (rich, 2 * net.PRICE)] * 3
    assert [s["taskId"] for s in ranked[3:]] == [cheap, cheap]
    assert len(api.open_shards(MODEL_HEX, net.miner.address, limit=2)) == 2
    assert api.open_shards("0x" + "22" * 32, net.miner.address) == []
    anyone = httpx.get(f"{market.url}/shards/open", params={"limit": 100}).json()
    assert len(anyone) == 5 and anyone[0]["taskId"] == rich
    with pytest.raises(MarketError, match="is not registered in GPURegistry") as unregistered:
        api.open_shards(MODEL_HEX, net.outsider.address)
    assert status_of(unregistered) == 404
    with pytest.raises(MarketError, match="modelId '0x11' is not 32 bytes"):
        api.open_shards("0x11", net.miner.address)
    with pytest.raises(MarketError, match="limit") as bad_limit:
        api.open_shards(MODEL_HEX, net.miner.address, limit=0)
    assert status_of(bad_limit) == 422

    # Fresh stored recommendations (younger than 3 index intervals: 180 s here) are served in
    # their order, minus shards no longer open.
    net.q.tasks.claim_shard(net.miner2, cheap, 1)
    board.index(net.q)
    stored = [{"taskId": cheap, "shard": 1}, {"taskId": cheap, "shard": 0},
              {"taskId": rich, "shard": 2}]
    board.set_recommendations(net.miner.address, stored, int(time.time()))
    assert [(s["taskId"], s["shard"]) for s in api.open_shards(MODEL_HEX, net.miner.address)
            ] == [(cheap, 0), (rich, 2)]
    with sqlite3.connect(market.settings.db_path) as conn:  # stored long ago: ignored
        conn.execute("UPDATE recommendations SET stored_at = stored_at - 3600")
    assert [s["taskId"] for s in api.open_shards(MODEL_HEX, net.miner.address)] == [
        rich, rich, rich, cheap]
    job = api.job(cheap)
    assert job["shards"][1]["state"] == "Claimed"
    assert job["shards"][1]["miner"] == net.miner2.address


@pytest.mark.chain
def test_open_shards_long_poll_answers_when_a_matching_shard_is_indexed(
        market: Market, devnet: Devnet) -> None:
    """`waitSeconds`: with nothing open, the request waits until the board indexes a
    matching shard (here the test indexes, as a worker would) instead of answering [] at
    once; without a match it answers [] when its time is up; over 30 s is refused."""
    net, url = devnet, f"{market.url}/shards/open"
    query = {"modelId": MODEL_HEX, "miner": net.miner.address, "waitSeconds": 30}
    market.board.index(net.q)
    assert httpx.get(url, params={**query, "waitSeconds": 0}).json() == []
    answers: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(httpx.get(url, params=query,
                                                                        timeout=60)))
    waiting.start()
    task_id = post_task(net, 2, 1)
    market.board.index(net.q)
    waiting.join(timeout=25)  # well inside the 30 s it would otherwise wait
    assert answers, "the long poll did not answer when the shard was indexed"
    assert answers[0].status_code == 200
    assert sorted((s["taskId"], s["shard"]) for s in answers[0].json()) == [(task_id, 0),
                                                                             (task_id, 1)]
    other = {**query, "modelId": "0x" + "99" * 32, "waitSeconds": 0.5}
    assert httpx.get(url, params=other, timeout=30).json() == []
    too_long = httpx.get(url, params={**query, "waitSeconds": 31})
    assert too_long.status_code == 422 and "waitSeconds" in too_long.json()["detail"]


@pytest.mark.chain
def test_a_miner_on_probation_is_shown_and_served_as_such(market: Market,
                                                          devnet: Devnet) -> None:
    """A miner registered now is on probation: `/miners` says so, `/models` counts it apart,
    and `/shards/open` gives it only tasks that allow probation (also from stored
    recommendations), as `claimShard` would."""
    from market.chain.contracts import GpuSpec

    api, board, net = market.api, market.board, devnet
    newcomer = net.outsider
    net.q.gpu.register(newcomer, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://new",
                       net.PRICE // 2, net.MINER_STAKE)
    ordinary = post_task(net, 2, 1)
    opted_in, _ = net.q.tasks.create_task(
        net.client, model_id=net.MODEL_ID, input_root=b"\x02" * 32,
        input_uri=content_uri(b"requests"), num_requests=2, shard_size=1,
        max_tokens_per_request=4, price_per_token=net.PRICE,
        deadline=net.chain.timestamp() + 3600, allow_probation=True)
    board.index(net.q)
    rows = {m["address"]: m for m in api.miners()}
    assert {k: rows[newcomer.address][k] for k in (
        "onProbation", "eligible", "eligibleAllowingProbation")} == {
        "onProbation": True, "eligible": False, "eligibleAllowingProbation": True}
    served = {m["modelId"]: m for m in api.models()}[MODEL_HEX]
    assert (served["miners"], served["minPricePerToken"], served["probationMiners"]) == (
        2, net.PRICE, 1)
    assert (api.job(ordinary)["allowProbation"], api.job(opted_in)["allowProbation"]) == (
        False, True)

    def shards(miner: str) -> list[tuple[int, int]]:
        return sorted((s["taskId"], s["shard"]) for s in api.open_shards(MODEL_HEX, miner, 50))

    assert shards(newcomer.address) == [(opted_in, 0), (opted_in, 1)]
    assert shards(net.miner.address) == [(ordinary, 0), (ordinary, 1), (opted_in, 0),
                                         (opted_in, 1)]
    anyone = httpx.get(f"{market.url}/shards/open", params={"limit": 100}).json()
    assert {(s["taskId"], s["allowProbation"]) for s in anyone} == {
        (ordinary, False), (opted_in, True)}
    # Stored recommendations that list an ordinary task are filtered when served.
    board.set_recommendations(newcomer.address, [{"taskId": ordinary, "shard": 0},
                                                 {"taskId": opted_in, "shard": 1}],
                              int(time.time()))
    assert shards(newcomer.address) == [(opted_in, 1)]
    net.q.tasks.claim_shard(newcomer, opted_in, 1)  # the chain agrees


@pytest.mark.chain
def test_heartbeats_and_miners(market: Market, devnet: Devnet) -> None:
    api, net = market.api, devnet
    market.board.index(net.q)
    rows = {m["address"]: m for m in api.miners()}
    assert set(rows) == {net.miner.address, net.miner2.address}
    assert rows[net.miner.address]["alive"] is False and rows[net.miner.address]["lastSeen"] \
        is None
    assert rows[net.miner.address]["models"] == [MODEL_HEX]
    assert rows[net.miner.address]["stake"] == net.MINER_STAKE
    assert rows[net.miner.address]["pricePerToken"] == net.PRICE
    assert rows[net.miner.address]["endpoint"] == "http://127.0.0.1:9100"
    assert (rows[net.miner.address]["onProbation"], rows[net.miner.address]["eligible"]) == (
        False, True)

    api.heartbeat(net.miner, {"shard": None, "tokensPerSecond": 12.5})
    rows = {m["address"]: m for m in api.miners()}
    assert rows[net.miner.address]["alive"] is True
    assert rows[net.miner.address]["status"] == {"shard": None, "tokensPerSecond": 12.5}
    assert abs(rows[net.miner.address]["lastSeen"] - time.time()) < 60
    assert rows[net.miner2.address]["alive"] is False

    def body(signer, *, miner: str | None = None, timestamp: int | None = None,
             status: object = None) -> dict:
        miner = miner or signer.address
        timestamp = int(time.time()) if timestamp is None else timestamp
        status = {} if status is None else status
        sig = signer.sign_message(encode_defunct(heartbeat_message(miner, timestamp, status)))
        return {"miner": miner, "timestamp": timestamp, "status": status,
                "signature": "0x" + bytes(sig.signature).hex()}

    url = f"{market.url}/miners/heartbeat"
    forged = httpx.post(url, json=body(net.outsider, miner=net.miner2.address))
    assert forged.status_code == 401
    assert forged.json()["detail"] == (f"heartbeat for {net.miner2.address} is signed by "
                                       f"{net.outsider.address}")
    stale = httpx.post(url, json=body(net.miner2, timestamp=int(time.time()) - 120))
    assert stale.status_code == 400 and "off the market's clock" in stale.json()["detail"]
    future = httpx.post(url, json=body(net.miner2, timestamp=int(time.time()) + 120))
    assert future.status_code == 400
    malformed = httpx.post(url, json={"miner": net.miner2.address})
    assert malformed.status_code == 422
    assert "timestamp: Field required" in malformed.json()["detail"]
    bad_signature = httpx.post(url, json={**body(net.miner2), "signature": "0x12"})
    assert bad_signature.status_code == 400
    assert "malformed heartbeat" in bad_signature.json()["detail"]
    not_object = httpx.post(url, json=body(net.miner2, status=[1]))
    assert not_object.status_code == 422 and "status: Input should be a valid dictionary" in \
        not_object.json()["detail"]
    assert {m["address"]: m["alive"] for m in api.miners()}[net.miner2.address] is False
    outsider = httpx.post(url, json=body(net.outsider))  # signed, but not a registered miner
    assert outsider.status_code == 403 and "not a registered miner" in outsider.json()["detail"]
    assert net.outsider.address not in {m["address"] for m in api.miners()}


def test_no_deployment_is_a_clear_503(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "deployment.json"
    with serve(settings_for(tmp_path, missing)) as url, MarketAPI(url, timeout=10) as api:
        with pytest.raises(MarketError, match="no deployment file at") as info:
            api.deployment()
        assert status_of(info) == 503
        health = api.health()
        assert health["ok"] is False and health["redis"] is False
        assert "no deployment file" in health["detail"]
        assert api.jobs() == [] and api.miners() == []  # the board still answers
        assert api.limits()["maxFileBytes"] == MAX_FILE
        uri = api.put(b"bytes need no chain")
        assert api.get(uri) == b"bytes need no chain"
    with pytest.raises(MarketError, match="no market answers"):
        MarketAPI(url, timeout=2).health()


def test_chain_down_reads_as_not_ok(tmp_path: Path) -> None:
    from market.chain.deployment import Deployment

    dead = f"http://127.0.0.1:{free_port()}"
    path = Deployment(31337, dead, {n: "0x" + f"{i + 1:040x}" for i, n in enumerate(
        ("PaymentEscrow", "GPURegistry", "TaskRegistry", "VerifierCommittee", "Arbitration"))},
        1, "0x" + "00" * 20).save(tmp_path / "deployment.json")
    with serve(settings_for(tmp_path, path)) as url, MarketAPI(url, timeout=10) as api:
        health = api.health()
        assert health["ok"] is False and health["chainId"] == 31337
        assert health["headBlock"] is None and "did not answer" in health["detail"]
        assert api.deployment().rpc_url == dead  # the file itself is served
