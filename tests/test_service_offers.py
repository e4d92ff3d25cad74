"""Task offers (`POST /tasks/{taskId}/offer`) on a real uvicorn app over the session Anvil:
a task its client offered to one miner shows in that miner's open shards and stored
recommendations (the Celery recommend task run in-process on a private Redis) and in no other
miner's, nor in the anonymous list; a newer offer moves it; refusals (not the client, an offer
replayed onto another task, unknown task or miner, a miner that could not claim the task such
as one on probation, stale timestamp, malformed body) change nothing; offers stay with the
deployment they were made on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from eth_account.messages import encode_defunct

from market.chain.devnet import free_port
from market.marketapi import MarketAPI, MarketError
from market.protocol.messages import offer_message
from market.protocol.precision import precision_mask
from market.service.app import serve_in_thread
from market.service.board import Board, deployment_identity
from market.service.settings import MarketSettings
from market.store import content_uri

if TYPE_CHECKING:
    from conftest import Devnet
    from eth_account.signers.local import LocalAccount

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]

MODEL_HEX = "0x" + "11" * 32


@dataclass
class Market:
    api: MarketAPI
    url: str
    settings: MarketSettings
    board: Board
    http: httpx.Client


@pytest.fixture
def market(devnet: Devnet, deployment_file: Path, tmp_path: Path) -> Iterator[Market]:
    # index_interval_s=60: stored recommendations stay fresh (3 intervals) for the test.
    settings = MarketSettings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", deployment=deployment_file,
        store_dir=tmp_path / "store", db_path=tmp_path / "board.sqlite", port=free_port(),
        index_interval_s=60.0)
    with serve_in_thread(settings) as url, MarketAPI(url, timeout=10) as api, \
            httpx.Client(base_url=url, timeout=10) as http:
        yield Market(api, url, settings, Board(settings.db_path), http)


def post_task(net: Devnet, n: int, shard_size: int, client: LocalAccount | None = None,
              allow_probation: bool = False, precisions: int = 0) -> int:
    task_id, _ = net.q.tasks.create_task(
        client or net.client, model_id=net.MODEL_ID, input_root=b"\x01" * 32,
        input_uri=content_uri(b"requests"), num_requests=n, shard_size=shard_size,
        max_tokens_per_request=4, price_per_token=net.PRICE,
        deadline=net.chain.timestamp() + 3600, allow_probation=allow_probation,
        precisions=precisions)
    return task_id


def shards_for(market: Market, miner: LocalAccount | None) -> list[tuple[int, int]]:
    """(taskId, shard) of /shards/open for `miner`, or for no miner (anonymous)."""
    params: dict[str, Any] = {"limit": 100}
    if miner is not None:
        params.update(modelId=MODEL_HEX, miner=miner.address)
    rows = market.http.get("/shards/open", params=params).json()
    return sorted((r["taskId"], r["shard"]) for r in rows)


def offer_body(signer: LocalAccount, task_id: int, miner: str,
               timestamp: int | None = None) -> dict[str, Any]:
    timestamp = int(time.time()) if timestamp is None else timestamp
    sig = signer.sign_message(encode_defunct(offer_message(task_id, miner, timestamp)))
    return {"miner": miner, "timestamp": timestamp,
            "signature": "0x" + bytes(sig.signature).hex()}


def run_recommend(market: Market, redis_dir: Path) -> dict[str, Any]:
    """The worker's `quarry.recommend` task, run in this process on a private Redis (it
    takes a Redis lock) against the app's board and deployment."""
    from market.local import processes
    from market.service import worker

    redis = processes.start_redis(redis_dir)
    try:
        worker.configure(market.settings.replace(redis_url=redis.extra["url"]))
        try:
            return dict(worker.recommend())
        finally:
            worker.configure(MarketSettings.load())
    finally:
        redis.stop()


