"""The committee protocol driven in-process, so a test can choose who misbehaves when:
four `CommitteeMember`s over a real LocalStack (Anvil, redis-server, market, Celery worker),
a real scoring worker and a real `miner run` process (a new miner: on probation, which the
challenge tasks allow).

A leader that withholds (sends no challenges, proposes nothing) makes its epoch fail, and
the next epoch's leader carries on and gets its report on-chain. A miner that is down for an
epoch is reported MISSED, not failed: its reputation and stake stay, it is challenged again,
and it passes once it runs. The >1/3 rule for missing answers and the quorums count stake,
not heads, the audited shards pooled into an epoch's evidence follow from the chain alone
(a proposal pooling others is refused), and an answer failing only with that evidence is
scored, not disputed (pure logic). A verifier whose seat has not
taken effect says so once and waits, touching neither the relay nor the chain's state.
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

import pytest

from market.chain.client import anvil_account
from market.chain.deploy import DeployParams
from market.errors import QuarryError
from market.local.processes import spawn
from market.local.stack import LocalStack
from verifier.committee import Snapshot, epoch_scores

BIN = Path(sys.executable).parent
EPOCH_S = 30
MINER = anvil_account(3)
VERIFIERS = [anvil_account(i) for i in (6, 7, 8, 9)]
A, B = "0x" + "a" * 40, "0x" + "b" * 40


def _proposal(missing: list[str]) -> dict:
    from eth_utils import to_checksum_address

    return {"body": {"scores": {to_checksum_address(A): 9000},
                     "challenges": [{"miner": to_checksum_address(A), "status": "answered"}] +
                     [{"miner": to_checksum_address(m), "status": "missing"} for m in missing]}}


def _observation(author: str, missing: list[str]) -> dict:
    from eth_utils import to_checksum_address

    return {"author": author, "body": {"missing": [to_checksum_address(m) for m in missing]}}


def test_missing_answer_counts_only_when_more_than_a_third_of_the_stake_confirms() -> None:
    """A confirmed missing answer is reported MISSED (unavailable), never a score of 0."""
    from eth_utils import to_checksum_address

    from market.chain.contracts import MISSED_BPS

    equal = {"m1": 1, "m2": 1, "m3": 1, "m4": 1}
    b = to_checksum_address(B)
    one = epoch_scores(_proposal([B]), [_observation("m1", [B])], equal)
    assert one == {to_checksum_address(A): 9000, b: None}, "1 of 4 is not more than a third"
    two = epoch_scores(_proposal([B]), [_observation("m1", [B]), _observation("m2", [B])],
                       equal)
    assert two[b] == MISSED_BPS
    # Confirmations from outsiders, or repeated by one member, do not count.
    fake = epoch_scores(_proposal([B]), [_observation("m1", [B]), _observation("m1", [B]),
                                         _observation("x", [B])], equal)
    assert fake[b] is None
    # A member cannot add a miner the leader did not report missing.
    assert A.lower() not in {k.lower() for k, v in two.items() if v == MISSED_BPS}
    # By stake, not heads: three small members are not a third, one large member is.
    skewed = {"big": 7, "s1": 1, "s2": 1, "s3": 1}
    smalls = [_observation(m, [B]) for m in ("s1", "s2", "s3")]
    assert epoch_scores(_proposal([B]), smalls, skewed)[b] is None
    assert epoch_scores(_proposal([B]), [_observation("big", [B])], skewed)[b] == MISSED_BPS


def test_a_quorum_is_a_stake_quorum() -> None:
    snap = Snapshot(3, {"0x01": 50, "0x02": 20, "0x03": 20, "0x04": 10}, 100 * 2 // 3 + 1)
    assert snap.total == 100 and snap.members == ["0x01", "0x02", "0x03", "0x04"]
    assert not snap.reached(["0x02", "0x03", "0x04"]), "three of four heads hold 50 of 100"
    assert snap.reached(["0x01", "0x02"]), "two heads hold 70 of 100"
    assert snap.weight_of(["0x01", "0x01", "0x05"]) == 50  # once each; outsiders weigh 0
    assert not snap.reached(["0x01", "0x04"])  # 60 is not more than 2/3 of 100


def test_members_pool_the_same_audited_shards_and_refuse_another_set(tmp_path: Path) -> None:
    """The shards pooled into epoch e's evidence follow from the chain alone: drawn by the
    audit rule at the chain's base rate (`AuditDesk.audited`), submitted in a block of
    epoch e - 1, over the member's model, not one of the committee's own challenges. Two
    members find the same set; a proposal that pools a shard more or one fewer, or says
    nothing readable, is refused (`_check_pool`, as `_cosign` and `_observe` call it)."""
    from types import SimpleNamespace

    from eth_utils import to_checksum_address

    from verifier.audits import Pooled
    from verifier.challenges import Challenge
    from verifier.committee import CommitteeMember, _check_pool, _pool_json
    from verifier.reputation import ReputationParams

    a, b = to_checksum_address(A), to_checksum_address(B)
    model, other = b"\x01" * 32, b"\x02" * 32
    line = {"custom_id": "c0", "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": "a private prompt", "max_tokens": 8}}
    challenge = Challenge(b, (line,)).input_root
    roots = {1: b"\x11" * 32, 2: b"\x12" * 32, 3: b"\x13" * 32, 4: challenge, 5: b"\x15" * 32}
    tasks = {t: SimpleNamespace(model_id=other if t == 3 else model, input_root=r)
             for t, r in roots.items()}
    drawn = [Pooled(1, 0, a, 150), Pooled(1, 1, b, 199), Pooled(2, 0, a, 100),
             Pooled(3, 0, a, 150),  # another model's task
             Pooled(4, 0, b, 150),  # the committee's challenge to b
             Pooled(5, 0, a, 200), Pooled(5, 1, a, 99)]  # the next epoch's, the last one's

    class Desk:  # what the audit rule drew (AuditDesk.audited's contract)
        def audited(self, start: int, end: int) -> list[Pooled]:
            return [p for p in drawn if start <= p.submitted_at < end]

    q = SimpleNamespace(chain=SimpleNamespace(chain_id=31337),
                        committee=SimpleNamespace(address="0x" + "c" * 40,
                                                  epoch_start=lambda e: 100 * e),
                        tasks=SimpleNamespace(get_task=tasks.__getitem__))

    def member(i: int) -> CommitteeMember:
        m = CommitteeMember(q, VERIFIERS[i], None, None,  # type: ignore[arg-type]
                            model_id=model, model_name="m", params=ReputationParams(),
                            state_path=tmp_path / f"state-{i}.json",
                            audits=Desk())  # type: ignore[arg-type]
        m.state.sets["1"] = {"challenges": [{"miner": b, "requests": [line]}]}
        return m

    first, second = member(0), member(1)
    pool = first.pooled_shards(2)  # epoch 2 pools what was submitted in [100, 200)
    assert pool == {a: [(1, 0), (2, 0)], b: [(1, 1)]}
    assert second.pooled_shards(2) == pool and first.pooled_shards(0) == {}
    _check_pool(_pool_json(pool), second.pooled_shards(2))  # the leader's set: co-signed
    with pytest.raises(QuarryError, match="pools task 5 shard 0"):
        _check_pool(_pool_json({**pool, a: [*pool[a], (5, 0)]}), pool)
    with pytest.raises(QuarryError, match="leaves out task 1 shard 1"):
        _check_pool(_pool_json({a: pool[a]}), pool)
    for junk in ({a: [[1]]}, "nothing", {a: [["x", 0]]}):
        with pytest.raises(QuarryError, match="malformed"):
            _check_pool(junk, pool)
    no_desk = CommitteeMember(q, VERIFIERS[2], None, None,  # type: ignore[arg-type]
                              model_id=model, model_name="m", params=ReputationParams(),
                              state_path=tmp_path / "state-2.json")
    with pytest.raises(QuarryError, match="pools task 1 shard 0"):
        _check_pool(_pool_json(pool), no_desk.pooled_shards(2))


def test_an_answer_failing_only_with_pooled_evidence_is_scored_not_disputed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dispute judges the answer alone: the leader disputes an answer that fails on its
    own, and only scores 0 one that failed with its carried or pooled evidence (a dispute
    of it would be lost, and the opener's bond with it)."""
    from types import SimpleNamespace

    from eth_account import Account
    from eth_utils import to_checksum_address

    import market.jobs
    from verifier.challenges import Answer, PostedChallenge
    from verifier.committee import CommitteeMember
    from verifier.reputation import ReputationParams
    from verifier.scoring import SAMPLED_WIDTH, ChallengeScore, judge

    a, b = to_checksum_address(A), to_checksum_address(B)
    weak = ChallengeScore(greedy=False, tokens=7,
                          log_ratios=(0.0,) * (SAMPLED_WIDTH - 1) + (9.0,))
    alone_fails = [weak, weak]
    pooled_fails = [weak]  # passes alone; with one pooled shard like it, fails
    assert not judge(alone_fails).passed and judge(pooled_fails).passed
    assert not judge(pooled_fails, joined=[[weak]]).passed
    q = SimpleNamespace(chain=SimpleNamespace(chain_id=31337),
                        committee=SimpleNamespace(address="0x" + "c" * 40))
    member = CommitteeMember(q, VERIFIERS[0], None, None,  # type: ignore[arg-type]
                             model_id=bytes(32), model_name="m", params=ReputationParams(),
                             state_path=tmp_path / "state.json")
    member._scored = {1: alone_fails, 2: pooled_fails}
    opened: list[tuple[int, int]] = []
    monkeypatch.setattr(market.jobs, "open_dispute",
                        lambda q, client, api, task, index: opened.append((task, index)) or 7)
    key = Account.create().key.hex()
    member._dispute_faults([PostedChallenge(a, 1, key), PostedChallenge(b, 2, key)],
                           None,  # type: ignore[arg-type]
                           [Answer(a, 1, "answered"), Answer(b, 2, "answered")], {a: 0, b: 0})
    assert opened == [(1, 0)] and member.state.disputed == [1]


