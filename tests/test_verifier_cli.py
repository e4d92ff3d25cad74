"""`verifier register / status / exit / withdraw` against the session devnet (the market is
unreachable, so the commands fall back to the deployment file): what they print, and what
they do on-chain, to the wei."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from market.chain.client import anvil_account
from market.chain.devnet import free_port
from verifier.cli import main

pytestmark = pytest.mark.chain

STAKE = 3 * 10**17


def _verifier(tmp_path: Path, index: int) -> tuple[Any, list[str]]:
    """An Anvil account and the flags that make the CLI act as it."""
    account = anvil_account(index)
    key = tmp_path / f"key-{index}"
    key.write_text("0x" + bytes(account.key).hex())
    return account, ["--key-file", str(key), "--market-url",
                     f"http://127.0.0.1:{free_port()}"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """One command, as if in its own process: the logging it sets up (register does) goes
    with it, so the next command's stderr holds only what that command says."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(list(argv))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_register_status_exit_withdraw(devnet: Any, deployment_file: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import until_seated

    q = devnet.q
    c = q.committee
    account, flags = _verifier(tmp_path, 16)
    me = account.address
    # Start at an epoch's first second, so the whole epoch passes before the seat takes
    # effect: on a busy machine the commands below can take longer than an epoch's tail.
    q.chain.advance_time(max(0, c.epoch_start(c.current_epoch() + 1) - q.chain.timestamp()))

    # Register: the seat takes effect at the next boundary, and the command says when.
    code, out, _ = _run(capsys, "register", *flags, "--stake", str(STAKE))
    at = c.current_epoch() + c.activation_delay()
    assert code == 0 and f"its seat takes effect at epoch {at} (chain time " \
        f"{c.epoch_start(at)}" in out
    code, out, _ = _run(capsys, "register", *flags)
    assert code == 0 and f"its seat takes effect at epoch {at}" in out  # nothing sent twice

    code, out, _ = _run(capsys, "status", *flags, "--json")
    status = json.loads(out)
    epoch = c.current_epoch()
    assert status["epoch"] == epoch and me not in status["members"]
    assert status["pending"][me] == {"activeFrom": at, "stake": STAKE}
    assert status["totalWeight"] == sum(status["weights"].values()) == 4 * devnet.VERIFIER_STAKE
    assert status["quorumWeight"] == status["totalWeight"] * 2 // 3 + 1
    assert status["nextReportEpoch"] == c.next_report_epoch()
    code, out, _ = _run(capsys, "status", *flags)
    assert f"pending {me}: seated from epoch {at}" in out and "quorum weight" in out

    # Exit before the seat took effect: the join never takes effect, the stake unbonds.
    code, out, _ = _run(capsys, "exit", *flags)
    info = c.verifier_info(me)
    assert code == 0 and "had not taken effect and never will" in out
    assert info.active_until == info.active_from == at and info.stake == STAKE
    assert info.withdrawable_at == q.chain.timestamp() + c.unbonding_period()
    assert f"withdrawn from chain time {info.withdrawable_at}" in out
    code, _, err = _run(capsys, "withdraw", *flags)
    assert code == 1 and f"bonded until chain time {info.withdrawable_at}" in err
    q.chain.advance_time(info.withdrawable_at - q.chain.timestamp())
    code, out, _ = _run(capsys, "withdraw", *flags)
    assert code == 0 and f"withdrew its stake: {STAKE} wei" in out
    assert not c.verifier_info(me).registered

    # Register again and take the seat; exit: the last epoch and the unbonding time.
    _run(capsys, "register", *flags, "--stake", str(STAKE))
    seated = until_seated(q)
    code, out, _ = _run(capsys, "status", *flags, "--json")
    status = json.loads(out)
    assert status["weights"][me] == STAKE and status["pending"] == {}
    assert status["quorumWeight"] == (4 * devnet.VERIFIER_STAKE + STAKE) * 2 // 3 + 1
    code, out, _ = _run(capsys, "exit", *flags)
    info = c.verifier_info(me)
    assert code == 0 and info.active_until == seated + c.activation_delay()
    assert f"its last epoch is {info.active_until - 1}" in out
    assert f"can be withdrawn from chain time {info.withdrawable_at}" in out
    code, out, _ = _run(capsys, "status", *flags, "--json")
    assert json.loads(out)["leaving"][me]["withdrawableAt"] == info.withdrawable_at
    code, _, err = _run(capsys, "exit", *flags)
    assert code == 1 and "already leaving" in err

    # Withdraw: refused while bonded (one line), then the exact stake.
    code, _, err = _run(capsys, "withdraw", *flags)
    assert code == 1 and f"bonded until chain time {info.withdrawable_at}" in err
    assert len(err.strip().splitlines()) == 1
    q.chain.advance_time(info.withdrawable_at - q.chain.timestamp())
    balance = q.chain.balance(me)
    code, out, _ = _run(capsys, "withdraw", *flags)
    assert code == 0 and f"withdrew its stake: {STAKE} wei" in out
    assert STAKE - 10**15 < q.chain.balance(me) - balance <= STAKE
    assert not c.verifier_info(me).registered
