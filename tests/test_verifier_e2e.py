"""The verifier committee end to end, every part real: a private redis-server, Anvil with the
contracts, `market serve` with its Celery worker (`LocalStack`), three `miner run` processes
(two honest, one serving a substituted cheaper model via its declared test mode), all new
miners registered by `miner register` and so on probation, and four `verifier run` processes,
each with its own Celery scoring worker, one of them Byzantine (`--test-mode lie`: inverted
scores, confirms every answer missing, never co-signs, votes the wrong way on disputes).
The stakes differ (0.4, 0.1, 0.1 and 0.1 ether, the liar one of the small ones), so a quorum
is a matter of weight: the large member and any other are one, three small ones are not.

The verifiers start before their seats take effect (each says at which epoch it joins and
waits), then the chain clock moves to that boundary. Checks, on-chain: challenge sets are
committed and reports submitted by signers that weigh a quorum of the epoch, never with the
liar; the challenge tasks reach the miners on probation; the honest miners' reputations rise
and they leave probation, the cheater's falls below the untrusted threshold (it stays on
probation and can no longer claim); the leader disputes the cheater's challenge answer and
the committee slashes it, to the wei.

To keep the run short, the chain clock skips the idle rest of an epoch once its report is in
and the next epoch's challenge set is committed (`_skip_idle_time`): every step still runs on
the chain's clock, only waiting is cut.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import to_next_epoch

from market.chain.client import anvil_account
from market.chain.deploy import DeployParams, Quarry
from market.local.processes import ManagedProcess, ProcessError, spawn
from market.local.stack import LocalStack
from market.marketapi import MarketAPI
from market.model.manifest import load_manifest

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BIN = Path(sys.executable).parent
PRICE = 10**9
EPOCH_S = 40
MINERS = {"honest-a": anvil_account(3), "honest-b": anvil_account(4),
          "cheater": anvil_account(5)}
VERIFIERS = [anvil_account(i) for i in (6, 7, 8, 9)]
STAKES = ["0.4ether", "0.1ether", "0.1ether", "0.1ether"]
LIAR = VERIFIERS[3]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # Seats take effect two epochs after registering: `verifier run` starts while pending.
    params = DeployParams(epoch_duration=EPOCH_S, challenge_window=60, dispute_timeout=600,
                          activation_delay=2)
    with LocalStack(home=tmp_path_factory.mktemp("verifiers"), deploy_params=params,
                    index_interval_s=0.3, sweep_interval_s=0.5) as s:
        yield s


def _env(stack: LocalStack) -> dict[str, str]:
    """The roles' local state under the stack's home, never in the working directory."""
    return {**os.environ, "QUARRY_HOME": str(stack.home / "quarry-home")}


def _run(stack: LocalStack, *argv: str) -> str:
    out = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True,
                         timeout=180, env=_env(stack))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def model_dir(stack: LocalStack) -> Path:
    from market.model.create import create_model

    path = stack.home / "model"
    create_model(path, layers=2, hidden=64)
    return path


def _miner_config(stack: LocalStack, name: str, model_dir: Path, port: int) -> Path:
    cfg = stack.home / f"miner-{name}.toml"
    cfg.write_text(
        "[miner]\n"
        f'key = "0x{bytes(MINERS[name].key).hex()}"\n'
        f'market_url = "{stack.market_url}"\n'
        f'model_dirs = ["{model_dir}"]\n'
        f"price_per_token = {PRICE}\n"
        'stake = "0.5ether"\n'
        f'endpoint = "http://127.0.0.1:{port}"\n'
        "poll_interval_s = 0.3\nheartbeat_interval_s = 1.0\nmax_batch = 4\n")
    return cfg


def _verifier_config(stack: LocalStack, i: int, model_dir: Path) -> Path:
    cfg = stack.home / f"verifier-{i}.toml"
    cfg.write_text(
        "[verifier]\n"
        f'key = "0x{bytes(VERIFIERS[i].key).hex()}"\n'
        f'market_url = "{stack.market_url}"\n'
        f'model_dir = "{model_dir}"\n'
        f'redis_url = "{stack.redis_url}"\n'
        f'state_dir = "{stack.home / "verifier-state"}"\n'
        f'stake = "{STAKES[i]}"\n'
        "scoring_workers = 1\npoll_interval_s = 0.5\n"
        "challenge_requests = 4\nchallenge_max_tokens = 16\n")
    return cfg


def _leader(q: Quarry, epoch: int) -> str | None:
    """`leaderOf(epoch)` at the block that committed its set (as the members read it)."""
    events = q.committee.events("ChallengeSetCommitted", q.deployment.deploy_block, epoch=epoch)
    return q.committee.leader_of(epoch, events[0]["blockNumber"]) if events else None


def _epoch_done(q: Quarry, relay: MarketAPI, epoch: int) -> bool:
    """Nothing is left to do in `epoch`: it ran no challenges, its report is in, or its
    leader is the liar and has proposed its report (the others refuse it)."""
    if q.committee.challenge_set_of(epoch) == bytes(32) or q.committee.next_report_epoch() > epoch:
        return True
    return _leader(q, epoch) == LIAR.address and any(
        str(m["author"]).lower() == LIAR.address.lower()
        for m in relay.messages(VERIFIERS[0], epoch=epoch, kind="report-signature"))


def _skip_idle_time(q: Quarry, relay: MarketAPI) -> None:
    """Move the chain clock to the next epoch once the current one is done and the next
    one's challenge set is committed."""
    c = q.committee
    epoch = c.current_epoch()
    if c.challenge_set_of(epoch + 1) == bytes(32) or not _epoch_done(q, relay, epoch):
        return
    to_next_epoch(q)


