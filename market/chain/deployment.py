"""The deployment file: chain id, RPC URL, contract addresses, deploy block, Anvil's pid.

Kept free of web3 so that reading it (`market devnet status|down`, every command's startup)
stays cheap.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.config import deployment_path
from market.errors import ConfigError

# The five Quarry contracts, in deploy order (TaskRegistry's NatSpec).
CONTRACT_NAMES: tuple[str, ...] = (
    "PaymentEscrow",
    "GPURegistry",
    "TaskRegistry",
    "VerifierCommittee",
    "Arbitration",
)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")


def _address(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value):
        raise ConfigError(f"{field_name}: {value!r} is not an address")
    return value


@dataclass
class Deployment:
    """What `deployment.json` holds: enough for any process to reach the contracts."""

    chain_id: int
    rpc_url: str
    addresses: dict[str, str]  # contract name -> checksummed address
    deploy_block: int
    deployer: str
    params: dict[str, int] = field(default_factory=dict)
    anvil_pid: int | None = None
    anvil_log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "chainId": self.chain_id,
            "rpcUrl": self.rpc_url,
            "addresses": self.addresses,
            "deployBlock": self.deploy_block,
            "deployer": self.deployer,
            "params": self.params,
            "anvilPid": self.anvil_pid,
            "anvilLog": self.anvil_log,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "deployment") -> Deployment:
        try:
            items = data["addresses"].items()
            addresses = {str(k): _address(v, f"addresses.{k}") for k, v in items}
            missing = [n for n in CONTRACT_NAMES if n not in addresses]
            if missing:
                raise ConfigError(f"no address for {', '.join(missing)}")
            return cls(
                chain_id=int(data["chainId"]),
                rpc_url=str(data["rpcUrl"]),
                addresses=addresses,
                deploy_block=int(data["deployBlock"]),
                deployer=_address(data["deployer"], "deployer"),
                params={str(k): int(v) for k, v in data.get("params", {}).items()},
                anvil_pid=None if data.get("anvilPid") is None else int(data["anvilPid"]),
                anvil_log=data.get("anvilLog"),
            )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source} is malformed: {type(exc).__name__}: {exc}") from exc

    def save(self, path: Path | None = None) -> Path:
        """Write atomically (a reader never sees half a file)."""
        path = path or deployment_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path | None = None) -> Deployment:
        """The deployment file (default `$QUARRY_HOME/deployment.json`)."""
        path = path or deployment_path()
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"no deployment file at {path}: start a devnet with `market devnet up` "
                "(or set QUARRY_HOME to where one was written)"
            ) from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read deployment file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"deployment file {path} is not a JSON object")
        return cls.from_json(data, str(path))
