"""The miner against a real Anvil (session devnet, rolled back per test) and the tiny model.

Most tests store through `market.store.LocalStore` (real files, content-addressed) with the
market URL on a port where nothing listens, so the worker also exercises its fallback: open
shards from chain events, the deployment from the deployment file. One test runs the whole
path through a real market app (uvicorn in a thread): `miner register` posting manifests,
`Worker.from_config`, recommendations from `/shards/open`, uploads and heartbeats.

Miners registered here are established (probation disabled around their registration, as
the session fixture does for its own miners) unless a test is about probation; those
registered through the CLI start on probation and are given tasks that allow it.
Availability challenges are answered by the worker's own loop, run in a thread with its own
chain connection while the test acts as the client; tests wait on chain conditions.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from market.chain.client import anvil_account
from market.chain.contracts import ShardState
from market.chain.devnet import free_port
from market.marketapi import MarketAPI
from market.model.manifest import ModelFileMismatch
from market.protocol.commitments import commitment_hash
from market.protocol.merkle import input_tree
from market.protocol.precision import Precision, precision_mask
from market.protocol.requests import parse_jsonl
from market.protocol.results import ShardResult, verify_shard_result
from market.store import LocalStore, StoreError
from miner import cli
from miner.archive import ResultArchive
from miner.config import MinerConfig
from miner.register import register_miner
from miner.worker import Worker

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]

PRICE = 10**9
STAKE = 10**18
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market.model.create import create_model

    d = tmp_path_factory.mktemp("models") / "quarry-miner-test"
    create_model(d, name="quarry-miner-test", layers=2, hidden=64, max_positions=256)
    return d


@pytest.fixture(scope="module")
def engine(model_dir: Path, one_torch_thread: None) -> Any:
    from market.engine.factory import load_engine

    eng = load_engine("torch", model_dir, max_batch_size=4)
    yield eng
    eng.close()


@pytest.fixture
def dead_market() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def config_file(tmp_path: Path, account: Any, model_dir: Path, market_url: str,
                deployment: Path | None = None, **extra: str) -> Path:
    key_file = tmp_path / f"{account.address}.key"
    key_file.write_text(bytes(account.key).hex())
    key_file.chmod(0o600)  # private, as a key file should be: no warning about it
    lines = ["[miner]", f'key_file = "{key_file}"', f'market_url = "{market_url}"',
             f'model_dirs = ["{model_dir}"]', f"price_per_token = {PRICE}",
             f'stake = "{STAKE}"', 'endpoint = "http://127.0.0.1:9200"',
             'gpu = {name = "Test GPU", memory_mib = 1024, count = 1}']
    if deployment is not None:
        lines.append(f'deployment = "{deployment}"')
    lines += [f"{k} = {v}" for k, v in extra.items()]
    path = tmp_path / f"{account.address}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(autouse=True)
def quarry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private QUARRY_HOME: the workers' local result copies go under it."""
    home = tmp_path / "home"
    monkeypatch.setenv("QUARRY_HOME", str(home))
    return home


def register(devnet: Any, account: Any, model_dir: Path, market_url: str, *,
             probation: bool = False, precision: str | None = None) -> None:
    """`register_miner`; without `probation` the miner is established (off probation)."""
    cfg = MinerConfig.load(key="0x" + bytes(account.key).hex(), model_dirs=[str(model_dir)],
                           price_per_token=PRICE, stake=STAKE, endpoint="http://127.0.0.1:9201",
                           gpu={"name": "Test GPU", "memory_mib": 1024, "count": 1},
                           precision=precision)
    gpu, owner = devnet.q.gpu, devnet.deployer
    params = gpu.probation_params()
    if not probation:
        gpu.set_probation(owner, 0, params[1])
    try:
        with MarketAPI(market_url) as market:
            register_miner(cfg, q=devnet.q, market=market)
    finally:
        gpu.set_probation(owner, *params)
    assert gpu.on_probation(account.address) == probation


def batch(n: int, max_tokens: int = MAX_TOKENS, tag: str = "") -> bytes:
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": "quarry-miner-test", "prompt": f"{tag}the river {i}",
                                  "max_tokens": max_tokens}}) for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def post_task(devnet: Any, store: LocalStore, model_id: bytes, data: bytes, *,
              shard_size: int = 3, root_of: bytes | None = None,
              allow_probation: bool = False, precisions: int = 0,
              require_commitments: bool = False) -> int:
    """Upload `data` and create a task for it; `root_of` commits to other bytes instead."""
    uri = store.put(data)
    parsed = parse_jsonl(root_of if root_of is not None else data)
    task_id, _ = devnet.q.tasks.create_task(
        devnet.client, model_id=model_id,
        input_root=input_tree([r.request_hash for r in parsed]).root, input_uri=uri,
        num_requests=len(parsed), shard_size=shard_size, max_tokens_per_request=MAX_TOKENS,
        price_per_token=PRICE, deadline=devnet.chain.timestamp() + 3600,
        allow_probation=allow_probation, precisions=precisions,
        require_commitments=require_commitments)
    return task_id


