"""`client gateway` end to end: the unmodified `openai` SDK against the gateway process, on a
private stack (redis-server, Anvil with the contracts, `market serve` and its Celery worker)
with real `miner run` processes serving the tiny model.

One stack, two registered miners and one gateway are shared by the module: miner "a" runs
throughout, miner "b" only where a test starts it, so a batch directed at "b" (metadata
`quarry_miner`) waits until its window passes (expiry). The expiry test moves the chain's
clock a day on, so it runs last.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from conftest import write_miner_config

from client.batch import encode_jsonl, output_line
from market.chain.client import anvil_account
from market.chain.contracts import ShardState
from market.chain.devnet import DEVNET_BLOCK_TIME, free_port
from market.local.processes import ManagedProcess, spawn
from market.local.stack import LocalStack
from market.protocol.precision import precision_mask

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BIN = Path(sys.executable).parent
PRICE = 10**9
TOKEN = "gateway-test-token"
CLIENT = anvil_account(1)
MINERS = {name: anvil_account(i) for name, i in (("a", 3), ("b", 4))}
MODEL = "quarry-tiny"
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"


class Gateway:
    """The `client gateway` process (restartable on the same QUARRY_HOME) and its SDK."""

    def __init__(self, stack: LocalStack, name: str = "gateway",
                 settings: dict[str, str] | None = None) -> None:
        self.stack, self.name, self.settings = stack, name, settings or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.home = stack.home / f"{name}-home"
        self.proc: ManagedProcess | None = None
        self.sdk = openai.OpenAI(base_url=self.url, api_key=TOKEN, max_retries=0)

    def start(self) -> None:
        env = {**os.environ, "QUARRY_HOME": str(self.home),
               "QUARRY_CLIENT_KEY": "0x" + bytes(CLIENT.key).hex(),
               "QUARRY_CLIENT_MARKET_URL": self.stack.market_url,
               "QUARRY_CLIENT_GATEWAY_TOKEN": TOKEN, **self.settings}
        self.proc = spawn([str(BIN / "client"), "gateway", "--port", str(self.port)],
                          name=f"client {self.name}", env=env,
                          log_path=self.stack.logs / f"{self.name}.log")
        self.proc.wait_port(self.port, timeout=60)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(home=tmp_path_factory.mktemp("gateway"), index_interval_s=0.3,
                    sweep_interval_s=0.5) as s:
        yield s


@pytest.fixture(scope="module")
def miners(stack: LocalStack) -> Iterator[dict[str, Path]]:
    """Two registered miners of a small tiny model (config files); "a" runs throughout."""
    from market.model.create import create_model

    model_dir = stack.home / "model"
    create_model(model_dir, layers=2, hidden=64)
    configs: dict[str, Path] = {}
    for name, account in MINERS.items():
        cfg = stack.home / f"miner-{name}.toml"
        write_miner_config(cfg, account.key, stack.market_url, model_dir, price=PRICE,
                           port=9100 + len(configs), max_batch=8)
        out = subprocess.run([str(BIN / "miner"), "register", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        configs[name] = cfg
    proc = RUNNING["a"] = start_miner(stack, configs["a"])
    try:
        yield configs
    finally:
        del RUNNING["a"]
        proc.stop()


RUNNING: dict[str, ManagedProcess] = {}  # the miner processes that run throughout ("a")


@contextlib.contextmanager
def only_b_serves() -> Iterator[None]:
    """Miner "a" is stopped (SIGSTOP) meanwhile, so a batch directed at "b" is "b"'s alone.
    The market keeps a directed task from other miners only once the client's offer has come,
    and the offer comes a moment after the task is created (it names the created task): in
    that moment, a miner woken at once by the new task's index (pushed heads) can claim it."""
    pid = RUNNING["a"].pid
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(pid, signal.SIGCONT)


def start_miner(stack: LocalStack, cfg: Path) -> ManagedProcess:
    return spawn([str(BIN / "miner"), "run", "--config", str(cfg), "--no-progress"],
                 name=f"miner {cfg.stem}", log_path=stack.logs / f"{cfg.stem}.log")


