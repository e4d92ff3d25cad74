"""Dispute votes end to end: a real Anvil (session devnet, four committee members of equal
stake: a quorum weighs three of them), a real market app (uvicorn in a thread, with its
committee relay), a real Redis and a real Celery scoring worker on the tiny model.

Miners run the real engine through `miner.worker.Worker`: one honestly, one with the declared
`random` cheating mode. The client disputes one output of each; four `DisputeDesk`s (one a
liar) judge, vote through the relay and record the votes of a quorum. Checked to the wei: the
bond split of the no-fault outcome and the slash/refund/reward of the fault outcome. Evidence
cases (withheld, tampered, client-side input) are judged without scoring.

The committee's gaps, each performed through the real desks: a verifier seated after a
dispute opened does not vote on it (the dispute's snapshot judges it); members that do not
vote cannot block a dispute: the working ones record their votes before the deadline, and
the idle ones are reported absent when it expires and lose their seats and 10% of their
stake, burned. The leader's remedy against a withheld challenge answer (availability
challenge, then settlement or dispute) runs against the same chain.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_utils import to_checksum_address

from market.chain.client import anvil_account
from market.chain.contracts import (
    Ballot,
    ChallengeStatus,
    DisputeStatus,
    GpuSpec,
    ShardState,
)
from market.chain.devnet import free_port
from market.chain.errors import revert_class
from market.jobs import challenge_info, open_dispute, wait_dispute
from market.marketapi import MarketAPI
from market.protocol.eip712 import Vote
from market.protocol.merkle import input_tree
from market.protocol.messages import committee_message
from market.protocol.precision import Precision
from market.protocol.requests import parse_jsonl
from market.protocol.results import Completion, ShardResult, build_shard_result
from market.store import content_uri
from verifier.disputes import DisputeDesk, valid_votes, vote_body
from verifier.shards import DisputeDeferred, scoring_line

pytestmark = [pytest.mark.chain, pytest.mark.timeout(300)]

PRICE = 10**9
STAKE = 10**18
MAX_TOKENS = 6
BPS = 10_000
QUEUE = "quarry.score.test-disputes"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market.model.create import create_model

    d = tmp_path_factory.mktemp("models") / "quarry-dispute-test"
    create_model(d, name="quarry-dispute-test", layers=2, hidden=64, max_positions=256)
    return d


@pytest.fixture(scope="module")
def engine(model_dir: Path, one_torch_thread: None) -> Iterator[Any]:
    from market.engine.factory import load_engine

    eng = load_engine("torch", model_dir, max_batch_size=4)
    yield eng
    eng.close()


@dataclasses.dataclass
class Scoring:
    redis_url: str
    scorer: Any  # ScoringClient on QUEUE, served by one real scoring worker


@pytest.fixture(scope="module")
def scoring(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scoring]:
    """Redis and one scoring worker; every desk in these tests shares the worker's queue
    (scores are deterministic, so sharing changes nothing)."""
    from market.local.processes import start_redis
    from verifier.scoring_worker import ScoringClient, start_scoring_worker

    root = tmp_path_factory.mktemp("scoring")
    redis = start_redis(root / "redis")
    procs = [redis]
    try:
        redis_url = redis.extra["url"]
        procs.append(start_scoring_worker(redis_url, QUEUE, root / "scoring.log"))
        yield Scoring(redis_url, ScoringClient(redis_url, QUEUE, model_dir, timeout_s=120))
    finally:
        for proc in reversed(procs):
            proc.stop()


@dataclasses.dataclass
class Stack:
    api: MarketAPI
    redis_url: str
    scorer: Any


@pytest.fixture
def stack(devnet: Any, scoring: Scoring, tmp_path: Path) -> Iterator[Stack]:
    """A market app of its own per test: the chain is rolled back after each test (dispute
    ids start again at 1), so a relay kept across tests would hold stale votes that still
    verify (same Arbitration address)."""
    from market.service.app import serve_in_thread
    from market.service.settings import MarketSettings

    settings = MarketSettings(
        redis_url=scoring.redis_url, deployment=devnet.deployment.save(
            tmp_path / "deployment.json"),
        store_dir=tmp_path / "store", db_path=tmp_path / "board.sqlite", port=free_port(),
        index_interval_s=60.0)
    with MarketAPI(settings.url) as api, serve_in_thread(settings):
        yield Stack(api, scoring.redis_url, scoring.scorer)


# ---------------------------------------------------------------------------- helpers


def batch(n: int, tag: str = "") -> bytes:
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": "quarry-dispute-test",
                                  "prompt": f"{tag}the river {i} runs",
                                  "max_tokens": MAX_TOKENS}}) for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def register_miner(devnet: Any, index: int, model_id: bytes, precision: str = "fp32") -> Any:
    miner = anvil_account(index)
    devnet.q.gpu.register(miner, [model_id], GpuSpec("Test GPU", 1024, 1),
                          f"http://127.0.0.1:{9300 + index}", PRICE, STAKE, [precision])
    return miner


def post_task(devnet: Any, api: MarketAPI, model_id: bytes, data: bytes, *,
              input_uri: str | None = None, max_tokens: int = MAX_TOKENS) -> int:
    """One task (one shard) for `data`; `input_uri` points the task at other bytes. Miners
    registered in these tests are on probation: the tasks allow them."""
    uri = api.put(data)
    hashes = [r.request_hash for r in parse_jsonl(data)]
    task_id, _ = devnet.q.tasks.create_task(
        devnet.client, model_id=model_id, input_root=input_tree(hashes).root,
        input_uri=input_uri or uri, num_requests=len(hashes), shard_size=len(hashes),
        max_tokens_per_request=max_tokens, price_per_token=PRICE,
        deadline=devnet.chain.timestamp() + 3600, allow_probation=True)
    return task_id


def serve_by_hand(devnet: Any, api: MarketAPI, task_id: int, miner: Any, data: bytes, *,
                  tamper: bool = False, upload: bool = True) -> ShardResult:
    """A miner's part without an engine: claim, fixed outputs, sign, (upload,) submit.
    `tamper` changes one item's text after signing; `upload=False` never publishes."""
    q = devnet.q
    q.tasks.claim_shard(miner, task_id, 0)
    task = q.tasks.get_task(task_id)
    completions = [Completion(r.index, r.custom_id, r.request_hash, f"out {r.index}",
                              (5, 6, 7), "length", 3) for r in parse_jsonl(data)]
    doc = build_shard_result(task_id=task_id, shard=0, model_id=task.model_id,
                             completions=completions, private_key=miner.key,
                             miner=miner.address, chain_id=q.chain_id,
                             task_registry=q.tasks.address)
    published = doc
    if tamper:
        items = list(doc.items)
        items[1] = dataclasses.replace(items[1], text="not what was signed")
        published = dataclasses.replace(doc, items=tuple(items))
    data_out = published.to_bytes()
    uri = api.put(data_out) if upload else content_uri(data_out)
    q.tasks.submit_result(miner, task_id, 0, doc.result_root, uri, doc.tokens_used)
    return doc