def last_tx_gas(devnet: Any) -> int:
    w3 = devnet.chain.w3
    block = w3.eth.get_block("latest")
    receipt = w3.eth.get_transaction_receipt(block["transactions"][-1])
    return int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """One command, as if in its own process: the logging it sets up goes with it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = cli.main(list(argv))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- register

def test_register_update_and_tampered_model(devnet: Any, model_dir: Path, tmp_path: Path,
                                            deployment_file: Path, dead_market: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from market.model.manifest import load_manifest

    miner = anvil_account(12)
    model_id = load_manifest(model_dir).model_id
    cfg = config_file(tmp_path, miner, model_dir, dead_market)
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg))
    assert code == 0, out
    assert f"miner {miner.address} registered" in out
    assert "0x" + model_id.hex() in out and "manifests NOT posted" in out
    # No precision configured: the engine's default on this CPU, fp32, is declared.
    assert f"{model_id.hex()} ({model_dir}) in fp32" in out
    assert devnet.q.gpu.precision_of(miner.address, model_id) == Precision.FP32
    info = devnet.q.gpu.miner_info(miner.address)
    assert (info.stake, info.price_per_token, info.endpoint) == (STAKE, PRICE,
                                                                 "http://127.0.0.1:9200")
    assert (info.gpu.name, info.gpu.memory_mi_b, info.gpu.count) == ("Test GPU", 1024, 1)
    assert devnet.q.gpu.models_of(miner.address) == [model_id]
    # A new miner starts on probation: only tasks that allow it, until the committee's
    # reports pass it; the command says so, with the deployment's terms.
    epochs, pass_bps = devnet.q.gpu.probation_params()
    assert info.on_probation and info.passed_epochs == 0
    assert not devnet.q.gpu.is_eligible(miner.address, model_id)
    assert devnet.q.gpu.is_eligible(miner.address, model_id, allow_probation=True)
    assert (f"probation the miner starts on probation (0 of {epochs} passing epochs): it may "
            "claim only tasks that allow miners on probation") in out
    assert f"until {epochs} consecutive committee reports score it at or above {pass_bps} bps" \
        in out

    # Again: an update, no second stake; then a higher stake is topped up, not doubled.
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg), "--price-per-token", "5")
    assert code == 0 and "updated" in out and "(nothing added)" in out
    assert "probation the miner is on probation (0 of" in out
    assert devnet.q.gpu.miner_info(miner.address).stake == STAKE
    assert devnet.q.gpu.miner_info(miner.address).price_per_token == 5
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg), "--stake", "1.5ether")
    assert code == 0 and f"(+{STAKE // 2} wei now)" in out
    assert devnet.q.gpu.miner_info(miner.address).stake == STAKE * 3 // 2
    # A declared precision is updated like the rest of the profile; `miner run` refuses an
    # engine less exact than the declaration (its shards would be judged at it), one line.
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg), "--precision", "bf16")
    assert code == 0 and "updated" in out and f"({model_dir}) in bf16" in out
    assert devnet.q.gpu.precision_of(miner.address, model_id) == Precision.BF16
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg), "--precision", "fp32")
    assert code == 0 and devnet.q.gpu.precision_of(miner.address, model_id) == Precision.FP32
    code, _, err = run_cli(capsys, "run", "--config", str(cfg), "--precision", "fp16",
                           "--once", "--no-progress")
    assert code == 1  # (a line before says the dead market gave no deployment)
    assert "in fp16, less exact than the fp32 this miner declared on-chain" in \
        err.strip().splitlines()[-1]
    code, _, err = run_cli(capsys, "register", "--config", str(cfg), "--precision", "fp4")
    assert code == 1 and "unknown precision 'fp4'" in err and len(err.strip().splitlines()) == 1

    # A modified weights file is refused by name, before any transaction.
    bad = tmp_path / "tampered"
    shutil.copytree(model_dir, bad)
    weights = bad / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0x01
    weights.write_bytes(bytes(raw))
    other = anvil_account(13)
    balance = devnet.chain.balance(other.address)
    code, _, err = run_cli(capsys, "register", "--config",
                           str(config_file(tmp_path, other, bad, dead_market)))
    assert code == 1
    assert "model.safetensors" in err and "does not match the manifest" in err
    assert len(err.strip().splitlines()) == 1
    assert not devnet.q.gpu.is_registered(other.address)
    assert devnet.chain.balance(other.address) == balance
    with pytest.raises(ModelFileMismatch, match="model.safetensors"):
        register_miner(MinerConfig.load(config_file(tmp_path, other, bad, dead_market)),
                       q=devnet.q, market=MarketAPI(dead_market))

    # An architecture no engine serves is refused by name, with the list that is served.
    from market.model.manifest import build_manifest, write_manifest

    alien = tmp_path / "alien"
    shutil.copytree(model_dir, alien)
    config = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    write_manifest(build_manifest(alien, "alien"), alien)
    code, _, err = run_cli(capsys, "register", "--config",
                           str(config_file(tmp_path, other, alien, dead_market)))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "model_type 'gpt2'" in err and "supported: llama, qwen2, qwen3, mistral" in err
    assert not devnet.q.gpu.is_registered(other.address)


# ----------------------------------------------------------------------------- work

def test_shard_end_to_end_then_finalize_and_withdraw(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, tmp_path: Path,
        deployment_file: Path, dead_market: str, capsys: pytest.CaptureFixture[str]) -> None:
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    data = batch(5)
    task_id = post_task(devnet, store, engine.model_id, data)  # shards [0,3) and [3,5)
    market = MarketAPI(dead_market)
    events: list[tuple[str, dict[str, Any]]] = []
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    market=market, max_batch=2, poll_interval_s=0.1, progress=False,
                    listener=lambda e, info: events.append((e, info)))

    outcome = worker.process_shard(task_id, 0)
    assert outcome.submitted, outcome.reason
    sh = q.tasks.get_shard(task_id, 0)
    assert (sh.state, sh.miner, sh.result_uri) == (ShardState.SUBMITTED, miner.address,
                                                   outcome.result_uri)
    result = ShardResult.from_bytes(store.get(sh.result_uri))
    parsed = parse_jsonl(data)
    items = verify_shard_result(
        result, task_id=task_id, shard=0, start=0, miner=sh.miner, model_id=engine.model_id,
        result_root=sh.result_root, tokens_used=sh.tokens_used,
        request_hashes=[r.request_hash for r in parsed[:3]], chain_id=q.chain_id,
        task_registry=q.tasks.address)
    assert sh.tokens_used == outcome.tokens_used == sum(len(i.token_ids) for i in items)
    assert [i.custom_id for i in items] == ["r0", "r1", "r2"]
    # The torch engine commits to its activations: each receipt signs its output's commitment.
    assert all(i.commitment and i.receipt.commitment == commitment_hash(i.commitment)
               for i in items)
    direct = engine.generate([engine.request_from_line(r.request) for r in parsed[:3]])
    assert [i.token_ids for i in items] == [d.token_ids for d in direct]
    assert all(0 < len(i.token_ids) <= MAX_TOKENS and i.prompt_tokens > 0 for i in items)
    # The miner's own copy, kept to answer availability challenges, under $QUARRY_HOME.
    assert worker.archive.path(task_id, 0) == (
        Path(os.environ["QUARRY_HOME"]) / "miner" / miner.address / "results"
        / q.identity() / f"{task_id}-0.json")
    assert worker.archive.load(task_id, 0) == result

    # The loop finds shard 1 from chain events (the market does not answer), then is idle.
    summary = worker.run(stop_when_idle=True)
    assert [(o.task_id, o.shard) for o in summary.submitted] == [(task_id, 0), (task_id, 1)]
    assert q.tasks.get_shard(task_id, 1).state == ShardState.SUBMITTED
    assert [e for e, _ in events].count("submitted") == 2

    # Payment: after the challenge window the miner finalizes both shards itself, even
    # after a restart (a fresh worker finds its submitted shards in ResultSubmitted events).
    tokens = summary.tokens
    assert worker.collect() == 0  # window still open: nothing to do yet
    devnet.chain.advance_time(q.tasks.params()["challenge_window"] + 1)
    restarted = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                       progress=False)
    assert restarted.collect() == tokens * PRICE
    assert not restarted.pending
    assert worker.collect() == 0  # already finalized by the other: done, nothing paid twice
    assert not worker.pending
    assert worker.archive.keys() == []  # finalized: the local copies are gone
    assert q.escrow.withdrawable(miner.address) == tokens * PRICE
    paid = q.tasks.events("ShardFinalized", devnet.deployment.deploy_block,
                          miner=miner.address)
    assert sorted(int(e["payment"]) for e in paid) == sorted(
        o.tokens_used * PRICE for o in summary.submitted)

    cfg = config_file(tmp_path, miner, model_dir, dead_market)
    code, out, _ = run_cli(capsys, "status", "--config", str(cfg), "--json")
    status = json.loads(out)
    assert (status["shards_claimed"], status["shards_submitted"],
            status["shards_finalized"]) == (2, 2, 2)
    assert status["earnings_wei"] == status["withdrawable_wei"] == tokens * PRICE
    assert (status["stake"], status["locked"], status["eligible_state"]) == (STAKE, 0, "active")
    assert status["precisions"] == {"0x" + engine.model_id.hex(): "fp32"}
    assert (status["untrusted_slash_bps"], status["reserve"]) == (1000, 0)
    code, out, _ = run_cli(capsys, "status", "--config", str(cfg))
    assert f"model      0x{engine.model_id.hex()} in fp32" in out
    assert (f"stake      {STAKE} wei (0 wei locked as collateral, {STAKE - STAKE // 10} wei "
            f"free for claims, {STAKE // 10} wei kept back for an untrusted verdict's burn)"
            in out)
    assert (status["on_probation"], status["open_challenges"]) == (False, [])

    before = devnet.chain.balance(miner.address)
    code, out, _ = run_cli(capsys, "withdraw", "--config", str(cfg))
    assert code == 0 and f"withdrew {tokens * PRICE} wei" in out
    assert devnet.chain.balance(miner.address) == before + tokens * PRICE - last_tx_gas(devnet)
    code, _, err = run_cli(capsys, "withdraw", "--config", str(cfg))
    assert code == 1 and "nothing to withdraw" in err
    market.close()


def test_input_not_matching_root_is_skipped_without_claiming(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(4, tag="altered "),
                        root_of=batch(4))
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    progress=False)
    balance = devnet.chain.balance(miner.address)
    outcome = worker.process_shard(task_id, 0)
    assert outcome.status == "skipped"
    assert "does not match the task's inputRoot" in outcome.reason
    assert q.tasks.get_shard(task_id, 0).state == ShardState.OPEN
    assert q.gpu.miner_info(miner.address).locked == 0
    assert devnet.chain.balance(miner.address) == balance
    assert task_id in worker.skipped_tasks  # remembered: the other shard is not tried either
    assert worker.process_shard(task_id, 1).reason == outcome.reason
    assert worker.open_shards_from_chain() == []


def test_claim_for_an_unregistered_model_is_not_eligible_and_costs_nothing(
        devnet: Any, engine: Any, store: LocalStore) -> None:
    """devnet.miner is registered for another model only: its claim reverts NotEligible at
    gas estimation, so no transaction is sent and nothing is locked."""
    q, miner = devnet.q, devnet.miner
    task_id = post_task(devnet, store, engine.model_id, batch(3))
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    progress=False)
    before = (devnet.chain.balance(miner.address), q.gpu.miner_info(miner.address),
              q.escrow.withdrawable(miner.address))
    outcome = worker.process_shard(task_id, 0)
    assert outcome.status == "skipped"
    assert "NotEligible" in outcome.reason
    assert "does not serve model 0x" + engine.model_id.hex() in outcome.reason
    assert (devnet.chain.balance(miner.address), q.gpu.miner_info(miner.address),
            q.escrow.withdrawable(miner.address)) == before
    assert q.tasks.get_shard(task_id, 0).state == ShardState.OPEN


def test_task_paying_below_the_miners_price_is_not_claimed(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    info = q.gpu.miner_info(miner.address)
    q.gpu.update(miner, q.gpu.models_of(miner.address), info.gpu, info.endpoint, PRICE + 1)
    task_id = post_task(devnet, store, engine.model_id, batch(3))
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    progress=False)
    outcome = worker.process_shard(task_id, 0)
    assert outcome.status == "skipped"
    assert f"below this miner's price of {PRICE + 1} wei/token" in outcome.reason
    assert q.tasks.get_shard(task_id, 0).state == ShardState.OPEN


class FlakyEngine:
    """Fault injection: the real engine, whose first `generate` call fails (as an OOM would)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("CUDA out of memory (injected)")
        return self._engine.generate(requests)


