"""A connection to one EVM chain: sending signed transactions from local accounts, decoding
reverts and events, and the devnet-only clock and snapshot controls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import ABIEvent
from eth_utils import event_abi_to_log_topic, to_checksum_address
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractFunction
from web3.eth import Eth
from web3.exceptions import ContractLogicError, TimeExhausted, Web3Exception, Web3RPCError
from web3.types import BlockIdentifier, RPCEndpoint

from market.chain.artifacts import Artifact
from market.chain.errors import (
    ChainError,
    ErrorDecoder,
    InsufficientFunds,
    default_decoder,
    format_wei,
    is_insufficient_funds,
)

Read = ContractFunction | Callable[[Eth], Any]
"""One read for `Chain.read`: a bound view (`contract.functions.f(args)`), or a function of
web3's `eth` module that makes one request and returns what it returns, untouched (in a
batch that is a placeholder): `lambda eth: eth.get_block("latest")`."""

READ_BATCH = 200
"""The most reads `Chain.read` puts in one batch."""

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"


@cache
def anvil_account(index: int) -> LocalAccount:
    """Account `index` of Anvil's default mnemonic (funded with 10,000 ETH on a devnet)."""
    if not isinstance(index, int) or index < 0:
        raise ChainError(f"account index must be a non-negative integer, got {index!r}")
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def as_account(key_or_account: LocalAccount | str | bytes) -> LocalAccount:
    """A LocalAccount from itself or from a private key (hex string or bytes)."""
    if isinstance(key_or_account, LocalAccount):
        return key_or_account
    try:
        return Account.from_key(key_or_account)
    except (ValueError, TypeError) as exc:
        raise ChainError(f"not a valid private key: {exc}") from exc


@dataclass
class TxResult:
    """A mined transaction: its receipt, the wei it cost in gas, and its decoded events."""

    tx_hash: str
    block_number: int
    gas_used: int
    gas_cost: int  # gasUsed * effectiveGasPrice, in wei
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    contract_address: str | None = None

    def event(self, name: str) -> dict[str, Any]:
        """The arguments of the first event called `name` (ChainError when there is none)."""
        for event_name, args in self.events:
            if event_name == name:
                return args
        raise ChainError(f"transaction {self.tx_hash} emitted no {name} event")

    def all(self, name: str) -> list[dict[str, Any]]:
        """The arguments of every event called `name`, in log order."""
        return [args for event_name, args in self.events if event_name == name]


def gas_limit(estimate: int) -> int:
    """The gas limit sent for an estimate: half as much again plus 50,000. A call's gas can
    depend on the block it lands in, and a node estimates on the latest block: an answered
    availability challenge rewrites the shard's window end only when time has passed, and a
    committee join or exit mined after an epoch boundary writes new checkpoint slots (about
    65,000 gas more). Unused gas is refunded, so the margin costs only balance headroom."""
    return estimate * 3 // 2 + 50_000


