"""Compiled contracts: ABI and bytecode, shipped in the package or read from Hardhat's output.

By default the roles load package data, so an installed wheel works outside the repository:
`market/chain/abi/<Contract>.json` for each Quarry contract (ABI and creation bytecode, which
the devnet deploys) and `abi/errors.json` (every custom error of every compiled contract,
OpenZeppelin's included, for revert decoding). `make compile` regenerates them from Hardhat's
`artifacts/` with `python -m market.chain.artifacts`; a test checks they equal a fresh compile.

`$QUARRY_ARTIFACTS` (see `market.config.artifacts_dir`) names a Hardhat artifacts directory
to load instead, for trying contract changes before regenerating the shipped files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from market.chain.deployment import CONTRACT_NAMES
from market.config import artifacts_dir
from market.errors import ConfigError

ERRORS_FILE = "errors.json"


@dataclass(frozen=True)
class Artifact:
    """One contract's ABI and creation bytecode, and where they were read from."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    source: str


def shipped_dir() -> Traversable:
    """The package's `abi/` directory (a plain directory for any installed wheel)."""
    return files("market.chain") / "abi"


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
    return _parse(path)


def _parse(file: Traversable) -> Artifact:
    try:
        data = json.loads(file.read_text())
        return Artifact(data["contractName"], data["abi"], data.get("bytecode", "0x"), str(file))
    except FileNotFoundError as exc:
        raise _missing(f"no artifact at {file}") from exc
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read artifact {file}: {exc}; run `make compile`") from exc


def _hardhat_root(directory: Path | None) -> Path | None:
    """The Hardhat directory to read: the argument, else `$QUARRY_ARTIFACTS`, else None."""
    root = directory or artifacts_dir()
    if root is not None and not root.is_dir():
        raise _missing(f"no artifacts directory at {root}")
    return root


def load_artifact(name: str, directory: Path | None = None) -> Artifact:
    """The artifact of contract `name`: shipped, or from a Hardhat artifacts directory."""
    root = _hardhat_root(directory)
    if root is None:
        return _load_shipped(name)
    path = root / "contracts" / f"{name}.sol" / f"{name}.json"
    if not path.exists():
        found = [p for p in root.rglob(f"{name}.json") if p.parent.name.endswith(".sol")]
        if not found:
            raise _missing(f"no artifact for contract {name!r} under {root}")
        path = found[0]
    return _load(path.resolve())


@cache
def _load_shipped(name: str) -> Artifact:
    if name not in CONTRACT_NAMES:
        raise ConfigError(f"the package ships no ABI for contract {name!r} (only "
                          f"{', '.join(CONTRACT_NAMES)}); set QUARRY_ARTIFACTS to a Hardhat "
                          "artifacts directory to load others")
    return _parse(shipped_dir() / f"{name}.json")


def all_error_abis(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every custom error declared in any compiled artifact (Quarry's and OpenZeppelin's).

    Contract ABIs list only the errors a contract itself can raise; scanning every artifact
    also covers errors of libraries and of contracts whose revert data bubbles up.
    """
    root = _hardhat_root(directory)
    if root is None:
        file = shipped_dir() / ERRORS_FILE
        try:
            return list(json.loads(file.read_text())["errors"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read {file}: {exc}; run `make compile`") from exc
    errors: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*.json")):
        if path.name.endswith(".dbg.json") or not path.parent.name.endswith(".sol"):
            continue
        for item in _load(path.resolve()).abi:
            if item.get("type") == "error":
                errors.setdefault(error_signature(item), item)
    return [errors[sig] for sig in sorted(errors)]


def error_signature(item: dict[str, Any]) -> str:
    return f"{item['name']}({','.join(abi_type(i) for i in item.get('inputs', []))})"


def abi_type(param: dict[str, Any]) -> str:
    """The canonical type of an ABI parameter, expanding tuples (structs)."""
    t = param["type"]
    if t.startswith("tuple"):
        return "(" + ",".join(abi_type(c) for c in param["components"]) + ")" + t[len("tuple"):]
    return str(t)


def shipped_files(hardhat_dir: Path) -> dict[str, str]:
    """The package's `abi/` files (name -> text) as generated from a Hardhat artifacts directory.

    Only what the roles read: each Quarry contract's name, ABI and bytecode, and the error list.
    """
    out: dict[str, str] = {}
    for name in CONTRACT_NAMES:
        art = load_artifact(name, hardhat_dir)
        out[f"{name}.json"] = _dump({"contractName": art.name, "abi": art.abi,
                                     "bytecode": art.bytecode})
    out[ERRORS_FILE] = _dump({"errors": all_error_abis(hardhat_dir)})
    return out


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1) + "\n"


def write_shipped(hardhat_dir: Path, out_dir: Path) -> list[str]:
    """Regenerate `out_dir` (the package's `abi/`) from `hardhat_dir`; returns the names written."""
    wanted = shipped_files(hardhat_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        target = out_dir / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    return sorted(wanted)


def main(argv: list[str] | None = None) -> int:
    """`python -m market.chain.artifacts [HARDHAT_ARTIFACTS_DIR]`, run by `make compile`."""
    args = sys.argv[1:] if argv is None else argv
    hardhat_dir = Path(args[0]) if args else Path("artifacts")
    out_dir = Path(__file__).resolve().parent / "abi"
    try:
        names = write_shipped(hardhat_dir, out_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(names)} ABI files to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