def test_engine_failure_mid_shard_does_not_stop_the_loop(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(4), shard_size=2)
    # One shard at a time: a batch spanning both shards would fail both (see
    # test_engine_failure_mid_stream_fails_only_the_unfinished_shards).
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: FlakyEngine(engine)},
                    store=store, progress=False, poll_interval_s=0.1, max_shards_in_flight=1)
    summary = worker.run(stop_when_idle=True)
    assert summary.failed == 1
    assert [(o.task_id, o.shard) for o in summary.submitted] == [(task_id, 1)]
    failed = q.tasks.get_shard(task_id, 0)
    assert (failed.state, failed.miner) == (ShardState.CLAIMED, miner.address)
    assert worker.failed == {(task_id, 0)}
    assert len(worker.run(stop_when_idle=True).submitted) == 1  # the failed one: not retried
    assert q.tasks.get_shard(task_id, 0).state == ShardState.CLAIMED

    # A restarted miner finishes its own unexpired claim first (no new claim, no slash).
    restarted = Worker(account=miner, quarry=q, engines={engine.model_id: engine},
                       store=store, progress=False, poll_interval_s=0.1)
    assert restarted.own_open_claims() == [(task_id, 0)]
    assert [(o.task_id, o.shard) for o in restarted.run(stop_when_idle=True).submitted] == [
        (task_id, 0)]
    assert q.tasks.get_shard(task_id, 0).state == ShardState.SUBMITTED
    assert len(q.tasks.events("ShardClaimed", devnet.deployment.deploy_block,
                              taskId=task_id)) == 2


class OverlapProbe:
    """Wraps the engine and the store: the first upload (shard 0's result) waits until the
    next shard's generation has begun, and fails if it never does. A miner that submits
    before claiming the next shard deadlocks on it; a pipelined one does not."""

    def __init__(self, engine: Any, store: LocalStore) -> None:
        self._engine, self._store = engine, store
        self.generations = 0
        self.second_generation = threading.Event()
        self.puts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Any) -> Any:
        self.generations += 1
        if self.generations == 2:
            self.second_generation.set()
        return self._engine.generate(requests)

    def get(self, uri: str) -> bytes:
        return self._store.get(uri)

    def put(self, data: bytes) -> str:
        self.puts += 1
        if self.puts == 1 and not self.second_generation.wait(60):
            raise StoreError("shard 0 was uploaded only after shard 1 was generated")
        return self._store.put(data)


def test_run_submits_a_shard_while_generating_the_next(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    """`run` pipelines: shard 0 is signed, uploaded and submitted in the background while
    shard 1 is generated (one batch per shard here); both end submitted, with their outcomes
    and events."""
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(6), shard_size=3)
    probe = OverlapProbe(engine, store)
    events: list[tuple[str, int]] = []
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: probe}, store=probe,
                    progress=False, poll_interval_s=0.1, max_batch=3,
                    listener=lambda name, info: events.append((name, info.get("shard", -1))))
    summary = worker.run(stop_when_idle=True)
    assert summary.failed == 0
    assert sorted((o.task_id, o.shard) for o in summary.submitted) == [(task_id, 0), (task_id, 1)]
    assert [e for e in events if e[0] in ("claimed", "submitted")].index(("claimed", 1)) < [
        e for e in events if e[0] in ("claimed", "submitted")].index(("submitted", 0))
    for k in (0, 1):
        sh = q.tasks.get_shard(task_id, k)
        assert (sh.state, sh.miner) == (ShardState.SUBMITTED, miner.address)
    assert worker.current is None and worker.drain() is None
    assert worker.status()["shardsSubmitted"] == 2
    worker.close()


class BatchLog:
    """The real engine, recording the size of every `generate` call; `fail_at` makes that
    call (1-based) raise, as a crashed GPU would."""

    def __init__(self, engine: Any, fail_at: int = 0) -> None:
        self._engine, self.fail_at = engine, fail_at
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Any) -> Any:
        self.sizes.append(len(requests))
        if len(self.sizes) == self.fail_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self._engine.generate(requests)


@pytest.mark.parametrize(("in_flight", "sizes"), [(4, [4, 4, 1]), (2, [4, 2, 3]),
                                                  (1, [3, 3, 3])])
def test_run_streams_shards_of_a_task_through_full_batches(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str,
        in_flight: int, sizes: list[int]) -> None:
    """Up to `max_shards_in_flight` shards of a task are claimed back to back and generated
    as one stream: batches run across shard boundaries (3 shards of 3 requests in batches of
    4), and every shard is submitted with exactly the outputs it would get alone."""
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    data = batch(9)
    task_id = post_task(devnet, store, engine.model_id, data, shard_size=3)
    log = BatchLog(engine)
    events: list[tuple[str, int]] = []
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: log}, store=store,
                    progress=False, poll_interval_s=0.1, max_batch=4,
                    max_shards_in_flight=in_flight,
                    listener=lambda name, info: events.append((name, info.get("shard", -1))))
    summary = worker.run(stop_when_idle=True)
    worker.close()
    assert summary.failed == 0 and log.sizes == sizes
    assert sorted(o.shard for o in summary.submitted) == [0, 1, 2]
    assert [k for name, k in events if name == "claimed"] == [0, 1, 2]
    # the shards streamed together were claimed in one transaction (Anvil: one per block)
    blocks = [e["blockNumber"] for e in q.tasks.events("ShardClaimed", 0, taskId=task_id)]
    assert len(set(blocks)) == -(-3 // in_flight)
    parsed = parse_jsonl(data)
    for k in range(3):
        sh = q.tasks.get_shard(task_id, k)
        items = verify_shard_result(
            ShardResult.from_bytes(store.get(sh.result_uri)), task_id=task_id, shard=k,
            start=3 * k, miner=sh.miner, model_id=engine.model_id, result_root=sh.result_root,
            tokens_used=sh.tokens_used,
            request_hashes=[r.request_hash for r in parsed[3 * k:3 * k + 3]],
            chain_id=q.chain_id, task_registry=q.tasks.address)
        alone = engine.generate([engine.request_from_line(r.request)
                                 for r in parsed[3 * k:3 * k + 3]])
        assert [i.token_ids for i in items] == [a.token_ids for a in alone]


def test_engine_failure_mid_stream_fails_only_the_unfinished_shards(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    """Shard 0 is complete after the first batch and is submitted; the engine then fails on
    the second batch, which held shards 1 and 2: both are failed (their claims will expire),
    none is left `current`, and the miner goes on."""
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(9), shard_size=3)
    log = BatchLog(engine, fail_at=2)
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: log}, store=store,
                    progress=False, max_batch=3)
    outcomes = worker.process_shards(task_id, [0, 1, 2])
    worker.close()
    assert [(o.shard, o.status) for o in outcomes] == [
        (0, "submitted"), (1, "failed"), (2, "failed")]
    assert "illegal memory access" in outcomes[1].reason
    assert worker.failed == {(task_id, 1), (task_id, 2)}
    assert worker.current is None and worker.abort_message() == "aborted; no shard was claimed"
    assert [q.tasks.get_shard(task_id, k).state for k in range(3)] == [
        ShardState.SUBMITTED, ShardState.CLAIMED, ShardState.CLAIMED]


