"""Chain errors, and reverts decoded into Python exceptions named after the custom error.

A revert such as `InsufficientStake(1, 2)` becomes an instance of a `ContractRevert`
subclass called `InsufficientStake`, whose message is
`GPURegistry.register reverted: InsufficientStake(sent=1, minimum=2)`. Catch one error with
`except revert_class("InsufficientStake")` (the class is made once per name, so `pytest.raises`
works), or any revert with `except ContractRevert` and read `.error` and `.args_dict`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_utils import to_checksum_address

from market.chain.artifacts import abi_type, all_error_abis, error_signature
from market.errors import QuarryError
from market.protocol.canonical import keccak


class ChainError(QuarryError):
    """The chain is unreachable, a transaction failed, or a deployment is unusable."""


class DeploymentMismatch(ChainError):
    """The chain answering at the RPC URL is not the one the deployment was made on (another
    chain id, or no contract code at the deployment's addresses)."""


class InsufficientFunds(ChainError):
    """An account cannot pay a transaction's value plus its gas. The node answers such a
    transaction with an RPC error, which once read as "the chain did not answer"; this names
    the account, its balance and what the transaction needs (`needed`: 0 when unknown)."""

    def __init__(self, message: str, *, address: str = "", balance: int = 0,
                 needed: int = 0) -> None:
        super().__init__(message)
        self.address = address
        self.balance = balance
        self.needed = needed


def is_insufficient_funds(exc: BaseException | None) -> bool:
    """Whether a node's error says the sender cannot pay value + gas (geth, Anvil, Hardhat
    and Erigon all say "insufficient funds")."""
    while exc is not None:
        if "insufficient funds" in str(exc).lower():
            return True
        exc = exc.__cause__
    return False


def format_wei(wei: int) -> str:
    """`wei` as wei and ETH, for messages about money."""
    return f"{wei} wei ({wei / 10**18:.9g} ETH)"


class ContractRevert(ChainError):
    """A contract call or transaction reverted. `error` is the custom error's name ("Error" for
    `require` strings, "Panic" for compiler checks, "" for a bare revert), `args_dict` its
    decoded arguments, `data` the raw revert data."""

    error: str = ""

    def __init__(
        self, message: str, *, error: str, args: dict[str, Any], data: bytes, where: str = ""
    ) -> None:
        super().__init__(message)
        self.error = error
        self.args_dict = args
        self.data = data
        self.where = where


_CLASSES: dict[str, type[ContractRevert]] = {}


def revert_class(error_name: str) -> type[ContractRevert]:
    """The exception class for the custom error `error_name` (created on first use)."""
    cls = _CLASSES.get(error_name)
    if cls is None:
        cls = type(error_name, (ContractRevert,), {"__module__": __name__, "error": error_name})
        _CLASSES[error_name] = cls
    return cls


PANIC_CODES = {
    0x01: "assert failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division or modulo by zero",
    0x21: "invalid enum value",
    0x22: "bad storage byte array",
    0x31: "pop on an empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialised function",
}

_BUILTIN = [
    {"type": "error", "name": "Error", "inputs": [{"name": "reason", "type": "string"}]},
    {"type": "error", "name": "Panic", "inputs": [{"name": "code", "type": "uint256"}]},
]


class ErrorDecoder:
    """Maps 4-byte selectors to custom errors (every compiled artifact's, plus the builtins)."""

    def __init__(self, error_abis: Iterable[dict[str, Any]] | None = None) -> None:
        abis = list(error_abis) if error_abis is not None else all_error_abis()
        self.by_selector: dict[bytes, dict[str, Any]] = {}
        for item in [*_BUILTIN, *abis]:
            self.by_selector.setdefault(keccak(error_signature(item).encode())[:4], item)

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """(error name, {arg name: value}); unknown selectors come back as "Unknown"."""
        if len(data) < 4:
            return "", {}
        item = self.by_selector.get(data[:4])
        if item is None:
            return "Unknown", {"selector": "0x" + data[:4].hex(), "data": "0x" + data[4:].hex()}
        inputs = item.get("inputs", [])
        try:
            values = abi_decode([abi_type(i) for i in inputs], data[4:])
        except (DecodingError, ValueError) as exc:
            return item["name"], {"undecodable": "0x" + data[4:].hex(), "why": str(exc)}
        names = [i.get("name") or f"arg{n}" for n, i in enumerate(inputs)]
        pairs = zip(names, values, inputs, strict=True)
        return item["name"], {n: _pretty(v, i) for n, v, i in pairs}

    def exception(self, data: bytes, where: str = "") -> ContractRevert:
        """The Python exception for revert `data` raised by `where` (e.g. "TaskRegistry.f")."""
        name, args = self.decode(data)
        prefix = f"{where} reverted" if where else "reverted"
        if not name:
            text = f"{prefix} without a reason"
        elif name == "Panic":
            code = int(args.get("code", 0))
            text = f"{prefix}: Panic(0x{code:02x}: {PANIC_CODES.get(code, 'unknown code')})"
        elif name == "Error":
            text = f"{prefix}: {args.get('reason')!r}"
        else:
            text = f"{prefix}: {name}({', '.join(f'{k}={_fmt(v)}' for k, v in args.items())})"
        return revert_class(name or "Revert")(text, error=name, args=args, data=data, where=where)


def _pretty(value: Any, param: dict[str, Any]) -> Any:
    t = param["type"]
    if t == "address":
        return to_checksum_address(value)
    if t.startswith("address["):
        return [to_checksum_address(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return repr(value) if isinstance(value, str) and not value.startswith("0x") else str(value)


_DEFAULT: ErrorDecoder | None = None


def default_decoder() -> ErrorDecoder:
    """The decoder over the current artifacts (built once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ErrorDecoder()
    return _DEFAULT