def votes_on(api: MarketAPI, reader: Any, dispute_id: int) -> list[dict[str, Any]]:
    return api.messages(reader, epoch=0, kind="vote", topic=str(dispute_id))


def withheld_dispute(devnet: Any, api: MarketAPI, tag: str) -> int:
    """A dispute the desks judge without scoring: the miner committed a result it never
    published, and the client disputes with the receipt the miner showed it."""
    q = devnet.q
    task_id = post_task(devnet, api, devnet.MODEL_ID, batch(2, tag))
    doc = serve_by_hand(devnet, api, task_id, devnet.miner, batch(2, tag), upload=False)
    item = doc.items[1]
    dispute_id, _ = q.arbitration.open_dispute(
        devnet.client, task_id, 0, item.receipt, item.proof,
        q.tasks.get_shard(task_id, 0).result_uri, q.arbitration.min_bond())
    return dispute_id


def by_address(addresses: Any) -> list[str]:
    return sorted((to_checksum_address(a) for a in addresses), key=lambda a: int(a, 16))


# ---------------------------------------------------------------------------- the committee


def test_committee_resolves_honest_and_cheating_outputs_to_the_wei(
        devnet: Any, stack: Stack, engine: Any, model_dir: Path) -> None:
    from market.engine.factory import load_engine
    from miner.cheats import cheating_engine
    from miner.worker import Worker

    q, api, mid = devnet.q, stack.api, engine.model_id
    # The honest miner declared bf16 and computes in it, as a GPU miner does; the verifiers
    # score in fp32. Its shard is judged at bf16, with the commitments its engine made.
    honest, cheat = register_miner(devnet, 12, mid, "bf16"), register_miner(devnet, 13, mid)
    data = batch(3)
    t_honest, t_cheat = post_task(devnet, api, mid, data), post_task(devnet, api, mid, data)
    cheat_engine = cheating_engine("random", engine, model_dir)  # closing it closes `engine`
    with load_engine("torch", model_dir, max_batch_size=4, precision="bf16") as bf16:
        for miner, eng, task_id in ((honest, bf16, t_honest), (cheat, cheat_engine, t_cheat)):
            worker = Worker(account=miner, quarry=q, engines={mid: eng}, store=api,
                            progress=False)
            outcome = worker.process_shard(task_id, 0)
            assert outcome.submitted, outcome.reason

    # The client disputes request 1 of each; the honest one with an evidenceURI that names
    # nothing, which the desks must not take as the miner withholding its data.
    bond = q.arbitration.min_bond()
    nowhere = "sha256:" + "0" * 64
    assert q.tasks.get_shard(t_honest, 0).precision == Precision.BF16
    honest_doc = ShardResult.from_bytes(api.get(q.tasks.get_shard(t_honest, 0).result_uri))
    assert all(it.commitment for it in honest_doc.items)
    d_honest = open_dispute(q, devnet.client, api, t_honest, 1, evidence_uri=nowhere)
    d_cheat = open_dispute(q, devnet.client, api, t_cheat, 1)
    assert q.tasks.get_shard(t_cheat, 0).state == ShardState.DISPUTED

    w = q.escrow.withdrawable
    parties = [devnet.client, honest, cheat, *devnet.verifiers]
    before = {a.address: w(a.address) for a in parties}
    cheat_stake = q.gpu.miner_info(cheat.address).stake
    collateral = q.tasks.get_shard(t_cheat, 0).collateral
    cheat_budget = q.tasks.shard_budget(t_cheat, 0)
    assert collateral > 0

    desks = [DisputeDesk(q, v, api, stack.scorer, lie=(i == 0))
             for i, v in enumerate(devnet.verifiers)]
    liar, fair = desks[0], desks[1:]

    # The liar votes first; alone it weighs no quorum, and with the dispute's time hardly
    # begun nothing is recorded on-chain yet.
    liar.step()
    assert set(liar.votes) == {d_honest, d_cheat}
    assert liar.votes[d_honest].miner_at_fault is True
    assert liar.votes[d_cheat].miner_at_fault is False
    for d in (d_honest, d_cheat):
        assert liar.try_resolve(d) is False
        assert q.arbitration.get_dispute(d).status == DisputeStatus.OPEN
        assert q.arbitration.ballot_of(d, liar.address) == Ballot.NONE

    for desk in fair:
        desk.step()
    assert q.arbitration.get_dispute(d_honest).status == DisputeStatus.MINER_NOT_AT_FAULT
    assert q.arbitration.get_dispute(d_cheat).status == DisputeStatus.MINER_AT_FAULT
    assert fair[-1].resolved_here == {d_honest, d_cheat}  # the third fair vote made a quorum
    assert not any(desk.resolved_here for desk in desks[:-1])
    for d in (d_honest, d_cheat):  # one castVotes with the three: the liar's never recorded
        assert q.arbitration.ballot_of(d, liar.address) == Ballot.NONE

    # Every desk judged the same way with the same numbers; the liar only signed otherwise.
    for d, fault in ((d_honest, False), (d_cheat, True)):
        verdicts = [desk.verdicts[d] for desk in desks]
        assert all(v.miner_at_fault is fault for v in verdicts)
        assert len({v.score for v in verdicts}) == 1
        assert all(desk.votes[d].miner_at_fault is fault for desk in fair)
    honest_score = fair[0].verdicts[d_honest].score
    cheat_score = fair[0].verdicts[d_cheat].score
    assert honest_score is not None and cheat_score is not None
    assert honest_score.possible and honest_score.mismatches() == 0
    assert cheat_score.mismatches() > 0
    assert "withheld" not in fair[0].verdicts[d_honest].reason
    assert "passes" in fair[0].verdicts[d_honest].reason
    assert "greedy tokens left the reference's argmax" in fair[0].verdicts[d_cheat].reason

    # The voters are the three fair members; the liar is in neither outcome.
    fair_addresses = sorted((d.address for d in fair), key=lambda a: int(a, 16))
    resolved = {int(e["disputeId"]): e for e in
                q.arbitration.events("DisputeResolved", devnet.deployment.deploy_block)}
    for d in (d_honest, d_cheat):
        assert [to_checksum_address(v) for v in resolved[d]["voters"]] == fair_addresses

    # No fault: minerBondShareBps of the bond to the miner, the rest split among the voters,
    # dust to the miner; the client's bond is gone. Fault: the shard budget back to the
    # client with the bond, the collateral slashed, verifierRewardBps of it to the voters.
    p = q.arbitration.params()
    n = len(fair)
    to_miner = bond * p["miner_bond_share_bps"] // BPS
    each_bond = (bond - to_miner) // n
    slash = collateral * p["fault_slash_bps"] // BPS
    each_slash = slash * p["verifier_reward_bps"] // BPS // n
    assert int(resolved[d_cheat]["slashed"]) == slash
    delta = {a.address: w(a.address) - before[a.address] for a in parties}
    assert delta[honest.address] == bond - each_bond * n
    assert delta[cheat.address] == 0
    assert q.gpu.miner_info(cheat.address).stake == cheat_stake - slash
    assert delta[devnet.client.address] == cheat_budget + bond + slash - each_slash * n
    for desk in fair:
        assert delta[desk.address] == each_bond + each_slash
    assert delta[liar.address] == 0
    assert q.tasks.get_shard(t_cheat, 0).state == ShardState.REFUNDED

    # The honest shard proceeds: finalizable at once, the miner paid for its tokens.
    shard = q.tasks.get_shard(t_honest, 0)
    assert shard.state == ShardState.SUBMITTED
    budget = q.tasks.shard_budget(t_honest, 0)
    q.tasks.finalize_shard(devnet.anyone, t_honest, 0)
    assert w(honest.address) - before[honest.address] == (bond - each_bond * n
                                                          + shard.tokens_used * PRICE)
    assert w(devnet.client.address) - before[devnet.client.address] == (
        delta[devnet.client.address] + budget - shard.tokens_used * PRICE)

    # Late resolvers are quiet; further steps change nothing and nobody votes twice.
    assert fair[0].try_resolve(d_honest) is False
    for desk in desks:
        desk.step()
        assert set(desk.closed) == {d_honest, d_cheat} and not desk.open
    for d in (d_honest, d_cheat):
        assert sorted(m["author"] for m in votes_on(api, liar.account, d)) == sorted(
            desk.address for desk in desks)