def test_a_refused_batch_claim_falls_back_to_one_claim_per_shard(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    """Another miner takes shard 1 between this miner's checks and its `claimShards`: the
    batch reverts (nothing locked), each shard is then claimed on its own, and only shard 1
    is skipped, saying why."""
    q, miner, rival = devnet.q, anvil_account(12), anvil_account(13)
    register(devnet, miner, model_dir, dead_market)
    register(devnet, rival, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(9), shard_size=3)
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    progress=False, max_batch=3)
    assert worker.claim_many is not None
    claim_many = worker.claim_many
    tried: list[list[int]] = []

    def rival_first(task: int, shards: Any) -> Any:
        tried.append(list(shards))
        q.tasks.claim_shard(rival, task, 1)
        return claim_many(task, shards)

    worker.claim_many = rival_first
    outcomes = worker.process_shards(task_id, [0, 1, 2])
    worker.close()
    assert tried == [[0, 1, 2]]
    assert [(o.shard, o.status) for o in outcomes] == [
        (0, "submitted"), (1, "skipped"), (2, "submitted")]
    assert "ShardNotOpen" in outcomes[1].reason
    assert q.tasks.get_shard(task_id, 1).miner == rival.address
    assert q.gpu.miner_info(miner.address).locked == sum(  # nothing left over from the batch
        q.tasks.get_shard(task_id, k).collateral for k in (0, 2))
    blocks = [e["blockNumber"] for e in q.tasks.events("ShardClaimed", 0, taskId=task_id)]
    assert len(set(blocks)) == 3


def test_an_abort_names_every_claim_held_including_those_made_ahead(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str) -> None:
    """Shards 1 and 2 are claimed in the background while shard 0 generates (the path when
    they cannot be claimed together: here, no `claimShards`); an abort (a second Ctrl-C)
    during shard 1's batch, once both claims are made, leaves them claimed, and the abort
    message names both with their collateral."""
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(9), shard_size=3)
    claimed = threading.Event()
    events: list[int] = []

    def on_event(name: str, info: dict[str, Any]) -> None:
        if name == "claimed":
            events.append(info["shard"])
            if len(events) == 3:
                claimed.set()

    def abort_on_second_batch() -> None:
        if worker.summary.submitted:  # shard 0 is done: this is shard 1's batch
            assert claimed.wait(60), "shard 2 was never claimed"
            raise KeyboardInterrupt

    worker = Worker(account=miner, quarry=q,
                    engines={engine.model_id: Hooked(engine, abort_on_second_batch)},
                    store=store, progress=False, max_batch=3, listener=on_event)
    worker.claim_many = None
    with pytest.raises(KeyboardInterrupt):
        worker.process_shards(task_id, [0, 1, 2])
    message = worker.abort_message()
    worker.close()
    assert sorted(events) == [0, 1, 2]
    assert [q.tasks.get_shard(task_id, k).state for k in range(3)] == [
        ShardState.SUBMITTED, ShardState.CLAIMED, ShardState.CLAIMED]
    for k in (1, 2):
        sh = q.tasks.get_shard(task_id, k)
        assert f"task {task_id} shard {k}: its claim expires at" in message
        assert f"{sh.collateral} wei of stake stays locked" in message