@pytest.fixture(scope="module")
def gateway(stack: LocalStack, miners: dict[str, Path]) -> Iterator[Gateway]:
    gw = Gateway(stack)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def sdk_client(stack: LocalStack) -> Iterator[Any]:
    """The Quarry SDK with the gateway's key, for reading back what the gateway did."""
    from client import Client

    with Client(stack.rpc_url, CLIENT.key, stack.market_url) as c:
        yield c


def chat_lines(n: int, tag: str, max_tokens: int = 24) -> bytes:
    """OpenAI Batch input as users write it: max_completion_tokens, n, user."""
    return b"".join(json.dumps({
        "custom_id": f"{tag}-{i}", "method": "POST", "url": CHAT,
        "body": {"model": MODEL, "messages": [
                     {"role": "developer", "content": "Answer briefly."},
                     {"role": "user", "content": [{"type": "text",
                                                   "text": f"{tag}: tell me about item {i}."}]}],
                 "max_completion_tokens": max_tokens, "n": 1, "user": "someone",
                 "temperature": 0}}).encode() + b"\n" for i in range(n))


def create(gw: Gateway, data: bytes, **metadata: str) -> Any:
    f = gw.sdk.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    # No Quarry metadata by default: an unmodified OpenAI script. The miners are new
    # identities, on probation, and with no established miner a task lets them claim it.
    return gw.sdk.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                                 metadata=metadata or None)


def wait_status(gw: Gateway, batch_id: str, *states: str, timeout: float = 240) -> Any:
    b = gw.stack.wait_until(lambda: _in(gw, batch_id, states),
                            f"batch {batch_id} to reach {states}", timeout=timeout)
    return b


def _in(gw: Gateway, batch_id: str, states: tuple[str, ...]) -> Any:
    b = gw.sdk.batches.retrieve(batch_id)
    return b if b.status in states else None


def _counts(gw: Gateway, batch_id: str) -> Any:
    return gw.sdk.batches.retrieve(batch_id).request_counts


def lines(gw: Gateway, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in gw.sdk.files.content(file_id).content.splitlines()]


@contextlib.contextmanager
def held_chain(q: Any) -> Iterator[None]:
    """Anvil mines nothing meanwhile (no block per transaction, no empty blocks): sent
    transactions wait in its pool. On leaving, its usual mining is back and a block is mined."""
    q.chain.rpc("evm_setIntervalMining", [0])
    q.chain.rpc("evm_setAutomine", [False])
    try:
        yield
    finally:
        q.chain.rpc("evm_setAutomine", [True])
        q.chain.rpc("evm_setIntervalMining", [DEVNET_BLOCK_TIME])
        q.chain.mine()


def pending_claim(q: Any, miner: str) -> bool:
    """Whether `miner` has a claim waiting in the held chain's pool. Anything else it sent
    first (finalizing an earlier test's shards, say) is mined, so it gets on to its claim."""
    pool = q.chain.rpc("txpool_content")["pending"]
    sent = next((txs for sender, txs in pool.items() if sender.lower() == miner.lower()), {})
    for tx in sent.values():
        if tx["to"] and tx["to"].lower() == q.tasks.address.lower():
            fn, _ = q.tasks.contract.decode_function_input(tx["input"])
            if fn.fn_name in ("claimShard", "claimShards"):
                return True
    if sent:
        q.chain.mine()
    return False


def quarry(obj: Any) -> Any:
    """The gateway's `quarry` extension object on a batch or model (kept by the SDK as an
    extra field)."""
    return obj.model_extra["quarry"]


def task_created(stack: LocalStack) -> list[dict[str, Any]]:
    return stack.quarry.tasks.events("TaskCreated", client=CLIENT.address)