# ---------------------------------------------------------------------------- snapshots


def test_the_verifiers_vote_with_the_snapshot(devnet: Any, stack: Stack) -> None:
    """A dispute opened while the four are the committee is theirs to judge: a fifth
    verifier seated after it opened (with more stake than the four together) runs its own
    desk and does not vote on it; the four resolve it with the weights of its epoch."""
    from conftest import until_seated

    q, api = devnet.q, stack.api
    dispute_id = withheld_dispute(devnet, api, "snap ")
    opened = q.arbitration.get_dispute(dispute_id)
    assert opened.epoch == q.committee.current_epoch()
    assert opened.total_weight == q.committee.total_weight_at(opened.epoch) == 4 * STAKE

    newcomer = anvil_account(15)
    q.committee.register(newcomer, 5 * STAKE)
    seated = until_seated(q)
    assert seated > opened.epoch and q.committee.is_member(newcomer.address)
    assert q.committee.weight_at(newcomer.address, opened.epoch) == 0
    assert q.committee.total_weight_at(seated) == 9 * STAKE  # today's committee is another

    desks = [DisputeDesk(q, v, api, stack.scorer) for v in devnet.verifiers]
    late = DisputeDesk(q, newcomer, api, stack.scorer)
    late.step()
    assert dispute_id in late.closed and dispute_id not in late.votes
    assert "not in" in late.closed[dispute_id]
    for desk in desks[:2]:  # two of four: half the snapshot's weight, no quorum
        desk.step()
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.OPEN
    # The newcomer's signature is refused on-chain too: it is not in the dispute's snapshot.
    signature = Vote(dispute_id, True).sign(newcomer.key, q.chain_id, q.arbitration.address)
    with pytest.raises(revert_class("NotCommitteeMember")):
        q.arbitration.cast_votes(newcomer, dispute_id, True, [signature])

    desks[2].step()
    d = q.arbitration.get_dispute(dispute_id)
    assert d.status == DisputeStatus.MINER_AT_FAULT and desks[2].resolved_here == {dispute_id}
    voters = by_address(v.address for v in devnet.verifiers[:3])
    assert by_address(q.arbitration.voters_of(dispute_id, True)) == voters
    assert q.arbitration.voters_of(dispute_id, False) == []
    assert d.fault_weight == 3 * STAKE and d.no_fault_weight == 0
    cast = q.arbitration.events("VoteCast", devnet.deployment.deploy_block, disputeId=dispute_id)
    assert {to_checksum_address(e["voter"]): int(e["weight"]) for e in cast} == {
        v: STAKE for v in voters}
    assert q.arbitration.ballot_of(dispute_id, newcomer.address) == Ballot.NONE
    assert q.arbitration.ballot_of(dispute_id, devnet.verifiers[3].address) == Ballot.NONE
    for desk in (late, desks[3]):
        desk.step()
        assert dispute_id in desk.closed and not desk.open
    assert sorted(m["author"] for m in votes_on(api, late.account, dispute_id)) == sorted(
        v.address for v in devnet.verifiers[:3])


