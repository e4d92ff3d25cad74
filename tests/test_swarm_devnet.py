"""A swarm end to end, every part real: Redis, Anvil with the contracts, `market serve` with
its Celery worker (`LocalStack`, as tests/test_e2e_market.py), and `miner run` processes with
`[miner] swarm = true` and different memory caps serving the 8-layer model as one swarm.

One scenario on one module-scoped stack (lean: few requests and tokens):

1. four members join; the market plans (each member's range within its cap), the members
   consent, the head registers the swarm on-chain and claims for it;
2. a client job completes through the pipeline across the four processes, its outputs equal
   to the single-process engine's token for token (greedy, fp32);
3. a fifth member joins while a job runs: it gets layers in a new plan (a new swarm) and the
   job completes, outputs again equal;
4. a non-head member is SIGKILLed mid-job: the job completes (over the re-planned survivors)
   or its claim is released by the standard rule;
5. every finalized shard pays each member of the swarm that claimed it exactly its
   `swarmSplit` share (escrow credits to the wei), and every reclaim slashes the penalty
   from that swarm's head alone, never from another member's stake.

Then, on the same stack, every other architecture the engines serve (`market.model.archs`:
Qwen 2 and 3, Mistral, Gemma 2 and 3, Phi-3) is served by three more `miner run` processes
as a swarm of 2 of its 6 layers each, and a client job's outputs equal the single-process
engine's, past the sliding window where the architecture has one. Each architecture's
members are fresh accounts (a miner registers once); the stack is shared, so each adds only
its members' start-up and one job.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_miner_config

from market.chain.client import Chain, anvil_account
from market.chain.contracts import ShardState
from market.local.processes import ManagedProcess, spawn
from market.local.stack import LocalStack

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BIN = Path(sys.executable).parent
PRICE = 10**9
CLIENT = anvil_account(1)
# name -> (anvil account, memory cap MiB, declared TFLOP/s). With the KV room the market
# reserves per layer (8 sessions), the caps hold 1, 2, 2 and 3 layers of the 8: no member
# holds the model alone and no three of the first four hold it together, so the plan needs
# all four; the fifth (2 layers) joins as a replica of a range.
MEMBERS = {"a": (12, 3, 2.0), "b": (13, 5, 1.0), "c": (14, 5, 1.5), "d": (15, 7, 1.0),
           "e": (16, 5, 2.0)}
FIRST_FOUR = ("a", "b", "c", "d")
# The other architectures' swarms: three members each, whose caps hold 2 of the model's 6
# layers (so the plan needs all three, and on Gemma each stage has a sliding and a full
# attention layer). Each member's balance is set to 10,000 ETH (Anvil funds only 0 to 19).
ARCH_LAYERS = 6
ARCH_ACCOUNTS = {"gemma2": 17, "qwen2": 20, "qwen3": 23, "mistral": 26, "gemma3_text": 29,
                 "phi3": 32}
ARCH_MEMBERS = ((5, 1.0), (5, 1.5), (5, 2.0))  # (memory cap MiB, TFLOP/s)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(home=tmp_path_factory.mktemp("swarm"), index_interval_s=0.3,
                    sweep_interval_s=0.5) as s:
        yield s


@pytest.fixture(scope="module")
def model_dir(stack: LocalStack) -> Path:
    from market.model.create import create_model

    path = stack.home / "model"
    create_model(path, layers=8, hidden=64)
    return path


@pytest.fixture(scope="module")
def members(stack: LocalStack, model_dir: Path) -> dict[str, Path]:
    """Five registered swarm members' config files."""
    return register_members(stack, model_dir, MEMBERS)


def register_members(stack: LocalStack, model_dir: Path,
                     members: dict[str, tuple[int, int, float]]) -> dict[str, Path]:
    """Swarm members of `model_dir` (name -> (anvil account, memory cap MiB, TFLOP/s)),
    registered in-process (the same `register_miner` the command runs): their config files."""
    from miner.config import MinerConfig
    from miner.register import register_miner

    configs = {}
    for name, (account, cap, tflops) in members.items():
        cfg = write_miner_config(stack.home / f"swarm-{name}.toml", anvil_account(account).key,
                                 stack.market_url, model_dir, price=PRICE, port=_free_port(),
                                 max_batch=4)
        with cfg.open("a") as f:
            # one shard claimed at a time: a job's shards span the re-plans
            f.write(f"swarm = true\nmemory_mib = {cap}\ntflops = {tflops}\n"
                    "max_shards_in_flight = 1\n"
                    f"stage_port = {_free_port()}\nstate_dir = \"{stack.home / name}\"\n")
        register_miner(MinerConfig.load(cfg))
        configs[name] = cfg
    return configs


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_member(stack: LocalStack, cfg: Path) -> ManagedProcess:
    return spawn([str(BIN / "miner"), "run", "--config", str(cfg), "--no-progress"],
                 name=f"member {cfg.stem}", log_path=stack.logs / f"{cfg.stem}.log")


