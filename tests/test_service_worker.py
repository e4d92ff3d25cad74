"""The market's background work for real: a private redis-server, Anvil with the contracts,
`market serve` (whose ticker enqueues the work) and Celery worker processes, all from
`LocalStack`.

Covers: indexing through the worker; recommendations for alive miners (one on probation
gets only tasks that allow probation); settlement sweeps finalizing a shard whose window
closed, reclaiming an expired claim, refunding shards past the deadline, settling an
availability challenge the miner never answered and expiring a dispute the committee left
undecided (reporting its silent members), all sent from the settler account while the clients
stay offline; two workers never sending the same settlement twice; a Redis restart losing no
indexing (the ticker and the worker reconnect); and no process left behind, on a normal exit,
on an error, on a failed start, or when the parent is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from market.chain.client import anvil_account
from market.chain.contracts import Ballot, ChallengeStatus, DisputeStatus, GpuSpec, ShardState
from market.chain.devnet import pid_alive
from market.local import processes
from market.local.stack import SETTLER_ACCOUNT, LocalStack

pytestmark = pytest.mark.chain

MODEL_ID = bytes.fromhex("11" * 32)
PRICE = 10**9
MAX_TOKENS = 8
CLIENT = anvil_account(1)
OFFLINE_CLIENT = anvil_account(2)  # posts, challenges or disputes, then sends nothing more
MINERS = (anvil_account(3), anvil_account(4))
NEWCOMER = anvil_account(5)  # registered during a test: on probation
VERIFIERS = [anvil_account(i) for i in range(6, 10)]
VERIFIER_STAKE = 10**18
SETTLER = anvil_account(SETTLER_ACCOUNT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(home=tmp_path_factory.mktemp("stack"), index_interval_s=0.3,
                    sweep_interval_s=0.5) as s:
        print(f"LocalStack startup timings (s): {s.timings}")
        q = s.quarry
        # The test miners are established (off probation), as in conftest.
        deployer, probation = anvil_account(0), q.gpu.probation_params()
        q.gpu.set_probation(deployer, 0, probation[1])
        for i, miner in enumerate(MINERS):
            q.gpu.register(miner, [MODEL_ID], GpuSpec("test GPU", 1024, 1),
                           f"http://127.0.0.1:{9200 + i}", PRICE, 10**18)
        q.gpu.set_probation(deployer, *probation)
        yield s
        pids = s.pids()
    assert pids and not [p for p in pids if pid_alive(p)], "the stack left processes behind"


def board(stack: LocalStack) -> Any:
    from market.service.board import Board

    return Board(stack.settings.board_location)  # the SQLite file, or QUARRY_STACK_POSTGRES


@pytest.fixture(scope="module")
def committee(stack: LocalStack) -> list[Any]:
    """Four verifiers registered on the stack's chain and seated (disputes need them)."""
    from conftest import until_seated

    for v in VERIFIERS:
        stack.quarry.committee.register(v, VERIFIER_STAKE)
    until_seated(stack.quarry)
    return VERIFIERS


def post_task(stack: LocalStack, *, shards: int = 1, shard_size: int = 2,
              deadline_in: int = 100_000, client: Any = CLIENT,
              allow_probation: bool = False) -> int:
    q = stack.quarry
    task_id, _ = q.tasks.create_task(
        client, model_id=MODEL_ID, input_root=b"\x01" * 32, input_uri="sha256:" + "ab" * 32,
        num_requests=shards * shard_size, shard_size=shard_size,
        max_tokens_per_request=MAX_TOKENS, price_per_token=PRICE,
        deadline=q.chain.timestamp() + deadline_in, allow_probation=allow_probation)
    return task_id


def state(stack: LocalStack, task_id: int, shard: int) -> ShardState:
    return stack.quarry.tasks.get_shard(task_id, shard).state


def settler_txs(stack: LocalStack, from_block: int) -> list[dict[str, Any]]:
    """Every transaction the settler sent from `from_block` on, with its receipt status."""
    w3 = stack.quarry.chain.w3
    out = []
    for n in range(from_block, w3.eth.block_number + 1):
        for tx in w3.eth.get_block(n, full_transactions=True)["transactions"]:
            if tx["from"] == SETTLER.address:
                receipt = w3.eth.get_transaction_receipt(tx["hash"])
                out.append({"to": tx["to"], "status": receipt["status"], "block": n})
    return out