@pytest.mark.chain
def test_a_verifier_waits_for_its_seat(devnet: Any, tmp_path: Path) -> None:
    """Freshly registered, a member says once at which epoch it joins and does nothing else:
    its market is a dead address, so any relay call would fail the step."""
    from conftest import until_seated

    from market.chain.devnet import free_port
    from market.marketapi import MarketAPI
    from verifier.committee import CommitteeMember
    from verifier.reputation import ReputationParams

    q = devnet.q
    newcomer = anvil_account(16)
    at = int(q.committee.register(newcomer, devnet.VERIFIER_STAKE)
             .event("VerifierRegistered")["activeFrom"])
    events: list[str] = []
    with MarketAPI(f"http://127.0.0.1:{free_port()}") as dead:
        member = CommitteeMember(q, newcomer, dead, None, model_id=devnet.MODEL_ID,  # type: ignore[arg-type]
                                 model_name="m", params=ReputationParams(),
                                 state_path=tmp_path / "state.json", on_event=events.append)
        for _ in range(3):
            member.step()
        assert events == [f"{newcomer.address} joins the committee at epoch {at} (chain time "
                          f"{q.committee.epoch_start(at)}); waiting for it"]
        assert until_seated(q) == at and q.committee.is_member(newcomer.address)
        with pytest.raises(QuarryError):  # seated, it reads the relay: here a dead market
            member.step()
    assert not (tmp_path / "state.json").exists()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    params = DeployParams(epoch_duration=EPOCH_S, challenge_window=60)
    with LocalStack(home=tmp_path_factory.mktemp("committee"), deploy_params=params,
                    index_interval_s=0.3, sweep_interval_s=0.5) as s:
        yield s