@pytest.mark.timeout(600)
def test_demo_sized_batch_completes_with_the_sdks_verified_outputs(
        stack: LocalStack, miners: dict[str, Path], gateway: Gateway, sdk_client: Any) -> None:
    """60 prompts of 24 tokens in 4 shards over two miners, as the demo; the output file is
    byte for byte what the SDK's verified `results()` give for the same task."""
    models = gateway.sdk.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert quarry(models[0])["lowest_ask_wei_per_token"] == PRICE
    proc_b = start_miner(stack, miners["b"])
    try:
        started = time.monotonic()
        batch = create(gateway, chat_lines(60, "demo"), quarry_shard_size="15",
                       quarry_max_price_per_token="1 gwei", quarry_precision="fp32,bf16",
                       quarry_require_commitments="true", project="demo")
        assert batch.status == "validating" and batch.metadata["project"] == "demo"
        done = wait_status(gateway, batch.id, "completed", "failed", timeout=540)
        elapsed = time.monotonic() - started
    finally:
        proc_b.stop()
    print(f"\n60-prompt batch: batches.create -> completed in {elapsed:.1f} s")
    assert done.status == "completed", done.errors
    assert done.request_counts.total == done.request_counts.completed == 60
    assert done.request_counts.failed == 0 and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    task_id = quarry(done)["task_id"]
    content = gateway.sdk.files.content(done.output_file_id).content
    expected = encode_jsonl([output_line(o) for o in sdk_client.job(task_id).results()])
    assert content == expected
    cli_out = stack.home / "cli-results.jsonl"
    r = subprocess.run([str(BIN / "client"), "results", str(task_id), "--out", str(cli_out),
                        "--market-url", stack.market_url],
                       env={**os.environ, "QUARRY_CLIENT_KEY": "0x" + bytes(CLIENT.key).hex()},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert cli_out.read_bytes() == content  # what `client results` writes for the task
    out = [json.loads(x) for x in content.splitlines()]
    assert [o["custom_id"] for o in out] == [f"demo-{i}" for i in range(60)]
    body = out[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] >= 1
    assert done.usage is not None
    assert done.usage.output_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"]
                                           for o in out)
    t = sdk_client.job(task_id).task()
    assert t.price_per_token == PRICE
    # the miners (fp32 on this CPU, committing torch engines) served what the task required;
    # the SDK's results() checked a commitment behind every output
    assert (t.precisions, t.require_commitments) == (precision_mask(["fp32", "bf16"]), True)
    assert {q_shard.precision for q_shard in (stack.quarry.tasks.get_shard(task_id, k)
                                              for k in range(t.num_shards))} == {1}


def test_bad_lines_fail_validation_with_their_line_numbers(
        stack: LocalStack, gateway: Gateway) -> None:
    good = json.loads(chat_lines(1, "ok"))
    bad = [
        {**good, "custom_id": "n2", "body": {**good["body"], "n": 2}},
        {**good, "custom_id": "logprobs", "body": {**good["body"], "logprobs": True}},
        {**good, "custom_id": "tools", "body": {**good["body"], "tools": []}},
        {**good, "custom_id": "url", "url": "/v1/completions"},
    ]
    data = (json.dumps(good) + "\n" + "\n".join(json.dumps(b) for b in bad)
            + "\n{not json\n").encode()
    before = len(task_created(stack))
    batch = create(gateway, data)
    failed = wait_status(gateway, batch.id, "failed", "in_progress", timeout=60)
    assert failed.status == "failed" and failed.failed_at
    errors = [(e.line, e.code, e.param) for e in failed.errors.data]
    assert errors == [(2, "invalid_request", "body.n"), (3, "invalid_request", "body.logprobs"),
                      (4, "invalid_request", "body.tools"), (5, "invalid_request", "url"),
                      (6, "invalid_json", None)]
    assert "not supported by Quarry" in failed.errors.data[2].message
    assert len(task_created(stack)) == before  # nothing was paid for


