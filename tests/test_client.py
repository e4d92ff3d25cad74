"""The client SDK and CLI against a real Anvil and a real market app (uvicorn in a thread).

The test plays the miners itself (claim, `build_shard_result`, upload, `submitResult` with the
devnet's registered miner accounts), so what is tested is the client: pre-flight checks that
keep money in place, verification that names the failing check, disputes, and the CLI's
OpenAI Batch output.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from client.batch import RequestTooLarge, encode_jsonl, prompt_lines
from client.cli import main as client_main
from client.sdk import (
    BatchError,
    ChainMismatch,
    Client,
    DeadlineExpired,
    DisputeNotPossible,
    InsufficientFunds,
    JobFailed,
    JobTimeout,
    MinerNotEligible,
    PaymentTooLow,
    ResultCheckFailed,
    ResultsNotReady,
    UnknownModel,
)
from market.chain.contracts import DisputeStatus, GpuSpec, ShardState
from market.chain.errors import revert_class
from market.protocol.canonical import json_hash
from market.protocol.eip712 import Vote, quorum_signatures
from market.protocol.errors import RequestError
from market.protocol.requests import parse_jsonl
from market.protocol.results import Completion, ShardResult, build_shard_result
from market.service.api import MarketAPI

pytestmark = pytest.mark.chain

MAX_REQUEST_BYTES = 2048
NAMED_PRICE_FACTOR = 3
MANIFEST = {"format": "quarry-manifest/1", "name": "tiny-test",
            "architecture": {"model_type": "test", "layers": 1}, "files": {}}


@dataclasses.dataclass
class Market:
    url: str
    api: MarketAPI
    named_model: bytes  # a model with a manifest ("tiny-test"), served by `devnet.outsider`


@pytest.fixture(scope="module")
def market(devnet_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """A market app on a free port, its board indexed once with the session's miners plus
    `outsider` serving a named model; all chain changes are rolled back afterwards."""
    from market.chain.devnet import free_port
    from market.service.app import serve_in_thread
    from market.service.board import Board
    from market.service.settings import MarketSettings

    net = devnet_session
    snapshot = net.chain.snapshot()
    root = tmp_path_factory.mktemp("market")
    deployment = net.deployment.save(root / "deployment.json")
    named = json_hash(MANIFEST)
    net.q.gpu.register(net.outsider, [named], GpuSpec("NVIDIA L4", 24576, 1),
                       "http://127.0.0.1:9199", NAMED_PRICE_FACTOR * net.PRICE, net.MINER_STAKE)
    settings = MarketSettings(deployment=deployment, store_dir=root / "store",
                              db_path=root / "board.sqlite", port=free_port(),
                              max_request_bytes=MAX_REQUEST_BYTES)
    Board(settings.db_path).index(net.q)  # the miners, as the worker's indexer would
    api = MarketAPI(settings.url)
    try:
        with serve_in_thread(settings):
            api.register_model(MANIFEST)
            for miner in (net.miner, net.miner2):
                api.heartbeat(miner, {"models": ["0x" + net.MODEL_ID.hex()]})
            yield Market(settings.url, api, named)
    finally:
        api.close()
        net.chain.revert_to(snapshot)


def connect(devnet: Any, market: Market, account: Any = None) -> Client:
    return Client(None, (account or devnet.client).key, market.url)


MODEL = "0x" + "11" * 32  # conftest's MODEL_ID, served by devnet.miner and devnet.miner2


Tamper = Callable[[ShardResult, Any], ShardResult]


def serve_shard(devnet: Any, market: Market, task_id: int, shard: int, miner: Any,
                tamper: Tamper | None = None) -> ShardResult:
    """Do a miner's part for one shard: claim, answer, sign, upload, submit."""
    q = devnet.q
    q.tasks.claim_shard(miner, task_id, shard)
    task = q.tasks.get_task(task_id)
    start, end = q.tasks.shard_range(task_id, shard)
    requests = parse_jsonl(market.api.get(task.input_uri))[start:end]
    completions = [Completion(r.index, r.custom_id, r.request_hash, f"answer {r.index} é",
                              tuple(range(100, 100 + r.index % 3 + 1)), "length", 2)
                   for r in requests]
    doc = build_shard_result(task_id=task_id, shard=shard, model_id=task.model_id,
                             completions=completions, private_key=miner.key,
                             miner=miner.address, chain_id=devnet.chain.chain_id,
                             task_registry=q.tasks.address)
    if tamper is not None:
        doc = tamper(doc, devnet)
    uri = market.api.put(doc.to_bytes())
    q.tasks.submit_result(miner, task_id, shard, doc.result_root, uri, doc.tokens_used)
    return doc