def test_first_ctrl_c_finishes_the_shards_claimed_second_aborts(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A first Ctrl-C, as the first claim is announced, finishes what is claimed (here shards
    0 and 1, claimed together: `max_shards_in_flight` 2) and claims nothing more (shard 2
    stays open); two Ctrl-Cs abort and say what the claim left behind costs."""
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(6), shard_size=2)

    def interrupt(times: int) -> Any:
        sent: list[int] = []

        def on_event(event: str, info: dict[str, Any]) -> None:
            if event == "claimed" and not sent:
                sent.append(info["shard"])
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)
        return on_event

    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    progress=False, poll_interval_s=0.1, max_shards_in_flight=2,
                    listener=interrupt(1))
    summary = worker.run()  # without stop_when_idle: only the Ctrl-C ends it
    assert sorted((o.task_id, o.shard) for o in summary.submitted) == [(task_id, 0),
                                                                        (task_id, 1)]
    assert [q.tasks.get_shard(task_id, k).state for k in range(3)] == [
        ShardState.SUBMITTED, ShardState.SUBMITTED, ShardState.OPEN]
    assert "finishing task" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is not worker._on_sigint  # handler restored

    worker.listener = interrupt(2)
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    sh = q.tasks.get_shard(task_id, 2)
    assert (sh.state, sh.miner) == (ShardState.CLAIMED, miner.address)
    err = capsys.readouterr().err
    assert f"aborted task {task_id} shard 2: its claim expires at" in err
    assert f"{sh.collateral} wei of stake stays locked" in err
    penalty = sh.collateral * q.tasks.params()["reclaim_penalty_bps"] // 10_000
    assert f"{penalty} wei of it is slashed" in err


def test_exit_and_withdraw_stake(devnet: Any, model_dir: Path, tmp_path: Path,
                                 deployment_file: Path, dead_market: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    cfg = str(config_file(tmp_path, miner, model_dir, dead_market))
    code, _, err = run_cli(capsys, "withdraw", "--config", cfg, "--stake")
    assert code == 1 and "run `miner exit` first" in err
    # One shard, settled after the exit request: the stake then also waits for the
    # committee's report of the next epoch (the verdict on it), at most 3 epochs if silent.
    model_id = q.gpu.models_of(miner.address)[0]
    task_id, _ = q.tasks.create_task(
        devnet.client, model_id=model_id, input_root=b"\1" * 32, input_uri="store://in",
        num_requests=1, shard_size=1, max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
        deadline=devnet.chain.timestamp() + 3600)
    q.tasks.claim_shard(miner, task_id, 0)
    q.tasks.submit_result(miner, task_id, 0, b"\2" * 32, "store://out", 1)
    code, out, _ = run_cli(capsys, "exit", "--config", cfg)
    assert code == 0 and "can be withdrawn" in out and "committee has reported" in out
    code, _, err = run_cli(capsys, "exit", "--config", cfg)
    assert code == 1 and "exit already requested" in err
    code, _, err = run_cli(capsys, "withdraw", "--config", cfg, "--stake")
    assert code == 1 and "unbonding is not over" in err and "s from now" in err
    code, out, _ = run_cli(capsys, "status", "--config", cfg)
    assert "(exiting)" in out and "stake withdrawable at" in out
    params = devnet.deployment.params
    devnet.chain.advance_time(max(params["challenge_window"], params["miner_unbonding_period"]) + 1)
    q.tasks.finalize_shard(devnet.client, task_id, 0)
    code, _, err = run_cli(capsys, "withdraw", "--config", cfg, "--stake")
    epoch, until = q.gpu.verdict_wait(miner.address)
    assert code == 1 and until and len(err.strip().splitlines()) == 1
    assert f"waiting for the committee's report of epoch {epoch}" in err and "at the latest" in err
    code, out, _ = run_cli(capsys, "status", "--config", cfg)
    assert f"verdict    waiting for the committee's report of epoch {epoch}" in out
    devnet.chain.advance_time(until - devnet.chain.timestamp())  # the committee stayed silent
    before = devnet.chain.balance(miner.address)
    code, out, _ = run_cli(capsys, "withdraw", "--config", cfg, "--stake")
    assert code == 0 and f"{STAKE} wei" in out
    assert devnet.chain.balance(miner.address) == before + STAKE - last_tx_gas(devnet)
    assert not devnet.q.gpu.is_registered(miner.address)


# ----------------------------------------------------------------------------- with a market

@pytest.fixture
def live_market(devnet: Any, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A market app on a free port over this test's chain; yields (url, board db path)."""
    from market.service.app import serve_in_thread
    from market.service.settings import MarketSettings

    root = tmp_path / "market"
    deployment = devnet.deployment.save(root / "deployment.json")
    settings = MarketSettings(deployment=deployment, store_dir=root / "store",
                              db_path=root / "board.sqlite", port=free_port())
    with serve_in_thread(settings) as url:
        yield url, settings.db_path


def test_register_and_run_through_the_market(
        devnet: Any, model_dir: Path, tmp_path: Path, live_market: tuple[str, Path],
        one_torch_thread: None, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, quarry_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from market.service.board import Board

    # `miner run` freezes its startup heap; not this test process's (test_engine checks it).
    frozen: list[bool] = []
    monkeypatch.setattr("market.engine.heap.freeze_startup_heap",
                        lambda: frozen.append(True) or 0)
    url, db_path = live_market
    q, miner = devnet.q, anvil_account(12)
    cfg_path = config_file(tmp_path, miner, model_dir, url, max_batch=2,
                           poll_interval_s=0.1, heartbeat_interval_s=0.5)
    code, out, _ = run_cli(capsys, "register", "--config", str(cfg_path))
    assert code == 0 and "manifests posted" in out  # contracts found through /deployment
    api = MarketAPI(url)
    model_id = q.gpu.models_of(miner.address)[0]
    assert api.model("0x" + model_id.hex())["name"] == "quarry-miner-test"

    data = batch(5)
    uri = api.put(data)
    parsed = parse_jsonl(data)
    task_id, _ = q.tasks.create_task(
        devnet.client, model_id=model_id,
        input_root=input_tree([r.request_hash for r in parsed]).root, input_uri=uri,
        num_requests=5, shard_size=3, max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
        deadline=devnet.chain.timestamp() + 3600, allow_probation=True)  # a new miner
    Board(db_path).index(q)  # as the market's Celery indexer would
    assert {(s["taskId"], s["shard"]) for s in api.open_shards(
        "0x" + model_id.hex(), miner.address)} == {(task_id, 0), (task_id, 1)}

    with caplog.at_level(logging.INFO, logger="miner"):
        code, out, _ = run_cli(capsys, "run", "--config", str(cfg_path), "--once",
                               "--no-progress")
    assert code == 0 and out.startswith("submitted 2 shard(s)")
    assert frozen == [True]  # once, after loading the model
    assert "reading them from chain events" not in caplog.text  # the market recommended them
    kept = ResultArchive.for_miner(quarry_home / "miner", miner.address,
                                   q.identity())  # the default state_dir
    assert kept.keys() == [(task_id, 0), (task_id, 1)]
    for shard in (0, 1):
        sh = q.tasks.get_shard(task_id, shard)
        assert (sh.state, sh.miner) == (ShardState.SUBMITTED, miner.address)
        start, end = q.tasks.shard_range(task_id, shard)
        doc = ShardResult.from_bytes(api.get(sh.result_uri))  # uploaded to the market
        verify_shard_result(doc, task_id=task_id, shard=shard, start=start, miner=sh.miner,
                            model_id=model_id, result_root=sh.result_root,
                            tokens_used=sh.tokens_used,
                            request_hashes=[r.request_hash for r in parsed[start:end]],
                            chain_id=q.chain_id, task_registry=q.tasks.address)
    Board(db_path).index(q)
    row = next(m for m in api.miners() if m["address"] == miner.address)
    assert row["alive"] and row["status"]["models"] == ["0x" + model_id.hex()]
    assert api.open_shards("0x" + model_id.hex(), miner.address) == []
    api.close()


def test_rechallenge_an_untrusted_miner_through_the_market(
        devnet: Any, model_dir: Path, tmp_path: Path, live_market: tuple[str, Path],
        one_torch_thread: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`miner rechallenge`: refused (one line, exit 1) while trusted. Once a committee report
    leaves the miner untrusted, `miner status` and `GET /miners` say "untrusted" (it can claim
    nothing) and the market recommends it nothing. It pays the fee, which is burned, and the
    10% of its stake the first untrusted report spared (issue 32): it is "re-challenged", the
    market recommends it a challenge-like task (directed, probation allowed, no floor) and
    `miner run` serves it, while an ordinary task stays closed to it; asking twice is refused
    by name. A further report in a row that leaves it untrusted burns 10% of its stake. A
    missed report burns nothing and uses the re-challenge up."""
    from eth_utils import to_checksum_address

    from market.chain.contracts import MISSED_BPS
    from market.protocol.canonical import keccak
    from market.protocol.eip712 import Report, quorum_signatures
    from market.service.board import Board

    url, db_path = live_market
    q = devnet.q
    miner = anvil_account(12)
    register(devnet, miner, model_dir, url)
    cfg = str(config_file(tmp_path, miner, model_dir, url, max_batch=4, poll_interval_s=0.1))
    code, _, err = run_cli(capsys, "rechallenge", "--config", cfg)
    assert code == 1 and "is not untrusted" in err and len(err.splitlines()) == 1
    api = MarketAPI(url)
    board = Board(db_path)

    def report(bps: int) -> None:
        epoch = max(q.committee.next_report_epoch(), q.committee.current_epoch())
        if epoch > q.committee.current_epoch():
            devnet.chain.advance_time(q.committee.epoch_start(epoch) - q.chain.timestamp())
        rep = Report(epoch, (miner.address,), (bps,), keccak(b"evidence %d" % epoch))
        q.committee.submit_reputation(devnet.anyone, rep, quorum_signatures(
            rep, devnet.verifier_keys[:3], q.chain.chain_id, q.committee.address))
        board.index(q)  # as the market's Celery indexer would

    def row() -> dict[str, Any]:
        return next(m for m in api.miners() if m["address"] == miner.address)

    model = q.gpu.models_of(miner.address)[0]
    challenge = post_task(devnet, api, model, batch(2, tag="challenge "), shard_size=2,  # type: ignore[arg-type]
                          allow_probation=True)
    ordinary = post_task(devnet, api, model, batch(2, tag="client "), shard_size=2)  # type: ignore[arg-type]
    report(3000)
    assert (row()["standing"], row()["untrusted"]) == ("untrusted", True)
    assert api.open_shards("0x" + model.hex(), miner.address) == []
    code, out, _ = run_cli(capsys, "status", "--config", cfg)
    assert code == 0 and "standing   UNTRUSTED: reputation 3000 bps is under 4000" in out
    assert "may claim nothing" in out and "miner rechallenge" in out

    burn = to_checksum_address(q.chain.call(q.gpu.contract.functions.BURN()))
    burned = q.escrow.withdrawable(burn)
    fee = q.gpu.rechallenge_fee()
    stake = q.gpu.miner_info(miner.address).stake
    code, out, _ = run_cli(capsys, "rechallenge", "--config", cfg)
    # the fee, and the burn the first untrusted report spared (issue 32): 10% of the stake
    assert code == 0 and f"paid {fee} wei (burned) and {stake // 10} wei of its stake" in out
    assert q.escrow.withdrawable(burn) == burned + fee + stake // 10
    assert q.gpu.miner_info(miner.address).stake == stake - stake // 10
    assert q.gpu.rechallenge_pending(miner.address) and q.gpu.on_probation(miner.address)
    assert q.gpu.is_eligible(miner.address, model, 0, allow_probation=True)
    assert not q.gpu.is_eligible(miner.address, model, 0, allow_probation=False)
    board.index(q)
    assert (row()["standing"], row()["rechallengePending"]) == ("re-challenged", True)
    assert [(s["taskId"], s["shard"]) for s in api.open_shards(
        "0x" + model.hex(), miner.address)] == [(challenge, 0)]
    code, out, _ = run_cli(capsys, "run", "--config", cfg, "--once", "--no-progress")
    assert code == 0 and out.startswith("submitted 1 shard(s)")
    assert q.tasks.get_shard(challenge, 0).miner == miner.address
    assert q.tasks.get_shard(ordinary, 0).state == ShardState.OPEN
    code, _, err = run_cli(capsys, "rechallenge", "--config", cfg)
    assert code == 1 and "already pending" in err

    stake = q.gpu.miner_info(miner.address).stake
    report(2000)  # failed again: a further untrusted report in a row burns its own 10%
    assert q.gpu.miner_info(miner.address).stake == stake - stake // 10
    assert q.gpu.untrusted_reports_of(miner.address) == 3
    assert not q.gpu.rechallenge_pending(miner.address)
    assert row()["standing"] == "untrusted"
    # Paid again, then missed: nothing burned, the re-challenge is used up.
    code, _, _ = run_cli(capsys, "rechallenge", "--config", cfg)
    assert code == 0
    stake = q.gpu.miner_info(miner.address).stake
    report(MISSED_BPS)
    assert q.gpu.miner_info(miner.address).stake == stake
    assert (row()["standing"], row()["missedReports"]) == ("untrusted", 1)
    api.close()


def test_a_shard_offered_to_the_miner_goes_before_older_work_and_a_busy_miner_says_so(
        devnet: Any, model_dir: Path, engine: Any, live_market: tuple[str, Path]) -> None:
    """A client task of three shards, served one at a time; as the miner claims the first, a
    directed task (a client's pick, or a committee challenge: they look alike) is offered to
    it. It is claimed next, before the client task's other shards; while the miner generates,
    its heartbeat status says what it is generating and what waits behind it."""
    from market.jobs import post_batch
    from market.service.board import Board

    url, db_path = live_market
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, url)
    api = MarketAPI(url)
    board = Board(db_path)
    client_task = post_task(devnet, api, engine.model_id, batch(3, tag="client "),  # type: ignore[arg-type]
                            shard_size=1)
    board.index(q)
    claims: list[tuple[int, int]] = []
    behind: list[dict[str, Any] | None] = []
    directed: list[int] = []
    worker: Worker | None = None

    def listener(event: str, info: dict[str, Any]) -> None:
        if event == "claimed":
            claims.append((info["task_id"], info["shard"]))
            assert worker is not None
            behind.append(worker.status()["behind"])
        if event == "claimed" and not directed:
            data = batch(2, tag="directed ")
            task_id, _ = post_batch(
                q, devnet.client2, api, data, [r.request_hash for r in parse_jsonl(data)],
                model_id=engine.model_id, shard_size=2, max_tokens=MAX_TOKENS, price=PRICE,
                deadline=devnet.chain.timestamp() + 3600, prefer_miner=miner.address)
            directed.append(task_id)
            board.index(q)

    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=api,
                    market=api, max_shards_in_flight=1, poll_interval_s=0.1, progress=False,
                    listener=listener)
    try:
        worker.run(stop_when_idle=True)
    finally:
        worker.close()
    assert claims[1] == (directed[0], 0)
    assert sorted(claims[:1] + claims[2:]) == [(client_task, 0), (client_task, 1),
                                               (client_task, 2)]
    # As each is claimed (the listener runs then), the rest it saw waits behind it.
    first, second = behind[0], behind[1]
    assert first is not None and second is not None
    assert (first["generating"], first["waiting"], first["offeredWaiting"]) == (
        {"taskId": client_task, "shard": claims[0][1]}, 2, 0)
    assert (second["generating"], second["waiting"]) == ({"taskId": directed[0], "shard": 0}, 2)
    assert worker.status()["behind"] is None  # idle now
    api.close()


def test_unservable_shard_is_skipped_alone_and_shown_in_the_heartbeat(
        devnet: Any, model_dir: Path, engine: Any, live_market: tuple[str, Path]) -> None:
    """A request over the model's context (256 positions) makes its shard unservable: it is
    skipped before any transaction and never tried again, the task's other shard is still
    served, and the shard is listed in the signed heartbeat's status, which `GET /miners`
    shows (what the client's `Job.wait` reads), the latest few only."""
    from market.service.board import Board

    url, db_path = live_market
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, url)
    lines = batch(6).decode().splitlines()
    long_prompt = json.loads(lines[4])
    long_prompt["body"]["prompt"] = "the river " * 400
    lines[4] = json.dumps(long_prompt)
    api = MarketAPI(url)
    task_id = post_task(devnet, api, engine.model_id,  # type: ignore[arg-type]
                        ("\n".join(lines) + "\n").encode())
    Board(db_path).index(q)
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=api,
                    market=api, progress=False)
    assert worker.status()["unservable"] == []
    before = q.gpu.miner_info(miner.address).locked
    skipped = worker.process_shard(task_id, 1)
    assert skipped.status == "skipped"
    assert "request 4 ('r4') cannot be served" in skipped.reason
    assert "positions" in skipped.reason
    assert q.tasks.get_shard(task_id, 1).state == ShardState.OPEN
    assert q.gpu.miner_info(miner.address).locked == before
    assert task_id not in worker.skipped_tasks  # the other shard fits
    assert worker.find_open_shards() == [(task_id, 0)]
    assert worker.process_shard(task_id, 0).submitted
    assert worker.process_shard(task_id, 1).reason == skipped.reason  # not re-tokenized

    api.heartbeat(miner, worker.status())
    row = next(m for m in api.miners() if m["address"] == miner.address)
    assert row["status"]["unservable"] == [
        {"taskId": task_id, "shardId": 1, "reason": skipped.reason[:200]}]

    # Many unservable shards: the heartbeat keeps the latest few, within the market's cap.
    for k in range(40):
        worker.unservable[(task_id + 1000, k)] = "x" * 1000
    status = worker.status()
    assert [u["shardId"] for u in status["unservable"]] == [35, 36, 37, 38, 39]
    assert len(json.dumps(status)) < 4096
    api.heartbeat(miner, status)
    row = next(m for m in api.miners() if m["address"] == miner.address)
    assert row["status"]["unservable"] == status["unservable"]
    api.close()


def test_tasks_the_miner_cannot_serve_are_not_offered_nor_claimed(
        devnet: Any, model_dir: Path, engine: Any, live_market: tuple[str, Path]) -> None:
    """A miner declared bf16: a task accepting only fp32 is not recommended to it, and
    skipped before any transaction when tried; a task requiring commitments is neither
    recommended to nor claimed by a miner whose engine makes none, while a committing
    engine serves it with a commitment behind every output; a task open to any precision is
    served at the miner's declaration, which the shard records."""
    from market.engine.torch_engine import TorchEngine
    from market.service.board import Board

    url, db_path = live_market
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, url, precision="bf16")
    assert q.gpu.precision_of(miner.address, engine.model_id) == Precision.BF16
    api = MarketAPI(url)
    fp32_only = post_task(devnet, api, engine.model_id, batch(2, tag="exact "),  # type: ignore[arg-type]
                          precisions=precision_mask(["fp32"]))
    committed = post_task(devnet, api, engine.model_id, batch(2, tag="commit "),  # type: ignore[arg-type]
                          require_commitments=True)
    anything = post_task(devnet, api, engine.model_id, batch(2, tag="any "))  # type: ignore[arg-type]
    Board(db_path).index(q)
    model = "0x" + engine.model_id.hex()
    assert {s["taskId"] for s in api.open_shards(model, miner.address)} == {committed,
                                                                             anything}
    plain = TorchEngine(model_dir, max_batch_size=4, commit=False)
    try:
        worker = Worker(account=miner, quarry=q, engines={engine.model_id: plain}, store=api,
                        market=api, progress=False)
        api.heartbeat(miner, worker.status())  # says its engine makes no commitments
        assert worker.status()["commitments"] is False
        assert {t for t, _ in worker.find_open_shards()} == {anything}
        nonce = devnet.chain.w3.eth.get_transaction_count(miner.address)
        for task_id, why in ((fp32_only, "the task accepts fp32; this miner serves the model "
                                         "in bf16"),
                             (committed, "the task requires activation commitments and this "
                                         "miner's engine makes none")):
            outcome = worker.process_shard(task_id, 0)
            assert (outcome.status, outcome.reason) == ("skipped", why)
            assert worker.skipped_tasks[task_id] == why  # the whole task, never tried again
            assert q.tasks.get_shard(task_id, 0).state == ShardState.OPEN
        assert devnet.chain.w3.eth.get_transaction_count(miner.address) == nonce
        assert q.gpu.miner_info(miner.address).locked == 0
        assert worker.process_shard(anything, 0).submitted
        sh = q.tasks.get_shard(anything, 0)
        assert sh.precision == Precision.BF16  # what its outputs are judged at
        doc = ShardResult.from_bytes(api.get(sh.result_uri))
        assert all(it.commitment == b"" and it.receipt.commitment == b"\x00" * 32
                   for it in doc.items)
    finally:
        plain.close()

    # The committing engine takes the task that requires commitments.
    committing = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=api,
                        market=api, progress=False)
    api.heartbeat(miner, committing.status())
    Board(db_path).index(q)  # the shard served above is taken
    assert {t for t, _ in committing.find_open_shards()} == {committed}
    assert committing.process_shard(committed, 0).submitted
    sh = q.tasks.get_shard(committed, 0)
    parsed = parse_jsonl(batch(2, tag="commit "))
    items = verify_shard_result(
        ShardResult.from_bytes(api.get(sh.result_uri)), task_id=committed, shard=0, start=0,
        miner=sh.miner, model_id=engine.model_id, result_root=sh.result_root,
        tokens_used=sh.tokens_used, request_hashes=[r.request_hash for r in parsed],
        chain_id=q.chain_id, task_registry=q.tasks.address, require_commitments=True)
    assert all(it.commitment for it in items)
    api.close()


def test_cli_run_first_ctrl_c_submits_the_shard_and_exits_0(
        devnet: Any, model_dir: Path, tmp_path: Path, live_market: tuple[str, Path]) -> None:
    """The real `miner run` process: Ctrl-C once it has claimed a shard; it submits that
    shard (no claim is left behind), takes no further shard, and exits 0."""
    import subprocess
    import sys

    from market.service.board import Board

    url, db_path = live_market
    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, url)
    api = MarketAPI(url)
    data = batch(20)
    parsed = parse_jsonl(data)
    task_id, _ = q.tasks.create_task(
        devnet.client, model_id=q.gpu.models_of(miner.address)[0],
        input_root=input_tree([r.request_hash for r in parsed]).root, input_uri=api.put(data),
        num_requests=20, shard_size=4, max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
        deadline=devnet.chain.timestamp() + 3600, allow_probation=True)  # a new miner
    api.close()
    Board(db_path).index(q)
    cfg = config_file(tmp_path, miner, model_dir, url, max_batch=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "miner.cli", "run", "--config", str(cfg),
                             "--no-progress"], stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parent.parent)
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if " claimed: " in line:
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(lines) + rest
    assert proc.returncode == 0, err
    # Where the signal lands is the scheduler's choice, not the test's: mid-shard (the usual
    # case) the miner names the shard it finishes, and that shard is submitted; on a busy
    # machine the shard may be done before the signal is handled, and it says it exits.
    # Either way no claim is left behind and no further shard is taken.
    finishing = re.search(r"Ctrl-C: finishing task (\d+) shard (\d+)", err)
    assert finishing or "Ctrl-C: exiting" in err, err
    states = [q.tasks.get_shard(task_id, k).state for k in range(5)]
    if finishing:
        assert int(finishing[1]) == task_id
        assert states[int(finishing[2])] == ShardState.SUBMITTED
    assert ShardState.CLAIMED not in states
    assert states.count(ShardState.SUBMITTED) >= 1 and ShardState.OPEN in states


