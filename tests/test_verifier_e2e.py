"""The verifier committee end to end, every part real: a private redis-server, Anvil with the
contracts, `market serve` with its Celery worker (`LocalStack`), three `miner run` processes
(two honest, one serving a substituted cheaper model via its declared test mode) and four
`verifier run` processes, each with its own Celery scoring worker, one of them Byzantine
(`--test-mode lie`: inverted scores, confirms every answer missing, never co-signs, votes
the wrong way on disputes).

Checks, on-chain: challenge sets are committed and quorum reports submitted; the honest
miners' reputations rise and the cheater's falls below the untrusted threshold so it can no
longer claim; the liar signs no report and changes no score; the leader disputes the
cheater's challenge answer and the committee slashes it, to the wei.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from market.chain.client import anvil_account
from market.chain.deploy import DeployParams
from market.model.manifest import load_manifest
from market.service.processes import ManagedProcess, spawn
from market.service.stack import LocalStack

pytestmark = [pytest.mark.chain, pytest.mark.slow]

BIN = Path(sys.executable).parent
PRICE = 10**9
EPOCH_S = 40
MINERS = {"honest-a": anvil_account(3), "honest-b": anvil_account(4),
          "cheater": anvil_account(5)}
VERIFIERS = [anvil_account(i) for i in (6, 7, 8, 9)]
LIAR = VERIFIERS[3]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    params = DeployParams(epoch_duration=EPOCH_S, challenge_window=60, dispute_timeout=600)
    with LocalStack(home=tmp_path_factory.mktemp("verifiers"), deploy_params=params,
                    index_interval_s=0.3, sweep_interval_s=0.5) as s:
        yield s


def _run(*argv: str) -> None:
    out = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr


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
        "scoring_workers = 1\npoll_interval_s = 0.5\n"
        "challenge_requests = 4\nchallenge_max_tokens = 16\n"
        # Small challenges are noisier than the 16 x 64 the default threshold is tuned for.
        "[verifier.reputation]\nabnormal_below_bps = 6000\n")
    return cfg


@pytest.mark.timeout(600)
def test_committee_epochs_rate_miners_and_slash_a_cheater(stack: LocalStack,
                                                          model_dir: Path) -> None:
    q = stack.quarry
    procs: list[ManagedProcess] = []
    try:
        for port, name in enumerate(MINERS, start=9200):
            cfg = _miner_config(stack, name, model_dir, port)
            _run("miner", "register", "--config", str(cfg))
            extra = ["--test-mode", "substitute"] if name == "cheater" else []
            procs.append(spawn([str(BIN / "miner"), "run", "--config", str(cfg),
                                "--no-progress", *extra],
                               name=f"miner {name}", log_path=stack.logs / f"miner-{name}.log"))
        for i in range(len(VERIFIERS)):
            _run("verifier", "register", "--config", str(_verifier_config(stack, i, model_dir)))
        assert len(q.committee.members()) == 4 and q.committee.quorum() == 3
        for i, v in enumerate(VERIFIERS):
            extra = ["--test-mode", "lie"] if v == LIAR else []
            procs.append(spawn([str(BIN / "verifier"), "run", "--config",
                                str(stack.home / f"verifier-{i}.toml"), *extra],
                               name=f"verifier {i}", log_path=stack.logs / f"verifier-{i}.log"))
        cheater = MINERS["cheater"].address
        honest = [MINERS["honest-a"].address, MINERS["honest-b"].address]
        stake_before = q.gpu.miner_info(cheater).stake

        def cheater_untrusted() -> bool:
            return q.gpu.miner_info(cheater).reputation_bps < 4000

        stack.wait_until(cheater_untrusted, "the cheater's reputation to fall under 0.4",
                         timeout=420)
        reports = q.committee.events("ReputationSubmitted", q.deployment.deploy_block)
        assert reports
        for r in reports:
            assert LIAR.address not in r["signers"], "the liar never co-signs"
            assert len(set(r["signers"])) >= 3
        for m in honest:
            assert q.gpu.miner_info(m).reputation_bps > 5000, "honest miners gain reputation"
        model_id = load_manifest(model_dir).model_id
        assert not q.gpu.is_eligible(cheater, model_id, 0), "an untrusted miner cannot claim"
        assert all(q.gpu.is_eligible(m, model_id, 0) for m in honest)

        # The leader disputed the cheater's challenge answer; the honest quorum slashes it.
        def cheater_slashed() -> bool:
            return any(ev["minerAtFault"] for ev in q.arbitration.events(
                "DisputeResolved", q.deployment.deploy_block))

        stack.wait_until(cheater_slashed, "the cheater's dispute to resolve at fault",
                         timeout=120)
        resolved = [ev for ev in q.arbitration.events("DisputeResolved",
                                                      q.deployment.deploy_block)
                    if ev["minerAtFault"]]
        assert LIAR.address not in resolved[0]["voters"]
        d = q.arbitration.get_dispute(int(resolved[0]["disputeId"]))
        assert d.miner == cheater
        slashed = int(resolved[0]["slashed"])
        assert slashed > 0
        assert q.gpu.miner_info(cheater).stake == stake_before - sum(
            int(ev["slashed"]) for ev in resolved)
    finally:
        for p in reversed(procs):
            p.stop()