def _items(doc: ShardResult, i: int, **changes: Any) -> ShardResult:
    items = list(doc.items)
    items[i] = dataclasses.replace(items[i], **changes)
    return dataclasses.replace(doc, items=tuple(items))


def signed_by_another(doc: ShardResult, devnet: Any) -> ShardResult:
    it = doc.items[1]
    forged = it.receipt.sign(devnet.miner2.key, devnet.chain.chain_id, devnet.q.tasks.address)
    return _items(doc, 1, signature=forged)


def altered_text(doc: ShardResult, devnet: Any) -> ShardResult:
    return _items(doc, 1, text="something the model never said")


def bad_proof(doc: ShardResult, devnet: Any) -> ShardResult:
    it = doc.items[1]
    first = bytes([it.proof[0][0] ^ 1]) + it.proof[0][1:]
    return _items(doc, 1, proof=(first, *it.proof[1:]))


# ---------------------------------------------------------------------------- happy path


def test_submit_wait_results_verified_and_settled(devnet: Any, market: Market) -> None:
    c = connect(devnet, market)
    prompts = [f"prompt {i}" for i in range(7)]
    job = c.submit(prompts, model=MODEL, max_tokens=4)
    t = devnet.q.tasks.get_task(job.task_id)
    # Two alive miners: shards of ceil(7 / 4) = 2; the price is the lowest ask.
    assert (t.num_requests, t.shard_size, t.num_shards) == (7, 2, 4)
    assert (t.max_tokens_per_request, t.price_per_token) == (4, devnet.PRICE)
    assert job.payment == 7 * 4 * devnet.PRICE == devnet.q.escrow.escrowed(job.task_id)
    assert job.submission is not None

    with pytest.raises(ResultsNotReady, match="no results yet"):
        job.results()
    with pytest.raises(JobTimeout, match="0/4 shards"):
        job.wait(progress=False, timeout=0)
    for k in range(t.num_shards):
        serve_shard(devnet, market, job.task_id, k, (devnet.miner, devnet.miner2)[k % 2])
    status = job.wait(progress=False, timeout=30, poll_s=0.05)
    assert status.results_ready and not status.finished
    assert status.counts == {"SUBMITTED": 4}

    # A fresh client re-attaches with nothing local: inputs come back from the store.
    again = connect(devnet, market).job(job.task_id)
    outputs = again.results()
    assert [o.custom_id for o in outputs] == [f"request-{i}" for i in range(7)]
    assert [o.text for o in outputs] == [f"answer {i} é" for i in range(7)]
    assert [o.miner for o in outputs[:2]] == [devnet.miner.address] * 2
    assert outputs[2].miner == devnet.miner2.address
    assert outputs[5].token_ids == (100, 101, 102)
    assert outputs[5].usage == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    tokens = sum(len(o.token_ids) for o in outputs)

    devnet.chain.advance_time(devnet.q.tasks.params()["challenge_window"] + 1)
    for k in range(t.num_shards):
        devnet.q.tasks.finalize_shard(devnet.anyone, job.task_id, k)
    settled = job.wait(progress=True, timeout=30, finalized=True, poll_s=0.05)
    assert settled.finished and settled.tokens == tokens
    assert settled.paid == tokens * devnet.PRICE
    assert settled.refunded == job.payment - settled.paid and settled.escrowed == 0
    assert c.withdrawable() == settled.refunded
    assert "4 finalized" in settled.summary() and f"paid to miners {settled.paid}" in \
        settled.summary()
    assert c.withdraw() == settled.refunded and c.withdrawable() == 0


