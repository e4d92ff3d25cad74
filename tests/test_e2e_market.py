"""The marketplace end to end, every part real: a private redis-server, Anvil with the
contracts, `market serve` with its Celery worker (`LocalStack`), miners as `miner register`
and `miner run` processes serving the tiny model, and the client SDK and CLI.

The miners are new identities, hence on probation: with no established miner for the model
(a fresh market) the client's tasks let them claim by default; the tests opt in explicitly
(`allow_probation`), and a submission that refuses them (`--no-probation`) is refused in one
line naming the option.

Covers: a job split across two miners, each paid for its own tokens to the wei; a miner
killed mid-shard losing its claim at expiry, another miner completing the shard, and the
client compensated from the first miner's collateral; a market restart with its board
deleted and a Redis restart losing no job; and the CLI's one-line refusals of bad input.
Tampered result documents are covered in tests/test_client.py (same SDK, real chain and
market), bad input to each component in the client, miner and service tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import write_miner_config

from market.chain.client import anvil_account
from market.chain.contracts import ShardState
from market.local.processes import ManagedProcess, spawn
from market.local.stack import LocalStack

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BIN = Path(sys.executable).parent
PRICE = 10**9
CLIENT = anvil_account(1)
MINERS = {name: anvil_account(i) for name, i in (("a", 3), ("b", 4))}



@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(home=tmp_path_factory.mktemp("e2e"), index_interval_s=0.3,
                    sweep_interval_s=0.5) as s:
        yield s


@pytest.fixture(scope="module")
def miners(stack: LocalStack) -> dict[str, Path]:
    """Two registered miners serving a small tiny model; returns their config files."""
    from market.model.create import create_model

    model_dir = stack.home / "model"
    create_model(model_dir, layers=2, hidden=64)
    configs = {}
    for name, account in MINERS.items():
        cfg = stack.home / f"miner-{name}.toml"
        write_miner_config(cfg, account.key, stack.market_url, model_dir, price=PRICE,
                           port=9100 + len(configs), max_batch=4)
        out = subprocess.run([str(BIN / "miner"), "register", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert stack.quarry.gpu.on_probation(account.address)  # a new identity
        configs[name] = cfg
    return configs


def start_miner(stack: LocalStack, cfg: Path, *extra: str) -> ManagedProcess:
    return spawn([str(BIN / "miner"), "run", "--config", str(cfg), "--no-progress", *extra],
                 name=f"miner {cfg.stem}", log_path=stack.logs / f"{cfg.stem}.log")


@pytest.fixture
def client(stack: LocalStack) -> Iterator[Any]:
    from client import Client

    with Client(stack.rpc_url, CLIENT.key, stack.market_url) as c:
        yield c


def wait_alive(stack: LocalStack, addresses: set[str], timeout: float = 120) -> None:
    """Until every one of `addresses` heartbeats to the market (its engine loaded), so a job
    posted next is open to all of them, however long one took to start."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {m["address"] for m in httpx.get(f"{stack.market_url}/miners",
                                                   timeout=10).json() if m["alive"]}
        if addresses <= alive:
            return
        assert time.monotonic() < deadline, f"miners {sorted(addresses - alive)} never alive"
        time.sleep(0.5)


def prompts(n: int, tag: str) -> list[str]:
    return [f"{tag}: tell me about item {i}." for i in range(n)]


def finalized_payments(stack: LocalStack, task_id: int) -> dict[str, int]:
    paid: dict[str, int] = {}
    for e in stack.quarry.tasks.events("ShardFinalized", taskId=task_id):
        paid[e["miner"]] = paid.get(e["miner"], 0) + int(e["payment"])
    return paid


@pytest.mark.timeout(240)
def test_job_split_across_two_miners_pays_each_for_its_tokens(
        stack: LocalStack, miners: dict[str, Path], client: Any) -> None:
    q = stack.quarry
    procs = [start_miner(stack, cfg) for cfg in miners.values()]
    try:
        wait_alive(stack, {m.address for m in MINERS.values()})  # else one may take it all
        job = client.submit(prompts(16, "split"), model="quarry-tiny", max_tokens=12,
                            price=PRICE, shard_size=2, deadline=3600,
                            allow_probation=True)
        job.wait(progress=False, timeout=120)
        outputs = job.results()  # raises unless every receipt, proof and hash checks out
        assert [o.index for o in outputs] == list(range(16))
        q.chain.advance_time(int(q.deployment.params["challenge_window"]) + 1)
        final = job.wait(progress=False, timeout=60, finalized=True)
    finally:
        for p in procs:
            p.stop()
    tokens: dict[str, int] = {}
    for s in final.shards:
        assert s.miner is not None
        tokens[s.miner] = tokens.get(s.miner, 0) + s.tokens_used
    assert set(tokens) == {m.address for m in MINERS.values()}, "both miners took shards"
    # Each miner's tokens are what its own receipts count, and it is paid exactly for them.
    by_receipts: dict[str, int] = {}
    for o in outputs:
        by_receipts[o.miner] = by_receipts.get(o.miner, 0) + o.receipt.output_tokens
    assert by_receipts == tokens
    assert finalized_payments(stack, job.task_id) == {m: t * PRICE for m, t in tokens.items()}
    budget = 16 * 12 * PRICE
    assert final.paid == sum(tokens.values()) * PRICE
    assert final.refunded == budget - final.paid
    assert q.escrow.escrowed(job.task_id) == 0


