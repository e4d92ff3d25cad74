"""The committee protocol driven in-process, so a test can choose who misbehaves when:
four `CommitteeMember`s over a real LocalStack (Anvil, redis-server, market, Celery worker),
a real scoring worker and a real `miner run` process.

A leader that withholds (sends no challenges, proposes nothing) makes its epoch fail, and
the next epoch's leader carries on and gets its report on-chain. The >1/3 rule for missing
answers is checked on its own (pure logic).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from market.chain.client import anvil_account
from market.chain.deploy import DeployParams
from market.service.processes import spawn
from market.service.stack import LocalStack
from verifier.committee import epoch_scores

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


def test_missing_answer_counts_only_when_more_than_a_third_confirm() -> None:
    from eth_utils import to_checksum_address

    members = ["m1", "m2", "m3", "m4"]
    b = to_checksum_address(B)
    one = epoch_scores(_proposal([B]), [_observation("m1", [B])], members)
    assert one == {to_checksum_address(A): 9000, b: None}, "1 of 4 is not more than a third"
    two = epoch_scores(_proposal([B]), [_observation("m1", [B]), _observation("m2", [B])],
                       members)
    assert two[b] == 0
    # Confirmations from outsiders, or repeated by one member, do not count.
    fake = epoch_scores(_proposal([B]), [_observation("m1", [B]), _observation("m1", [B]),
                                         _observation("x", [B])], members)
    assert fake[b] is None
    # A member cannot add a miner the leader did not report missing.
    assert A.lower() not in {k.lower() for k, v in two.items() if v == 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    params = DeployParams(epoch_duration=EPOCH_S, challenge_window=60)
    with LocalStack(home=tmp_path_factory.mktemp("committee"), deploy_params=params,
                    index_interval_s=0.3, sweep_interval_s=0.5) as s:
        yield s


@pytest.mark.chain
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_withholding_leader_fails_only_its_epoch(stack: LocalStack) -> None:
    from market.model.create import create_model
    from market.model.manifest import load_manifest
    from market.service.api import MarketAPI
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
    out = subprocess.run([str(BIN / "miner"), "register", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    miner = spawn([str(BIN / "miner"), "run", "--config", str(cfg), "--no-progress"],
                  name="miner", log_path=stack.logs / "miner.log")
    scorer_proc = start_scoring_worker(stack.redis_url, "quarry.score.committee-test",
                                       stack.logs / "scorer.log")
    markets = []
    try:
        stake = int(q.chain.call(q.committee.contract.functions.minVerifierStake()))
        for v in VERIFIERS:
            q.committee.register(v, stake)
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
        deadline = time.monotonic() + 420
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
                if q.committee.reported(withheld + 1) or q.committee.reported(withheld + 2):
                    break
            time.sleep(0.2)
        assert withheld is not None, "no challenge set was ever committed"
        assert not q.committee.reported(withheld), "the withholding leader's epoch fails"
        assert q.committee.reported(withheld + 1) or q.committee.reported(withheld + 2), \
            "the next leader carries on"
        assert q.gpu.miner_info(MINER.address).reputation_bps > 5000

        # Equivocation: a member that signs two different reports for one epoch is slashed
        # by whoever sees both on the relay; half its stake goes to the prover.
        from market.protocol.eip712 import Report
        from market.service.api import committee_message
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
        miner.stop()