def test_name_resolution_and_prompt_defaults(devnet: Any, market: Market) -> None:
    c = connect(devnet, market)
    offer = c.resolve_model("tiny-test")
    assert offer.model_id == market.named_model
    assert [m.address for m in offer.miners] == [devnet.outsider.address]
    assert offer.min_price == NAMED_PRICE_FACTOR * devnet.PRICE
    job = c.submit(["a", "b", "c"], model="tiny-test", deadline=120)
    t = job.task()
    # No heartbeat from `outsider`: counted as one miner, so shards of ceil(3 / 2) = 2.
    assert (t.shard_size, t.price_per_token) == (2, NAMED_PRICE_FACTOR * devnet.PRICE)
    assert t.deadline - devnet.chain.timestamp() in range(115, 121)
    assert job.inputs().requests[0].request["body"]["model"] == "tiny-test"
    assert job.cancel() == job.payment
    with pytest.raises(JobFailed, match="refunded .*cancelled"):
        job.wait(progress=False, timeout=10)


# ---------------------------------------------------------------------------- tampering


@pytest.mark.parametrize(("tamper", "check"), [
    (signed_by_another, "signature"),
    (altered_text, "output hash"),
    (bad_proof, "merkle proof"),
])
def test_tampered_results_are_rejected_naming_the_check(
        devnet: Any, market: Market, tmp_path: Path, tamper: Tamper, check: str) -> None:
    c = connect(devnet, market)
    job = c.submit(["x", "y", "z"], model=MODEL, max_tokens=4, shard_size=3)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner, tamper)
    with pytest.raises(ResultCheckFailed) as info:
        job.results()
    assert info.value.check == check and info.value.index == 1
    assert f"{check} check failed: request 1" in str(info.value)

    key = tmp_path / "key"
    key.write_text(devnet.client.key.hex())
    out = tmp_path / "out.jsonl"
    code = client_main(["results", str(job.task_id), "--out", str(out), "--market-url",
                        market.url, "--key-file", str(key)])
    assert code == 1 and not out.exists()  # never writes unverified output


def test_result_document_for_another_shard_fails_the_header_check(
        devnet: Any, market: Market) -> None:
    job = connect(devnet, market).submit(["x", "y"], model=MODEL, max_tokens=4, shard_size=1)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner,
                lambda doc, _: dataclasses.replace(doc, shard=1))
    with pytest.raises(ResultCheckFailed, match="header check failed"):
        job.shard_results(0)


# ---------------------------------------------------------------------------- bad input


def test_bad_inputs_fail_before_any_money_moves(
        devnet: Any, market: Market, tmp_path: Path) -> None:
    c = connect(devnet, market)
    balance = devnet.chain.balance(c.address)
    tasks = devnet.q.tasks.task_count()
    start_block = devnet.chain.block_number()

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(encode_jsonl(prompt_lines(["ok"], model=MODEL, max_tokens=4))
                    + b'{"custom_id": "r1", "method": "POST"}\n')
    with pytest.raises(RequestError, match=r"bad\.jsonl: line 2: url: missing"):
        c.submit(bad)

    with pytest.raises(UnknownModel, match="no registered miner serves model 'gpt-4'; "
                       "known: ") as unknown:
        c.submit(["hi"], model="gpt-4", max_tokens=4)
    assert f"tiny-test (0x{market.named_model.hex()}): 1 miner(s)" in str(unknown.value)
    assert f"{MODEL}: 2 miner(s), from {devnet.PRICE} wei/token" in str(unknown.value)
    with pytest.raises(UnknownModel, match="no registered miner serves model '0x2222"):
        c.submit(["hi"], model="0x" + "22" * 32, max_tokens=4)

    with pytest.raises(PaymentTooLow, match=rf"payment too low: {devnet.PRICE - 1} wei/token "
                       rf".*lowest ask: {devnet.PRICE} wei/token"):
        c.submit(["hi"], model=MODEL, max_tokens=4, price=devnet.PRICE - 1)

    with pytest.raises(RequestTooLarge, match=rf"line 2: request is \d+ bytes, over the "
                       rf"market's limit of {MAX_REQUEST_BYTES} bytes") as info:
        c.submit(["short", "x" * MAX_REQUEST_BYTES], model=MODEL, max_tokens=4)
    assert info.value.size > info.value.limit == MAX_REQUEST_BYTES

    with pytest.raises(DeadlineExpired, match="already passed"):
        c.submit(["hi"], model=MODEL, max_tokens=4, deadline=-5)
    past = datetime.fromtimestamp(devnet.chain.timestamp() - 60, tz=UTC)
    with pytest.raises(DeadlineExpired, match=r"already passed: the chain's time is"):
        c.submit(["hi"], model=MODEL, max_tokens=4, deadline=past)

    mixed = [*prompt_lines(["a"], model=MODEL, max_tokens=4),
             *prompt_lines(["b"], model="other", max_tokens=4)]
    mixed[1]["custom_id"] = "b"
    with pytest.raises(BatchError, match="line 2: body.model 'other' differs"):
        c.submit(mixed)
    with pytest.raises(BatchError, match="line 1: body.model is 'other', but the task is for"):
        c.submit([mixed[1]], model=MODEL)

    poor = devnet.client2
    devnet.chain.set_balance(poor.address, 10**6)
    with pytest.raises(InsufficientFunds, match=rf"payment is {4 * devnet.PRICE} wei .* holds "
                       r"1000000 wei"):
        connect(devnet, market, poor).submit(["hi"], model=MODEL, max_tokens=4)
    assert devnet.chain.balance(poor.address) == 10**6

    assert devnet.chain.balance(c.address) == balance  # not a wei, not even gas
    assert devnet.q.tasks.task_count() == tasks
    assert devnet.chain.block_number() == start_block  # no transaction was even mined