class Chain:
    """One JSON-RPC endpoint. Transactions are signed locally, so any EVM node works."""

    def __init__(
        self, rpc_url: str, *, timeout: float = 30.0, decoder: ErrorDecoder | None = None
    ) -> None:
        self.rpc_url = rpc_url
        self.timeout = timeout
        # web3 validates every eth_call and estimate against the chain id, which it asks the
        # node for each time unless cached: one extra round trip per call. Only the chain id
        # is cached (blocks are not: a restarted devnet reuses their numbers).
        self.w3 = Web3(Web3.HTTPProvider(
            rpc_url, request_kwargs={"timeout": timeout}, cache_allowed_requests=True,
            cacheable_requests={RPCEndpoint("eth_chainId")}))
        self._decoder = decoder
        self._chain_id: int | None = None
        self._contracts: dict[str, tuple[str, Contract]] = {}  # address -> (name, contract)
        self._topics: dict[tuple[str, bytes], str] = {}  # (address, topic0) -> event name
        self._send_lock = threading.Lock()

    # -- basics ---------------------------------------------------------------------------

    @property
    def decoder(self) -> ErrorDecoder:
        if self._decoder is None:
            self._decoder = default_decoder()
        return self._decoder

    def is_up(self) -> bool:
        """Whether the node answers JSON-RPC."""
        try:
            return self.w3.is_connected()
        except Exception:  # any transport failure means "not up"
            return False

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self._rpc(lambda: self.w3.eth.chain_id))
        return self._chain_id

    def block_number(self) -> int:
        return int(self._rpc(lambda: self.w3.eth.block_number))

    def timestamp(self) -> int:
        """The latest block's timestamp (the contracts' `block.timestamp` is at least this)."""
        return int(self._rpc(lambda: self.w3.eth.get_block("latest"))["timestamp"])

    def balance(self, address: str) -> int:
        return int(self._rpc(lambda: self.w3.eth.get_balance(to_checksum_address(address))))

    def _rpc(self, thunk: Any) -> Any:
        try:
            return thunk()
        except (OSError, Web3Exception) as exc:
            if isinstance(exc, ContractLogicError):
                raise
            raise ChainError(f"chain at {self.rpc_url} did not answer: {exc}") from exc
        except Exception as exc:  # requests' errors are not OSError subclasses everywhere
            if type(exc).__module__.startswith(("requests", "urllib3")):
                raise ChainError(f"chain at {self.rpc_url} did not answer: {exc}") from exc
            raise

    # -- contracts ------------------------------------------------------------------------

    def contract(self, name: str, address: str, abi: Sequence[dict[str, Any]]) -> Contract:
        """A web3 contract bound to `address`, remembered so its events are decoded."""
        address = to_checksum_address(address)
        contract = self.w3.eth.contract(address=address, abi=list(abi), decode_tuples=True)
        self._contracts[address] = (name, contract)
        for item in abi:
            if item.get("type") == "event" and not item.get("anonymous"):
                topic = event_abi_to_log_topic(cast(ABIEvent, item))
                self._topics[(address, topic)] = item["name"]
        return contract

    def deploy(
        self, artifact: Artifact, sender: LocalAccount, *args: Any, value: int = 0
    ) -> tuple[Contract, TxResult]:
        """Deploy `artifact` with constructor `args`; returns the bound contract and receipt."""
        factory = self.w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        result = self.send(factory.constructor(*args), sender, value=value,
                           where=f"{artifact.name}.constructor")
        if not result.contract_address:
            raise ChainError(f"deploying {artifact.name} created no contract")
        return self.contract(artifact.name, result.contract_address, artifact.abi), result

    def where(self, fn: Any) -> str:
        address = getattr(fn, "address", None)
        name = self._contracts.get(address, ("contract", None))[0] if address else "contract"
        return f"{name}.{getattr(fn, 'fn_name', '?')}"

    def call(self, fn: ContractFunction, *, block: BlockIdentifier = "latest") -> Any:
        """Run a view (or simulate a transaction) and decode its reverts."""
        try:
            return self._rpc(lambda: fn.call(block_identifier=block))
        except ContractLogicError as exc:
            raise self._revert(exc, self.where(fn)) from None

    def read(self, reads: Sequence[Read]) -> list[Any]:
        """The answers to several reads, in order, from one JSON-RPC batch: each decoded as
        `call` (a view) or web3's `eth` method would decode it alone. A status assembled from a
        dozen reads then costs one round trip instead of a dozen (each about 1 ms of CPU and
        a turn on the node).

        When the batch fails as a whole (a view reverts, or the node refuses batches), the
        reads go again one by one, so a revert raises the named error of the read that made
        it, as `call` does; a node that does not answer raises `ChainError`."""
        def batched() -> list[Any]:
            with self.w3.batch_requests() as batch:
                for r in reads:
                    batch.add(r if isinstance(r, ContractFunction) else r(self.w3.eth))
                return list(batch.execute())

        if len(reads) > READ_BATCH:  # nodes cap their batches (often at a few hundred)
            return [a for i in range(0, len(reads), READ_BATCH)
                    for a in self.read(reads[i:i + READ_BATCH])]
        if len(reads) > 1:
            try:
                return cast(list[Any], self._rpc(batched))
            except ContractLogicError:
                pass  # one by one, below, says which read reverted
            except ChainError as exc:
                if not isinstance(exc.__cause__, Web3RPCError):
                    raise  # the node did not answer; a refused batch goes one by one
        return [self.call(r) if isinstance(r, ContractFunction)
                else self._rpc(lambda r=r: r(self.w3.eth)) for r in reads]

    def send(
        self,
        fn: Any,
        sender: LocalAccount,
        *,
        value: int = 0,
        gas: int | None = None,
        where: str | None = None,
    ) -> TxResult:
        """Sign `fn` (a contract function or constructor call) as `sender`, send it, and wait
        for its receipt. A revert raises the `ContractRevert` subclass named after the error.

        The nonce, the gas estimate (which also surfaces a revert before anything is sent)
        and the fee inputs are asked for in one JSON-RPC batch, and the signed transaction is
        sent raw: web3's `build_transaction` asks for them one request at a time, each through
        its formatting middleware, and that CPU is what a miner's claims and submissions
        take from the generation running beside them (a send cost 11 ms of CPU; see
        `prepare`)."""
        where = where or self.where(fn)
        built: dict[str, Any] = {}  # the transaction once prepared; {} if estimating failed
        with self._send_lock:
            try:
                built = self.prepare(fn, sender, int(value), gas, where=where)
                signed = sender.sign_transaction(built)
                tx_hash, shown = signed.hash, "0x" + bytes(signed.hash).hex()
                raw = "0x" + bytes(signed.raw_transaction).hex()
                (sent,) = self._batch([("eth_sendRawTransaction", [raw])])
                if "error" in sent:
                    raise self._rpc_error(sent["error"], where, "the node refused it")
            except ChainError as exc:
                if is_insufficient_funds(exc):
                    raise self._unfunded(sender.address, int(value), built, where) from None
                raise
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.timeout, poll_latency=0.05
            )
        except TimeExhausted as exc:
            raise ChainError(f"{where}: transaction {shown} not mined: {exc}") from exc
        if receipt["status"] != 1:
            # Replay it as a call on the parent block's state to recover the revert data.
            try:
                self.w3.eth.call(cast(Any, built), receipt["blockNumber"] - 1)
            except ContractLogicError as exc:
                raise self._revert(exc, where) from None
            raise ChainError(f"{where}: transaction {shown} reverted (no reason)")
        return TxResult(
            tx_hash=shown,
            block_number=int(receipt["blockNumber"]),
            gas_used=int(receipt["gasUsed"]),
            gas_cost=int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"]),
            events=self._decode_logs(receipt["logs"]),
            contract_address=receipt.get("contractAddress"),
        )

    def prepare(self, fn: Any, sender: LocalAccount, value: int = 0, gas: int | None = None,
                *, where: str | None = None) -> dict[str, Any]:
        """The unsigned transaction `send` would sign for `fn`: its calldata encoded here,
        then the pending nonce, the gas estimate and the fee inputs (the tip and the latest
        base fee) in one batch. The fee cap is web3's default (tip + twice the base fee); a
        chain without EIP-1559 gets a legacy gas price. A revert in the estimate raises the
        named error; a value over the balance, a `ChainError` that `is_insufficient_funds`
        tells apart."""
        where = where or self.where(fn)
        # All fee fields given, so web3 only encodes: it makes no request here.
        call = fn.build_transaction({"from": sender.address, "value": value, "gas": 0,
                                     "chainId": self.chain_id, "nonce": 0,
                                     "maxFeePerGas": 0, "maxPriorityFeePerGas": 0})
        probe = {"from": sender.address, "value": hex(value), "data": call["data"]}
        if call.get("to"):
            probe["to"] = call["to"]
        asks: dict[str, tuple[str, list[Any]]] = {
            "nonce": ("eth_getTransactionCount", [sender.address, "pending"]),
            "latest block": ("eth_getBlockByNumber", ["latest", False]),
            "priority fee": ("eth_maxPriorityFeePerGas", [])}
        if gas is None:
            asks["gas estimate"] = ("eth_estimateGas", [probe])
        answers = dict(zip(asks, self._batch(list(asks.values())), strict=True))
        for what in ("nonce", "latest block", "gas estimate"):  # a tip has a fallback below
            if "error" in answers.get(what, {}):
                raise self._rpc_error(answers[what]["error"], where, f"asking for the {what}")
        tx: dict[str, Any] = {**call, "nonce": int(answers["nonce"]["result"], 16),
                              "gas": int(gas) if gas is not None
                              else gas_limit(int(answers["gas estimate"]["result"], 16))}
        block, tip = answers["latest block"], answers["priority fee"]
        base_fee = (block.get("result") or {}).get("baseFeePerGas")
        if base_fee is None:  # no EIP-1559 on this chain
            for key in ("maxFeePerGas", "maxPriorityFeePerGas"):
                tx.pop(key, None)
            tx["gasPrice"] = int(self._rpc(lambda: self.w3.eth.gas_price))
            return tx
        # A node without eth_maxPriorityFeePerGas: web3 derives the tip from fee history.
        tip_wei = (int(tip["result"], 16) if "result" in tip
                   else int(self._rpc(lambda: self.w3.eth.max_priority_fee)))
        tx["maxPriorityFeePerGas"] = tip_wei
        tx["maxFeePerGas"] = tip_wei + 2 * int(base_fee, 16)
        return tx

    def _batch(self, calls: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        """Raw JSON-RPC answers to `calls`, in order: one batch request, or one request each
        where the node does not take batches."""
        provider = self.w3.provider
        batch = getattr(provider, "make_batch_request", None)
        answers = None if batch is None or len(calls) == 1 else self._rpc(
            lambda: batch([(RPCEndpoint(m), p) for m, p in calls]))
        if not isinstance(answers, list) or len(answers) != len(calls):
            answers = [self._rpc(lambda m=m, p=p: provider.make_request(RPCEndpoint(m), p))
                       for m, p in calls]
        return [dict(a) for a in answers]

    def _rpc_error(self, error: Any, where: str, doing: str) -> Exception:
        """The exception for a JSON-RPC error object met while `doing` something for
        `where`: the contract's named error for a revert, otherwise a ChainError quoting
        the node (an "insufficient funds" one is told apart by `is_insufficient_funds`)."""
        error = error if isinstance(error, dict) else {"message": str(error)}
        data, message = error.get("data"), str(error.get("message") or error)
        if data not in (None, "0x") or "revert" in message.lower():
            return self._revert_of(data, message, where)
        return ChainError(f"{where}: {doing}: the node answered {message!r}")

    def transfer(self, sender: LocalAccount, to: str, value: int) -> TxResult:
        """Send plain ether (to fund an account that is not one of Anvil's)."""
        with self._send_lock:
            tx = {
                "from": sender.address, "to": to_checksum_address(to), "value": int(value),
                "chainId": self.chain_id, "gas": 21000,
                "nonce": self._rpc(
                    lambda: self.w3.eth.get_transaction_count(sender.address, "pending")),
                "maxFeePerGas": 2 * int(self._rpc(lambda: self.w3.eth.gas_price)) + 1,
                "maxPriorityFeePerGas": 1,
            }
            signed = sender.sign_transaction(tx)
            try:
                tx_hash = self._rpc(
                    lambda: self.w3.eth.send_raw_transaction(signed.raw_transaction))
            except ChainError as exc:
                if is_insufficient_funds(exc):
                    raise self._unfunded(sender.address, int(value), tx,
                                         f"transfer to {to}") from None
                raise
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self.timeout,
                                                           poll_latency=0.05)
        return TxResult("0x" + bytes(tx_hash).hex(), int(receipt["blockNumber"]),
                        int(receipt["gasUsed"]),
                        int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"]))

    def _unfunded(self, address: str, value: int, tx: dict[str, Any],
                  where: str) -> InsufficientFunds:
        """The error for a sender that cannot pay `value` plus gas: its address, balance and
        what is needed (value plus the gas limit at the fee cap, when the node estimated it)."""
        balance = self.balance(address)
        fee = int(tx.get("maxFeePerGas") or tx.get("gasPrice") or 0)
        gas = int(tx.get("gas") or 0)
        if gas and fee:
            needed = value + gas * fee
            need = (f"{format_wei(needed)}: {value} wei of value plus up to {gas * fee} wei of "
                    f"gas ({gas} gas at {fee} wei)")
        else:  # the node refused to estimate: value alone is more than the balance
            needed = value
            need = f"{format_wei(value)} of value plus its gas"
        return InsufficientFunds(
            f"{where}: account {address} cannot pay for the transaction: it holds "
            f"{format_wei(balance)} and needs {need}; fund the account first",
            address=address, balance=balance, needed=needed)

    def _revert(self, exc: ContractLogicError, where: str) -> Exception:
        return self._revert_of(exc.data, str(exc.message or exc), where)

    def _revert_of(self, data: Any, message: str, where: str) -> Exception:
        """The exception for a revert with `data` (the node's revert data, as web3 or a raw
        JSON-RPC error carries it): the contract's named error when it decodes."""
        if isinstance(data, dict):  # some nodes nest it: {"data": "0x..."}
            data = data.get("data")
        if isinstance(data, str) and data.startswith("0x"):
            return self.decoder.exception(bytes.fromhex(data[2:]), where)
        return self.decoder.exception(b"", where) if data in (None, "0x") else ChainError(
            f"{where} reverted: {message}"
        )

    def _decode_logs(self, logs: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for log in logs:
            if not log["topics"]:
                continue
            address = to_checksum_address(log["address"])
            name = self._topics.get((address, bytes(log["topics"][0])))
            if name is None:
                continue
            contract = self._contracts[address][1]
            decoded = contract.events[name]().process_log(log)
            out.append((name, plain(decoded["args"])))
        return out

    def log_topics(self, address: str, from_block: int, to_block: int,
                   topics: Sequence[str | None]) -> list[tuple[str | None, list[bytes]]]:
        """One `eth_getLogs` over `address`'s logs in [from_block, to_block] matching `topics`
        (None: any): each log's event name (None when its ABI is not bound here) and its
        topics, undecoded. For following a few indexed fields cheaply, without decoding."""
        address = to_checksum_address(address)
        logs = self.rpc("eth_getLogs", [{"address": address, "fromBlock": hex(from_block),
                                         "toBlock": hex(to_block), "topics": list(topics)}])
        out: list[tuple[str | None, list[bytes]]] = []
        for log in logs or []:
            raw = [bytes.fromhex(str(t)[2:]) for t in log["topics"]]
            out.append((self._topics.get((address, raw[0])) if raw else None, raw))
        return out

    # -- devnet controls (Anvil, Hardhat) -------------------------------------------------

    def rpc(self, method: str, params: Sequence[Any] = ()) -> Any:
        """A raw JSON-RPC call; errors become ChainError."""
        response = self._rpc(
            lambda: self.w3.provider.make_request(RPCEndpoint(method), list(params)))
        if "error" in response:
            raise ChainError(f"{method} failed: {response['error']}")
        return response.get("result")

    def snapshot(self) -> str:
        return str(self.rpc("evm_snapshot"))

    def revert_to(self, snapshot_id: str) -> None:
        if not self.rpc("evm_revert", [snapshot_id]):
            raise ChainError(f"evm_revert to snapshot {snapshot_id} failed")

    def mine(self, count: int = 1) -> None:
        for _ in range(count):
            self.rpc("evm_mine")

    def advance_time(self, seconds: int) -> int:
        """Move the chain clock forward and mine a block at the new time; returns it."""
        self.rpc("evm_increaseTime", [int(seconds)])
        self.rpc("evm_mine")
        return self.timestamp()

    def set_balance(self, address: str, wei: int) -> None:
        self.rpc("anvil_setBalance", [to_checksum_address(address), hex(int(wei))])


def plain(value: Any) -> Any:
    """AttributeDicts and HexBytes into dicts and bytes, so results compare and print simply."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not isinstance(value, bytes):
        if hasattr(value, "_asdict"):
            return {k: plain(v) for k, v in value._asdict().items()}
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return bytes(value)
    return value