@pytest.mark.timeout(60)
def test_index_through_the_worker(stack: LocalStack) -> None:
    from market.marketapi import MarketAPI
    from market.service import worker

    task_id = post_task(stack, shards=2)
    job = stack.wait_until(lambda: board(stack).job(task_id), f"task {task_id} on the board")
    assert [s["shard"] for s in job["shards"]] == [0, 1]
    # The same through a task sent by hand (another worker or the ticker may hold the lock).
    worker.configure(stack.settings)
    head = stack.quarry.chain.block_number()
    result = worker.celery_app.send_task(worker.TASK_INDEX).get(timeout=30)
    assert result.get("skipped") == "locked" or result["cursor"] >= head
    with MarketAPI(stack.market_url) as api:
        assert api.job(task_id)["taskId"] == task_id
        assert api.health()["ok"]


@pytest.mark.timeout(60)
def test_a_held_lock_outlives_its_ttl_and_is_freed_on_release(stack: LocalStack) -> None:
    """The keeper thread extends the token the holder's thread took (the lock is not
    thread-local, or every extension would fail and the lock lapse under a live holder,
    which is what a task slower than a third of the TTL on a busy machine met)."""
    import redis

    from market.service.worker import redis_lock

    client = redis.Redis.from_url(stack.redis_url)
    name = "quarry:lock:test-keeper"
    ttl_s = 1
    with redis_lock(name, ttl_s=ttl_s, client=client) as held:
        assert held
        with redis_lock(name, ttl_s=ttl_s, client=client) as again:
            assert not again, "taken: a second holder is refused"
        lived = time.monotonic()
        while time.monotonic() - lived < 3 * ttl_s:  # three TTLs: extended, or it lapsed
            assert client.exists(name), "the lock lapsed under its live holder"
            time.sleep(ttl_s / 5)
    assert not client.exists(name), "released on exit"
    client.close()


@pytest.mark.timeout(60)
def test_recommendations_for_alive_miners(stack: LocalStack) -> None:
    from market.marketapi import MarketAPI

    alive, silent = MINERS
    stack.quarry.gpu.register(NEWCOMER, [MODEL_ID], GpuSpec("test GPU", 1024, 1),
                              "http://127.0.0.1:9299", PRICE, 10**18)
    with MarketAPI(stack.market_url) as api:
        api.heartbeat(alive, {"state": "idle"})
        api.heartbeat(NEWCOMER, {"state": "idle"})
    task_id = post_task(stack, shards=3, shard_size=1)
    opted_in = post_task(stack, shards=1, shard_size=1, allow_probation=True)
    ours = (task_id, opted_in)

    def recommended(miner: Any) -> list[tuple[int, int]]:
        stored = board(stack).recommendations(miner.address)
        rows = stored[0] if stored else []
        return sorted((r["taskId"], r["shard"]) for r in rows if r["taskId"] in ours)

    assert stack.wait_until(lambda: len(recommended(alive)) == 4 and recommended(alive),
                      "recommendations for the alive miner") == [
        (task_id, 0), (task_id, 1), (task_id, 2), (opted_in, 0)]
    # The one on probation is recommended only the task that allows probation.
    assert stack.wait_until(lambda: recommended(NEWCOMER),
                            "recommendations for the miner on probation") == [(opted_in, 0)]
    assert board(stack).miner(NEWCOMER.address)["onProbation"] is True
    assert board(stack).recommendations(silent.address) is None  # no heartbeat: not alive