def test_client_refuses_a_chain_the_market_is_not_on(devnet: Any, market: Market) -> None:
    from market.chain.devnet import start_anvil

    for chain_id, message in ((devnet.chain.chain_id, "no PaymentEscrow code"),
                              (4242, "has id 4242, but the deployment settles on chain "
                                     ".* the market at")):
        other = start_anvil(silent=True, die_with_parent=True, chain_id=chain_id)
        try:
            with pytest.raises(ChainMismatch, match=message):
                Client(other.rpc_url, devnet.client.key, market.url)
        finally:
            other.stop()


# ---------------------------------------------------------------------------- disputes


def test_dispute_freezes_the_shard(devnet: Any, market: Market, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    c = connect(devnet, market)
    job = c.submit(["p0", "p1", "p2", "p3"], model=MODEL, max_tokens=4, shard_size=2)
    with pytest.raises(DisputeNotPossible, match="shard 0, which is OPEN"):
        job.dispute(1)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner)
    with pytest.raises(DisputeNotPossible, match="neither .* client nor its arbiter"):
        connect(devnet, market, devnet.client2).job(job.task_id).dispute(1)

    before = devnet.chain.balance(c.address)
    dispute_id = job.dispute(1)
    bond = devnet.q.arbitration.min_bond()
    assert devnet.chain.balance(c.address) < before - bond + 1  # the bond (and gas) left
    assert devnet.q.tasks.get_shard(job.task_id, 0).state == ShardState.DISPUTED
    [d] = job.disputes()
    assert (d.dispute_id, d.shard, d.index, d.status, d.bond) == \
        (dispute_id, 0, 1, DisputeStatus.OPEN, bond)
    assert d.miner == devnet.miner.address
    assert d.evidence_uri == devnet.q.tasks.get_shard(job.task_id, 0).result_uri

    devnet.chain.advance_time(devnet.q.tasks.params()["challenge_window"] + 1)
    with pytest.raises(revert_class("DisputeOpen")):  # frozen: no payout while disputed
        devnet.q.tasks.finalize_shard(devnet.anyone, job.task_id, 0)
    with pytest.raises(DisputeNotPossible, match="which is DISPUTED"):
        job.dispute(0)

    key = tmp_path / "key"
    key.write_text(devnet.client.key.hex())
    capsys.readouterr()
    assert client_main(["dispute", str(job.task_id), "--market-url", market.url,
                        "--key-file", str(key)]) == 0
    assert f"dispute {dispute_id}: request 1 (shard 0), OPEN, bond {bond} wei" in \
        capsys.readouterr().out