def plan_of(stack: LocalStack, model_id: bytes) -> dict[str, Any] | None:
    from market.marketapi import MarketAPI, MarketError

    with MarketAPI(stack.market_url) as api:
        try:
            return api.swarm_plan("0x" + model_id.hex())
        except MarketError:
            return None


def registered_plan(stack: LocalStack, model_id: bytes) -> dict[str, Any]:
    """Wait for a plan whose swarm is registered on-chain (and checked by the market)."""
    def ready() -> dict[str, Any] | None:
        plan = plan_of(stack, model_id)
        return plan if plan is not None and plan.get("swarm_id") is not None else None

    plan = stack.wait_until(ready, "the swarm to be planned and registered", timeout=120)
    assert plan is not None
    return plan


def reference(model_dir: Path, texts: list[str], max_tokens: int) -> list[tuple[int, ...]]:
    """The single-process engine's tokens for the prompts (greedy, fp32)."""
    from market.engine.torch_engine import TorchEngine

    engine = TorchEngine(model_dir)
    try:
        reqs = [engine.request_from_body({"prompt": t, "max_tokens": max_tokens})
                for t in texts]
        return [tuple(o.token_ids) for o in engine.generate(reqs)]
    finally:
        engine.close()


def prompts(n: int, tag: str) -> list[str]:
    return [f"{tag}: tell me about item {i}." for i in range(n)]


@pytest.mark.timeout(360)
def test_swarm_serves_pays_takes_a_joiner_and_survives_a_kill(
        stack: LocalStack, model_dir: Path, members: dict[str, Path]) -> None:
    from client import Client
    from client.sdk import JobTimeout
    from market.model.manifest import load_manifest

    q = stack.quarry
    model_id = load_manifest(model_dir).model_id
    address: dict[str, str] = {n: anvil_account(MEMBERS[n][0]).address for n in MEMBERS}
    escrow_before = {a: q.escrow.withdrawable(a) for a in address.values()}
    stake_before = {a: q.gpu.miner_info(a).stake for a in address.values()}
    procs = {n: start_member(stack, members[n]) for n in FIRST_FOUR}
    try:
        plan = registered_plan(stack, model_id)
        assert {m["address"] for m in plan["members"]} == {address[n] for n in FIRST_FOUR}
        for m in plan["members"]:  # within each member's cap
            assert m["memory_mib"] == MEMBERS[_name(address, m["address"])][1]
        info = q.gpu.swarm_info(plan["swarm_id"])
        assert info.head == plan["head"] and info.active
        assert dict(zip(info.members, info.shares, strict=True)) == {
            m["address"]: m["layers"][1] - m["layers"][0] for m in plan["members"]}

        with Client(stack.rpc_url, CLIENT.key, stack.market_url) as client:
            # 2. one job through the four processes
            texts = prompts(4, "swarm")
            job = client.submit(texts, model="quarry-tiny", max_tokens=6, price=PRICE,
                                shard_size=2, deadline=3600, allow_probation=True)
            # 3. a fifth member starts now (it joins within seconds) ...
            procs["e"] = start_member(stack, members["e"])
            job.wait(progress=False, timeout=120)
            outputs = job.results()  # every receipt, proof and hash checked
            assert [o.token_ids for o in outputs] == reference(model_dir, texts, 6)
            assert {o.miner for o in outputs} == {plan["head"]}
            jobs = [job.task_id]

            # ... while the next job runs: it gets layers, the job goes on
            texts2 = prompts(8, "joiner")
            job2 = client.submit(texts2, model="quarry-tiny", max_tokens=32, price=PRICE,
                                 shard_size=2, deadline=3600, allow_probation=True)
            stack.wait_until(lambda: address["e"] in {
                m["address"] for m in (plan_of(stack, model_id) or {"members": []})["members"]},
                "the fifth member to get layers", timeout=90)
            job2.wait(progress=False, timeout=150)
            assert [o.token_ids for o in job2.results()] == reference(model_dir, texts2, 32)
            jobs.append(job2.task_id)

            # 4. a member killed mid-job
            current = registered_plan(stack, model_id)
            victim = next(n for n in MEMBERS if address[n] != current["head"]
                          and address[n] in {m["address"] for m in current["members"]})
            texts3 = prompts(4, "killed")
            job3 = client.submit(texts3, model="quarry-tiny", max_tokens=48, price=PRICE,
                                 shard_size=4, deadline=3600, allow_probation=True)
            stack.wait_until(lambda: q.tasks.get_shard(job3.task_id, 0).state
                             == ShardState.CLAIMED, "the head to claim", timeout=90)
            os.killpg(procs[victim].pid, signal.SIGKILL)
            procs[victim].popen.wait(timeout=10)
            jobs.append(job3.task_id)
            try:
                job3.wait(progress=False, timeout=150)
                completed = True
            except JobTimeout:  # released instead: the sweep reclaims it at expiry
                completed = False
            if completed:
                assert [o.token_ids for o in job3.results()] == reference(model_dir, texts3, 48)
            else:
                q.chain.advance_time(q.tasks.params()["claim_timeout"] + 1)
                stack.wait_until(lambda: q.tasks.events("ClaimReclaimed", taskId=job3.task_id),
                                 "the expired claim to be reclaimed", timeout=60)

            # 5. settlement: each swarm's members get exactly their split, to the wei
            q.chain.advance_time(int(q.deployment.params["challenge_window"]) + 1)
            for task_id in jobs:
                stack.wait_until(lambda t=task_id: all(  # type: ignore[misc]
                    q.tasks.get_shard(t, k).state in (ShardState.FINALIZED, ShardState.OPEN,
                                                      ShardState.REFUNDED)
                    for k in range(q.tasks.get_task(t).num_shards)),
                    f"task {task_id} to settle", timeout=90)
    finally:
        for p in procs.values():
            p.stop()
    expected: dict[str, int] = dict.fromkeys(address.values(), 0)
    for task_id in jobs:
        for ev in q.tasks.events("ShardFinalized", taskId=task_id):
            swarm_id = q.tasks.shard_swarm(task_id, int(ev["shard"]))
            assert swarm_id != 0, "every shard was claimed by a swarm"
            for member, part in q.gpu.swarm_split(swarm_id, int(ev["payment"])).items():
                expected[member] += part
    assert sum(expected.values()) > 0
    assert {a: q.escrow.withdrawable(a) - escrow_before[a] for a in address.values()} == \
        expected
    # A released claim's penalty is slashed from the head of the swarm that held it, alone.
    slashed: dict[str, int] = dict.fromkeys(address.values(), 0)
    for task_id in jobs:
        for ev in q.tasks.events("ClaimReclaimed", taskId=task_id):
            held = [c for c in q.tasks.events("SwarmShardClaimed", taskId=task_id,
                                              shard=int(ev["shard"]))
                    if c["blockNumber"] <= ev["blockNumber"]][-1]
            assert q.gpu.swarm_info(int(held["swarmId"])).head == ev["miner"]
            slashed[ev["miner"]] += int(ev["penalty"])
    assert {a: stake_before[a] - q.gpu.miner_info(a).stake for a in address.values()} == \
        slashed