def test_idle_members_cannot_block_a_dispute(devnet: Any, stack: Stack) -> None:
    """Only two of the four desks run. No quorum can come, so past half the dispute's time
    each records its own vote on-chain; at expiry the two idle members are reported absent:
    they lose their seats at the next boundary and 10% of their stake, burned: the opener
    gets its bond back and nothing from their absence."""
    from conftest import until_seated

    q, api = devnet.q, stack.api
    working = [DisputeDesk(q, v, api, stack.scorer) for v in devnet.verifiers[:2]]
    idle = [v.address for v in devnet.verifiers[2:]]
    dispute_id = withheld_dispute(devnet, api, "idle ")
    d = q.arbitration.get_dispute(dispute_id)
    for desk in working:
        desk.step()
        assert desk.votes[dispute_id].miner_at_fault is True
        assert q.arbitration.ballot_of(dispute_id, desk.address) == Ballot.NONE  # not yet
    assert len(votes_on(api, working[0].account, dispute_id)) == 2

    half = d.opened_at + (d.deadline - d.opened_at) // 2
    devnet.chain.advance_time(half - devnet.chain.timestamp())
    for desk in working:
        desk.step()
        assert dispute_id in desk.recorded
    d = q.arbitration.get_dispute(dispute_id)
    assert d.status == DisputeStatus.OPEN and d.fault_weight == 2 * STAKE
    assert by_address(q.arbitration.voters_of(dispute_id, True)) == by_address(
        desk.address for desk in working)

    devnet.chain.advance_time(d.deadline - devnet.chain.timestamp())
    w = q.escrow.withdrawable
    burn = q.chain.call(q.arbitration.contract.functions.BURN())
    before, burned = w(devnet.client.address), w(burn)
    slash_bps = int(q.chain.call(q.committee.contract.functions.idleSlashBps()))
    slash = STAKE * slash_bps // BPS
    info = wait_dispute(q, dispute_id, expire_as=devnet.client)
    assert info.status == DisputeStatus.EXPIRED
    assert by_address(info.absent) == by_address(idle)
    assert w(devnet.client.address) - before == d.bond  # to the wei
    assert w(burn) - burned == 2 * slash
    leaving_at = q.committee.current_epoch() + 1
    for v in idle:
        vi = q.committee.verifier_info(v)
        assert vi.stake == STAKE - slash and vi.active_until == leaving_at
        assert q.committee.strikes_of(v) == 1
        assert q.arbitration.ballot_of(dispute_id, v) == Ballot.ABSENT
    for desk in working:
        vi = q.committee.verifier_info(desk.address)
        assert vi.stake == STAKE and vi.seated and q.committee.strikes_of(desk.address) == 0
        desk.step()
        assert dispute_id in desk.closed
    assert until_seated(q) == leaving_at
    assert q.committee.members() == by_address(desk.address for desk in working)


# ---------------------------------------------------------------------------- withheld answers