def test_dispute_wait_outcomes_in_cli_and_status(devnet: Any, market: Market, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    q = devnet.q
    key = tmp_path / "key"
    key.write_text(devnet.client.key.hex())
    flags = ["--market-url", market.url, "--key-file", str(key), "--no-progress"]
    c = connect(devnet, market)
    job = c.submit(["p0", "p1", "p2", "p3"], model=MODEL, max_tokens=4, shard_size=2)
    for k in range(2):
        serve_shard(devnet, market, job.task_id, k, devnet.miner)
    collateral = q.tasks.get_shard(job.task_id, 0).collateral
    budget = q.tasks.shard_budget(job.task_id, 0)
    bond = q.arbitration.min_bond()
    opened = q.arbitration.dispute_count()

    def committee() -> None:  # votes the miner at fault once the dispute is open
        while q.arbitration.dispute_count() == opened:
            time.sleep(0.02)
        sigs = quorum_signatures(Vote(opened + 1, True), devnet.verifier_keys[:3],
                                 devnet.chain.chain_id, q.arbitration.address)
        q.arbitration.resolve(devnet.anyone, opened + 1, True, sigs)

    thread = threading.Thread(target=committee, daemon=True)
    thread.start()
    capsys.readouterr()
    try:  # waits by default: the id at once, then the verdict in one line
        assert client_main(["dispute", str(job.task_id), "1", *flags]) == 0
    finally:
        thread.join(timeout=60)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"opened dispute {opened + 1} on request 1 (shard 0), bond "
                             f"{bond} wei")
    assert out[1] == (f"dispute {opened + 1}: miner at fault: bond of {bond} wei returned, "
                      f"shard budget of {budget} wei refunded, miner slashed {collateral} wei "
                      "(3 votes)")

    # --no-wait returns at once; an unresolved dispute is expired by the waiting client.
    assert client_main(["dispute", str(job.task_id), "3", "--no-wait", *flags]) == 0
    assert capsys.readouterr().out.startswith(f"opened dispute {opened + 2} on request 3")
    assert client_main(["dispute", str(job.task_id), *flags]) == 0
    listed = capsys.readouterr().out
    assert f"dispute {opened + 1}: request 1 (shard 0), MINER_AT_FAULT" in listed
    assert f"dispute {opened + 2}: request 3 (shard 1), OPEN, bond {bond} wei" in listed
    devnet.chain.advance_time(q.arbitration.params()["dispute_timeout"])
    info = job.wait_dispute(opened + 2, timeout=60, progress=False, poll_s=0.05)
    assert info.status == DisputeStatus.EXPIRED
    assert info.outcome() == (f"expired with no committee verdict: bond of {bond} wei "
                              "returned, the shard is paid as submitted")
    with pytest.raises(DisputeNotPossible, match=f"task {job.task_id} has no dispute 999"):
        job.wait_dispute(999)

    assert client_main(["status", str(job.task_id), *flags[:4]]) == 0
    summary = capsys.readouterr().out
    assert f"dispute {opened + 1} on request 1 (shard 0): miner at fault" in summary
    assert f"dispute {opened + 2} on request 3 (shard 1): expired" in summary
    status = job.status().to_json()
    assert [(d["disputeId"], d["status"], d["slashed"]) for d in status["disputes"]] == \
        [(opened + 1, "MINER_AT_FAULT", collateral), (opened + 2, "EXPIRED", 0)]


# ---------------------------------------------------------------------------- directed jobs