@pytest.mark.timeout(60)
def test_market_worker_command(stack: LocalStack, tmp_path: Path) -> None:
    """`market worker --config FILE` joins the same Redis and answers pings; a bad config
    is one line and exit code 1."""
    s = stack.settings
    config = tmp_path / "market.toml"
    config.write_text(f'[market]\nredis_url = "{s.redis_url}"\ndeployment = "{s.deployment}"\n'
                      f'db_path = "{s.db_path}"\nstore_dir = "{s.store_dir}"\n')
    node = processes.worker_nodename("cli-worker")
    proc = processes.spawn([sys.executable, "-m", "market.cli", "worker", "--config",
                            str(config), "--name", node], name="market worker",
                           log_path=tmp_path / "worker.log")
    proc.extra["node"] = node
    try:
        processes.wait_worker(proc, s.redis_url, timeout=30)
    finally:
        proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()
    config.write_text('[market]\nredis_ur = "x"\n')
    bad = subprocess.run([sys.executable, "-m", "market.cli", "worker", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith("market: error: unknown market setting redis_ur (from "), line


@pytest.mark.timeout(60)
def test_sweep_finalizes_a_shard_whose_window_closed(stack: LocalStack) -> None:
    q = stack.quarry
    task_id = post_task(stack)
    miner = MINERS[0]
    before = q.escrow.withdrawable(miner.address)
    q.tasks.claim_shard(miner, task_id, 0)
    q.tasks.submit_result(miner, task_id, 0, b"\x02" * 32, "sha256:" + "cd" * 32, 5)
    start = q.chain.block_number()
    stack.wait_until(lambda: (task_id, 0) in board(stack).due_finalize(2**62),
               "the submission on the board")
    assert state(stack, task_id, 0) == ShardState.SUBMITTED  # the window is still open
    q.chain.advance_time(int(q.deployment.params["challenge_window"]) + 1)
    stack.wait_until(lambda: state(stack, task_id, 0) == ShardState.FINALIZED, "finalization")
    assert q.escrow.withdrawable(miner.address) - before == 5 * PRICE
    txs = settler_txs(stack, start)
    assert [(t["to"], t["status"]) for t in txs] == [(q.tasks.address, 1)]


@pytest.mark.timeout(60)
def test_sweep_reclaims_an_expired_claim(stack: LocalStack) -> None:
    q = stack.quarry
    task_id = post_task(stack)
    miner = MINERS[1]
    q.tasks.claim_shard(miner, task_id, 0)
    stack.wait_until(lambda: board(stack).expired_claims(2**62).count((task_id, 0)),
               "the claim on the board")
    q.chain.advance_time(int(q.deployment.params["claim_timeout"]) + 1)
    stack.wait_until(lambda: q.tasks.events("ClaimReclaimed", taskId=task_id),
               "the reclaim")
    assert state(stack, task_id, 0) == ShardState.OPEN  # reopened: the deadline is far off
    event = q.tasks.events("ClaimReclaimed", taskId=task_id)[0]
    assert event["miner"] == miner.address and event["reopened"] is True
    # The board follows: the shard is open again for the other miner.
    stack.wait_until(lambda: any(s["taskId"] == task_id for s in
                           board(stack).open_shards(MODEL_ID, q.chain.timestamp())),
               "the reopened shard on the board")


@pytest.mark.timeout(60)
def test_sweep_refunds_unfinished_shards_after_the_deadline(stack: LocalStack) -> None:
    q = stack.quarry
    task_id = post_task(stack, shards=3, deadline_in=40)
    stack.wait_until(lambda: board(stack).job(task_id), "the task on the board")
    q.chain.advance_time(41)
    stack.wait_until(lambda: len(q.tasks.events("ShardRefunded", taskId=task_id)) == 3,
               "three refunds")
    assert {state(stack, task_id, k) for k in range(3)} == {ShardState.REFUNDED}
    assert q.escrow.escrowed(task_id) == 0


@pytest.mark.timeout(90)
def test_two_workers_never_send_the_same_settlement_twice(stack: LocalStack) -> None:
    from market.service import worker

    extra = stack.add_worker()
    try:
        q = stack.quarry
        shards = 6
        task_id = post_task(stack, shards=shards, shard_size=1)
        for k in range(shards):
            m = MINERS[k % 2]
            q.tasks.claim_shard(m, task_id, k)
            q.tasks.submit_result(m, task_id, k, b"\x03" * 32, "sha256:" + "ef" * 32, 1 + k)
        start = q.chain.block_number()
        stack.wait_until(lambda: len([p for p in board(stack).due_finalize(2**62)
                                if p[0] == task_id]) == shards,
                   "the submissions on the board")
        q.chain.advance_time(int(q.deployment.params["challenge_window"]) + 1)
        # Besides the ticker's, a burst of sweeps for both workers at once.
        worker.configure(stack.settings)
        results = [worker.celery_app.send_task(worker.TASK_SWEEP) for _ in range(8)]
        for r in results:
            r.get(timeout=60)
        stack.wait_until(lambda: all(state(stack, task_id, k) == ShardState.FINALIZED
                               for k in range(shards)), "every shard finalized")
        # Let a few more sweeps run on a board that may still lag the chain.
        worker.celery_app.send_task(worker.TASK_SWEEP).get(timeout=30)
        txs = settler_txs(stack, start)
        assert len(txs) == shards, txs  # one transaction per shard, none repeated
        assert all(t["status"] == 1 and t["to"] == q.tasks.address for t in txs)
        assert len(q.tasks.events("ShardFinalized", taskId=task_id)) == shards
    finally:
        stack.stop_worker(extra)


def settler_calls(stack: LocalStack, from_block: int) -> list[tuple[str, int]]:
    """(contract address, status) of the settler's transactions from `from_block` on."""
    return [(t["to"], t["status"]) for t in settler_txs(stack, from_block)]


@pytest.mark.timeout(90)
def test_sweep_settles_an_unanswered_challenge_for_an_offline_client(
        stack: LocalStack) -> None:
    """The miner bills a shard whose results it never publishes; the client challenges one
    request and goes offline. Past the response window the workers settle it: the client's
    escrow gets the shard's budget and the bond back, to the wei; the miner's slashed
    collateral is burned."""
    q = stack.quarry
    client, miner = OFFLINE_CLIENT, MINERS[0]
    task_id = post_task(stack, client=client)
    q.tasks.claim_shard(miner, task_id, 0)
    q.tasks.submit_result(miner, task_id, 0, b"\x04" * 32, "sha256:" + "0f" * 32,
                          2 * MAX_TOKENS)
    budget = q.tasks.shard_budget(task_id, 0)
    collateral = q.tasks.get_shard(task_id, 0).collateral
    stake = q.gpu.miner_info(miner.address).stake
    bond = q.arbitration.min_availability_bond()
    challenge_id, _ = q.arbitration.challenge_availability(client, task_id, 0, 1, bond)
    before = q.escrow.withdrawable(client.address)
    stack.wait_until(lambda: board(stack).due_settle(2**62) == [(challenge_id, task_id, 0)],
                     "the challenge on the board")
    start = q.chain.block_number()
    assert q.arbitration.get_challenge(challenge_id).status == ChallengeStatus.OPEN
    q.chain.advance_time(q.arbitration.response_window() + 1)
    stack.wait_until(lambda: q.arbitration.get_challenge(challenge_id).status
                     == ChallengeStatus.UNANSWERED, "the settlement")
    assert q.tasks.get_shard(task_id, 0).state == ShardState.REFUNDED
    assert q.escrow.withdrawable(client.address) - before == budget + bond
    assert q.gpu.miner_info(miner.address).stake == stake - collateral
    stack.wait_until(lambda: board(stack).job(task_id)["challenges"][0]["status"]
                     == "Unanswered", "the settlement on the board")
    assert settler_calls(stack, start) == [(q.arbitration.address, 1)]


@pytest.mark.timeout(120)
def test_sweep_expires_an_undecided_dispute_and_reports_the_silent_members(
        stack: LocalStack, committee: list[Any]) -> None:
    """One member of four votes, the others stay silent, the client is offline. Past the
    deadline the workers expire the dispute (the bond goes back to the client), report the
    three silent members (a tenth of each one's stake to the client) and finalize the shard."""
    from market.protocol import Receipt, Vote, keccak, output_hash, receipts_tree

    q = stack.quarry
    client, miner = OFFLINE_CLIENT, MINERS[1]
    task_id = post_task(stack, client=client)
    q.tasks.claim_shard(miner, task_id, 0)
    receipts = [Receipt(task_id, 0, i, keccak(b"%d" % i), output_hash("x", [1, 2]), 2,
                        MODEL_ID) for i in range(2)]
    tree = receipts_tree(receipts)
    q.tasks.submit_result(miner, task_id, 0, tree.root, "sha256:" + "1f" * 32, tree.total)
    refund = q.tasks.shard_budget(task_id, 0) - tree.total * PRICE
    arb = q.arbitration
    bond = arb.min_bond()
    dispute_id, _ = arb.open_dispute(client, task_id, 0, receipts[0], tree.proof(0), "e", bond)
    voter, silent = committee[0], [v.address for v in committee[1:]]
    arb.cast_votes(miner, dispute_id, False,
                   [Vote(dispute_id, False).sign(voter.key, q.chain.chain_id, arb.address)])
    stakes = {m: q.committee.verifier_info(m).stake for m in silent}
    burn = q.chain.call(arb.contract.functions.BURN())
    before, burned = q.escrow.withdrawable(client.address), q.escrow.withdrawable(burn)
    stack.wait_until(lambda: board(stack).due_expire(2**62) == [(dispute_id, task_id, 0)],
                     "the dispute on the board")
    start = q.chain.block_number()
    q.chain.advance_time(arb.get_dispute(dispute_id).deadline - q.chain.timestamp() + 1)
    stack.wait_until(lambda: {arb.ballot_of(dispute_id, m) for m in silent} == {Ballot.ABSENT},
                     "the silent members reported")
    assert arb.get_dispute(dispute_id).status == DisputeStatus.EXPIRED
    assert arb.ballot_of(dispute_id, voter.address) == Ballot.NO_FAULT
    stack.wait_until(lambda: q.tasks.get_shard(task_id, 0).state == ShardState.FINALIZED,
                     "the unfrozen shard finalized")
    assert q.escrow.withdrawable(client.address) - before == bond + refund
    assert q.escrow.withdrawable(burn) - burned == sum(  # the absences: burned
        s * 1000 // 10_000 for s in stakes.values())
    # expire, report, finalize: each once
    assert settler_calls(stack, start) == [(arb.address, 1), (arb.address, 1),
                                           (q.tasks.address, 1)]
    stack.wait_until(lambda: board(stack).job(task_id)["disputes"][0]["absent"] == 3,
                     "the absences on the board")
    assert board(stack).due_report(q.chain.timestamp()) == []


@pytest.mark.timeout(90)
def test_redis_restart_loses_no_indexing(stack: LocalStack) -> None:
    workers_before = [w.pid for w in stack.workers]
    market_before = stack.market.pid if stack.market else None
    # Down long enough for the ticker to meet the outage (it enqueues every 0.3 s).
    stack.restart_redis(down_s=1.0)
    task_id = post_task(stack)
    stack.wait_until(lambda: board(stack).job(task_id),
                     f"task {task_id} indexed after the restart", timeout=60)
    log = (stack.logs / "market.log").read_text()
    assert "cannot reach Redis" in log and "background work resumed" in log
    # The same worker and market processes carried on: they reconnected.
    assert [w.pid for w in stack.workers] == workers_before
    assert all(w.alive() for w in stack.workers)
    assert stack.market is not None and stack.market.pid == market_before
    assert stack.market.alive()


@pytest.mark.timeout(60)
def test_failed_start_leaves_no_process(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part running (two-process worker pool included), then the start fails at the
    last step: the stack stops all of it."""
    seen: list[int] = []
    real_wait = processes.wait_worker

    def wait_then_fail(proc: processes.ManagedProcess, url: str, timeout: float = 60) -> None:
        real_wait(proc, url, timeout)
        seen.extend(stack.pids())
        raise processes.ProcessError("injected failure after every part started")

    stack = LocalStack(home=tmp_path / "s", worker_concurrency=2)
    monkeypatch.setattr(processes, "wait_worker", wait_then_fail)
    with pytest.raises(processes.ProcessError, match="injected"):
        stack.start()
    # redis, anvil, market, worker + its 2 pool processes
    assert len(seen) >= 6, seen
    assert [p for p in seen if pid_alive(p)] == []
    assert stack.pids() == []


@pytest.mark.timeout(60)
def test_killed_parent_leaves_no_process(tmp_path: Path) -> None:
    """A parent killed with SIGKILL (no cleanup at all): its Redis and Celery worker die
    with it, by the kernel's parent-death signal."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from market.local import processes
        from market.service.settings import MarketSettings
        redis = processes.start_redis(Path({str(tmp_path)!r}) / "redis")
        settings = MarketSettings(redis_url=redis.extra["url"],
                                  deployment=Path({str(tmp_path)!r}) / "none.json")
        w = processes.start_worker(settings, name="orphan-check",
                                   log_path=Path({str(tmp_path)!r}) / "w.log")
        print(" ".join(map(str, redis.group() + w.group())), flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 2, line
        assert all(pid_alive(p) for p in pids)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    assert [p for p in pids if pid_alive(p)] == []