def test_an_offered_task_shows_to_the_offered_miner_only(market: Market, devnet: Devnet,
                                                         tmp_path: Path) -> None:
    net, api, board = devnet, market.api, market.board
    directed = post_task(net, 4, 2)  # shards 0, 1
    public = post_task(net, 2, 1)
    board.index(net.q)
    everything = [(directed, 0), (directed, 1), (public, 0), (public, 1)]
    assert shards_for(market, net.miner) == shards_for(market, net.miner2) == everything

    api.offer(net.client, directed, net.miner.address)
    assert shards_for(market, net.miner) == everything
    assert shards_for(market, net.miner2) == [(public, 0), (public, 1)]
    assert shards_for(market, None) == [(public, 0), (public, 1)]
    assert {(r["taskId"], r["offeredTo"]) for r in board.open_shards(None, 0)} == {
        (directed, net.miner.address), (public, None)}
    # The offer needs no reindex: it is read with the board's shards at each request.
    assert board.offer(deployment_identity(net.q), directed)["until"] == \
        net.q.tasks.get_task(directed).deadline

    # The workers' stored recommendations (computed for alive miners) follow the offer too.
    api.heartbeat(net.miner, {})
    api.heartbeat(net.miner2, {})
    out = run_recommend(market, tmp_path / "redis")
    assert out["miners"] == 2, out
    stored = {m.address: sorted((r["taskId"], r["shard"]) for r in board.recommendations(
        m.address)[0]) for m in (net.miner, net.miner2)}
    assert stored == {net.miner.address: everything,
                      net.miner2.address: [(public, 0), (public, 1)]}
    assert shards_for(market, net.miner2) == [(public, 0), (public, 1)]
    # Recommendations stored before the offer are filtered when served.
    board.set_recommendations(net.miner2.address, [{"taskId": directed, "shard": 1},
                                                   {"taskId": public, "shard": 0}],
                              int(time.time()))
    assert shards_for(market, net.miner2) == [(public, 0)]

    # The offered miner claims one shard; the other stays its own.
    net.q.tasks.claim_shard(net.miner, directed, 0)
    board.index(net.q)
    assert (directed, 1) in shards_for(market, net.miner)
    assert (directed, 1) not in shards_for(market, None)

    # A newer offer moves the task to another miner (both still served from their stored
    # recommendations, which listed it for one and not the other).
    api.offer(net.client, directed, net.miner2.address)
    assert (directed, 1) in shards_for(market, net.miner2)
    assert (directed, 1) not in shards_for(market, net.miner)
    # An older offer (a replay of the first) does not take it back.
    first = offer_body(net.client, directed, net.miner.address, int(time.time()) - 100)
    response = market.http.post(f"/tasks/{directed}/offer", json=first)
    assert response.status_code == 200 and response.json()["miner"] == net.miner2.address
    assert (directed, 1) not in shards_for(market, net.miner)


