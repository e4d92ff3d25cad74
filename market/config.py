"""Where Quarry keeps its local state and finds the compiled contracts.

- `quarry_home()`: `$QUARRY_HOME`, or `./.quarry` under the current directory. It holds the
  devnet's `deployment.json` (which every command reads by default), Anvil's log and the
  market store.
- `artifacts_dir()`: `$QUARRY_ARTIFACTS`, or Hardhat's `artifacts/` in the project root
  (written by `make compile`).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def quarry_home() -> Path:
    """The local state directory (not created here)."""
    env = os.environ.get("QUARRY_HOME")
    return Path(env).expanduser() if env else Path.cwd() / ".quarry"


def deployment_path() -> Path:
    """The deployment file of the running devnet: chain id, RPC URL, addresses, Anvil pid."""
    return quarry_home() / "deployment.json"


def artifacts_dir() -> Path:
    """Hardhat's artifacts directory, holding each contract's ABI and bytecode."""
    env = os.environ.get("QUARRY_ARTIFACTS")
    return Path(env).expanduser() if env else PROJECT_ROOT / "artifacts"


def node_modules_dir() -> Path:
    """The project's npm packages (Anvil's binary, the OpenZeppelin Merkle library)."""
    return PROJECT_ROOT / "node_modules"