@pytest.mark.timeout(240)
def test_killed_miner_loses_claim_and_client_is_compensated(
        stack: LocalStack, miners: dict[str, Path], client: Any) -> None:
    q = stack.quarry
    a, b = MINERS["a"], MINERS["b"]
    stake_before = q.gpu.miner_info(a.address).stake
    comp_before = q.escrow.withdrawable(CLIENT.address)
    # One slow shard (16 requests, 128 tokens, one at a time) so the kill lands mid-shard.
    job = client.submit(prompts(16, "killed"), model="quarry-tiny", max_tokens=128,
                        price=PRICE, shard_size=16, deadline=7200, allow_probation=True)
    proc_a = start_miner(stack, miners["a"], "--max-batch", "1")
    try:
        stack.wait_until(lambda: q.tasks.get_shard(job.task_id, 0).state == ShardState.CLAIMED,
                         "miner a to claim the shard", timeout=90)
        os.killpg(proc_a.pid, signal.SIGKILL)
        proc_a.popen.wait(timeout=10)
    finally:
        proc_a.stop()
    shard = q.tasks.get_shard(job.task_id, 0)
    assert shard.state == ShardState.CLAIMED and shard.miner == a.address
    collateral = shard.collateral
    assert collateral == 16 * 128 * PRICE * q.tasks.params()["collateral_bps"] // 10_000

    # The claim expires; the market's sweep (or the next miner) reclaims it.
    q.chain.advance_time(q.tasks.params()["claim_timeout"] + 1)
    proc_b = start_miner(stack, miners["b"])
    try:
        job.wait(progress=False, timeout=150)
        outputs = job.results()
    finally:
        proc_b.stop()
    assert {o.miner for o in outputs} == {b.address}
    reclaims = q.tasks.events("ClaimReclaimed", taskId=job.task_id)
    assert len(reclaims) == 1 and reclaims[0]["miner"] == a.address and reclaims[0]["reopened"]
    penalty = collateral * q.tasks.params()["reclaim_penalty_bps"] // 10_000
    assert int(reclaims[0]["penalty"]) == penalty
    assert q.escrow.withdrawable(CLIENT.address) - comp_before == penalty
    assert stake_before - q.gpu.miner_info(a.address).stake == penalty
    assert job.status().compensation == penalty


@pytest.mark.timeout(240)
def test_market_and_redis_restart_lose_no_job(
        stack: LocalStack, miners: dict[str, Path], client: Any) -> None:
    from market.marketapi import MarketAPI

    job = client.submit(prompts(6, "restart"), model="quarry-tiny", max_tokens=8,
                        price=PRICE, shard_size=3, deadline=3600, allow_probation=True)
    api = MarketAPI(stack.market_url)
    stack.wait_until(lambda: _job_or_none(api, job.task_id), "the board to index the job",
                     timeout=90)
    # Lose everything off-chain: the market process, its SQLite board, every Redis key.
    assert stack.market is not None
    stack.market.stop()
    stack.market = None
    for suffix in ("", "-wal", "-shm"):
        Path(f"{stack.settings.db_path}{suffix}").unlink(missing_ok=True)
    stack.restart_redis()
    stack.restart_market()
    board_job = stack.wait_until(lambda: _job_or_none(api, job.task_id),
                                 "the rebuilt board to show the job again", timeout=90)
    assert board_job["numRequests"] == 6 and board_job["numShards"] == 2
    # Model manifests (off-chain, uploaded by the miners) come back from the store's disk.
    assert "quarry-tiny" in {m["name"] for m in api.models()}
    proc = start_miner(stack, miners["a"])
    try:
        job.wait(progress=False, timeout=120)
        assert len(job.results()) == 6
    finally:
        proc.stop()
    api.close()


def _job_or_none(api: Any, task_id: int) -> dict[str, Any] | None:
    from market.marketapi import MarketError

    try:
        return api.job(task_id)
    except MarketError:
        return None


@pytest.mark.timeout(120)
def test_cli_refuses_bad_input_in_one_line(stack: LocalStack, miners: dict[str, Path],
                                           tmp_path: Path) -> None:
    q = stack.quarry
    cfg = tmp_path / "client.toml"
    cfg.write_text(f'[client]\nkey = "0x{bytes(CLIENT.key).hex()}"\n'
                   f'market_url = "{stack.market_url}"\nrpc_url = "{stack.rpc_url}"\n')
    cfg.chmod(0o600)  # a raw key others can read is warned about: one more line
    good = ('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": '
            '{"model": "quarry-tiny", "prompt": "hi", "max_tokens": 4}}')
    cases = {  # what the one line says, the batch, the flags
        "line 2": (good + "\n{not json\n", []),
        "no registered miner serves model": (
            good.replace("quarry-tiny", "gpt-nothing") + "\n", []),
        "`client submit --allow-probation`": (good + "\n", ["--no-probation"]),  # only new miners
    }
    tasks_before = q.tasks.task_count()
    balance_before = q.chain.balance(CLIENT.address)
    for expected, (text, flags) in cases.items():
        batch = tmp_path / "batch.jsonl"
        batch.write_text(text)
        out = subprocess.run([str(BIN / "client"), "submit", str(batch), "--config", str(cfg),
                              *flags], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], out.stderr
    too_low = tmp_path / "batch.jsonl"
    too_low.write_text(good + "\n")
    out = subprocess.run([str(BIN / "client"), "submit", str(too_low), "--config", str(cfg),
                          "--price", "1", "--allow-probation"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out
    assert "payment too low" in out.stderr
    assert q.tasks.task_count() == tasks_before
    assert q.chain.balance(CLIENT.address) == balance_before
