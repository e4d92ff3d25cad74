"""Swarms on the market: miners registered on the session Anvil join the 8-layer model's
swarm through `MarketAPI` against a real uvicorn market, which plans the layers over the
live members (Parallax Phase 1; CG-BP by setting), re-plans under the churn rules on a join
and when a member goes silent past the TTL, checks and relays the members' EIP-712
consents, and serves the on-chain swarm id only once swarmInfo matches the plan's terms.
The join checks refuse unregistered miners, miners of another model, forged signatures and
stale timestamps."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from eth_account.signers.local import LocalAccount
from test_service_app import serve, settings_for

from market.chain.client import anvil_account
from market.chain.contracts import GpuSpec
from market.chain.deployment import Deployment
from market.marketapi import MarketAPI, MarketError
from market.model.create import llama_config
from market.protocol.messages import sign, swarm_join, swarm_terms_consent
from market.scheduler.churn import ParallaxScheduler, uncovered_layers
from market.scheduler.cluster import Placement
from market.scheduler.live import (
    CannotCover,
    LiveMember,
    PlanState,
    check_plan,
    live_cluster,
    model_spec_from_architecture,
    plan_live,
)
from market.scheduler.parallax_phase1 import Phase1Config
from market.service.board import Board

if TYPE_CHECKING:
    from conftest import Devnet, RpcFront

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent
ARCH = llama_config(layers=8, hidden=64, vocab_size=300, heads=2, kv_heads=1,
                    intermediate=192, max_positions=256)
MANIFEST = {"format": "quarry-manifest/1", "name": "swarm-8", "architecture": ARCH,
            "files": {"model.safetensors": "ab" * 32}}
MODEL = model_spec_from_architecture("swarm-8", ARCH)
# per member (anvil accounts 12..16): memory (MiB; a layer with its KV room is ~1.7 MiB, so
# none holds all 8 layers), declared TFLOP/s, ask (wei per token)
MEMORY = (8, 6, 4, 5, 7)
TFLOPS = (20.0, 10.0, 12.0, 8.0, 15.0)
ASKS = (10**9, 3 * 10**9, 2 * 10**9, 10**9, 10**9)
STAKE = 10**18


@dataclass
class Swarm:
    net: Devnet
    api: MarketAPI
    url: str
    board: Board
    model_id: str
    accounts: list[LocalAccount]  # the five candidate members, registered for the model

    def body(self, i: int, *, timestamp: int | None = None, **over: Any) -> dict[str, Any]:
        """Member i's signed join (fields overridable before signing)."""
        fields = {"memory_mib": MEMORY[i], "tflops": TFLOPS[i],
                  "endpoint": f"tcp://127.0.0.1:{9400 + i}", "public_key": f"{i:040d}",
                  "rtts": {a.address: 0.001 * (1 + (i + j) % 3)
                           for j, a in enumerate(self.accounts) if j != i},
                  "price_per_token": ASKS[i], **over}
        return swarm_join(self.accounts[i], self.model_id, timestamp=timestamp, **fields)

    def join(self, i: int, **kw: Any) -> dict[str, Any]:
        body = self.body(i, **kw)
        return post(self.url, f"/swarms/{self.model_id}/members", body)

    def live(self, indices: range | list[int]) -> list[LiveMember]:
        """The members as the market sees them, for recomputing its plan here."""
        out = []
        for i in indices:
            b = self.body(i)
            out.append(LiveMember(b["miner"], b["memory_mib"], b["tflops"], b["endpoint"],
                                  b["public_key"], b["rtts"], b["price_per_token"]))
        return out


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a raw body; MarketError with the status on a refusal (as MarketAPI raises)."""
    r = httpx.post(url + path, json=body, timeout=30)
    if r.status_code >= 400:
        raise MarketError(r.json()["detail"], r.status_code)
    return dict(r.json())


def register_members(net: Devnet, model_id: bytes) -> list[LocalAccount]:
    accounts = [anvil_account(i) for i in range(12, 17)]
    for i, a in enumerate(accounts):
        net.q.gpu.register(a, [model_id], GpuSpec("RTX 4090", 24576, 1),
                           f"http://127.0.0.1:{9400 + i}", ASKS[i], STAKE)
    return accounts


@pytest.fixture
def swarm_factory(devnet: Devnet, deployment_file: Path,
                  tmp_path: Path) -> Iterator[Any]:
    """Start a market with the given settings and the swarm model's manifest uploaded."""
    stack: list[Any] = []
    registered: dict[str, list[LocalAccount]] = {}

    def make(rpc_url: str | None = None, **settings: Any) -> Swarm:
        """`rpc_url`: the market reaches the devnet there (a counting front, say). These
        tests join many times a second, far more often than members do (once per
        `heartbeat_interval_s`): the per-miner limit is lifted unless given
        (`test_admission` has it)."""
        settings.setdefault("swarm_joins_per_miner_per_s", 1000.0)
        deployment = deployment_file
        if rpc_url is not None:
            d = Deployment.load(deployment_file)
            deployment = Deployment(d.chain_id, rpc_url, dict(d.addresses), d.deploy_block,
                                    d.deployer, dict(d.params)).save(
                tmp_path / f"deployment{len(stack)}.json")
        s = settings_for(tmp_path / f"m{len(stack)}", deployment, **settings)
        cm = serve(s)
        url = cm.__enter__()
        stack.append(cm)
        api = MarketAPI(url, timeout=30)
        model_id = api.register_model(MANIFEST)
        if model_id not in registered:
            registered[model_id] = register_members(devnet, bytes.fromhex(model_id[2:]))
        return Swarm(devnet, api, url, Board(s.db_path), model_id, registered[model_id])

    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def test_join_is_refused_unless_registered_for_the_model_signed_and_fresh(
        swarm_factory: Any) -> None:
    s: Swarm = swarm_factory()
    net = s.net
    path = f"/swarms/{s.model_id}/members"
    cases = {
        "unregistered": (swarm_join(net.outsider, s.model_id, memory_mib=8, tflops=1,
                                    endpoint="tcp://127.0.0.1:1", public_key="0" * 40,
                                    price_per_token=1), 403, "not a registered miner"),
        # a registered miner that lists only the conftest's model, not this one
        "wrong model": (swarm_join(net.miner, s.model_id, memory_mib=8, tflops=1,
                                   endpoint="tcp://127.0.0.1:1", public_key="0" * 40,
                                   price_per_token=1), 403, "does not list model"),
        "stale": (s.body(0, timestamp=int(time.time()) - 300), 400, "off the market's clock"),
    }
    forged = s.body(0)
    forged["memory_mib"] = 80  # changed after signing: the signer recovers as someone else
    cases["altered"] = (forged, 401, "is signed by")
    other = s.body(0)
    other["signature"] = s.body(1)["signature"]
    cases["signed by another member"] = (other, 401, "is signed by")
    for name, (body, status, match) in cases.items():
        with pytest.raises(MarketError, match=match) as info:
            post(s.url, path, body)
        assert info.value.status == status, name
    # the path names one model, the body another
    with pytest.raises(MarketError, match="not 0x") as info:
        post(s.url, f"/swarms/0x{'11' * 32}/members", s.body(0))
    assert info.value.status == 400
    # a model the market has no manifest of, that the miner does list
    alone = swarm_join(net.miner, "0x" + net.MODEL_ID.hex(), memory_mib=8, tflops=1,
                       endpoint="tcp://127.0.0.1:1", public_key="0" * 40, price_per_token=1)
    with pytest.raises(MarketError, match="no manifest") as info:
        post(s.url, f"/swarms/0x{net.MODEL_ID.hex()}/members", alone)
    assert info.value.status == 404
    # nothing was admitted: no member, so no plan
    with pytest.raises(MarketError, match="no live members") as info:
        s.api.swarm_plan(s.model_id)
    assert info.value.status == 404
    # bounded inputs: 422 before any check
    for bad in ({"memory_mib": 0}, {"tflops": -1.0}, {"endpoint": "http://x:1"},
                {"public_key": "short"}, {"rtts": {"0x12": 1.0}}):
        body = {**s.body(0), **bad}
        r = httpx.post(s.url + path, json=body, timeout=30)
        assert r.status_code == 422, (bad, r.text)