def test_refused_offers_change_nothing(market: Market, devnet: Devnet) -> None:
    net, api, board = devnet, market.api, market.board
    task = post_task(net, 2, 1)
    other = post_task(net, 2, 1)
    board.index(net.q)
    everyone = shards_for(market, None)
    assert len(everyone) == 4

    def refused(call: Any, status: int, match: str) -> None:
        with pytest.raises(MarketError) as info:
            call()
        assert info.value.status == status and match in str(info.value), str(info.value)

    refused(lambda: api.offer(net.client2, task, net.miner.address), 401,
            f"is signed by {net.client2.address}, not its client {net.client.address}")
    refused(lambda: api.offer(net.miner, task, net.miner.address), 401, "not its client")
    unknown = net.q.tasks.task_count() + 10
    refused(lambda: api.offer(net.client, unknown, net.miner.address), 404,
            f"task {unknown} does not exist in TaskRegistry")
    refused(lambda: api.offer(net.client, task, net.outsider.address), 404,
            f"miner {net.outsider.address} is not registered in GPURegistry")

    url = f"/tasks/{task}/offer"
    replayed = market.http.post(f"/tasks/{other}/offer",
                                json=offer_body(net.client, task, net.miner.address))
    assert replayed.status_code == 401  # signed for `task`: recovers to another address
    for when in (int(time.time()) - 300, int(time.time()) + 300):
        stale = market.http.post(url, json=offer_body(net.client, task, net.miner.address,
                                                      when))
        assert stale.status_code == 400 and "off the market's clock" in stale.json()["detail"]
    malformed = market.http.post(url, json={"miner": net.miner.address})
    assert malformed.status_code == 422
    assert "timestamp: Field required" in malformed.json()["detail"]
    bad_signature = market.http.post(url, json={**offer_body(net.client, task, net.miner.address),
                                                "signature": "0x12"})
    assert bad_signature.status_code == 400 and "malformed offer" in bad_signature.json()["detail"]
    bad_miner = market.http.post(url, json=offer_body(net.client, task, "0x1234"))
    assert bad_miner.status_code == 400 and "is not an address" in bad_miner.json()["detail"]
    assert shards_for(market, None) == everyone
    assert shards_for(market, net.miner2) == everyone

    # An offer filed under another deployment (a chain redeployed under the market, whose
    # task ids restart) hides nothing here.
    board.put_offer(deployment_identity(net.q) + ":elsewhere", task, net.client.address,
                    net.miner.address, 2**40, int(time.time()), "0x")
    assert shards_for(market, net.miner2) == everyone
    # Nor does one whose `until` (the task's deadline when offered) has passed.
    board.put_offer(deployment_identity(net.q), other, net.client.address,
                    net.miner.address, 0, int(time.time()), "0x")
    assert shards_for(market, net.miner2) == everyone

    # An offer to a miner whose declared precision the task's mask leaves out.
    from market.chain.contracts import GpuSpec

    net.q.gpu.update(net.miner2, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://m2",
                     net.PRICE, ["bf16"])
    exact = post_task(net, 2, 1, precisions=precision_mask(["fp32"]))
    board.index(net.q)
    refused(lambda: api.offer(net.client, exact, net.miner2.address), 400,
            "serves the model in bf16, the task accepts fp32")
    assert board.offer(deployment_identity(net.q), exact) is None
    assert (exact, 0) not in shards_for(market, net.miner2)
    assert (exact, 0) in shards_for(market, net.miner)


def test_an_offer_to_a_miner_on_probation_needs_a_task_that_allows_it(
        market: Market, devnet: Devnet) -> None:
    """Offering an ordinary task to a miner on probation would hide it from every miner that
    can claim it, while the offered one cannot: refused. A task that allows probation may be
    offered to it, and then shows to it alone."""
    from market.chain.contracts import GpuSpec

    net, api, board = devnet, market.api, market.board
    newcomer = net.outsider
    net.q.gpu.register(newcomer, [net.MODEL_ID], GpuSpec("L4", 24576, 1), "http://new",
                       net.PRICE, net.MINER_STAKE)
    ordinary = post_task(net, 2, 1)
    opted_in = post_task(net, 2, 1, allow_probation=True)
    board.index(net.q)
    with pytest.raises(MarketError) as info:
        api.offer(net.client, ordinary, newcomer.address)
    assert info.value.status == 400 and "on probation" in str(info.value), str(info.value)
    assert board.offer(deployment_identity(net.q), ordinary) is None
    assert shards_for(market, net.miner) == [(ordinary, 0), (ordinary, 1), (opted_in, 0),
                                             (opted_in, 1)]
    assert shards_for(market, newcomer) == [(opted_in, 0), (opted_in, 1)]

    api.offer(net.client, opted_in, newcomer.address)
    assert shards_for(market, newcomer) == [(opted_in, 0), (opted_in, 1)]
    assert shards_for(market, net.miner) == [(ordinary, 0), (ordinary, 1)]
    assert shards_for(market, None) == [(ordinary, 0), (ordinary, 1)]
    net.q.tasks.claim_shard(newcomer, opted_in, 0)  # the chain lets it