def _drive(stack: LocalStack, done: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll `done()` while skipping idle epoch time; ProcessError with the logs on timeout."""
    deadline = time.monotonic() + timeout
    with MarketAPI(stack.market_url) as relay:
        while not done():
            if time.monotonic() > deadline:
                raise ProcessError(f"timed out after {timeout:g} s waiting for {what}\n"
                                   + stack.log_tails(25))
            _skip_idle_time(stack.quarry, relay)
            time.sleep(0.5)


def _signed_weight(q: Quarry, signers: list[str], epoch: int) -> int:
    return sum(q.committee.weight_at(s, epoch) for s in set(signers))


@pytest.mark.timeout(600)
def test_committee_epochs_rate_miners_and_slash_a_cheater(stack: LocalStack,
                                                          model_dir: Path) -> None:
    from conftest import until_seated

    q = stack.quarry
    procs: list[ManagedProcess] = []
    try:
        for port, name in enumerate(MINERS, start=9200):
            cfg = _miner_config(stack, name, model_dir, port)
            _run(stack, "miner", "register", "--config", str(cfg))
            assert q.gpu.on_probation(MINERS[name].address), "a new miner is on probation"
            extra = ["--test-mode", "substitute"] if name == "cheater" else []
            procs.append(spawn([str(BIN / "miner"), "run", "--config", str(cfg),
                                "--no-progress", *extra], env=_env(stack),
                               name=f"miner {name}", log_path=stack.logs / f"miner-{name}.log"))
        # Register early in an epoch: a boundary passing between a transaction's gas
        # estimate and its block makes the weight checkpoint a new, dearer one (out of gas).
        to_next_epoch(q)
        for i in range(len(VERIFIERS)):
            out = _run(stack, "verifier", "register", "--config",
                       str(_verifier_config(stack, i, model_dir)))
            assert "its seat takes effect at epoch" in out, out
        assert q.committee.members() == [], "no seat takes effect before the next boundary"
        logs = [stack.logs / f"verifier-{i}.log" for i in range(len(VERIFIERS))]
        for i, v in enumerate(VERIFIERS):
            extra = ["--test-mode", "lie"] if v == LIAR else []
            procs.append(spawn([str(BIN / "verifier"), "run", "--config",
                                str(stack.home / f"verifier-{i}.toml"), *extra],
                               env=_env(stack), name=f"verifier {i}", log_path=logs[i]))
        active_from = q.committee.verifier_info(VERIFIERS[-1].address).active_from

        def waiting(log: Path) -> bool:
            """Its loop runs and, unless the seat is in effect already, it says it waits."""
            text = log.read_text(errors="replace") if log.exists() else ""
            return "Ctrl-C stops" in text and ("joins the committee at epoch" in text or
                                               q.committee.current_epoch() >= active_from)

        stack.wait_until(lambda: all(waiting(log) for log in logs),
                         "every verifier to run, waiting for its seat", timeout=240)
        seated = until_seated(q)
        assert seated == active_from
        assert all(p.alive() for p in procs), "no process died while pending"
        assert len(q.committee.members()) == 4
        total = q.committee.total_weight_at(seated)
        assert total == 7 * 10**17 and q.committee.quorum_weight(seated) == total * 2 // 3 + 1

        cheater = MINERS["cheater"].address
        honest = [MINERS["honest-a"].address, MINERS["honest-b"].address]
        stake_before = q.gpu.miner_info(cheater).stake

        def cheater_untrusted() -> bool:
            return q.gpu.miner_info(cheater).reputation_bps < 4000

        def honest_off_probation() -> bool:
            return not any(q.gpu.on_probation(m) for m in honest)

        def cheater_slashed() -> bool:
            return any(ev["minerAtFault"] for ev in q.arbitration.events(
                "DisputeResolved", q.deployment.deploy_block))

        _drive(stack, lambda: cheater_untrusted() and honest_off_probation()
               and cheater_slashed(), "the cheater to be untrusted and slashed and the honest "
               "miners to leave probation", timeout=420)

        reports = q.committee.events("ReputationSubmitted", q.deployment.deploy_block)
        assert reports
        for r in reports:
            epoch = int(r["epoch"])
            assert LIAR.address not in r["signers"], "the liar never co-signs"
            assert _signed_weight(q, r["signers"], epoch) >= q.committee.quorum_weight(epoch)
        for m in honest:
            assert q.gpu.miner_info(m).reputation_bps > 5000, "honest miners gain reputation"
        model_id = load_manifest(model_dir).model_id
        assert not q.gpu.is_eligible(cheater, model_id, 0, allow_probation=True), \
            "an untrusted miner cannot claim"
        assert q.gpu.on_probation(cheater), "the cheater never passes its probation"
        assert all(q.gpu.is_eligible(m, model_id, 0) for m in honest)

        # The leader disputed the cheater's challenge answer; the honest weight slashes it.
        resolved = [ev for ev in q.arbitration.events("DisputeResolved",
                                                      q.deployment.deploy_block)
                    if ev["minerAtFault"]]
        assert LIAR.address not in resolved[0]["voters"]
        d = q.arbitration.get_dispute(int(resolved[0]["disputeId"]))
        assert d.miner == cheater
        assert _signed_weight(q, resolved[0]["voters"], d.epoch) * 3 > d.total_weight * 2
        slashed = int(resolved[0]["slashed"])
        assert slashed > 0
        # The disputes' slashes, and 10% burned for every report after the first in a row
        # that left the cheater untrusted: to the wei.
        burn = q.chain.call(q.gpu.contract.functions.BURN())
        burned = [int(ev["amount"]) for ev in q.gpu.events("Slashed", q.deployment.deploy_block,
                                                           miner=cheater)
                  if ev["beneficiary"] == burn]
        assert len(burned) == max(0, q.gpu.untrusted_reports_of(cheater) - 1)
        assert q.gpu.miner_info(cheater).stake == stake_before - sum(
            int(ev["slashed"]) for ev in resolved) - sum(burned)
    finally:
        for p in reversed(procs):
            p.stop()
