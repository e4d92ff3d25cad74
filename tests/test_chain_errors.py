"""Revert decoding, artifact loading and the deployment file (without a chain), and the
error an account that cannot pay its transaction gets (on the devnet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_account import Account

from market.chain.artifacts import all_error_abis, load_artifact
from market.chain.client import Chain, anvil_account
from market.chain.contracts import GpuSpec
from market.chain.deploy import Quarry
from market.chain.deployment import CONTRACT_NAMES, Deployment
from market.chain.errors import (
    ChainError,
    ContractRevert,
    ErrorDecoder,
    InsufficientFunds,
    revert_class,
)
from market.errors import ConfigError, QuarryError
from market.protocol import keccak

ADDR = "0x" + "ab" * 20


def selector(signature: str) -> bytes:
    return keccak(signature.encode())[:4]


def test_every_contract_and_openzeppelin_error_is_known() -> None:
    for name in CONTRACT_NAMES:
        artifact = load_artifact(name)
        assert artifact.abi and len(artifact.bytecode) > 1000
    names = {e["name"] for e in all_error_abis()}
    for expected in ("WrongPayment", "TooManyOutputTokens", "ResponseWindowClosed",
                     "MinersNotSorted", "ContractAccount", "DuplicateSigner",
                     "QuorumNotReached", "OwnableUnauthorizedAccount", "ECDSAInvalidSignature",
                     "ReentrancyGuardReentrantCall", "FailedCall"):
        assert expected in names


def test_decoder_names_errors_and_args() -> None:
    decoder = ErrorDecoder()
    data = selector("WrongPayment(uint256,uint256)") + abi_encode(["uint256", "uint256"], [5, 1])
    exc = decoder.exception(data, "TaskRegistry.createTask")
    assert type(exc) is revert_class("WrongPayment")
    assert isinstance(exc, ContractRevert) and isinstance(exc, QuarryError)
    assert str(exc) == "TaskRegistry.createTask reverted: WrongPayment(expected=5, got=1)"
    assert exc.args_dict == {"expected": 5, "got": 1}

    data = selector("SignerMismatch(address,address)") + abi_encode(
        ["address", "address"], [ADDR, ADDR])
    assert decoder.decode(data)[1]["got"] == "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"

    panic = decoder.exception(selector("Panic(uint256)") + abi_encode(["uint256"], [0x11]))
    assert panic.error == "Panic" and "arithmetic overflow" in str(panic)
    plain = decoder.exception(selector("Error(string)") + abi_encode(["string"], ["nope"]), "X.f")
    assert str(plain) == "X.f reverted: 'nope'"
    bare = decoder.exception(b"", "X.f")
    assert str(bare) == "X.f reverted without a reason" and bare.error == ""
    unknown = decoder.exception(b"\xde\xad\xbe\xef" + b"\0" * 32)
    assert unknown.error == "Unknown" and "0xdeadbeef" in str(unknown)
    garbled = decoder.decode(selector("WrongPayment(uint256,uint256)") + b"\x01")
    assert garbled[0] == "WrongPayment" and "undecodable" in garbled[1]


def test_struct_and_enum_error_args_decode() -> None:
    decoder = ErrorDecoder()
    data = selector("ShardNotOpen(uint8)") + abi_encode(["uint8"], [5])
    assert decoder.decode(data) == ("ShardNotOpen", {"state": 5})


def test_missing_artifacts_say_make_compile(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("QUARRY_ARTIFACTS", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="make compile"):
        load_artifact("TaskRegistry")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("QUARRY_ARTIFACTS", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"TaskRegistry.*make compile"):
        load_artifact("TaskRegistry")


def test_deployment_file_round_trip_and_errors(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="market devnet up"):
        Deployment.load()
    d = Deployment(31337, "http://127.0.0.1:1", {n: ADDR for n in CONTRACT_NAMES}, 1,
                   ADDR, {"min_stake": 5}, 123, "/tmp/log")
    path = d.save()
    assert path == tmp_path / "deployment.json"
    assert Deployment.load() == Deployment.from_json(json.loads(path.read_text()))
    assert Deployment.load().anvil_pid == 123
    data = json.loads(path.read_text())
    del data["addresses"]["Arbitration"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="no address for Arbitration"):
        Deployment.load()
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read deployment file"):
        Deployment.load()
    path.write_text(json.dumps({"chainId": 1}))
    with pytest.raises(ConfigError, match="malformed"):
        Deployment.load()


def test_unreachable_chain_is_a_clear_error(tmp_path: Path) -> None:
    from market.chain.devnet import free_port

    url = f"http://127.0.0.1:{free_port()}"
    chain = Chain(url, timeout=2)
    assert not chain.is_up()
    with pytest.raises(ChainError, match="did not answer"):
        chain.block_number()
    d = Deployment(31337, url, {n: ADDR for n in CONTRACT_NAMES}, 1, ADDR)
    d.save(tmp_path / "deployment.json")
    with pytest.raises(ChainError, match="is the devnet running"):
        Quarry.connect(tmp_path / "deployment.json")


def test_anvil_accounts_are_the_well_known_ones() -> None:
    assert anvil_account(0).address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert anvil_account(1).address == "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    with pytest.raises(ChainError):
        anvil_account(-1)


@pytest.mark.chain
@pytest.mark.parametrize("funded", ["nothing", "the stake but no gas"])
def test_unfunded_key_is_told_its_address_balance_and_need(devnet: Any, funded: str) -> None:
    """Defect 5: a key with no ETH (or too little for value + gas) was told "the chain did
    not answer". Every role sends through `Chain.send`, so a miner's register stands for all."""
    fresh = Account.create()
    stake = devnet.MINER_STAKE
    balance = 0 if funded == "nothing" else stake
    devnet.chain.set_balance(fresh.address, balance)
    with pytest.raises(InsufficientFunds) as info:
        devnet.q.gpu.register(fresh, [devnet.MODEL_ID], GpuSpec("RTX 4090", 24564, 1),
                              "http://127.0.0.1:9", devnet.PRICE, stake)
    err = info.value
    assert (err.address, err.balance) == (fresh.address, balance)
    assert err.needed > balance and err.needed >= stake
    text = str(err)
    assert text.startswith(f"GPURegistry.register: account {fresh.address} cannot pay")
    assert f"holds {balance} wei" in text and f"needs {err.needed} wei" in text
    assert "did not answer" not in text
    assert devnet.chain.balance(fresh.address) == balance