@pytest.mark.chain
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_withholding_leader_fails_only_its_epoch_and_a_missed_epoch_is_not_a_failure(
        stack: LocalStack) -> None:
    from market.marketapi import MarketAPI
    from market.model.create import create_model
    from market.model.manifest import load_manifest
    from verifier.committee import CommitteeMember, EpochTiming
    from verifier.reputation import ReputationParams
    from verifier.scoring_worker import ScoringClient, start_scoring_worker

    q = stack.quarry
    model_dir = stack.home / "model"
    create_model(model_dir, layers=2, hidden=64)
    manifest = load_manifest(model_dir)
    cfg = stack.home / "miner.toml"
    cfg.write_text("[miner]\n"
                   f'key = "0x{bytes(MINER.key).hex()}"\n'
                   f'market_url = "{stack.market_url}"\n'
                   f'model_dirs = ["{model_dir}"]\n'
                   'price_per_token = 1000000000\nstake = "0.5ether"\n'
                   'endpoint = "http://127.0.0.1:9300"\npoll_interval_s = 0.3\n')
    env = {**os.environ, "QUARRY_HOME": str(stack.home / "quarry-home")}  # private state
    out = subprocess.run([str(BIN / "miner"), "register", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    scorer_proc = start_scoring_worker(stack.redis_url, "quarry.score.committee-test",
                                       stack.logs / "scorer.log")
    markets = []
    # Down at first (stopped, SIGSTOP, once it runs): its first challenge goes unanswered.
    # Resumed (SIGCONT) once reported MISSED, it answers the next one at once: a start from
    # nothing there (torch, the model) could outlast the answer window on a busy machine,
    # and a second miss fails the test.
    miner = spawn([str(BIN / "miner"), "run", "--config", str(cfg), "--no-progress"], env=env,
                  name="miner", log_path=stack.logs / "miner.log")
    down = False
    try:
        from conftest import to_next_epoch, until_seated

        with MarketAPI(stack.market_url) as api:
            stack.wait_until(lambda: any(m["address"] == MINER.address and m["alive"]
                                         for m in api.miners()),
                             "the miner's first heartbeat", timeout=240)
        os.killpg(miner.pid, signal.SIGSTOP)
        down = True
        stake = int(q.chain.call(q.committee.contract.functions.minVerifierStake()))
        stake_miner = q.gpu.miner_info(MINER.address).stake
        # Early in an epoch, so no boundary passes between a registration's gas estimate and
        # its block (that would make its weight checkpoint a new, dearer one).
        q.chain.advance_time(q.committee.epoch_start(q.committee.current_epoch() + 1)
                             - q.chain.timestamp())
        for v in VERIFIERS:
            q.committee.register(v, stake)
        until_seated(q)  # the seats take effect at the next boundary
        assert q.gpu.on_probation(MINER.address), "a new miner starts on probation"
        scorer = ScoringClient(stack.redis_url, "quarry.score.committee-test", model_dir)
        members = []
        for v in VERIFIERS:
            market = MarketAPI(stack.market_url)
            markets.append(market)
            members.append(CommitteeMember(
                q, v, market, scorer, model_id=manifest.model_id, model_name=manifest.name,
                params=ReputationParams(abnormal_below_bps=6000),
                state_path=stack.home / f"state-{v.address}.json",
                requests=2, max_tokens=8, timing=EpochTiming()))
        by_address = {m.me: m for m in members}
        withheld: int | None = None
        start = q.deployment.deploy_block

        def missed() -> list[Any]:
            return q.gpu.events("ReportMissed", start, miner=MINER.address)

        def rated() -> list[Any]:
            return q.gpu.events("ReputationSet", start, miner=MINER.address)

        deadline = time.monotonic() + 540
        while time.monotonic() < deadline:
            for m in members:
                m.step()
            epoch = q.committee.current_epoch()
            if withheld is None:
                # The first epoch whose set is committed: its leader withholds.
                if q.committee.challenge_set_of(epoch + 1) != bytes(32):
                    withheld = epoch + 1
                    leader = members[0].leader(withheld)
                    assert leader is not None
                    by_address[leader].test_mode = "withhold"
            elif epoch > withheld:
                for m in members:
                    m.test_mode = ""
                if down and missed():  # reported unavailable: now it runs
                    os.killpg(miner.pid, signal.SIGCONT)
                    down = False
                if rated():
                    break
            if withheld is not None and epoch in (withheld - 1, withheld) and all(
                    str(epoch + 1) in m.state.sets for m in members):
                # Idle until the boundary: the epoch before the withheld one has no set of
                # its own, and in the withheld one the leader sends nothing. Skip the rest once
                # every member holds the next epoch's committed set. The miss and the pass
                # after it run on the real clock: their answer windows are real seconds.
                to_next_epoch(q)
            time.sleep(0.2)
        assert withheld is not None, "no challenge set was ever committed"
        assert not q.committee.reported(withheld), "the withholding leader's epoch fails"
        assert missed(), "the next leader carries on: the miner, down, is reported MISSED"
        info = q.gpu.miner_info(MINER.address)
        assert rated(), "challenged again after the miss, it answered and was rated"
        assert [int(ev["missed"]) for ev in missed()] == [1]
        assert not missed()[0]["probation"], "one miss does not change its standing"
        assert info.reputation_bps > 5000, "a miss costs no reputation; the pass raised it"
        assert info.stake == stake_miner, "a miss burns no stake"
        assert q.gpu.missed_reports_of(MINER.address) == 0

        # Equivocation: a member that signs two different reports for one epoch is slashed
        # by whoever sees both on the relay; half its stake goes to the prover.
        from market.protocol.eip712 import Report
        from market.protocol.messages import committee_message
        from verifier.committee import REPORT_SIGNATURE, _report_json

        cheat, prover = VERIFIERS[3], members[0]
        before = q.escrow.withdrawable(prover.me)
        for score in (6000, 7000):
            report = Report(withheld + 5, (MINER.address,), (score,), bytes(32))
            sig = report.sign(cheat.key, q.chain.chain_id, q.committee.address)
            digest = report.digest(q.chain.chain_id, q.committee.address)
            markets[3].post_message(committee_message(
                cheat, REPORT_SIGNATURE, report.epoch, "0x" + digest.hex(),
                {"report": _report_json(report), "evidenceUri": "", "signature": "0x" + sig.hex()}))
        prover.step()
        assert q.committee.verifier_info(cheat.address).stake == 0
        assert not q.committee.is_member(cheat.address)
        assert q.escrow.withdrawable(prover.me) == before + stake // 2
    finally:
        for market in markets:
            market.close()
        scorer_proc.stop()
        if down:
            os.killpg(miner.pid, signal.SIGCONT)
        miner.stop()