def test_leader_challenges_a_withheld_answer_then_settles_or_disputes(
        devnet: Any, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two challenge answers committed on-chain but never published. The leader, as each
    task's client, challenges their availability (once, across a restart). One miner does
    not answer: after the response window the leader settles it, the miner is slashed. The
    other answers on-chain but still publishes nothing: the leader disputes the answered
    receipt, and a desk finds the data withheld."""
    from verifier import challenges
    from verifier.challenges import (
        check_challenge_set,
        claimable_at,
        client_jobs,
        collect_answer,
        draw_challenge_set,
        post_challenge,
    )
    from verifier.committee import CommitteeMember, chain_faults, unanswered_availability
    from verifier.reputation import ReputationParams

    q, api = devnet.q, stack.api
    start = devnet.chain.timestamp()
    miners = {m.address: m for m in (devnet.miner, devnet.miner2)}
    cs = draw_challenge_set(1, devnet.MODEL_ID, "quarry-dispute-test", list(miners),
                            requests=2, max_tokens=MAX_TOKENS)
    # Terms the first miner cannot meet now (a floor above its reputation, closed to
    # probation, a precision it did not declare: its standing changed since the set's
    # block) give way to terms it can: it is challenged, not locked out.
    target = cs.challenges[0]
    declared = int(q.gpu.precision_of(target.miner, devnet.MODEL_ID))
    unmeetable = dataclasses.replace(target, min_reputation_bps=10_000, allow_probation=False,
                                     precisions=1 << (declared % 5 + 1))
    cs = dataclasses.replace(cs, challenges=(unmeetable, *cs.challenges[1:]))
    leader = devnet.verifiers[0]
    deadline = devnet.chain.timestamp() + 3600
    before = devnet.chain.block_number()
    posted = [post_challenge(q, leader, api, c, devnet.MODEL_ID, deadline)
              for c in cs.challenges]
    posted_terms = [dataclasses.replace(unmeetable.terms, min_reputation_bps=0,
                                        allow_probation=True, precisions=0),
                    *(c.terms for c in cs.challenges[1:])]
    for p, terms in zip(posted, posted_terms, strict=True):  # on the drawn terms otherwise
        t = q.tasks.get_task(p.task_id)
        assert (t.precisions, t.require_commitments, t.allow_probation,
                t.min_reputation_bps) == (terms.precisions, False, terms.allow_probation,
                                          terms.min_reputation_bps)
    docs = {p.miner: serve_by_hand(devnet, api, p.task_id, miners[p.miner],
                                   cs.challenge_for(p.miner).data, upload=False)  # type: ignore[union-attr]
            for p in posted}
    answers = [collect_answer(q, api, cs.challenge_for(p.miner), p.task_id,  # type: ignore[arg-type]
                              answer_window=q.committee.challenge_answer_window(),
                              now=devnet.chain.timestamp())
               for p in posted]
    assert all(a.withheld for a in answers)
    # What the next set's shapes read of these tasks (`client_jobs`): their terms as posted,
    # the premium over the claimant's ask at the block read; none created after that block;
    # none that is one of the committee's own challenges (by input root).
    head = devnet.chain.block_number()
    jobs = client_jobs(q, devnet.MODEL_ID, head)
    assert jobs[-2:] == posted_terms
    assert client_jobs(q, devnet.MODEL_ID, before) == jobs[:-2]
    assert client_jobs(q, devnet.MODEL_ID, head,
                       frozenset(c.input_root for c in cs.challenges)) == jobs[:-2]
    # Which of them each miner could claim, as GPURegistry answered at that block.
    open_terms = posted_terms[0]
    floor = dataclasses.replace(open_terms, min_reputation_bps=10_000)
    other = dataclasses.replace(open_terms, precisions=unmeetable.precisions)
    can = claimable_at(q, devnet.MODEL_ID, head, list(miners), [open_terms, floor, other])
    assert [can(target.miner, t) for t in (open_terms, floor, other)] == [True, False, False]

    # Two members read the same client tasks and standings at a block, so what one draws
    # the other re-derives (MIN_JOBS lowered so that these two tasks are enough to copy).
    monkeypatch.setattr(challenges, "MIN_JOBS", 1)
    proposer, checker = (
        CommitteeMember(q, v, api, None, model_id=devnet.MODEL_ID,  # type: ignore[arg-type]
                        model_name="quarry-dispute-test", params=ReputationParams(),
                        state_path=tmp_path / f"member{i}.json", requests=2,
                        max_tokens=MAX_TOKENS)
        for i, v in enumerate(devnet.verifiers[:2]))
    eligible = sorted(miners, key=lambda a: int(a, 16))
    jobs, probation, claimable = proposer.standing(head, eligible)
    drawn = draw_challenge_set(2, devnet.MODEL_ID, "quarry-dispute-test", eligible,
                               requests=2, max_tokens=MAX_TOKENS, block=head, jobs=jobs,
                               on_probation=probation, claimable=claimable)
    assert {c.terms for c in drawn.challenges} <= set(posted_terms)
    jobs, probation, claimable = checker.standing(head, eligible)
    check_challenge_set(drawn, epoch=2, model_id=devnet.MODEL_ID, eligible=eligible,
                        requests=2, max_tokens=MAX_TOKENS, jobs=jobs,
                        on_probation=probation, claimable=claimable)

    def member(events: list[str]) -> CommitteeMember:
        return CommitteeMember(q, leader, api, None, model_id=devnet.MODEL_ID,  # type: ignore[arg-type]
                               model_name="quarry-dispute-test", params=ReputationParams(),
                               state_path=tmp_path / "state.json", on_event=events.append)

    events: list[str] = []
    first = member(events)
    first.state.posted["1"] = [p.to_json() for p in posted]
    first.challenge_withheld(1, posted, answers)
    entries = first.state.availability
    assert [entries[str(p.task_id)]["status"] for p in posted] == ["open", "open"]
    assert q.arbitration.challenge_count() == 2
    assert all(q.tasks.get_shard(p.task_id, 0).state == ShardState.DISPUTED for p in posted)

    restarted = member(events)  # from the state file: nothing is challenged twice
    restarted.challenge_withheld(1, posted, answers)
    assert q.arbitration.challenge_count() == 2

    silent, answering = posted
    stake = q.gpu.miner_info(silent.miner).stake
    item = docs[answering.miner].items[0]
    challenge_id = int(restarted.state.availability[str(answering.task_id)]["challengeId"])
    q.arbitration.answer_availability(miners[answering.miner], challenge_id, item.receipt,
                                      item.proof)
    restarted.follow_availability()  # the silent one's window is still open
    entries = restarted.state.availability
    assert entries[str(silent.task_id)]["status"] == "open"
    assert entries[str(answering.task_id)]["status"] == "disputed"
    dispute_id = int(entries[str(answering.task_id)]["disputeId"])
    d = q.arbitration.get_dispute(dispute_id)
    assert (d.task_id, d.receipt) == (answering.task_id, item.receipt)

    devnet.chain.advance_time(q.arbitration.response_window())
    restarted.follow_availability()
    silent_id = int(entries[str(silent.task_id)]["challengeId"])
    settled = challenge_info(q, silent_id)
    assert entries[str(silent.task_id)]["status"] == "unanswered"
    assert settled.status == ChallengeStatus.UNANSWERED and settled.slashed > 0
    assert q.gpu.miner_info(silent.miner).stake == stake - settled.slashed
    assert q.tasks.get_shard(silent.task_id, 0).state == ShardState.REFUNDED
    # The committee counts the silence as unavailability (MISSED in its next report), not
    # as a fault: the shard's budget and collateral are the whole cost.
    end = devnet.chain.timestamp() + 1
    assert unanswered_availability(q, start, end) == {silent.miner}
    assert silent.miner not in chain_faults(q, start, end)

    verdict = DisputeDesk(q, devnet.verifiers[1], api, stack.scorer).judge(dispute_id)
    assert verdict.miner_at_fault and "data withheld" in verdict.reason

    again = member(events)  # a second restart repeats nothing
    again.follow_availability()
    again.challenge_withheld(1, posted, answers)
    assert q.arbitration.challenge_count() == 2 and q.arbitration.dispute_count() == dispute_id
    assert sum("availability challenge" in e for e in events) >= 3


def test_an_unanswered_challenge_is_pending_until_its_answer_window_closes(
        devnet: Any, stack: Stack) -> None:
    """However late in an epoch a challenge is posted, its miner has the whole
    `challengeAnswerWindow` from the task's creation before anyone may call it missing."""
    from verifier.challenges import collect_answer, draw_challenge_set, post_challenge

    q, api, miner = devnet.q, stack.api, devnet.miner
    cs = draw_challenge_set(1, devnet.MODEL_ID, "quarry-dispute-test", [miner.address],
                            requests=2, max_tokens=MAX_TOKENS)
    challenge = cs.challenges[0]
    posted = post_challenge(q, devnet.verifiers[0], api, challenge, devnet.MODEL_ID,
                            devnet.chain.timestamp() + 3600)
    window = q.committee.challenge_answer_window()
    created = q.tasks.get_task(posted.task_id).created_at
    assert 0 < window < q.committee.epoch_duration()

    def status(at: int) -> str:
        return collect_answer(q, api, challenge, posted.task_id, answer_window=window,
                              now=at).status

    assert status(created) == "pending"
    assert status(created + window - 1) == "pending"
    assert status(created + window) == "missing"
    missing = collect_answer(q, api, challenge, posted.task_id, answer_window=window,
                             now=created + window)
    assert not missing.withheld  # nothing committed: no availability challenge to make
    serve_by_hand(devnet, api, posted.task_id, miner, challenge.data)  # late, but in
    assert status(created + window + 5) == "answered"


# ---------------------------------------------------------------------------- evidence


def test_evidence_withheld_tampered_or_client_side_is_judged_without_scoring(
        devnet: Any, stack: Stack) -> None:
    """Checks that need no model: the disputes are over conftest's MODEL_ID, which the
    scorer does not run, so any attempt to score would defer instead of returning."""
    q, api, miner = devnet.q, stack.api, devnet.miner
    desk = DisputeDesk(q, devnet.verifiers[1], api, stack.scorer)

    withheld = post_task(devnet, api, devnet.MODEL_ID, batch(2, "a "))
    withheld_doc = serve_by_hand(devnet, api, withheld, miner, batch(2, "a "),
                                 upload=False)
    tampered = post_task(devnet, api, devnet.MODEL_ID, batch(2, "b "))
    serve_by_hand(devnet, api, tampered, miner, batch(2, "b "), tamper=True)
    # The client's inputURI names bytes that are not its committed batch.
    client_side = post_task(devnet, api, devnet.MODEL_ID, batch(2, "c "),
                            input_uri=api.put(batch(2, "other ")))
    serve_by_hand(devnet, api, client_side, miner, batch(2, "c "))
    fine = post_task(devnet, api, devnet.MODEL_ID, batch(2, "d "))
    serve_by_hand(devnet, api, fine, miner, batch(2, "d "))

    def dispute(task_id: int) -> int:
        return open_dispute(q, devnet.client, api, task_id, 1)

    # The client of the withheld shard disputes with the receipt the miner showed it.
    item = withheld_doc.items[1]
    d_withheld, _ = q.arbitration.open_dispute(
        devnet.client, withheld, 0, item.receipt, item.proof,
        q.tasks.get_shard(withheld, 0).result_uri, q.arbitration.min_bond())
    verdict = desk.judge(d_withheld)
    assert verdict.miner_at_fault and verdict.score is None
    assert "data withheld" in verdict.reason and "not in the market's store" in verdict.reason

    verdict = desk.judge(dispute(tampered))
    assert verdict.miner_at_fault and verdict.score is None
    assert "output hash check failed" in verdict.reason

    verdict = desk.judge(dispute(client_side))
    assert not verdict.miner_at_fault and verdict.score is None
    assert "task input unusable" in verdict.reason and "inputRoot" in verdict.reason

    # A document that verifies must be scored: with no model for it, no verdict.
    d_fine = dispute(fine)
    with pytest.raises(DisputeDeferred, match="scores with 0x"):
        desk.judge(d_fine)
    desk.step()
    assert d_fine not in desk.votes and d_withheld in desk.votes
    assert votes_on(api, desk.account, d_fine) == []


def test_no_vote_while_the_scorer_does_not_answer(devnet: Any, stack: Stack, engine: Any,
                                                  model_dir: Path) -> None:
    from verifier.scoring_worker import ScoringClient

    q, api, mid = devnet.q, stack.api, engine.model_id
    miner = register_miner(devnet, 14, mid)
    data = batch(2, "e ")
    task_id = post_task(devnet, api, mid, data)
    serve_by_hand(devnet, api, task_id, miner, data)
    dispute_id = open_dispute(q, devnet.client, api, task_id, 0)
    silent = ScoringClient(stack.redis_url, "quarry.score.nobody-listens", model_dir,
                           timeout_s=1)
    desk = DisputeDesk(q, devnet.verifiers[2], api, silent)
    desk.step()
    assert desk.open == {dispute_id} and not desk.votes
    assert votes_on(api, desk.account, dispute_id) == []
    # Nor while the market does not answer (its own side's trouble is never a verdict).
    with MarketAPI(f"http://127.0.0.1:{free_port()}") as dead:
        cut_off = DisputeDesk(q, devnet.verifiers[3], dead, stack.scorer)
        cut_off.step()
        assert cut_off.open == {dispute_id} and not cut_off.votes and not cut_off.verdicts
    # With a scorer that answers, the same desk votes (a hand-made output: at fault).
    desk.shards.scorer = stack.scorer
    desk.step()
    assert desk.votes[dispute_id].miner_at_fault is True
    assert [m["author"] for m in votes_on(api, desk.account, dispute_id)] == [desk.address]


# ---------------------------------------------------------------------------- pure logic


def test_valid_votes_keeps_only_members_signing_this_dispute() -> None:
    chain_id, arbitration = 31337, "0x" + "ab" * 20
    a, b, c, outsider = (anvil_account(i) for i in (6, 7, 8, 5))
    members = [a.address, b.address, c.address]

    def vote(account: Any, dispute_id: int, fault: bool, *, topic: int = 7,
             signer: Any = None) -> dict[str, Any]:
        sig = Vote(dispute_id, fault).sign((signer or account).key, chain_id, arbitration)
        return committee_message(account, "vote", 0, str(topic), vote_body(fault, sig, "r"))

    good_a, good_b = vote(a, 7, True), vote(b, 7, False)
    messages = [
        good_a, good_b,
        vote(c, 8, True),  # signed for another dispute, posted under this topic
        vote(c, 7, True, signer=outsider),  # c posts a signature that is not c's
        vote(outsider, 7, True),  # not a member
        {**vote(c, 7, True), "body": {"minerAtFault": 1, "signature": "0x00"}},  # not a bool
        {**vote(c, 7, True), "body": "junk"},
        vote(a, 7, True, topic=9),  # another topic
        good_a,  # a repeat counts once
    ]
    out = valid_votes(messages, 7, members, chain_id, arbitration)
    assert out == {True: {a.address: bytes.fromhex(good_a["body"]["signature"][2:])},
                   False: {b.address: bytes.fromhex(good_b["body"]["signature"][2:])}}


def test_scoring_line_caps_max_tokens_without_touching_the_request() -> None:
    request = parse_jsonl(batch(1))[0].request
    line = scoring_line(request, 2)
    assert line["body"]["max_tokens"] == 2 and request["body"]["max_tokens"] == MAX_TOKENS
    assert scoring_line(request, 100)["body"]["max_tokens"] == MAX_TOKENS


# ---------------------------------------------------------------------------- audits


def test_audits_catch_a_miner_honest_only_on_challenges(
        devnet: Any, stack: Stack, engine: Any, model_dir: Path,
        tmp_path: Path) -> None:
    """A `selective` miner (honest on what looks like a challenge, a cheaper model on client
    prompts) serves a client task; so does an honest one. The sitting members audit every
    shard (rate 10000 bps): the honest shard passes, the selective one fails, one auditor
    disputes it at its own bond, the committee resolves it at fault (collateral slashed,
    budget back to the client) and the chain's record of faults, which the committee's next
    report counts as an abnormal epoch, names the miner. The client bought the whole rate
    for the honest task: a desk at base rate 0 audits that shard (and it passes, costing the
    miner nothing) and nothing else. The cheat asks to leave right after submitting (issue
    32): the verdict still reaches it, its stake waits for the report of the epoch after it,
    and that report's record of faults names it (exiting miners are reported like any other)."""
    from miner.cheats import cheating_engine
    from miner.status import miner_status
    from miner.worker import Worker
    from verifier.audits import DEFAULT_AUDIT_RATE_BPS, AuditDesk, audit_draw, audit_seed
    from verifier.committee import CommitteeMember, chain_faults
    from verifier.reputation import ReputationParams

    q, api, mid = devnet.q, stack.api, engine.model_id
    honest, cheat = register_miner(devnet, 14, mid), register_miner(devnet, 15, mid)
    start = q.chain.timestamp()
    selective = cheating_engine("selective", engine, model_dir, cache_dir=tmp_path / "cheats")
    t_honest = post_task(devnet, api, mid, batch(3, "Please summarise: "))
    t_cheat = post_task(devnet, api, mid, batch(3, "Please summarise: "))
    assert q.committee.base_audit_rate_bps() == DEFAULT_AUDIT_RATE_BPS
    fee = q.committee.audit_fee(t_honest, 10_000)
    members = len(q.committee.members())
    open_budget = q.escrow.escrowed(t_honest)
    assert fee == open_budget * 9000 * q.committee.audit_fee_bps() // 10**8 * members
    q.committee.raise_audit_rate(devnet.client, t_honest, 10_000)
    assert q.committee.audit_rate_of(t_honest) == 10_000
    for miner, eng, task_id in ((honest, engine, t_honest), (cheat, selective, t_cheat)):
        worker = Worker(account=miner, quarry=q, engines={mid: eng}, store=api, progress=False)
        assert worker.process_shard(task_id, 0).submitted
    q.gpu.request_exit(cheat)  # before anyone has looked at its shard

    events: list[str] = []
    idle = AuditDesk(q, devnet.verifiers[0], api, stack.scorer, rate_bps=0)
    idle.step()
    assert set(idle.cases) == {(t_honest, 0)} and idle.drawn >= 2
    assert idle.cases[t_honest, 0].status == "passed" and idle.cases[t_honest, 0].dispute_id is None
    assert idle.rates[t_cheat, 0] == 0  # a young miner's weighting leaves no rate at no rate
    # The draw is a pure function of the submission's block and the rate the chain gives it:
    # at base rate 5000 a desk audits exactly the shards whose draw is under their rate, as
    # every other member does; the two new miners' shards count four times (0.9375).
    half = AuditDesk(q, devnet.verifiers[0], api, stack.scorer, rate_bps=5000)
    half._discover()
    assert half.rates[t_honest, 0] == 10_000 and half.rates[t_cheat, 0] >= 9375
    submitted = {(int(ev["taskId"]), int(ev["shard"])): int(ev["blockNumber"])
                 for ev in q.tasks.events("ResultSubmitted", q.deployment.deploy_block)}
    assert set(half.cases) == {key for key, n in submitted.items() if audit_draw(audit_seed(
        bytes(q.chain.w3.eth.get_block(n)["hash"]), *key)) < half.rates[key]}
    auditors = [AuditDesk(q, v, api, stack.scorer, rate_bps=10_000, stagger_s=0,
                          on_event=events.append) for v in devnet.verifiers[1:]]
    for desk in auditors:
        desk.step()
    cases = {k: c for desk in auditors for k, c in desk.cases.items() if k[0] in (t_honest,
                                                                                 t_cheat)}
    assert cases[t_honest, 0].status == "passed"
    assert {desk.cases[t_cheat, 0].status for desk in auditors} == {"disputed", "closed"}
    disputes = [d for d in (desk.cases[t_cheat, 0].dispute_id for desk in auditors) if d]
    assert len(disputes) == 1  # the others found it disputed already: one bond, not three
    dispute_id = disputes[0]
    d = q.arbitration.get_dispute(dispute_id)
    assert to_checksum_address(d.opener) in {v.address for v in devnet.verifiers[1:]}
    assert any("FAILED" in e for e in events)
    # The open dispute holds a reserve for the verdict's burn, and `miner status` says so.
    held = miner_status(q, cheat.address)
    assert held.reserve == q.gpu.reserve_of(cheat.address) > 0
    assert held.claimable == held.stake - held.locked - max(held.stake // 10, held.reserve)
    assert "held as the reserve of an open dispute" in held.format()

    desks = [DisputeDesk(q, v, api, stack.scorer) for v in devnet.verifiers]
    for desk in desks:
        desk.step()
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.MINER_AT_FAULT
    assert q.tasks.get_shard(t_cheat, 0).state == ShardState.REFUNDED
    assert q.gpu.miner_info(cheat.address).stake < STAKE
    assert chain_faults(q, start, q.chain.timestamp() + 1) == {cheat.address}
    settled = q.gpu.miner_info(cheat.address).settled_at  # the verdict's block
    epoch, until = q.gpu.verdict_wait(cheat.address)
    c = q.committee
    assert c.epoch_start(epoch - 1) <= settled < c.epoch_start(epoch) and until > settled
    member = CommitteeMember(q, devnet.verifiers[0], api, None,  # type: ignore[arg-type]
                             model_id=mid, model_name="quarry-dispute-test",
                             params=ReputationParams(), state_path=tmp_path / "state.json")
    assert member._faults(epoch) == {cheat.address: 0}  # scored 0: under the untrusted line

    # The audited shards also join their miners' evidence in the report of the epoch after
    # their submission: drawn at the chain's base rate whatever rate a member's desk audits
    # at, so a member at 100% and one at 50% pool the same shards (the honest task's, whose
    # client bought 100%, surely). Its passing evidence is carried on from the desk's kept
    # verdict, not scored again.
    from types import SimpleNamespace

    from verifier.scoring import EVIDENCE_WIDTH, judge

    def pooling(desk: AuditDesk, i: int) -> CommitteeMember:
        return CommitteeMember(q, devnet.verifiers[i], api, None,  # type: ignore[arg-type]
                               model_id=mid, model_name="quarry-dispute-test",
                               params=ReputationParams(), audits=desk,
                               state_path=tmp_path / f"pool-{i}.json")

    first, second = pooling(auditors[0], 1), pooling(half, 0)
    submitted_in = (auditors[0].pool[t_honest, 0].submitted_at - c.genesis_time()) \
        // c.epoch_duration()
    pooled = first.pooled_shards(submitted_in + 1)
    assert (t_honest, 0) in pooled[honest.address]
    assert second.pooled_shards(submitted_in + 1) == pooled
    # Reading blocks again (a scan's events can run past the head it noted) counts nothing
    # twice: the typical budget, hence every later rate and draw, stays the same.
    seen = (idle.drawn, list(idle._budgets), dict(idle.pool))  # most shards not drawn
    idle._scan_from = q.deployment.deploy_block
    idle._discover()
    assert (idle.drawn, list(idle._budgets), idle.pool) == seen
    # A shard refunded after its fault keeps its committed document: a member that had
    # not judged it yet still finds what the others pooled.
    assert q.tasks.get_shard(t_cheat, 0).state == ShardState.REFUNDED
    refunded = half.judge.judge(t_cheat, 0)
    assert refunded.fault and refunded.scores and not refunded.withheld
    kept = auditors[0].judge.judge(t_honest, 0)
    assert kept.scores and not kept.fault
    assert first._pooled_scores(submitted_in + 1)[honest.address][0] is kept.scores
    prior = (5.0,) * EVIDENCE_WIDTH  # evidence the miner carried in from its last epoch
    first._carry_in[submitted_in + 1] = {honest.address: prior}
    first._score(SimpleNamespace(epoch=submitted_in + 1), [])  # type: ignore[arg-type]
    carried = first._carry_out[submitted_in + 1][honest.address]
    assert carried == judge([], prior=prior, joined=[kept.scores]).carry != prior


def test_audit_rate_rule() -> None:
    """The rate every member computes for a shard: the paid rate or the base, whichever is
    higher; four times the shards for a young miner; k shards for a budget k >= 2 times the
    typical one; never above 100%, and nothing where there is no rate at all."""
    from verifier.audits import YOUNG_EPOCHS, YOUNG_WEIGHT, audit_rate

    old, b = YOUNG_EPOCHS, 1_000

    def rate(base: int, paid: int = 0, epochs: int = old, budget: int = b,
             typical: int = b) -> int:
        return audit_rate(base, paid, epochs_registered=epochs, budget=budget,
                          typical_budget=typical)

    assert rate(1000) == 1000
    assert rate(1000, paid=5000) == 5000 and rate(1000, paid=500) == 1000
    assert YOUNG_WEIGHT == 4
    assert rate(1000, epochs=old - 1) == 3439  # 1 - 0.9^4
    assert rate(1000, budget=2 * b - 1) == 1000  # not well above the typical one
    assert rate(1000, budget=3 * b) == 2710  # 1 - 0.9^3
    assert rate(1000, epochs=0, budget=2 * b) == 5696  # 1 - 0.6561^2
    assert rate(1000, budget=10**9 * b) == 9989  # counted as 64 shards: 1 - 0.9^64, rounded up
    assert rate(1000, paid=10_000, epochs=0, budget=50 * b) == 10_000
    assert rate(1000, budget=b, typical=0) == 1000  # no history: no scaling
    assert rate(0, epochs=0, budget=9 * b) == 0


# ---------------------------------------------------------------------------- rational cheats


def mixed_batch(n: int, tag: str, max_tokens: int) -> bytes:
    """A client job of greedy and sampled (temperature 1) requests, alternating."""
    lines = []
    for i in range(n):
        body: dict[str, Any] = {"model": "quarry-dispute-test", "max_tokens": max_tokens,
                                "prompt": f"{tag} tell a story about the sea {i}"}
        if i % 2:
            body |= {"temperature": 1.0, "seed": 1000 + i}
        lines.append(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                 "url": "/v1/completions", "body": body}))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(("mode", "evidence"), [
    ("greedy-sampled", "sampled tokens are not what honest sampling"),
    ("cold", "sampled tokens are not what honest sampling"),
    ("truncate", "greedy tokens left the reference's argmax"),  # its stop token
    # int8 weights (a quantised substitute) served under an fp32 declaration: its greedy
    # tokens move (e^33.6 on this shard) and so do its activations: the commitments alone
    # convict it too (checked below; e^16.5 since outputs' short last chunks stopped counting)
    ("int8", "greedy tokens left the reference's argmax"),
])  # `noise` is caught on the default model (test_miner_cheats); on this 2-layer test model
#     its weight noise changes no greedy token at all, so there is nothing to find
def test_rational_cheats_lose_their_disputes(devnet: Any, stack: Stack, engine: Any,
                                             model_dir: Path, tmp_path: Path, mode: str,
                                             evidence: str) -> None:
    """Each way of serving the right model the wrong way, on an ordinary client shard of 12
    requests x 48 tokens: the client disputes one output, the committee scores the whole
    shard and finds the miner at fault (its collateral slashed, the budget refunded)."""
    from miner.cheats import cheating_engine
    from miner.worker import Worker

    q, api, mid = devnet.q, stack.api, engine.model_id
    miner = register_miner(devnet, 16, mid)
    data = mixed_batch(12, mode, 48)
    task_id = post_task(devnet, api, mid, data, max_tokens=48)
    cheat = cheating_engine(mode, engine, model_dir, cache_dir=tmp_path)  # never closed:
    worker = Worker(account=miner, quarry=q, engines={mid: cheat}, store=api,  # it would
                    progress=False)                                        # close `engine`
    assert worker.process_shard(task_id, 0).submitted
    stake = q.gpu.miner_info(miner.address).stake
    dispute_id = open_dispute(q, devnet.client, api, task_id, 0)
    desks = [DisputeDesk(q, v, api, stack.scorer) for v in devnet.verifiers]
    for desk in desks:
        desk.step()
    assert q.arbitration.get_dispute(dispute_id).status == DisputeStatus.MINER_AT_FAULT
    assert evidence in desks[0].verdicts[dispute_id].reason
    if mode == "int8":  # the same outputs again (greedy, or seeded): commitments alone fail
        from verifier.scoring import judge, score_outputs

        reqs = [engine.request_from_line(json.loads(x)) for x in data.decode().splitlines()]
        outs = cheat.generate(reqs)
        alone = judge(score_outputs(engine, reqs, [o.token_ids for o in outs],
                                    [o.finish_reason for o in outs],
                                    commitments=[o.commitment for o in outs]))
        assert alone.kind_log_evidence[2] > alone.threshold, alone
    assert q.gpu.miner_info(miner.address).stake < stake
    assert q.tasks.get_shard(task_id, 0).state == ShardState.REFUNDED