def test_cancel_mid_batch_refunds_the_open_shards_to_the_wei(
        stack: LocalStack, miners: dict[str, Path], gateway: Gateway,
        sdk_client: Any) -> None:
    q = stack.quarry
    before = q.escrow.withdrawable(CLIENT.address)
    first_block = q.chain.block_number() + 1
    shards = 20
    with only_b_serves():
        batch = create(gateway, chat_lines(2 * shards, "cancel"), quarry_shard_size="2",
                       quarry_miner=MINERS["b"].address)  # "b" is not running yet
        task_id = quarry(wait_status(gateway, batch.id, "in_progress", timeout=120))["task_id"]
        proc_b = start_miner(stack, miners["b"])
        try:
            # Ctrl-C while its first claim waits in the held chain's pool: the miner then
            # submits what that claim takes (at most max_shards_in_flight) and claims no
            # more, so most shards are still open when the cancel lands, however fast it is.
            with held_chain(q):
                stack.wait_until(lambda: pending_claim(q, MINERS["b"].address),
                                 "the miner's first claim", timeout=180)
                os.killpg(proc_b.pid, signal.SIGINT)
            proc_b.popen.wait(timeout=120)
        finally:
            proc_b.stop()
        cancelling = gateway.sdk.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at
        done = wait_status(gateway, batch.id, "cancelled", timeout=240)
    assert quarry(done)["task_id"] == task_id
    [ev] = q.tasks.events("TaskCancelled", taskId=task_id)
    refunded = [k for k in range(shards)
                if q.tasks.get_shard(task_id, k).state == ShardState.REFUNDED]
    assert 0 < len(refunded) < shards
    budget = 2 * 24 * PRICE
    assert int(ev["refund"]) == len(refunded) * budget
    assert quarry(done)["cancel_refund"] == int(ev["refund"])
    # Every wei that reached the client's escrow balance meanwhile is accounted for: the
    # cancel's refund, and the earlier tasks' unused budgets as their windows closed.
    released = [e for e in q.escrow.events("Released", first_block)
                if e["to"] == CLIENT.address]
    credited = [e for e in q.escrow.events("Credited", first_block)
                if e["to"] == CLIENT.address]
    assert q.escrow.withdrawable(CLIENT.address) - before == sum(
        int(e["amount"]) for e in released + credited)
    assert sum(int(e["amount"]) for e in released if e["taskId"] == task_id and
               e["blockNumber"] == ev["blockNumber"]) == int(ev["refund"])
    errors, outputs = lines(gateway, done.error_file_id), lines(gateway, done.output_file_id)
    assert len(errors) == 2 * len(refunded) == done.request_counts.failed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert len(outputs) == 2 * shards - len(errors) == done.request_counts.completed
    assert outputs == [output_line(o) for k in range(shards) if k not in refunded
                       for o in sdk_client.job(task_id).shard_results(k)]


def test_gateway_restart_mid_batch_resumes_the_same_task(
        stack: LocalStack, gateway: Gateway, sdk_client: Any) -> None:
    batch = create(gateway, chat_lines(8, "restart"), quarry_shard_size="2",
                   quarry_miner=MINERS["a"].address)
    running = wait_status(gateway, batch.id, "in_progress", "completed", timeout=120)
    task_id = quarry(running)["task_id"]
    gateway.stop()
    created = len(task_created(stack))
    gateway.start()
    done = wait_status(gateway, batch.id, "completed", timeout=240)
    assert quarry(done)["task_id"] == task_id
    assert len(task_created(stack)) == created  # followed, not submitted again
    assert lines(gateway, done.output_file_id) == [
        output_line(o) for o in sdk_client.job(task_id).results()]


