"""Compiled contracts: ABI and bytecode from Hardhat's `artifacts/` directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from market.config import artifacts_dir
from market.errors import ConfigError


@dataclass(frozen=True)
class Artifact:
    """One contract's ABI and creation bytecode."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    path: Path


def _missing(what: str) -> ConfigError:
    return ConfigError(f"{what}: the contracts are not compiled; run `make compile` first")


def _load(path: Path) -> Artifact:
    try:
        return _load_cached(path, path.stat().st_mtime_ns)
    except FileNotFoundError as exc:
        raise _missing(f"no artifact at {path}") from exc


@cache
def _load_cached(path: Path, mtime_ns: int) -> Artifact:
    """Parsed once per file version, so a recompile is picked up."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise _missing(f"no artifact at {path}") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read artifact {path}: {exc}; run `make compile`") from exc
    return Artifact(data["contractName"], data["abi"], data.get("bytecode", "0x"), path)


def load_artifact(name: str, directory: Path | None = None) -> Artifact:
    """The artifact of contract `name` (a Quarry contract or any other compiled one)."""
    root = directory or artifacts_dir()
    if not root.is_dir():
        raise _missing(f"no artifacts directory at {root}")
    path = root / "contracts" / f"{name}.sol" / f"{name}.json"
    if not path.exists():
        found = [p for p in root.rglob(f"{name}.json") if p.parent.name.endswith(".sol")]
        if not found:
            raise _missing(f"no artifact for contract {name!r} under {root}")
        path = found[0]
    return _load(path.resolve())


def all_error_abis(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every custom error declared in any compiled artifact (Quarry's and OpenZeppelin's).

    Contract ABIs list only the errors a contract itself can raise; scanning every artifact
    also covers errors of libraries and of contracts whose revert data bubbles up.
    """
    root = directory or artifacts_dir()
    if not root.is_dir():
        raise _missing(f"no artifacts directory at {root}")
    errors: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*.json")):
        if path.name.endswith(".dbg.json") or not path.parent.name.endswith(".sol"):
            continue
        for item in _load(path.resolve()).abi:
            if item.get("type") == "error":
                errors.setdefault(error_signature(item), item)
    return list(errors.values())


def error_signature(item: dict[str, Any]) -> str:
    return f"{item['name']}({','.join(abi_type(i) for i in item.get('inputs', []))})"


def abi_type(param: dict[str, Any]) -> str:
    """The canonical type of an ABI parameter, expanding tuples (structs)."""
    t = param["type"]
    if t.startswith("tuple"):
        return "(" + ",".join(abi_type(c) for c in param["components"]) + ")" + t[len("tuple"):]
    return str(t)
