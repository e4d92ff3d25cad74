"""The client SDK and CLI against a real Anvil and a real market app (uvicorn in a thread).

The test plays the miners itself (claim, `build_shard_result`, upload, `submitResult` with the
devnet's registered miner accounts) and the committee (Vote signatures of three of the four
equal-stake verifiers), so what is tested is the client: pre-flight checks that keep money in
place, verification that names the failing check and its remedy, disputes, availability
challenges and billing proofs (run as a user would, through the CLI's `main`), probation, and
the CLI's OpenAI Batch output.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from client import sdk
from client.batch import RequestTooLarge, encode_jsonl, prompt_lines
from client.cli import main as client_main
from client.sdk import (
    BatchError,
    ChainMismatch,
    Client,
    ClientError,
    DeadlineExpired,
    DisputeNotPossible,
    InsufficientFunds,
    JobFailed,
    JobTimeout,
    MinerNotEligible,
    PaymentTooLow,
    ResultCheckFailed,
    ResultsNotReady,
    ShardUnservable,
    UnknownModel,
)
from market.chain.client import anvil_account
from market.chain.contracts import ChallengeStatus, DisputeStatus, GpuSpec, ShardState
from market.chain.errors import revert_class
from market.jobs import post_batch
from market.marketapi import MarketAPI
from market.model.context import publish_tokenizer
from market.model.manifest import Manifest, sha256_file
from market.model.tokenizer import TOKENIZER_FILES, write_tokenizer
from market.protocol.canonical import json_hash
from market.protocol.eip712 import Vote, quorum_signatures
from market.protocol.errors import RequestError
from market.protocol.merkle import SumNode, receipt_leaf, receipts_tree
from market.protocol.precision import precision_mask
from market.protocol.requests import parse_jsonl
from market.protocol.results import Completion, ShardResult, build_shard_result
from market.store import ContentTooLarge, content_uri

pytestmark = pytest.mark.chain

MAX_REQUEST_BYTES = 2048
NAMED_PRICE_FACTOR = 3
MANIFEST = {"format": "quarry-manifest/1", "name": "tiny-test",
            "architecture": {"model_type": "test", "layers": 1}, "files": {}}


NEWCOMER = anvil_account(11)  # registered by the module's market, on probation
NEWCOMER_PRICE = 10**9 // 2  # cheaper than every established miner: must not set the price


CONTEXT = 64  # positions of the "tiny-ctx" model


@dataclasses.dataclass
class Market:
    url: str
    api: MarketAPI
    named_model: bytes  # a model with a manifest ("tiny-test"), served by `devnet.outsider`
    ctx_model: bytes  # "tiny-ctx": CONTEXT positions, its tokenizer in the store (outsider)
    ctx_dir: Path  # its tokenizer files


def ctx_manifest(model_dir: Path) -> Manifest:
    """A manifest with a context length and the embedded tokenizer's files (no weights:
    the client reads only these)."""
    write_tokenizer(model_dir)
    return Manifest("tiny-ctx", {"model_type": "llama", "max_position_embeddings": CONTEXT,
                                 "eos_token_id": 2},
                    {name: sha256_file(model_dir / name) for name in TOKENIZER_FILES})


@pytest.fixture(scope="module")
def market(devnet_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    """A market app on a free port, its board indexed once with the session's miners plus
    `outsider` (established, like them) serving a named model and `NEWCOMER` (on probation,
    as any new identity) serving conftest's two models; all chain changes are rolled back
    afterwards."""
    from market.chain.devnet import free_port
    from market.service.app import serve_in_thread
    from market.service.board import Board
    from market.service.settings import MarketSettings

    net = devnet_session
    snapshot = net.chain.snapshot()
    root = tmp_path_factory.mktemp("market")
    deployment = net.deployment.save(root / "deployment.json")
    named = json_hash(MANIFEST)
    ctx_dir = root / "tiny-ctx"
    ctx_dir.mkdir()
    ctx = ctx_manifest(ctx_dir)
    probation = net.q.gpu.probation_params()
    net.q.gpu.set_probation(net.deployer, 0, probation[1])
    net.q.gpu.register(net.outsider, [named, ctx.model_id], GpuSpec("NVIDIA L4", 24576, 1),
                       "http://127.0.0.1:9199", NAMED_PRICE_FACTOR * net.PRICE, net.MINER_STAKE)
    net.q.gpu.set_probation(net.deployer, *probation)
    net.q.gpu.register(NEWCOMER, [net.MODEL_ID, net.OTHER_MODEL_ID], GpuSpec("RTX 4090", 24564, 1),
                       "http://127.0.0.1:9198", NEWCOMER_PRICE, net.MINER_STAKE)
    settings = MarketSettings(deployment=deployment, store_dir=root / "store",
                              db_path=root / "board.sqlite", port=free_port(),
                              max_request_bytes=MAX_REQUEST_BYTES)
    Board(settings.db_path).index(net.q)  # the miners, as the worker's indexer would
    api = MarketAPI(settings.url)
    try:
        with serve_in_thread(settings):
            api.register_model(MANIFEST)
            api.register_model(ctx.to_dict())
            publish_tokenizer(api, ctx_dir, ctx)
            heartbeats(net, api)
            yield Market(settings.url, api, named, ctx.model_id, ctx_dir)
    finally:
        api.close()
        net.chain.revert_to(snapshot)


def heartbeats(devnet: Any, api: MarketAPI) -> None:
    """The fixture's miners beat (alive for the market's 30 s TTL): tests that count alive
    miners beat first, since the module's earlier tests may take longer than the TTL."""
    for miner in (devnet.miner, devnet.miner2, NEWCOMER):
        api.heartbeat(miner, {"models": ["0x" + devnet.MODEL_ID.hex()]})