def test_wrong_or_missing_token_gets_openais_401(gateway: Gateway) -> None:
    wrong = openai.OpenAI(base_url=gateway.url, api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        wrong.batches.list()
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    r = httpx.get(f"{gateway.url}/files")
    assert r.status_code == 401
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


DEEP = b"[" * 80_000 + b"]" * 80_000  # 160 KB


def test_deep_json_without_a_token_is_a_401_and_the_gateway_lives(gateway: Gateway) -> None:
    """80,000 nested arrays posted to /v1/batches without a token killed the gateway
    (SIGSEGV: the body was parsed before the token was checked, and eth-account raises the
    recursion limit). The token is checked first; with it, the market's JsonBodyGuard refuses
    the nesting, as OpenAI's error object."""
    url = f"{gateway.url}/batches"
    r = httpx.post(url, content=DEEP, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(url, content=DEEP, timeout=30, headers={
        "content-type": "application/json", "authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400
    assert "nested 80000 levels deep, over the limit of 64" in r.json()["error"]["message"]
    assert gateway.proc is not None and gateway.proc.alive()
    assert gateway.sdk.batches.list(limit=1).object == "list"


def test_a_huge_body_is_answered_before_it_is_sent(gateway: Gateway) -> None:
    """A 60 MiB body without a token was read and parsed (385 MiB peak) before its 401. Now
    the 401 (and with the token, the 413 of a JSON body over its limit) comes back while
    not one byte of the declared body has been sent."""
    size = 60 << 20
    for auth, status in (("", 401), (f"authorization: Bearer {TOKEN}\r\n", 413)):
        head = (f"POST /v1/batches HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}"
                f"content-type: application/json\r\ncontent-length: {size}\r\n\r\n")
        assert raw_exchange(gateway.port, head.encode(), iter(()))[0] == status


def test_uploads_stream_to_disk_within_their_limits(gateway: Gateway) -> None:
    """Uploads were parsed whole on the event loop by the standard library's MIME parser:
    20,000 tiny parts took 29 s, a 100 MiB upload peaked at 836 MiB, a 210 MiB chunked one
    was read whole before its 413. Now python-multipart parses them as they stream, off the
    event loop, into a file: a part count over the limit is refused, a chunked body past the
    limit is cut off there, and the gateway's peak memory does not grow by the upload."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    boundary = "quarry-test-boundary"
    parts = b"".join(b'--%s\r\ncontent-disposition: form-data; name="f%d"\r\n\r\nx\r\n'
                     % (boundary.encode(), i) for i in range(20_000))
    r = httpx.post(f"{gateway.url}/files", content=parts + b"--%s--\r\n" % boundary.encode(),
                   headers={**auth, "content-type": f"multipart/form-data; boundary={boundary}"},
                   timeout=60)
    assert r.status_code == 400 and "more than 8 form parts" in r.json()["error"]["message"]
    # a legal upload round-trips from disk
    data = chat_lines(2000, "big")
    f = gateway.sdk.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.bytes == len(data) and gateway.sdk.files.content(f.id).content == data
    assert (gateway.home / "gateway" / "files" / f.id).read_bytes() == data
    gateway.sdk.files.delete(f.id)
    assert not (gateway.home / "gateway" / "files" / f.id).exists()
    # 300 MiB, chunked (no content-length): cut off past the 200 MiB limit, long before the
    # end (the kernel's socket buffers take some MiB more before the cut is seen: on a busy
    # machine a 210 MiB body went wholly into them)
    assert gateway.proc is not None
    peak_before = peak_rss_mib(gateway.proc.pid)
    head = (f"POST /v1/files HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {TOKEN}"
            f"\r\ncontent-type: multipart/form-data; boundary={boundary}\r\n"
            "transfer-encoding: chunked\r\n\r\n").encode()
    opening = (f'--{boundary}\r\ncontent-disposition: form-data; name="purpose"\r\n\r\n'
               f'batch\r\n--{boundary}\r\ncontent-disposition: form-data; name="file"; '
               'filename="huge.jsonl"\r\n\r\n').encode()
    piece = b"x" * (1 << 20)
    body = (_chunk(c) for c in [opening, *[piece] * 300])
    status, sent = raw_exchange(gateway.port, head, body)
    assert status == 413
    assert sent < 300 << 20  # refused while the body was still coming
    assert peak_rss_mib(gateway.proc.pid) - peak_before < 64
    assert not list((gateway.home / "gateway" / "files").glob(".upload-*"))
    assert gateway.sdk.batches.list(limit=1).object == "list"


def test_uploads_past_their_limit_get_openais_429_while_batches_answer(
        stack: LocalStack) -> None:
    """Each upload costs the gateway a thread and a file: past `gateway_uploads_per_s` (here
    one per 100 s, so nothing refills meanwhile) the rest of a burst gets OpenAI's 429 with
    Retry-After before its body is read, while reads are answered."""
    gw = Gateway(stack, "limited-gateway", {"QUARRY_CLIENT_GATEWAY_UPLOADS_PER_S": "0.01",
                                            "QUARRY_CLIENT_GATEWAY_UPLOADS_AT_ONCE": "16"})
    gw.start()
    auth = {"authorization": f"Bearer {TOKEN}"}

    def upload(i: int) -> httpx.Response:
        return httpx.post(f"{gw.url}/files", headers=auth, data={"purpose": "batch"},
                          files={"file": (f"{i}.jsonl", b'{"custom_id": "x"}\n')}, timeout=60)

    try:
        with ThreadPoolExecutor(8) as pool:
            uploads = [pool.submit(upload, i) for i in range(6)]
            reads = [httpx.get(f"{gw.url}/batches", headers=auth, timeout=60)
                     for _ in range(3)]  # meanwhile
            replies = [f.result() for f in uploads]
        assert [r.status_code for r in reads] == [200] * 3
        statuses = sorted(r.status_code for r in replies)
        assert statuses == [200] + [429] * 5, statuses  # a burst of one
        for r in (r for r in replies if r.status_code == 429):
            assert int(r.headers["retry-after"]) > 50  # the setting's rate: ~100 s
            error = r.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
            assert "too many requests for uploads" in error["message"]
        with pytest.raises(openai.RateLimitError):
            gw.sdk.files.create(file=("more.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        assert gw.sdk.batches.list(limit=1).object == "list"
    finally:
        gw.stop()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) / 1024  # type: ignore[index]


def raw_exchange(port: int, head: bytes, body: Iterator[bytes]) -> tuple[int, int]:
    """Send a request's head, then its body pieces until the server answers; returns the
    answer's status and the body bytes sent by then (a server that answers before reading a
    body it refuses gets fewer than the whole)."""
    import select
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head)
        sent = 0
        for piece in body:
            if select.select([s], [], [], 0)[0]:
                break  # answered
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        answer = b""
        while b"\r\n" not in answer:
            more = s.recv(4096)
            if not more:
                break
            answer += more
    return int(answer.split(b" ", 2)[1]), sent


def test_gateway_without_a_token_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "QUARRY_HOME": str(tmp_path),
           "QUARRY_CLIENT_KEY": "0x" + bytes(CLIENT.key).hex()}
    env.pop("QUARRY_CLIENT_GATEWAY_TOKEN", None)
    r = subprocess.run([str(BIN / "client"), "gateway"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "client: error: missing client setting gateway_token (the bearer token callers send): "
        "set it under [client] in the config file (--config) or in "
        "QUARRY_CLIENT_GATEWAY_TOKEN"]


def test_batches_page_newest_first(gateway: Gateway) -> None:
    for i in range(3):  # cheap batches: they fail validation, no task is created
        create(gateway, b'{"custom_id": "x%d"}\n' % i)
    everything = [b.id for b in gateway.sdk.batches.list(limit=100)]
    assert len(everything) >= 3
    first = gateway.sdk.batches.list(limit=2)
    assert [b.id for b in first.data] == everything[:2] and first.has_more
    second = gateway.sdk.batches.list(limit=2, after=everything[1])
    assert [b.id for b in second.data] == everything[2:4]
    assert [b.id for b in gateway.sdk.batches.list(limit=2)] == everything  # auto-paging
    with pytest.raises(openai.NotFoundError):
        gateway.sdk.batches.list(after="batch_unknown")


@pytest.mark.timeout(300)
def test_expired_batch_refunds_the_unused_budget(
        stack: LocalStack, gateway: Gateway, sdk_client: Any) -> None:
    """The last stack test: it moves the chain's clock past the 24 h window (so the earlier tasks'
    windows close too, and their unused budgets reach escrow: only this task's releases are
    counted)."""
    q = stack.quarry
    with only_b_serves():
        batch = create(gateway, chat_lines(4, "expire"), quarry_shard_size="2",
                       quarry_miner=MINERS["b"].address)  # "b" is not running
        running = wait_status(gateway, batch.id, "in_progress", timeout=120)
        task_id = quarry(running)["task_id"]
        q.chain.advance_time(24 * 3600 + 5)
        done = wait_status(gateway, batch.id, "expired", timeout=120)
    payment = 4 * 24 * PRICE
    assert q.escrow.escrowed(task_id) == 0
    released = q.escrow.events("Released", taskId=task_id)
    assert [(e["to"], int(e["amount"])) for e in released] == [(CLIENT.address, payment // 2)
                                                                ] * 2  # both shards
    assert sdk_client.job(task_id).status().refunded == payment
    assert quarry(done)["refunded_wei"] == payment
    assert done.expired_at and done.output_file_id is None
    assert done.request_counts.failed == 4 and done.request_counts.completed == 0
    errors = lines(gateway, done.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        (f"expire-{i}", "batch_expired") for i in range(4)]


# ---------------------------------------------------------------------------- units
# The translation, options and store logic on their own (no stack; they run in milliseconds).


def _line(**body: Any) -> dict[str, Any]:
    return {"custom_id": "c", "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}}


def test_translation_rewrites_what_users_write_into_quarry_lines() -> None:
    from client.gateway.translate import translate_line
    from client.sdk import DEFAULT_MAX_TOKENS

    line = translate_line(_line(max_completion_tokens=7, n=1, user="u", stream=False,
                                frequency_penalty=0.0, top_p=0.5, seed=3,
                                messages=[{"role": "developer", "content": "be brief"},
                                          {"role": "user", "content": [
                                              {"type": "text", "text": "a"},
                                              {"type": "text", "text": "b"}]}]), CHAT, 1)
    assert line["body"] == {"model": MODEL, "max_tokens": 7, "top_p": 0.5, "seed": 3,
                            "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "ab"}]}
    assert translate_line(_line(), CHAT, 1)["body"]["max_tokens"] == DEFAULT_MAX_TOKENS
    # null is OpenAI's "the default"; stop strings reach the Quarry line as written
    line = translate_line(_line(stop=None, seed=None, temperature=None, max_tokens=5), CHAT, 1)
    assert set(line["body"]) == {"model", "messages", "max_tokens"}
    assert translate_line(_line(stop=["\n\n", "END"], max_tokens=5), CHAT, 1)["body"][
        "stop"] == ["\n\n", "END"]
    prompt = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": ["once"], "max_tokens": 4, "echo": False}}
    assert translate_line(prompt, "/v1/completions", 1)["body"] == {
        "model": MODEL, "prompt": "once", "max_tokens": 4}


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"n": 2}, "body.n", "only 1"),
    ({"n": True}, "body.n", "only 1"),
    ({"logprobs": True}, "body.logprobs", "not supported by Quarry"),
    ({"presence_penalty": 0.5}, "body.presence_penalty", "not supported by Quarry"),
    ({"tools": []}, "body.tools", "not supported by Quarry (supported: messages"),
    ({"response_format": {"type": "json_object"}}, "body.response_format", "not supported"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, "body.max_completion_tokens", "differs"),
    ({"user": 5}, "body.user", "must be a string"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "body.messages[0].name",
     "only role and content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "body.messages[0].content[0]", "'image_url' is not supported"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "body.messages[0].role", "one of"),
    ({"temperature": 3}, "body.temperature", "[0, 2]"),
])
def test_translation_refuses_what_quarry_cannot_do_naming_the_field(
        body: dict[str, Any], field: str, says: str) -> None:
    from client.gateway.translate import translate_line
    from market.protocol.errors import RequestError

    with pytest.raises(RequestError) as exc:
        translate_line(_line(**body), CHAT, 4)
    assert exc.value.field == field and exc.value.line == 4
    assert says in str(exc.value)


def test_translated_file_errors_name_every_bad_line() -> None:
    from client.gateway.translate import translate_file

    good = json.dumps(_line())
    other = json.dumps({**_line(), "custom_id": "d", "body": {**_line()["body"], "model": "x"}})
    errors = translate_file(f"{good}\n\n{good}\n{other}\n[1]\n".encode(), CHAT)
    assert isinstance(errors, list)
    assert [(e.line, e.code) for e in errors] == [
        (3, "duplicate_custom_id"), (4, "model_mismatch"), (5, "invalid_request")]
    assert [e.code for e in translate_file(b"\n\n", CHAT)] == ["empty_file"]  # type: ignore[union-attr]
    assert [e.code for e in translate_file(b"\xff\n", CHAT)] == ["invalid_file"]  # type: ignore[union-attr]
    ok = translate_file(f"{good}\n".encode(), CHAT)
    assert not isinstance(ok, list) and ok.model == MODEL and ok.line_numbers == (1,)


def test_quarry_options_in_metadata() -> None:
    from client.gateway.runner import OptionError, Options, parse_options

    a = MINERS["a"].address
    assert parse_options({"team": "x"}) == Options()
    assert parse_options({"quarry_precision": "BF16, fp32",
                          "quarry_require_commitments": "true"}) == Options(
        precisions=precision_mask(["bf16", "fp32"]), require_commitments=True)
    assert parse_options({"quarry_max_price_per_token": "2 gwei", "quarry_miner": a.lower(),
                          "quarry_min_reputation_bps": "500", "quarry_allow_probation": "TRUE",
                          "quarry_shard_size": "15", "quarry_arbiter": a}) == Options(
        price=2 * 10**9, miner=a, arbiter=a, min_reputation_bps=500, allow_probation=True,
        shard_size=15)
    for key, value, says in [("quarry_price", "1", "unknown Quarry option"),
                             ("quarry_miner", "0x12", "not an address"),
                             ("quarry_min_reputation_bps", "10001", "[0, 10000]"),
                             ("quarry_shard_size", "0", "[1, "),
                             ("quarry_allow_probation", "yes", '"true" or "false"'),
                             ("quarry_precision", "fp4", "unknown precision 'fp4'"),
                             ("quarry_require_commitments", "1", '"true" or "false"'),
                             ("quarry_max_price_per_token", "lots", "not an amount")]:
        with pytest.raises(OptionError, match=re.escape(says)) as exc:
            parse_options({key: value})
        assert exc.value.key == key


def test_store_pages_migrates_and_guards_state_changes(tmp_path: Path) -> None:
    import sqlite3

    from client.gateway.store import VERSION, GatewayStore, StoreError

    path = tmp_path / "g.sqlite"
    store = GatewayStore(path)
    ids = [store.add_batch(endpoint=CHAT, input_file_id="f", completion_window="24h",
                           expires_at=0)["id"] for _ in range(5)]
    rows, more = store.batches(after=None, limit=2)
    assert [r["id"] for r in rows] == ids[::-1][:2] and more
    rows, more = store.batches(after=ids[1], limit=2)
    assert [r["id"] for r in rows] == [ids[0]] and not more
    assert store.update_batch(ids[0], only_if="validating", status="cancelling")
    assert not store.update_batch(ids[0], only_if="validating", status="in_progress")
    assert [r["id"] for r in store.active_batches()] == ids
    store.close()
    reopened = GatewayStore(path)  # a restart reads back everything
    assert reopened.batch(ids[0])["status"] == "cancelling"  # type: ignore[index]
    reopened.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION
        conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this gateway"):
        GatewayStore(path)


def test_a_version_1_store_moves_its_file_blobs_to_disk(tmp_path: Path) -> None:
    """Files were SQLite BLOBs (a whole upload in memory to store or serve it); migration 2
    writes each to `files/<id>` and empties its BLOB, losing nothing."""
    import sqlite3

    from client.gateway.store import VERSION, GatewayStore, _v1_baseline

    path = tmp_path / "g.sqlite"
    with sqlite3.connect(path) as conn:
        _v1_baseline(conn, tmp_path / "files")
        conn.execute("INSERT INTO files (id, filename, purpose, bytes, created_at, data) "
                     "VALUES ('file-old', 'in.jsonl', 'batch', 5, 1, x'68656c6c6f')")
        conn.execute("PRAGMA user_version = 1")
    store = GatewayStore(path)
    assert store.file_data("file-old") == b"hello"
    assert (tmp_path / "files" / "file-old").read_bytes() == b"hello"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT length(data) FROM files").fetchone()[0] == 0
        assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION == 2
    new = store.add_file("out.jsonl", "batch_output", b"{}\n")
    assert store.file_data(new["id"]) == b"{}\n" and new["bytes"] == 3
    assert store.delete_file("file-old") and store.file_path("file-old") is None
    assert not (tmp_path / "files" / "file-old").exists()