def _name(address: dict[str, str], addr: str) -> str:
    return next(n for n, a in address.items() if a == addr)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", list(ARCH_ACCOUNTS))
def test_each_architecture_serves_as_a_swarm_with_the_single_process_engines_tokens(
        stack: LocalStack, arch: str) -> None:
    """Three `miner run` processes serve a 6-layer model of `arch` as one swarm (2 layers
    each): a job through them gives the single-process engine's tokens, past the sliding
    window where the architecture has one."""
    from client import Client
    from market.engine.torch_engine import TorchEngine
    from market.model.archs import TINY_SLIDING_WINDOW
    from market.model.create import create_model

    first = ARCH_ACCOUNTS[arch]
    members = {f"{arch}-{i}": (first + i, cap, tflops)
               for i, (cap, tflops) in enumerate(ARCH_MEMBERS)}
    chain = Chain(stack.rpc_url)
    for account, _, _ in members.values():  # Anvil funds only 0 to 19
        chain.set_balance(anvil_account(account).address, 10**22)
    name = f"quarry-tiny-{arch}".replace("_", "-")
    model_dir = stack.home / arch
    model_id = create_model(model_dir, name=name, arch=arch, layers=ARCH_LAYERS,
                            hidden=64).model_id
    configs = register_members(stack, model_dir, members)
    address = {anvil_account(account).address for account, _, _ in members.values()}
    procs = [start_member(stack, cfg) for cfg in configs.values()]
    try:
        plan = registered_plan(stack, model_id)
        assert {m["address"] for m in plan["members"]} == address
        assert sorted(tuple(m["layers"]) for m in plan["members"]) == [(0, 2), (2, 4), (4, 6)]
        texts = prompts(3, arch)
        engine = TorchEngine(model_dir)
        reqs = [engine.request_from_body({"prompt": t, "max_tokens": 8}) for t in texts]
        assert all(len(r.prompt_ids) > TINY_SLIDING_WINDOW for r in reqs)
        want = [o.token_ids for o in engine.generate(reqs)]
        engine.close()
        with Client(stack.rpc_url, CLIENT.key, stack.market_url) as client:
            job = client.submit(texts, model=name, max_tokens=8, price=PRICE, shard_size=2,
                                deadline=3600, allow_probation=True)
            job.wait(progress=False, timeout=150)
            outputs = job.results()  # every receipt, proof and hash checked
        assert [o.token_ids for o in outputs] == want
        assert {o.miner for o in outputs} == {plan["head"]}
    finally:
        for p in procs:
            p.stop()