def test_four_members_of_different_memory_get_a_covering_plan(swarm_factory: Any) -> None:
    s: Swarm = swarm_factory()
    answers = [s.api.swarm_join(s.accounts[i], s.model_id, memory_mib=MEMORY[i],
                                tflops=TFLOPS[i], endpoint=f"tcp://127.0.0.1:{9400 + i}",
                                public_key=f"{i:040d}", price_per_token=ASKS[i])
               for i in range(4)]
    assert answers[0]["version"] is None  # one member cannot hold 8 layers
    plan = s.api.swarm_plan(s.model_id)
    assert answers[-1]["version"] == plan["version"]
    assert plan["algorithm"] == "parallax" and plan["num_layers"] == 8
    ranges = {m["address"]: tuple(m["layers"]) for m in plan["members"]}
    assert uncovered_layers(ranges, 8) == []
    four = s.accounts[:4]
    assert set(ranges) | set(plan["standby"]) == {a.address for a in four}
    for i, a in enumerate(four):  # each within its memory, as a member checks it
        assert check_plan(plan, MODEL, a.address, MEMORY[i]) == ranges.get(a.address)
    last = four[3].address
    assert answers[3]["layers"] == (list(ranges[last]) if last in ranges else None)
    # the head serves layer 0 with the most memory
    memory = {a.address: MEMORY[i] for i, a in enumerate(four)}
    firsts = [n for n, (a, _) in ranges.items() if a == 0]
    assert plan["head"] == max(firsts, key=lambda n: (memory[n], -int(n, 16)))
    # the terms: serving members ascending, shares = layers served, the highest ask
    terms = plan["terms"]
    assert terms["members"] == sorted(ranges, key=lambda n: int(n, 16))
    assert terms["shares"] == [ranges[n][1] - ranges[n][0] for n in terms["members"]]
    asks = {a.address: ASKS[i] for i, a in enumerate(four)}
    assert terms["price_per_token"] == max(asks[n] for n in terms["members"])
    assert terms["head"] == plan["head"] and plan["swarm_id"] is None
    assert plan["predicted_s_per_token"] > 0
    # deterministic: the same members give the same plan, and reading it again re-plans nothing
    again = plan_live(MODEL, list(reversed(s.live(range(4)))))
    assert again.ranges == ranges and again.head == plan["head"]
    assert s.api.swarm_plan(s.model_id)["version"] == plan["version"]
    # one member alone cannot hold the model
    with pytest.raises(CannotCover, match="cannot hold"):
        plan_live(MODEL, s.live([2]))
    # `market plan --swarm` prints it
    res = subprocess.run([sys.executable, "-m", "market.cli", "plan", "--swarm", s.model_id,
                          "--market", s.url], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"live plan v{plan['version']}" in res.stdout
    for n, (a, b) in ranges.items():
        assert f"{n} [{a}, {b})" in res.stdout
    res = subprocess.run([sys.executable, "-m", "market.cli", "plan", "--swarm", "0x12",
                          "--market", s.url], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1
    assert "--swarm must be 0x" in res.stderr


def test_a_join_and_a_silent_member_replan_under_the_churn_rules(swarm_factory: Any) -> None:
    s: Swarm = swarm_factory(swarm_member_ttl_s=2.0)
    first = [s.body(i) for i in range(4)]
    for body in first:
        post(s.url, f"/swarms/{s.model_id}/members", body)
    v1 = s.api.swarm_plan(s.model_id)
    # a fifth member joins: the next version, placed by the churn rules from v1
    joined = s.join(4)
    v2 = s.api.swarm_plan(s.model_id)
    assert v2["version"] == v1["version"] + 1 == joined["version"]
    r1 = {m["address"]: tuple(m["layers"]) for m in v1["members"]}
    r2 = {m["address"]: tuple(m["layers"]) for m in v2["members"]}
    assert uncovered_layers(r2, 8) == []
    stored = s.board.swarm_plan(_identity(s), s.model_id, v1["version"])
    assert stored is not None
    state = PlanState.from_dict(stored["state"]["placement"])
    cfg = Phase1Config.for_workload()
    sched = ParallaxScheduler(live_cluster(MODEL, s.live(range(4))), phase1=cfg,
                              placement=Placement(state.ranges, state.pipelines, "parallax"),
                              cv_floor=state.cv_floor)
    event = sched.join(live_cluster(MODEL, s.live(range(5))).server(s.accounts[4].address))
    # these members trip no re-plan: the others keep their layers, the joiner takes the
    # bottleneck range
    assert event.replanned is None and event.range is not None
    joiner = s.accounts[4].address
    assert {n: r for n, r in r2.items() if n != joiner} == r1
    assert r2[joiner] == event.range
    assert v2["replanned"] == f"join {joiner} -> {event.range}"
    assert {n: r for n, r in sched.placement.ranges.items() if r[1] > r[0]} == r2
    # member 1 goes silent; the others keep joining (strictly newer timestamps) until the
    # market drops it after the TTL
    gone = s.accounts[1].address
    ts = int(time.time())
    deadline = time.monotonic() + 30
    while True:
        ts += 1
        for i in (0, 2, 3, 4):
            s.join(i, timestamp=ts)
        v3 = s.api.swarm_plan(s.model_id)
        if v3["version"] > v2["version"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert v3["version"] == v2["version"] + 1
    r3 = {m["address"]: tuple(m["layers"]) for m in v3["members"]}
    assert gone not in r3 and gone not in v3["standby"]
    assert uncovered_layers(r3, 8) == []
    # its layers were replicated: the CV trips a global re-plan, which here keeps the
    # survivors' layers
    assert v3["replanned"].startswith(f"leave {gone} (re-plan: layer-load CV")
    assert r3 == {n: r for n, r in r2.items() if n != gone}
    # its last join, replayed (no newer than the stored one), does not bring it back; the
    # replay must be that very body: the loop above advanced `ts` faster than the wall clock,
    # so a body signed at `ts - 5` could be newer than it and count as a real rejoin
    post(s.url, f"/swarms/{s.model_id}/members", first[1])
    assert s.api.swarm_plan(s.model_id)["version"] == v3["version"]


def test_cgbp_by_setting(swarm_factory: Any) -> None:
    s: Swarm = swarm_factory(swarm_algorithm="cgbp")
    for i in range(4):
        s.join(i)
    plan = s.api.swarm_plan(s.model_id)
    assert plan["algorithm"] == "cgbp"
    ranges = {m["address"]: tuple(m["layers"]) for m in plan["members"]}
    assert uncovered_layers(ranges, 8) == []
    for i in range(4):
        check_plan(plan, MODEL, s.accounts[i].address, MEMORY[i])


def _identity(s: Swarm) -> str:
    from market.service.board import deployment_identity

    return deployment_identity(s.net.q)


def test_consents_are_checked_and_the_registered_swarm_against_the_chain(
        swarm_factory: Any) -> None:
    s: Swarm = swarm_factory()
    q = s.net.q
    for i in range(4):
        s.join(i)
    plan = s.api.swarm_plan(s.model_id)
    version, terms = plan["version"], plan["terms"]
    by = {a.address: a for a in s.accounts}
    members = [by[m] for m in terms["members"]]  # in the terms' (ascending) order
    assert len(members) >= 2
    consent = swarm_terms_consent(terms)
    sigs = {a.address: q.gpu.sign_swarm_consent(consent, a) for a in members}
    first, second = members[0], members[1]
    # wrong signer: another member's signature under this member's name
    with pytest.raises(MarketError, match="is signed by") as info:
        s.api.swarm_consent(first, s.model_id, version, q.gpu.nonces(first.address),
                            sigs[second.address])
    assert info.value.status == 401
    # wrong version: none such; a signature over other terms
    with pytest.raises(MarketError, match="no plan version") as info:
        s.api.swarm_consent(first, s.model_id, version + 1, 0, sigs[first.address])
    assert info.value.status == 404
    # a nonce that is not the member's current one
    stale = consent.with_nonce(5).sign(first.key, q.chain_id, q.gpu.address)
    with pytest.raises(MarketError, match="current GPURegistry") as info:
        s.api.swarm_consent(first, s.model_id, version, 5, stale)
    assert info.value.status == 409
    # a miner that is not a member of the terms
    outsider = next(a for a in s.accounts[:4] if a.address not in terms["members"]) \
        if len(members) < 4 else s.accounts[4]
    with pytest.raises(MarketError, match="not a member") as info:
        s.api.swarm_consent(outsider, s.model_id, version, 0,
                            consent.sign(outsider.key, q.chain_id, q.gpu.address))
    assert info.value.status == 403
    for a in members:
        assert not s.api.swarm_consents(s.model_id)["complete"]
        s.api.swarm_consent(a, s.model_id, version, q.gpu.nonces(a.address), sigs[a.address])
    got = s.api.swarm_consents(s.model_id, version)
    assert got["complete"] and got["version"] == version
    assert list(got["signatures"]) == terms["members"]
    # the head registers the swarm on-chain with the relayed signatures
    head = by[plan["head"]]
    relayed = [bytes.fromhex(got["signatures"][m]["signature"][2:]) for m in terms["members"]]
    swarm_id, _ = q.gpu.register_swarm(head, consent, relayed)
    with pytest.raises(MarketError, match="not the head") as info:
        s.api.swarm_registered(next(a for a in members if a is not head), s.model_id,
                               version, swarm_id)
    assert info.value.status == 403
    with pytest.raises(MarketError, match="has no swarm") as info:
        s.api.swarm_registered(head, s.model_id, version, swarm_id + 1)
    assert info.value.status == 409
    # a swarm of other terms (the same members with other shares) is not this plan's
    other = consent.__class__(consent.model_id, consent.head, consent.members,
                              tuple(x + 1 for x in consent.shares), consent.price_per_token,
                              0, consent.deadline)
    other_id, _ = q.gpu.register_swarm(head, other, [q.gpu.sign_swarm_consent(other, a)
                                                     for a in members])
    with pytest.raises(MarketError, match="shares") as info:
        s.api.swarm_registered(head, s.model_id, version, other_id)
    assert info.value.status == 409
    assert s.api.swarm_plan(s.model_id)["swarm_id"] is None
    assert s.api.swarm_registered(head, s.model_id, version, swarm_id) == {
        "version": version, "swarm_id": swarm_id}
    assert s.api.swarm_plan(s.model_id)["swarm_id"] == swarm_id
    # a consent to a superseded version is refused once a join re-plans
    s.join(4)
    assert s.api.swarm_plan(s.model_id)["version"] == version + 1
    with pytest.raises(MarketError, match="superseded") as info:
        s.api.swarm_consent(first, s.model_id, version, q.gpu.nonces(first.address),
                            sigs[first.address])
    assert info.value.status == 409
    # the registration report must be signed by the head it names
    body = {"head": head.address, "version": version, "swarm_id": swarm_id,
            "timestamp": int(time.time()), "signature": sign(first, b"x")}
    with pytest.raises(MarketError, match="is signed by") as info:
        post(s.url, f"/swarms/{s.model_id}/registered", body)
    assert info.value.status == 401


def test_a_manifest_declaring_300000_layers_is_refused_not_planned(
        swarm_factory: Any) -> None:
    """Anyone can upload a manifest; planning its 300,000 layers for one joining miner took
    10 to 18 s inside the board's write transaction (heartbeats waited, the index fell
    behind). Planning is now bounded by MAX_LAYERS: the join is stored and answered with no
    plan, and the plan is a 409 naming the limit."""
    s: Swarm = swarm_factory()
    huge = {**MANIFEST, "name": "swarm-huge",
            "architecture": {**ARCH, "num_hidden_layers": 300_000}}
    huge_id = s.api.register_model(huge)
    member = anvil_account(17)
    s.net.q.gpu.register(member, [bytes.fromhex(huge_id[2:])], GpuSpec("H100", 81920, 1),
                         "http://127.0.0.1:9417", ASKS[0], STAKE)
    answer = s.api.swarm_join(member, huge_id, memory_mib=1 << 24, tflops=1000.0,
                              endpoint="tcp://127.0.0.1:9417", public_key="9" * 40,
                              price_per_token=ASKS[0])
    assert (answer["version"], answer["layers"]) == (None, None)
    with pytest.raises(MarketError, match="declares 300000 layers; swarms are planned for "
                       "at most 1024") as info:
        s.api.swarm_plan(huge_id)
    assert info.value.status == 409
    assert s.board.swarm_plan(_identity(s), huge_id) is None
    # the port of a stage endpoint is a port
    body = s.body(0, endpoint="tcp://127.0.0.1:99999")
    r = httpx.post(f"{s.url}/swarms/{s.model_id}/members", json=body, timeout=30)
    assert r.status_code == 422 and "endpoint" in r.text


def test_reading_the_plan_never_writes_nor_asks_the_chain(swarm_factory: Any,
                                                          rpc_front: RpcFront) -> None:
    """`GET /swarms/{id}/plan` re-planned in a write transaction and read the chain's clock
    on every call. Now a member gone silent past the TTL leaves the plan as stored (no
    version, no RPC call) until a member's join re-plans."""
    # A TTL with room for slow joins on a busy machine: the others' second joins must land
    # after 3 s and before member 4 expires, and they stay alive 3 s past its expiry.
    ttl = 10.0
    s: Swarm = swarm_factory(swarm_member_ttl_s=ttl, rpc_url=rpc_front.url)
    s.join(4)
    joined_4 = time.monotonic()  # its last_seen (the market's clock) is no later than this
    for i in (0, 1, 2, 3):
        s.join(i)
    plan = s.api.swarm_plan(s.model_id)
    time.sleep(max(0.0, joined_4 + 3.0 - time.monotonic()))
    ts = int(time.time()) + 1
    for i in range(4):  # the others stay; the same declarations re-plan nothing
        assert s.join(i, timestamp=ts)["version"] == plan["version"]
    assert time.monotonic() < joined_4 + ttl, "the others' joins outlasted member 4's TTL"
    time.sleep(max(0.0, joined_4 + ttl + 0.5 - time.monotonic()))  # 4 is now past the TTL
    rpc_calls, versions = rpc_front.singles + len(rpc_front.batches), _versions(s)
    for _ in range(5):
        assert s.api.swarm_plan(s.model_id) == plan
    assert rpc_front.singles + len(rpc_front.batches) == rpc_calls
    assert _versions(s) == versions and versions[-1] == plan["version"]
    replanned = s.join(0, timestamp=ts + 1)  # the next join drops it
    assert replanned["version"] == plan["version"] + 1
    after = s.api.swarm_plan(s.model_id)
    assert s.accounts[4].address not in {m["address"] for m in after["members"]}


def test_old_plan_versions_are_deleted_with_their_consents(swarm_factory: Any) -> None:
    """A member re-declaring its memory at every join made a new version each time, and
    none was ever deleted: only the latest PLAN_VERSIONS_KEPT remain (and registered ones)."""
    from market.service.state import PLAN_VERSIONS_KEPT

    s: Swarm = swarm_factory()
    for i in range(4):
        s.join(i)
    ts = int(time.time())
    for k in range(2 * PLAN_VERSIONS_KEPT):
        s.join(0, timestamp=ts + 1 + k, memory_mib=MEMORY[0] + 1 + k % 2)
    latest = s.api.swarm_plan(s.model_id)["version"]
    assert latest > PLAN_VERSIONS_KEPT + 2
    assert _versions(s) == list(range(latest - PLAN_VERSIONS_KEPT + 1, latest + 1))


def _versions(s: Swarm) -> list[int]:
    import sqlite3

    with sqlite3.connect(s.board.db_path) as conn:
        return [v for (v,) in conn.execute(
            "SELECT version FROM swarm_plans WHERE model_id = ? ORDER BY version",
            (s.model_id,))]


def test_a_version_2_market_state_gains_the_swarm_tables_keeping_its_rows(
        tmp_path: Path) -> None:
    """The swarm tables are migration 3: a file of version 2 opens at the current version
    with its rows intact, and stores swarm members, plans and consents after."""
    import sqlite3

    from market.service.state import STATE_VERSION

    path = tmp_path / "b.sqlite"
    miner = anvil_account(12).address
    Board(path).record_heartbeat(miner, 7, {"load": 1})
    with sqlite3.connect(path) as conn:
        for table in ("swarm_members", "swarm_plans", "swarm_consents"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("PRAGMA user_version = 2")
    board = Board(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == STATE_VERSION >= 3
        assert conn.execute("SELECT miner, timestamp FROM heartbeats").fetchall() == [
            (miner, 7)]
    body = {"miner": miner, "memory_mib": 8, "tflops": 1.5, "endpoint": "tcp://h:1",
            "public_key": "0" * 40, "rtts": {}, "price_per_token": 2**70, "timestamp": 5}
    assert board.record_swarm_member("dep", "0x" + "ab" * 32, body)
    assert not board.record_swarm_member("dep", "0x" + "ab" * 32, body)  # no newer: ignored
    [row] = board.swarm_members("dep", "0x" + "ab" * 32)
    assert row["price_per_token"] == 2**70 and row["memory_mib"] == 8
    assert board.swarm_members("other deployment", "0x" + "ab" * 32) == []