@pytest.mark.chain
def test_unfunded_transfer_names_the_gas_it_needs(devnet: Any) -> None:
    fresh = Account.create()
    with pytest.raises(InsufficientFunds, match=rf"transfer to .*: account {fresh.address} "
                       r"cannot pay .* holds 0 wei .* 1 wei of value plus up to \d+ wei of "
                       r"gas \(21000 gas at \d+ wei\)"):
        devnet.chain.transfer(fresh, devnet.anyone.address, 1)


@pytest.mark.chain
def test_a_node_that_refuses_batches_still_gets_transactions(devnet: Any,
                                                             no_batch_node: Any) -> None:
    """`Chain.send` asks for the nonce, estimate and fees in one JSON-RPC batch; a node with
    batches turned off answers a single error object, and the same questions then go one
    by one. A revert is still named from the estimate, before anything is sent."""
    q = Quarry(devnet.deployment, Chain(no_batch_node.url))
    miner = Account.create()
    devnet.chain.set_balance(miner.address, 10**20)
    result = q.gpu.register(miner, [devnet.MODEL_ID], GpuSpec("RTX 4090", 24564, 1),
                            "http://127.0.0.1:9", devnet.PRICE, devnet.MINER_STAKE)
    assert result.event("MinerRegistered")["miner"] == miner.address
    assert no_batch_node.batches == [4]
    nonce = devnet.chain.w3.eth.get_transaction_count(miner.address)
    with pytest.raises(ContractRevert, match="GPURegistry.register reverted: AlreadyRegistered"):
        q.gpu.register(miner, [devnet.MODEL_ID], GpuSpec("RTX 4090", 24564, 1),
                       "http://127.0.0.1:9", devnet.PRICE, devnet.MINER_STAKE)
    assert devnet.chain.w3.eth.get_transaction_count(miner.address) == nonce  # nothing sent


@pytest.mark.chain
def test_a_transaction_the_node_refuses_for_funds_is_told_what_it_needs(devnet: Any) -> None:
    """With the gas limit given, nothing is estimated: the node itself refuses the signed
    transaction, and the sender is told its balance and what the gas limit at the fee cap
    comes to, as when the estimate refuses."""
    fresh = Account.create()
    devnet.chain.set_balance(fresh.address, devnet.MINER_STAKE)
    with pytest.raises(InsufficientFunds, match=rf"GPURegistry.register: account "
                       rf"{fresh.address} cannot pay .* holds {devnet.MINER_STAKE} wei .* plus "
                       r"up to \d+ wei of gas \(900000 gas at \d+ wei\)"):
        devnet.chain.send(devnet.q.gpu.fn(
            "register", [devnet.MODEL_ID], [1], GpuSpec("RTX 4090", 24564, 1).as_tuple(),
            "http://127.0.0.1:9", devnet.PRICE), fresh, value=devnet.MINER_STAKE, gas=900_000)
    assert devnet.chain.rpc("eth_getTransactionCount", [fresh.address, "pending"]) == "0x0"