def connect(devnet: Any, market: Market, account: Any = None) -> Client:
    return Client(None, (account or devnet.client).key, market.url)


MODEL = "0x" + "11" * 32  # conftest's MODEL_ID, served by devnet.miner and devnet.miner2


Tamper = Callable[[ShardResult, Any], ShardResult]
REMEDY_WHY = {"dispute": "the committee judges the output",
              "challenge": "the miner must show the receipt on-chain or be slashed",
              "prove-billing": "proves the over-billing on-chain at once"}


def serve_shard(devnet: Any, market: Market, task_id: int, shard: int, miner: Any,
                tamper: Tamper | None = None) -> ShardResult:
    """Do a miner's part for one shard: claim, answer, sign, upload, submit."""
    q = devnet.q
    q.tasks.claim_shard(miner, task_id, shard)
    task = q.tasks.get_task(task_id)
    start, end = q.tasks.shard_range(task_id, shard)
    requests = parse_jsonl(market.api.get(task.input_uri))[start:end]
    completions = [Completion(r.index, r.custom_id, r.request_hash, f"answer {r.index} é",
                              tuple(range(100, 100 + r.index % 3 + 1)), "stop", 2)
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
    node = it.proof[0]
    first = SumNode(bytes([node.hash[0] ^ 1]) + node.hash[1:], node.sum)
    return _items(doc, 1, proof=(first, *it.proof[1:]))


def lying_finish(doc: ShardResult, devnet: Any) -> ShardResult:
    """Request 1 (2 of its 4 tokens) claims it ran out of length: signed and proven like any
    other item, since finish_reason is not in the receipt, but not what an engine reports."""
    return _items(doc, 1, finish_reason="length")


def over_billed(index: int, tokens: int) -> Tamper:
    """A miner's document (and so its on-chain commitment) whose receipt for `index` bills
    `tokens` output tokens, whatever its output holds: signed and proven like any other."""

    def tamper(doc: ShardResult, devnet: Any) -> ShardResult:
        receipts = [dataclasses.replace(it.receipt, output_tokens=tokens)
                    if it.index == index else it.receipt for it in doc.items]
        tree = receipts_tree(receipts)
        items = tuple(dataclasses.replace(
            it, receipt=r, proof=tuple(tree.proof(j)),
            signature=r.sign(devnet.miner.key, devnet.chain.chain_id, devnet.q.tasks.address))
            for j, (it, r) in enumerate(zip(doc.items, receipts, strict=True)))
        return dataclasses.replace(doc, result_root=tree.root, tokens_used=tree.total,
                                   items=items)

    return tamper


def inner_lie(position: int, extra: int) -> Tamper:
    """Issue 29, gap 3: a miner's document (and commitment) whose tree records `extra` tokens
    too many for request `position` in its parent node: tokensUsed grows by `extra`, every
    other receipt still proves under the root, signatures and outputs untouched."""

    def tamper(doc: ShardResult, devnet: Any) -> ShardResult:
        from conftest import lying_result_tree

        leaves = [receipt_leaf(it.receipt) for it in doc.items]
        key = f"{position}:{position + 1}"
        root, total, proofs, _ = lying_result_tree(leaves, {key: leaves[position].sum + extra})
        items = tuple(dataclasses.replace(it, proof=tuple(p))
                      for it, p in zip(doc.items, proofs, strict=True))
        return dataclasses.replace(doc, result_root=root, tokens_used=total, items=items)

    return tamper


def vote(devnet: Any, dispute_id: int, at_fault: bool) -> None:
    """Three of the four equal-stake members vote: more than two thirds of the weight."""
    q = devnet.q
    sigs = quorum_signatures(Vote(dispute_id, at_fault), devnet.verifier_keys[:3],
                             devnet.chain.chain_id, q.arbitration.address)
    q.arbitration.cast_votes(devnet.anyone, dispute_id, at_fault, sigs)


WAIT_FLAGS = ("--no-progress", "--timeout", "120")  # a stuck wait fails, it does not hang


def key_flags(devnet: Any, market: Market, tmp_path: Path) -> list[str]:
    """The CLI's connection flags for `devnet.client`."""
    key = tmp_path / "client.key"
    key.write_text(devnet.client.key.hex())
    return ["--market-url", market.url, "--key-file", str(key)]


def when(condition: Callable[[], bool], action: Callable[[], Any]) -> Callable[[], None]:
    """Run `action` in a thread once `condition` holds (someone else acting on-chain while
    the CLI waits); returns the join, which stops the watch and re-raises what `action`
    raised."""
    done = threading.Event()
    failed: list[BaseException] = []

    def watch() -> None:
        while not done.is_set():
            if condition():
                try:
                    action()
                except BaseException as exc:  # re-raised by join, in the test's thread
                    failed.append(exc)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def join() -> None:
        done.set()
        thread.join(timeout=60)
        if failed:
            raise failed[0]

    return join


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


def test_wait_follows_the_task_events_not_every_pending_shard(
        devnet: Any, market: Market, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job.wait read every pending shard on every poll (client CPU 2 s -> 22 s between 5,000
    and 20,000 requests). Now each shard is read once, then followed through the task's
    events: however many polls run while the shards are served, the reads stay the same."""
    c = connect(devnet, market)
    job = c.submit([f"p{i}" for i in range(6)], model=MODEL, max_tokens=4, shard_size=1)
    reads: list[int] = []  # shards read per batch of reads
    read_task = c.q.tasks.read_task
    monkeypatch.setattr(c.q.tasks, "read_task", lambda task_id, n, also=():
                        reads.append(n) or read_task(task_id, n, also))
    monkeypatch.setattr(c.q.tasks, "get_shard", lambda *a: pytest.fail("a shard read alone"))
    followed: list[int] = []  # one eth_getLogs of the task's events per new head
    changes = sdk.shard_changes
    monkeypatch.setattr(sdk, "shard_changes", lambda q, task_id, first, last:
                        followed.append(last) or changes(q, task_id, first, last))

    def serve_slowly() -> None:
        for k in range(6):
            serve_shard(devnet, market, job.task_id, k, devnet.miner)
            time.sleep(0.05)

    join = when(lambda: len(reads) == 1, serve_slowly)  # once wait() read the shards
    try:
        # Without prefetch: checking landed shards reads them again (the next test).
        status = job.wait(progress=False, timeout=120, poll_s=0.01, prefetch=False)
    finally:
        join()
    assert status.counts == {"SUBMITTED": 6}
    assert len(followed) > 2  # it followed new heads while shards were still pending...
    assert reads == [6, 6]  # ...but read each once, in one batch, and again for the status


def test_wait_checks_landed_shards_while_the_others_are_served(
        devnet: Any, market: Market, monkeypatch: pytest.MonkeyPatch) -> None:
    """While shards are pending, `wait` fetches and checks each shard that lands, so
    `results()` fetches no document a second time: each shard is served only once the
    previous one's document was fetched (the test fails by timeout if `wait` never does),
    and results() then fetches only the last one."""
    c = connect(devnet, market)
    job = c.submit([f"p{i}" for i in range(3)], model=MODEL, max_tokens=4, shard_size=1)
    fetched: list[str] = []
    get = c.market.get
    monkeypatch.setattr(c.market, "get", lambda uri: fetched.append(uri) or get(uri))
    uris: list[str] = []

    def serve_after_each_fetch() -> None:
        for k in range(3):
            serve_shard(devnet, market, job.task_id, k, devnet.miner)
            uris.append(devnet.q.tasks.get_shard(job.task_id, k).result_uri)
            deadline = time.monotonic() + 60
            while k < 2 and uris[-1] not in fetched:
                assert time.monotonic() < deadline, f"wait never fetched shard {k}"
                time.sleep(0.01)

    join = when(lambda: True, serve_after_each_fetch)
    try:
        status = job.wait(progress=False, timeout=120, poll_s=0.01)
    finally:
        join()
    assert status.counts == {"SUBMITTED": 3}
    assert [u for u in fetched if u in uris] == uris[:2]  # the last is left to results()
    outputs = job.results()
    assert [o.text for o in outputs] == [f"answer {i} é" for i in range(3)]
    assert [u for u in fetched if u in uris] == uris  # each document fetched once


def test_name_resolution_and_prompt_defaults(devnet: Any, market: Market) -> None:
    c = connect(devnet, market)
    offer = c.resolve_model("tiny-test")
    assert offer.model_id == market.named_model
    assert [m.address for m in offer.miners] == [devnet.outsider.address]
    assert offer.min_price == NAMED_PRICE_FACTOR * devnet.PRICE
    before = devnet.chain.timestamp()
    job = c.submit(["a", "b", "c"], model="tiny-test", deadline=120)
    t = job.task()
    # No heartbeat from `outsider`: counted as one miner, so shards of ceil(3 / 2) = 2.
    assert (t.shard_size, t.price_per_token) == (2, NAMED_PRICE_FACTOR * devnet.PRICE)
    # 120 s from the chain time the SDK read, which lies between these two:
    assert before + 120 <= t.deadline <= t.created_at + 120
    assert job.inputs().requests[0].request["body"]["model"] == "tiny-test"
    assert job.cancel() == job.payment
    with pytest.raises(JobFailed, match="refunded .*cancelled"):
        job.wait(progress=False, timeout=10)


# ---------------------------------------------------------------------------- tampering


@pytest.mark.parametrize(("tamper", "check", "remedy"), [
    (signed_by_another, "signature", "dispute"),
    (altered_text, "output hash", "dispute"),
    (bad_proof, "merkle proof", "challenge"),  # an unproven receipt cannot be disputed
    (over_billed(1, 4), "token count", "prove-billing"),
    (lying_finish, "finish reason", "dispute"),
])
def test_tampered_results_are_rejected_naming_the_check_and_remedy(
        devnet: Any, market: Market, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        tamper: Tamper, check: str, remedy: str) -> None:
    c = connect(devnet, market)
    job = c.submit(["x", "y", "z"], model=MODEL, max_tokens=4, shard_size=3)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner, tamper)
    window_end = devnet.q.tasks.get_shard(job.task_id, 0).window_end
    with pytest.raises(ResultCheckFailed) as info:
        job.results()
    assert info.value.check == check and info.value.index == 1
    assert str(info.value).startswith(f"{check} check failed: request 1: ")
    assert str(info.value).endswith(f"; remedy: `client {remedy} {job.task_id} 1` "
                                    f"({REMEDY_WHY[remedy]}) before chain time {window_end}")

    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    code = client_main(["results", str(job.task_id), "--out", str(out),
                        *key_flags(devnet, market, tmp_path)])
    assert code == 1 and not out.exists()  # never writes unverified output
    assert capsys.readouterr().err == f"client: error: {info.value}\n"  # one line


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
    heartbeats(devnet, market.api)
    c = connect(devnet, market)
    balance = devnet.chain.balance(c.address)
    tasks = devnet.q.tasks.task_count()
    start_block = devnet.chain.block_number()

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(encode_jsonl(prompt_lines(["ok"], model=MODEL, max_tokens=4))
                    + b'{"custom_id": "r1", "method": "POST"}\n')
    with pytest.raises(RequestError, match=r"bad\.jsonl: line 2: url: missing"):
        c.submit(bad)

    with pytest.raises(UnknownModel, match=r"no registered miner serves model 'gpt-4' \(start "
                       r"one: `miner register`, `miner run`\); "
                       "known: ") as unknown:
        c.submit(["hi"], model="gpt-4", max_tokens=4)
    assert f"tiny-test (0x{market.named_model.hex()}): 1 miner(s)" in str(unknown.value)
    assert f"{MODEL}: 2 miner(s) (2 alive), from {devnet.PRICE} wei/token; 1 on probation " \
        f"(1 alive), from {NEWCOMER_PRICE} wei/token" in str(unknown.value)
    with pytest.raises(UnknownModel, match="no registered miner serves model '0x3333"):
        c.submit(["hi"], model="0x" + "33" * 32, max_tokens=4)

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


def test_submit_refuses_a_file_over_the_store_limit_without_reading_it(
        devnet: Any, market: Market, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 5: a 113 MiB file was read and parsed whole (28 s, 955 MiB) before the store's
    limit refused it. Now its size alone refuses it: nothing is parsed, nothing held."""
    limit = market.api.limits()["maxFileBytes"]
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write(encode_jsonl(prompt_lines(["hi"], model=MODEL, max_tokens=4)))
        f.truncate(limit + 1)  # sparse: one byte over, the rest a hole never written

    def parsed(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the over-limit batch file was parsed")

    monkeypatch.setattr("client.batch.parse_batch", parsed)
    tasks = devnet.q.tasks.task_count()
    c = connect(devnet, market)
    tracemalloc.start()
    try:
        with pytest.raises(ContentTooLarge, match=rf"batch file .*big\.jsonl is {limit + 1} "
                           rf"bytes, over the store's limit of {limit} bytes"):
            c.submit(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit // 16  # the file was never read into memory

    capsys.readouterr()
    assert client_main(["submit", str(big), *key_flags(devnet, market, tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("client: error: batch file ") and err.count("\n") == 1
    assert f"over the store's limit of {limit} bytes" in err
    assert devnet.q.tasks.task_count() == tasks


def test_requests_over_the_model_context_are_refused_before_paying(
        devnet: Any, market: Market) -> None:
    """A 60 KB prompt for a 1,024-position model was accepted, paid into escrow and skipped
    by every miner. The manifest gives the context, the store its tokenizer."""
    c = connect(devnet, market)
    balance, tasks = devnet.chain.balance(c.address), devnet.q.tasks.task_count()
    long_prompt = "the market " * 40
    with pytest.raises(RequestError, match=r"^line 2: \d+ prompt tokens \+ max_tokens 8 = "
                       rf"\d+ is over the {CONTEXT}-position context of model tiny-ctx") as info:
        c.submit(["short", long_prompt], model="tiny-ctx", max_tokens=8)
    assert info.value.line == 2
    with pytest.raises(RequestError, match=rf"line 1: \d+ prompt tokens \+ max_tokens {CONTEXT} "
                       "= "):
        c.submit(["hi"], model="tiny-ctx", max_tokens=CONTEXT)
    chat = [{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "tiny-ctx", "max_tokens": 8,
                      "messages": [{"role": "user", "content": long_prompt}]}}]
    with pytest.raises(RequestError, match="line 1: .* over the 64-position context"):
        c.submit(chat)
    assert devnet.chain.balance(c.address) == balance  # not a wei, not even gas
    assert devnet.q.tasks.task_count() == tasks

    job = c.submit(["a short prompt"], model="tiny-ctx", max_tokens=8)  # fits: posted
    assert job.cancel() == job.payment


def test_a_shard_a_miner_reports_unservable_fails_the_wait_at_once(
        devnet: Any, market: Market) -> None:
    """A shard nobody can serve (posted around the SDK's check) is skipped by every miner;
    the client learns it from the miners' heartbeats instead of waiting for the deadline."""
    c = connect(devnet, market)
    data = encode_jsonl(prompt_lines(["short", "the market " * 40], model="tiny-ctx",
                                     max_tokens=8))
    task_id, _ = post_batch(
        devnet.q, devnet.client, market.api, data, [r.request_hash for r in parse_jsonl(data)],
        model_id=market.ctx_model, shard_size=1, max_tokens=8,
        price=NAMED_PRICE_FACTOR * devnet.PRICE, deadline=devnet.chain.timestamp() + 3600)
    job = c.job(task_id)
    with pytest.raises(JobTimeout):  # nothing reported yet: an ordinary wait
        job.wait(progress=False, timeout=0.3, poll_s=0.05, unservable_s=0.05)
    reason = "request 1: 121 prompt tokens + 8 max_tokens > 64 positions"
    market.api.heartbeat(devnet.miner, {
        "models": [MODEL],
        "unservable": [{"taskId": task_id + 1000, "shardId": 1, "reason": "another task"},
                       {"taskId": task_id, "shardId": 1, "reason": reason}]})
    try:
        expected = (rf"task {task_id}: shard 1 cannot be served: miner "
                    rf"{devnet.miner.address} reports {re.escape(repr(reason))}")
        with pytest.raises(ShardUnservable, match=expected) as info:
            job.wait(progress=False, timeout=60, poll_s=0.05)
        assert (info.value.shard, info.value.reason) == (1, reason)
        assert isinstance(info.value, JobFailed)
    finally:
        heartbeats(devnet, market.api)
        job.cancel()


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


def test_dispute_without_a_committee_says_to_start_verifiers(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every member has left: a dispute could not be judged, so it is refused before any
    transaction, in one line that says what to start (not the contract's bare NoCommittee)."""
    from conftest import until_seated

    q = devnet.q
    for v in devnet.verifiers:
        q.committee.request_exit(v)
    epoch = until_seated(q)
    assert q.committee.total_weight_at(epoch) == 0
    c = connect(devnet, market)
    job = c.submit(["p0", "p1"], model=MODEL, max_tokens=4, shard_size=2)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner)
    start = devnet.chain.block_number()
    with pytest.raises(DisputeNotPossible, match=f"no verifier committee sits in epoch {epoch}"
                       r".*start verifiers \(`verifier register`, then `verifier run`"):
        job.dispute(1)
    key = tmp_path / "key"
    key.write_text(devnet.client.key.hex())
    capsys.readouterr()
    assert client_main(["dispute", str(job.task_id), "1", "--market-url", market.url,
                        "--key-file", str(key)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`verifier run`" in err
    assert devnet.chain.block_number() == start  # nothing sent


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

    # The committee votes the miner at fault once the dispute is open.
    join = when(lambda: q.arbitration.dispute_count() > opened,
                lambda: vote(devnet, opened + 1, True))
    capsys.readouterr()
    try:  # waits by default: the id at once, then the verdict in one line
        assert client_main(["dispute", str(job.task_id), "1", *flags]) == 0
    finally:
        join()
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
    assert info.status == DisputeStatus.EXPIRED  # and every member that cast no vote reported
    assert info.outcome() == (f"expired with no committee verdict: bond of {bond} wei "
                              "returned, the shard is paid as submitted; 4 member(s) that "
                              "cast no vote lost their seats")
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
    with pytest.raises(MinerNotEligible, match=f"{devnet.outsider.address} does not serve "
                       f"model {MODEL} .*: it may not claim this task"):
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


def test_submit_accepts_only_the_precisions_asked_for(devnet: Any, market: Market,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`precisions` restricts a task to miners that declared one of them, whose asks alone
    set its price; asking for a precision nobody serves, an unknown one, or commitments no
    miner's engine makes is refused in one line before any money moves; the mask and
    `require_commitments` go on-chain; `client models` shows each miner's declaration."""
    q = devnet.q
    dearer = 2 * devnet.PRICE
    q.gpu.update(devnet.miner2, [devnet.MODEL_ID], GpuSpec("NVIDIA H100", 81920, 1),
                 "http://127.0.0.1:9101", dearer, ["bf16"])
    heartbeats(devnet, market.api)
    c = connect(devnet, market)
    [offer] = [o for o in c.offers() if o.model_id == devnet.MODEL_ID]
    assert {(m.address, m.precision.label if m.precision else None) for m in offer.miners} == {
        (devnet.miner.address, "fp32"), (devnet.miner2.address, "bf16")}
    job = c.submit(["a", "b"], model=MODEL, max_tokens=2, precisions="bf16",
                   require_commitments=True)
    t = job.task()
    assert (t.precisions, t.require_commitments) == (precision_mask(["bf16"]), True)
    assert t.price_per_token == dearer  # the cheaper fp32 miner may not claim it
    either = c.submit(["a"], model=MODEL, max_tokens=2, precisions=["fp32", "BF16"]).task()
    assert (either.precisions, either.price_per_token) == (
        precision_mask(["fp32", "bf16"]), devnet.PRICE)

    count, balance = q.tasks.task_count(), devnet.chain.balance(devnet.client.address)
    with pytest.raises(UnknownModel, match=f"no miner serves model '{MODEL}' in fp8: its "
                       "miners declared bf16, fp32"):
        c.submit(["a"], model=MODEL, max_tokens=2, precisions=["fp8"])
    with pytest.raises(ClientError, match="precisions: unknown precision 'fp4'"):
        c.submit(["a"], model=MODEL, max_tokens=2, precisions="fp4,bf16")
    with pytest.raises(MinerNotEligible, match=f"serves model {MODEL} in bf16; the task "
                       "accepts fp32"):
        c.submit(["a"], model=MODEL, max_tokens=2, precisions="fp32",
                 prefer_miner=devnet.miner2.address)
    for miner in (devnet.miner, devnet.miner2, NEWCOMER):  # engines without commitments
        market.api.heartbeat(miner, {"models": [MODEL], "commitments": False})
    with pytest.raises(UnknownModel, match="makes activation commitments"):
        c.submit(["a"], model=MODEL, max_tokens=2, require_commitments=True)
    assert (q.tasks.task_count(), devnet.chain.balance(devnet.client.address)) == (count,
                                                                                   balance)
    heartbeats(devnet, market.api)

    flags = key_flags(devnet, market, tmp_path)
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(encode_jsonl(prompt_lines(["x"], model=MODEL, max_tokens=2)))
    capsys.readouterr()
    assert client_main(["submit", str(batch), "--precision", "bf16,fp32",
                        "--require-commitments", *flags]) == 0
    out = capsys.readouterr().out
    assert "only miners serving it in fp32, bf16 may claim it" in out
    assert "every output must carry an activation commitment" in out
    task_id = int(out.split()[1].rstrip(":"))
    assert q.tasks.get_task(task_id).require_commitments
    assert client_main(["submit", str(batch), "--precision", "fp4", *flags]) == 1
    err = capsys.readouterr().err
    assert "unknown precision 'fp4'" in err and len(err.strip().splitlines()) == 1
    assert client_main(["models", *flags]) == 0
    listed = capsys.readouterr().out
    assert f"  {devnet.miner2.address} {dearer} wei/token, bf16, alive" in listed
    assert f"  {devnet.miner.address} {devnet.PRICE} wei/token, fp32, alive" in listed


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
    count = devnet.q.tasks.task_count()
    assert client_main(["submit", str(batch), "--config", str(config), "--audit-rate",
                        "1000"]) == 1  # the base rate is not a raise: refused before posting
    assert "above the base 1000 bps" in capsys.readouterr().err
    assert devnet.q.tasks.task_count() == count
    assert client_main(["submit", str(batch), "--config", str(config), "--shard-size", "2",
                        "--deadline", "600", "--audit-rate", "5000"]) == 0
    out = capsys.readouterr().out
    task_id = int(out.split()[1].rstrip(":"))
    cost = 3 * 3 * NAMED_PRICE_FACTOR * devnet.PRICE
    assert f"cost: {cost} wei (0.000000027 ETH)" in out
    # The client bought 4000 bps above the base: a quarter of the budget per 100% per member.
    members = len(devnet.q.committee.members())
    fee = cost * 4000 * 2500 // 10**8 * members
    assert members > 0 and devnet.q.committee.audit_rate_of(task_id) == 5000
    assert f"audit rate 5000 bps: {fee} wei" in out

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

    # A miner answers as soon as the task exists: `submit --wait` sees it done.
    join = when(lambda: devnet.q.tasks.task_count() > before,
                lambda: serve_shard(devnet, market, before + 1, 0, devnet.miner))
    try:
        assert client_main(["submit", str(batch), "--wait", "--timeout", "60", "--shard-size",
                            "2", *flags]) == 0
    finally:
        join()
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


# ---------------------------------------------------------------------------- withheld results


def withhold(devnet: Any, market: Market, task_id: int) -> ShardResult:
    """A miner's commitment with nothing behind it: claim shard 0, commit to a result tree
    billing every request the task's maximum, and never upload the document."""
    q = devnet.q
    q.tasks.claim_shard(devnet.miner, task_id, 0)
    task = q.tasks.get_task(task_id)
    start, end = q.tasks.shard_range(task_id, 0)
    requests = parse_jsonl(market.api.get(task.input_uri))[start:end]
    most = tuple(range(task.max_tokens_per_request))
    doc = build_shard_result(
        task_id=task_id, shard=0, model_id=task.model_id,
        completions=[Completion(r.index, r.custom_id, r.request_hash, "", most, "length", 2)
                     for r in requests],
        private_key=devnet.miner.key, miner=devnet.miner.address,
        chain_id=devnet.chain.chain_id, task_registry=q.tasks.address)
    assert doc.tokens_used == (end - start) * task.max_tokens_per_request  # a full bill
    q.tasks.submit_result(devnet.miner, task_id, 0, doc.result_root,
                          content_uri(doc.to_bytes()), doc.tokens_used)
    return doc


def test_withheld_document_unanswered_challenge_refunds_everything(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The gap "a miner is paid in full for publishing nothing", closed from the client's
    side: `results` names the missing document and the remedy; `client challenge` gets the
    shard budget, the slash and the bond back, and the miner is paid nothing."""
    q, flags = devnet.q, [*key_flags(devnet, market, tmp_path), *WAIT_FLAGS]
    job = connect(devnet, market).submit(["p0", "p1", "p2", "p3"], model=MODEL, max_tokens=4,
                                         shard_size=4)
    withhold(devnet, market, job.task_id)
    shard = q.tasks.get_shard(job.task_id, 0)
    with pytest.raises(ResultCheckFailed) as info:
        job.results()
    assert (info.value.check, info.value.index) == ("document", None)
    assert str(info.value).startswith(f"document check failed: shard 0's result document is "
                                      f"missing (market {market.url} holds no "
                                      f"{shard.result_uri})")
    assert str(info.value).endswith(f"remedy: `client challenge {job.task_id} 0` (the miner "
                                    "must show the receipt on-chain or be slashed) before "
                                    f"chain time {shard.window_end}")

    budget = q.tasks.shard_budget(job.task_id, 0)
    slash = shard.collateral * q.arbitration.params()["fault_slash_bps"] // 10_000
    bond = q.arbitration.min_availability_bond()
    client_before = q.escrow.withdrawable(devnet.client.address)
    miner_before = q.escrow.withdrawable(devnet.miner.address)
    stake_before = q.gpu.miner_info(devnet.miner.address).stake
    challenge_id = q.arbitration.challenge_count() + 1
    # Nobody can answer: once the challenge is open, its response window just passes.
    join = when(lambda: q.arbitration.challenge_count() >= challenge_id,
                lambda: devnet.chain.advance_time(q.arbitration.response_window()))
    capsys.readouterr()
    try:
        assert client_main(["challenge", str(job.task_id), "2", *flags]) == 0
    finally:
        join()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"challenge {challenge_id}: request 2 (shard 0), bond {bond} wei; "
                             "the miner must show its receipt on-chain by chain time ")
    assert out[1:] == [f"challenge {challenge_id}: unanswered: miner at fault, shard budget "
                       f"refunded, miner slashed {slash} wei (burned), bond of {bond} wei "
                       "returned"]

    assert q.arbitration.get_challenge(challenge_id).status == ChallengeStatus.UNANSWERED
    assert q.tasks.get_shard(job.task_id, 0).state == ShardState.REFUNDED
    assert budget == job.payment and slash > 0
    # made whole, nothing more: the slash is burned (issue 29, gap 6)
    assert q.escrow.withdrawable(devnet.client.address) == client_before + budget + bond
    assert q.escrow.withdrawable(devnet.miner.address) == miner_before  # paid nothing
    assert q.gpu.miner_info(devnet.miner.address).stake == stake_before - slash
    assert q.escrow.escrowed(job.task_id) == 0
    assert not q.tasks.events("ShardFinalized", devnet.deployment.deploy_block,
                              taskId=job.task_id)
    status = job.status()
    assert (status.paid, status.refunded) == (0, budget)
    [c] = status.challenges
    assert f"availability challenge {challenge_id} on request 2 (shard 0): {c.outcome()}" in \
        status.summary()
    assert status.to_json()["challenges"][0]["status"] == "UNANSWERED"


def test_challenge_left_open_is_resumed(devnet: Any, market: Market, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--no-wait` leaves the challenge open; running the command again waits on it (here
    past its deadline: it is settled at once) instead of opening another."""
    q, flags = devnet.q, [*key_flags(devnet, market, tmp_path), *WAIT_FLAGS]
    job = connect(devnet, market).submit(["p0", "p1"], model=MODEL, max_tokens=4, shard_size=2)
    withhold(devnet, market, job.task_id)
    capsys.readouterr()
    assert client_main(["challenge", str(job.task_id), "1", "--no-wait", *flags]) == 0
    [opened] = job.challenges()
    assert opened.status == ChallengeStatus.OPEN and opened.index == 1
    assert capsys.readouterr().out.startswith(f"challenge {opened.challenge_id}: request 1 ")

    devnet.chain.advance_time(q.arbitration.response_window())
    assert client_main(["challenge", str(job.task_id), "1", *flags]) == 0
    [settled] = job.challenges()
    assert settled.challenge_id == opened.challenge_id
    assert settled.status == ChallengeStatus.UNANSWERED
    assert capsys.readouterr().out.splitlines() == [
        f"challenge {opened.challenge_id} on request 1 is still open (the miner must answer "
        f"by chain time {opened.deadline}): waiting on it",
        f"challenge {opened.challenge_id}: {settled.outcome()}"]


def test_answered_challenge_with_the_document_still_missing_is_disputed(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The miner shows the challenged receipt on-chain but still publishes no output: the
    client disputes the shown receipt and the committee finds the output withheld."""
    q, flags = devnet.q, [*key_flags(devnet, market, tmp_path), *WAIT_FLAGS]
    job = connect(devnet, market).submit(["p0", "p1", "p2", "p3"], model=MODEL, max_tokens=4,
                                         shard_size=4)
    doc = withhold(devnet, market, job.task_id)
    shown = doc.items[2]

    def answer(challenge_id: int) -> Callable[[], None]:  # the miner answers, nothing more
        return when(lambda: q.arbitration.challenge_count() >= challenge_id,
                    lambda: q.arbitration.answer_availability(
                        devnet.miner, challenge_id, shown.receipt, shown.proof))

    # --no-dispute: answered, the document still missing: no data, no money, one line.
    first = q.arbitration.challenge_count() + 1
    join = answer(first)
    capsys.readouterr()
    try:
        assert client_main(["challenge", str(job.task_id), "2", "--no-dispute", *flags]) == 1
    finally:
        join()
    captured = capsys.readouterr()
    answered = job.challenge_info(first)
    assert answered.status == ChallengeStatus.ANSWERED and answered.receipt == shown.receipt
    assert captured.out.splitlines()[1] == f"challenge {first}: {answered.outcome()}"
    assert captured.err == (
        "client: error: the miner showed request 2's receipt, but its result still fails the "
        f"document check; `client dispute {job.task_id} 2` disputes the shown receipt until "
        f"chain time {answered.window_end}\n")

    # Again, disputing: the committee votes the miner at fault once the dispute is open.
    second, dispute_id = first + 1, q.arbitration.dispute_count() + 1
    budget = q.tasks.shard_budget(job.task_id, 0)
    collateral = q.tasks.get_shard(job.task_id, 0).collateral
    client_before = q.escrow.withdrawable(devnet.client.address)
    join_answer = answer(second)
    join_votes = when(lambda: q.arbitration.dispute_count() >= dispute_id,
                      lambda: vote(devnet, dispute_id, True))
    try:
        assert client_main(["challenge", str(job.task_id), "2", *flags]) == 0
    finally:
        join_answer()
        join_votes()
    out = capsys.readouterr().out.splitlines()
    d = job.disputes()[-1]
    assert d.dispute_id == dispute_id
    assert out[1:] == [
        f"challenge {second}: {job.challenge_info(second).outcome()}",
        f"opened dispute {dispute_id} on the shown receipt: its result still fails the "
        "document check",
        f"dispute {dispute_id}: {d.outcome()}"]
    assert (d.status, d.index, d.slashed, d.refunded) == \
        (DisputeStatus.MINER_AT_FAULT, 2, collateral, budget)
    params = q.arbitration.params()
    slash = collateral * params["fault_slash_bps"] // 10_000
    reward = slash * params["verifier_reward_bps"] // 10_000
    to_client = slash - 3 * (reward // 3)  # three equal stakes: the dust goes to the client
    dispute_bond = q.arbitration.min_bond()
    assert q.escrow.withdrawable(devnet.client.address) == \
        client_before + budget + to_client + dispute_bond
    challenge_bond = q.arbitration.min_availability_bond()
    assert q.escrow.withdrawable(devnet.miner.address) == 2 * challenge_bond  # its answers


# ---------------------------------------------------------------------------- billing


def test_over_billing_receipt_proven_with_the_cli(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    flags = key_flags(devnet, market, tmp_path)
    job = connect(devnet, market).submit(["x", "y", "z"], model=MODEL, max_tokens=4,
                                         shard_size=3)
    serve_shard(devnet, market, job.task_id, 0, devnet.miner, over_billed(1, 4))
    with pytest.raises(ResultCheckFailed, match="token count check failed: request 1: receipt "
                       "bills 4 tokens, output has 2; remedy: `client prove-billing"):
        job.results()

    capsys.readouterr()  # an honest receipt: nothing to prove, nothing moves
    assert client_main(["prove-billing", str(job.task_id), "0", *flags]) == 1
    assert capsys.readouterr().err == ("client: error: request 0's receipt bills 1 tokens, "
                                       "its output holds 1: no over-billing to prove\n")

    prove_billing_with_the_cli(devnet, job.task_id, "1", flags, capsys)


def prove_billing_with_the_cli(devnet: Any, task_id: int, request: str, flags: list[str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    """`client prove-billing` from `request` proves the lie on request 1 of shard 0: the
    shard budget and the slash go to the client, nothing to the miner."""
    q = devnet.q
    budget = q.tasks.shard_budget(task_id, 0)
    slash = q.tasks.get_shard(task_id, 0).collateral \
        * q.arbitration.params()["fault_slash_bps"] // 10_000
    client_before = q.escrow.withdrawable(devnet.client.address)
    capsys.readouterr()
    assert client_main(["prove-billing", str(task_id), request, *flags]) == 0
    assert capsys.readouterr().out == (
        f"billing fault proven on request 1 (shard 0): shard budget of {budget} wei refunded, "
        f"miner slashed {slash} wei, both to your escrow balance (`client withdraw`)\n")
    assert q.tasks.get_shard(task_id, 0).state == ShardState.REFUNDED
    assert q.escrow.withdrawable(devnet.client.address) == client_before + budget + slash
    assert q.escrow.withdrawable(devnet.miner.address) == 0 and q.escrow.escrowed(task_id) == 0


def test_inner_node_billing_lie_proven_with_the_cli(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The lie sits in request 1's parent; `client prove-billing` for request 2 (whose
    receipt proves) finds the lying path from the document's receipts and proofs and
    proves it on-chain: the whole shard budget and the slash go to the client."""
    q, flags = devnet.q, key_flags(devnet, market, tmp_path)
    job = connect(devnet, market).submit(["x", "y", "z"], model=MODEL, max_tokens=4,
                                         shard_size=3)
    doc = serve_shard(devnet, market, job.task_id, 0, devnet.miner, inner_lie(1, 4))
    billed = sum(it.receipt.output_tokens for it in doc.items)
    shard = q.tasks.get_shard(job.task_id, 0)
    assert shard.tokens_used == billed + 4
    for it in doc.items:
        assert q.arbitration.proves(job.task_id, 0, it.receipt, it.proof) == (it.index != 1)
    with pytest.raises(ResultCheckFailed, match="merkle proof check failed: request 1: .*; "
                       f"remedy: `client prove-billing {job.task_id} 1` "):
        job.results()
    prove_billing_with_the_cli(devnet, job.task_id, "2", flags, capsys)


# ---------------------------------------------------------------------------- probation


def test_miners_on_probation_only_serve_clients_that_allow_them(
        devnet: Any, market: Market, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    q, flags = devnet.q, key_flags(devnet, market, tmp_path)
    heartbeats(devnet, market.api)
    c = connect(devnet, market)
    assert q.gpu.on_probation(NEWCOMER.address)
    [offer] = [o for o in c.offers() if o.model_id == devnet.MODEL_ID]
    assert {m.address for m in offer.miners} == {devnet.miner.address, devnet.miner2.address}
    assert offer.min_price == devnet.PRICE  # the newcomer's lower ask does not count
    assert devnet.OTHER_MODEL_ID not in {o.model_id for o in c.offers()}
    [opted] = [o for o in c.offers(allow_probation=True) if o.model_id == devnet.MODEL_ID]
    assert [(m.address, m.on_probation) for m in opted.on_probation] == \
        [(NEWCOMER.address, True)]
    assert opted.min_price == NEWCOMER_PRICE and len(opted.established) == 2

    capsys.readouterr()
    assert client_main(["models", *flags]) == 0
    listed = capsys.readouterr().out
    assert f"{MODEL}: 2 miner(s) (2 alive), from {devnet.PRICE} wei/token; 1 on probation " \
        f"(1 alive), from {NEWCOMER_PRICE} wei/token (only with allow_probation=True / " \
        "`client submit --allow-probation`)" in listed
    other = "0x" + devnet.OTHER_MODEL_ID.hex()
    assert f"{other}: 0 miner(s); 1 on probation (1 alive), from {NEWCOMER_PRICE}" in listed

    # Refusals name the option, and move nothing.
    start_block = devnet.chain.block_number()
    with pytest.raises(UnknownModel, match=f"only miners on probation serve model '{other}' "
                       rf"\(1 miner\(s\) \(1 alive\), from {NEWCOMER_PRICE} wei/token\): .* "
                       r"pass allow_probation=True / `client submit --allow-probation`"):
        c.submit(["a"], model=other, max_tokens=2, allow_probation=False)
    with pytest.raises(MinerNotEligible, match=f"miner {NEWCOMER.address} is on probation .*"
                       r"\(allow_probation=True / `client submit --allow-probation`\)"):
        c.submit(["a"], model=MODEL, max_tokens=2, prefer_miner=NEWCOMER.address)
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(encode_jsonl(prompt_lines(["a", "b"], model=other, max_tokens=2)))
    assert client_main(["submit", str(batch), "--no-probation", *flags]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-probation" in err
    assert devnet.chain.block_number() == start_block

    # By default a model that only miners on probation serve (a new market's first miners)
    # is open to them: the task allows probation, at their ask.
    first = c.submit(["a"], model=other, max_tokens=2)
    assert first.task().allow_probation and first.task().price_per_token == NEWCOMER_PRICE
    assert client_main(["submit", str(batch), *flags]) == 0
    out = capsys.readouterr().out
    assert "may claim it: no established miner serves the model yet" in out

    # An ordinary task is out of its reach; a client that allows probation reaches it.
    ordinary = c.submit(["a"], model=MODEL, max_tokens=2)
    assert not ordinary.task().allow_probation
    with pytest.raises(revert_class("NotEligible")):
        q.tasks.claim_shard(NEWCOMER, ordinary.task_id, 0)
    job = c.submit(["a", "b"], model=MODEL, max_tokens=2, shard_size=2, allow_probation=True,
                   prefer_miner=NEWCOMER.address)
    t = job.task()
    assert t.allow_probation and t.price_per_token == NEWCOMER_PRICE
    serve_shard(devnet, market, job.task_id, 0, NEWCOMER)
    assert [o.miner for o in job.results()] == [NEWCOMER.address] * 2

    assert client_main(["submit", str(batch), "--allow-probation", *flags]) == 0
    out = capsys.readouterr().out
    assert f"{NEWCOMER_PRICE} wei/token" in out
    assert "miners on probation (new, not yet vetted by the committee) may claim it" in out
    assert q.tasks.get_task(q.tasks.task_count()).allow_probation