def test_directed_job_prefer_miner(devnet: Any, market: Market, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    q = devnet.q
    dearer = 2 * devnet.PRICE  # miner2 now asks more than the cheapest miner
    q.gpu.update(devnet.miner2, [devnet.MODEL_ID], GpuSpec("NVIDIA H100", 81920, 1),
                 "http://127.0.0.1:9101", dearer)
    c = connect(devnet, market)
    job = c.submit(["a", "b", "c"], model=MODEL, max_tokens=2,
                   prefer_miner=devnet.miner2.address)
    t = job.task()
    # One miner to do it: shards of ceil(3 / 2); its ask is the default price.
    assert (t.shard_size, t.price_per_token) == (2, dearer)
    with pytest.raises(PaymentTooLow, match=f"preferred miner {devnet.miner2.address}"):
        c.submit(["a"], model=MODEL, max_tokens=2, price=devnet.PRICE,
                 prefer_miner=devnet.miner2.address)
    with pytest.raises(MinerNotEligible, match=f"{devnet.outsider.address} may not claim "
                       f"tasks for model {MODEL}"):
        c.submit(["a"], model=MODEL, max_tokens=2, prefer_miner=devnet.outsider.address)

    key = tmp_path / "key"
    key.write_text(devnet.client.key.hex())
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(encode_jsonl(prompt_lines(["x"], model=MODEL, max_tokens=2)))
    capsys.readouterr()
    assert client_main(["submit", str(batch), "--miner", devnet.miner.address, "--market-url",
                        market.url, "--key-file", str(key)]) == 0
    out = capsys.readouterr().out
    assert f"{devnet.PRICE} wei/token" in out
    assert f"offered to miner {devnet.miner.address} only" in out


# ---------------------------------------------------------------------------- CLI


def test_cli_submit_status_results(devnet: Any, market: Market, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "client.key"
    key.write_text(devnet.client.key.hex())
    config = tmp_path / "client.toml"
    config.write_text(f'[client]\nmarket_url = "{market.url}"\nkey_file = "{key}"\n')
    batch = tmp_path / "batch.jsonl"
    lines = prompt_lines(["one", "two", "three"], model="tiny-test", max_tokens=3)
    lines[2]["custom_id"] = "my-own-id"
    batch.write_bytes(encode_jsonl(lines))

    capsys.readouterr()
    assert client_main(["submit", str(batch), "--config", str(config), "--shard-size", "2",
                        "--deadline", "600"]) == 0
    out = capsys.readouterr().out
    task_id = int(out.split()[1].rstrip(":"))
    cost = 3 * 3 * NAMED_PRICE_FACTOR * devnet.PRICE
    assert f"cost: {cost} wei (0.000000027 ETH)" in out

    for k in range(2):
        serve_shard(devnet, market, task_id, k, devnet.outsider)
    assert client_main(["status", str(task_id), "--json", "--config", str(config)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["resultsReady"] and status["counts"] == {"SUBMITTED": 2}

    result_file = tmp_path / "results.jsonl"
    assert client_main(["results", str(task_id), "--out", str(result_file),
                        "--config", str(config)]) == 0
    rows = [json.loads(x) for x in result_file.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["request-0", "request-1", "my-own-id"]
    for i, row in enumerate(rows):
        assert row["id"] == f"batch_req_{task_id}_{i}" and row["error"] is None
        body = row["response"]["body"]
        assert row["response"]["status_code"] == 200
        assert body["object"] == "text_completion" and body["model"] == "tiny-test"
        assert body["choices"][0]["text"] == f"answer {i} é"
        assert body["usage"]["completion_tokens"] == i % 3 + 1
        assert row["quarry"]["miner"] == devnet.outsider.address
        assert row["quarry"]["receipt"]["index"] == i

    assert client_main(["status", "99999", "--config", str(config)]) == 1
    assert "no task 99999" in capsys.readouterr().err


def test_cli_submit_wait_models_cancel_withdraw(devnet: Any, market: Market, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "client.key"
    key.write_text(devnet.client.key.hex())
    flags = ["--market-url", market.url, "--key-file", str(key)]
    assert client_main(["models", *flags]) == 0
    assert f"tiny-test (0x{market.named_model.hex()}): 1 miner(s) (0 alive)" in \
        capsys.readouterr().out

    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(encode_jsonl(prompt_lines(["a", "b"], model=MODEL, max_tokens=2)))
    before = devnet.q.tasks.task_count()

    def miner() -> None:  # answers as soon as the task exists: `submit --wait` sees it done
        while devnet.q.tasks.task_count() == before:
            time.sleep(0.02)
        serve_shard(devnet, market, before + 1, 0, devnet.miner)

    thread = threading.Thread(target=miner, daemon=True)
    thread.start()
    try:
        assert client_main(["submit", str(batch), "--wait", "--timeout", "60", "--shard-size",
                            "2", *flags]) == 0
    finally:
        thread.join(timeout=60)
    out = capsys.readouterr().out
    assert f"task {before + 1}: 2 requests in 1 shard(s)" in out
    assert "results ready" in out and "SUBMITTED by " + devnet.miner.address in out

    job = connect(devnet, market).submit(["c"], model=MODEL, max_tokens=2)
    assert client_main(["cancel", str(job.task_id), *flags]) == 0
    assert f"{job.payment} wei" in capsys.readouterr().out
    assert client_main(["withdraw", *flags]) == 0
    assert f"withdrew {job.payment} wei" in capsys.readouterr().out
    assert client_main(["cancel", str(job.task_id), *flags]) == 1
    assert "AlreadyCancelled" in capsys.readouterr().err