# ----------------------------------------------------------------------------- availability

@pytest.fixture
def long_windows(devnet: Any) -> int:
    """A one-hour challenge window and a ten-minute response window (devnet: 30 s and 60 s),
    so the pace of a loaded machine never decides an outcome; the miner is not slower for it
    (it answers at its next poll). Rolled back with the test's snapshot. Returns the
    response window."""
    q, owner = devnet.q, devnet.deployer
    p = q.tasks.params()
    devnet.chain.send(q.tasks.contract.functions.setParams(
        p["collateral_bps"], p["claim_timeout"], 3600, p["reclaim_penalty_bps"]), owner)
    devnet.chain.send(q.arbitration.contract.functions.setAvailabilityParams(
        q.arbitration.min_availability_bond(), 600), owner)
    return 600


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Poll `condition` until it is truthy and return it; fail naming `what` after a
    generous `timeout` (a safety net, not a measurement)."""
    give_up = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.1)
    return value


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """`worker.run()` in a thread, as `miner run` runs it; stopped and joined on exit."""
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            worker.run()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=loop, name="miner-loop", daemon=True)
    thread.start()
    try:
        yield
    finally:
        worker.request_stop()
        thread.join(timeout=120)
    assert not thread.is_alive(), "the miner loop did not stop"
    assert not errors, errors


def answer_of(devnet: Any, challenge_id: int) -> dict[str, Any]:
    """The AvailabilityAnswered event of a challenge, with the block it is in."""
    ev = devnet.q.arbitration.events("AvailabilityAnswered", devnet.deployment.deploy_block,
                                     challengeId=challenge_id)[-1]
    return ev | {"block": devnet.chain.w3.eth.get_block(ev["blockNumber"],
                                                         full_transactions=True)}


def withdrawable_at(devnet: Any, address: str, block: int) -> int:
    q = devnet.q
    return int(devnet.chain.call(q.escrow.contract.functions.withdrawable(address),
                                 block=block))


@pytest.mark.timeout(300)
def test_running_miner_answers_availability_challenges_on_its_own(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str,
        long_windows: int, caplog: pytest.LogCaptureFixture) -> None:
    """The client challenges requests of the miner's two submitted shards: with everything
    in place; with the market's store missing the document (the local copy answers); with
    the local copy gone (the store answers). The loop answers each by itself: ANSWERED, the
    bond credited to the miner to the wei, the shard's window extended. Then a request no
    one can prove: the miner says so loudly, lists it in `miner status`, and is slashed."""
    from market import jobs
    from market.chain.contracts import ChallengeStatus
    from market.chain.deploy import Quarry
    from miner.status import miner_status

    q, miner, window = devnet.q, anvil_account(12), long_windows
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(5))  # shards [0,3) and [3,5)
    events: list[tuple[str, dict[str, Any]]] = []
    worker = Worker(account=miner, quarry=Quarry(devnet.deployment),  # its own connection
                    engines={engine.model_id: engine}, store=store, max_batch=2,
                    poll_interval_s=0.1, progress=False,
                    listener=lambda e, info: events.append((e, info)))
    bond = q.arbitration.min_availability_bond()

    def challenge_answered(index: int, source: str) -> None:
        shard = index // 3
        before = q.tasks.get_shard(task_id, shard).window_end
        cid = jobs.challenge_availability(q, devnet.client, task_id, index)
        c = q.arbitration.get_challenge(cid)
        assert (c.miner, c.bond, c.deadline) == (miner.address, bond, c.opened_at + window)
        info = wait_for(f"challenge {cid} to be settled",
                        lambda: (i := jobs.challenge_info(q, cid)).settled and i)
        assert info.status == ChallengeStatus.ANSWERED, info.outcome()
        assert info.receipt is not None and info.receipt.index == index
        assert q.arbitration.proves(task_id, shard, info.receipt, info.proof)
        answer = answer_of(devnet, cid)
        (tx,) = answer["block"]["transactions"]
        assert tx["from"] == miner.address  # sent by the miner's own loop
        n = answer["blockNumber"]
        assert withdrawable_at(devnet, miner.address, n) - \
            withdrawable_at(devnet, miner.address, n - 1) == bond
        at = answer["block"]["timestamp"]
        extended = max(before + (at - c.opened_at), at + window)
        sh = q.tasks.get_shard(task_id, shard)
        assert (sh.state, sh.window_end, info.window_end) == (
            ShardState.SUBMITTED, extended, extended)
        # The loop emits once its transaction's receipt is back: the chain may show it first.
        answered = ("answered", {"challenge_id": cid, "task_id": task_id, "shard": shard,
                                 "index": index, "bond": bond, "window_end": extended,
                                 "source": source})
        wait_for(f"the miner's event for challenge {cid}", lambda: answered in events)

    with caplog.at_level(logging.INFO, logger="miner"), running(worker):
        wait_for("both shards submitted", lambda: all(
            q.tasks.get_shard(task_id, k).state == ShardState.SUBMITTED for k in (0, 1)))
        challenge_answered(1, "local copy")
        uri = q.tasks.get_shard(task_id, 1).result_uri
        store._path(uri).unlink()  # the market's store lost shard 1's document
        assert not store.has(uri)
        challenge_answered(4, "local copy")
        worker.archive.remove(task_id, 0)  # the miner's disk lost shard 0's copy
        challenge_answered(0, "store")
        assert q.escrow.withdrawable(miner.address) == 3 * bond
        assert (worker.summary.challenges_answered, worker.summary.challenge_bonds_wei) == (
            3, 3 * bond)

        # Shard 1's document is nowhere now: the miner cannot answer, and says so.
        worker.archive.remove(task_id, 1)
        collateral = q.tasks.get_shard(task_id, 1).collateral
        cid = jobs.challenge_availability(q, devnet.client, task_id, 3)
        wait_for("the miner to report it cannot answer", lambda: any(
            e == "challenge_unanswerable" and i["challenge_id"] == cid for e, i in events))
        status = miner_status(q, miner.address)
        assert [(c["challengeId"], c["deadline"]) for c in status.open_challenges] == [
            (cid, q.arbitration.get_challenge(cid).deadline)]
        assert f"CHALLENGE  #{cid} task {task_id} shard 1 request 3" in status.format()
        assert status.challenges_answered == 3
        devnet.chain.advance_time(window)
        info = jobs.wait_challenge(q, cid, timeout=120, settle_as=devnet.client)
        assert info.status == ChallengeStatus.UNANSWERED
        slash_bps = q.arbitration.params()["fault_slash_bps"]
        assert info.slashed == collateral * slash_bps // 10_000
        wait_for("the loop to drop the settled challenge and shard", lambda: (
            cid not in worker.open_challenges and (task_id, 1) not in worker.pending))
    cannot = [r for r in caplog.records if r.name == "miner" and r.levelno == logging.ERROR
              and f"CANNOT ANSWER availability challenge {cid}" in r.getMessage()]
    assert len(cannot) == 1  # loud, once (retried quietly every poll)
    assert "local copy: missing" in cannot[0].getMessage()
    assert miner_status(q, miner.address).open_challenges == []


class Hooked:
    """The real engine, calling `before()` ahead of every `generate` (the client acting
    while the miner generates)."""

    def __init__(self, engine: Any, before: Callable[[], None]) -> None:
        self._engine = engine
        self._before = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Any) -> Any:
        self._before()
        return self._engine.generate(requests)


def test_challenge_during_a_long_shard_is_answered_between_batches(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore, dead_market: str,
        long_windows: int) -> None:
    """A shard in generation must not make the miner miss a response window: a challenge
    on its earlier shard, opened during the next shard's first batch, is answered before
    the second batch runs (and so long before that shard is submitted).

    The answer is mined a second after the challenge's block, while gas is estimated on that
    block: answerAvailability's gas depends on the time (the window end it rewrites), so a
    plain estimate runs out of gas there; the miner adds a margin."""
    from market import jobs
    from market.chain.contracts import ChallengeStatus

    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market)
    task_id = post_task(devnet, store, engine.model_id, batch(4), shard_size=2)
    opened: list[int] = []
    seen: list[ChallengeStatus] = []

    def client_acts() -> None:
        if worker.current is None or worker.current.shard != 1:
            return
        if not opened:  # first batch of shard 1: challenge a request of shard 0
            opened.append(jobs.challenge_availability(q, devnet.client, task_id, 1))
            devnet.chain.rpc("evm_setNextBlockTimestamp", [devnet.chain.timestamp() + 1])
        else:
            seen.append(q.arbitration.get_challenge(opened[0]).status)

    worker = Worker(account=miner, quarry=q, engines={engine.model_id: Hooked(engine,
                                                                              client_acts)},
                    store=store, max_batch=1, progress=False, challenge_check_s=0)
    assert worker.process_shard(task_id, 0).submitted
    assert worker.process_shard(task_id, 1).submitted
    assert seen == [ChallengeStatus.ANSWERED]  # checked before the second batch
    since = devnet.deployment.deploy_block
    (submitted,) = q.tasks.events("ResultSubmitted", since, taskId=task_id, shard=1)
    assert answer_of(devnet, opened[0])["blockNumber"] < submitted["blockNumber"]
    assert worker.answered == set(opened) and worker.summary.challenges_answered == 1


# ----------------------------------------------------------------------------- probation

def pass_probation(devnet: Any, miner: str) -> None:
    """Committee reports (a quorum of the session's verifiers) scoring `miner` at the pass
    mark, one per epoch for as many epochs as probation lasts, each epoch starting after the
    registration (only those count): what ends a probation on-chain."""
    from market.protocol.canonical import keccak
    from market.protocol.eip712 import Report, quorum_signatures

    c = devnet.q.committee
    epochs, pass_bps = devnet.q.gpu.probation_params()
    for _ in range(epochs):
        epoch = max(c.current_epoch() + 1, c.next_report_epoch())
        devnet.chain.advance_time(c.epoch_start(epoch) - devnet.chain.timestamp())
        report = Report(epoch, (miner,), (pass_bps,), keccak(b"probation"))
        c.submit_reputation(devnet.anyone, report, quorum_signatures(
            report, devnet.verifier_keys[:3], devnet.chain.chain_id, c.address))


@pytest.mark.timeout(240)
def test_miner_on_probation_takes_only_tasks_that_allow_it(
        devnet: Any, model_dir: Path, engine: Any, store: LocalStore,
        dead_market: str) -> None:
    from miner.status import miner_status

    q, miner = devnet.q, anvil_account(12)
    register(devnet, miner, model_dir, dead_market, probation=True)
    epochs, pass_bps = q.gpu.probation_params()
    ordinary = post_task(devnet, store, engine.model_id, batch(3))
    opted_in = post_task(devnet, store, engine.model_id, batch(3, tag="new "),
                         allow_probation=True)
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    poll_interval_s=0.1, progress=False)
    nonce = devnet.chain.w3.eth.get_transaction_count(miner.address)
    summary = worker.run(stop_when_idle=True)
    assert [(o.task_id, o.shard) for o in summary.submitted] == [(opted_in, 0)]
    assert worker.skipped_tasks[ordinary] == (
        "the task does not allow miners on probation, and this miner is on probation (0 of "
        f"{epochs} passing epochs): it may claim only tasks that allow miners on probation "
        "(the committee's challenge tasks, clients that opt in, and by default every client "
        "while no established miner serves the model) until "
        f"{epochs} consecutive committee reports score it at or above {pass_bps} bps")
    assert q.tasks.get_shard(ordinary, 0).state == ShardState.OPEN
    # Skipped without a transaction: the miner sent only the opted-in claim and submit.
    assert devnet.chain.w3.eth.get_transaction_count(miner.address) == nonce + 2
    assert "on probation (0 of" in worker.ineligibility(engine.model_id, 0)
    assert "probation" not in worker.ineligibility(engine.model_id, 0, allow_probation=True)
    status = miner_status(q, miner.address)
    assert (status.on_probation, status.passed_epochs, status.probation_epochs) == (
        True, 0, epochs)
    assert f"standing   ON PROBATION: 0 of {epochs} passing epochs" in status.format()
    assert status.standing == "on probation"

    # The committee's reports end the probation: the skipped task is taken on the next run.
    pass_probation(devnet, miner.address)
    status = miner_status(q, miner.address)
    assert (status.on_probation, status.passed_epochs) == (False, epochs)
    assert "standing   trusted" in status.format()
    summary = worker.run(stop_when_idle=True)
    assert [(o.task_id, o.shard) for o in summary.submitted] == [(opted_in, 0), (ordinary, 0)]
    assert ordinary not in worker.skipped_tasks
