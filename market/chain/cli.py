"""`market devnet up|down|status|accounts`: the local Anvil chain with the contracts deployed,
and its funded accounts.

Cheap to import: the devnet module (and web3) load inside the handlers.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_commands(subparsers: Any) -> None:
    devnet = subparsers.add_parser(
        "devnet", help="local Anvil chain with the Quarry contracts",
        description="Start, inspect or stop the local devnet. The deployment file "
        "($QUARRY_HOME/deployment.json, default ./.quarry) is what every other command reads.",
    )
    sub = devnet.add_subparsers(dest="devnet_command", metavar="ACTION")
    up = sub.add_parser("up", help="start Anvil, deploy and wire the contracts")
    up.add_argument("--port", type=int, default=None, help="RPC port (default: a free one)")
    up.set_defaults(func=_up)
    status = sub.add_parser("status", help="show the deployment and whether its chain answers")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=_status)
    down = sub.add_parser("down", help="stop Anvil and remove the deployment file")
    down.set_defaults(func=_down)
    accounts = sub.add_parser(
        "accounts", help="print the funded devnet accounts, their keys and roles",
        description="The devnet's funded accounts (Anvil's default mnemonic: their keys are "
        "public, never use them elsewhere) and the role examples/config/*.toml gives each.")
    accounts.add_argument("--json", action="store_true", help="print them as JSON")
    accounts.set_defaults(func=_accounts)
    devnet.set_defaults(func=lambda args: (devnet.print_help(), 2)[1])


def _print_addresses(addresses: dict[str, str]) -> None:
    for name, address in addresses.items():
        print(f"  {name:<18} {address}")


def _up(args: argparse.Namespace) -> int:
    from market.chain import devnet

    if args.port is not None and not 0 < args.port < 65536:
        raise devnet.DevnetError(f"--port must be in 1..65535, got {args.port}")
    d = devnet.up(args.port)
    print(f"devnet up: chain id {d.chain_id}, RPC {d.rpc_url}, Anvil pid {d.anvil_pid}")
    _print_addresses(d.addresses)
    print(f"funded accounts: {devnet.DEVNET_ACCOUNTS} from Anvil's default mnemonic, 0 "
          "deployed the contracts; `market devnet accounts` prints their keys and the roles "
          "examples/config/*.toml give them")
    print(f"deployment written to {devnet.deployment_path()}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from market.chain import devnet

    state = devnet.status()
    if args.json:
        print(json.dumps(state, indent=2))
        return 0 if state["answers"] else 1
    answers = "answers" if state["answers"] else "does NOT answer"
    print(f"devnet: chain id {state['chainId']}, RPC {state['rpcUrl']} {answers}"
          + (f" (block {state['blockNumber']})" if state["answers"] else ""))
    running = "running" if state["anvilRunning"] else "not running"
    print(f"  anvil pid {state['anvilPid']}: {running}")
    _print_addresses(state["addresses"])
    return 0 if state["answers"] else 1


def _accounts(args: argparse.Namespace) -> int:
    from market.chain import devnet

    rows = devnet.accounts()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("devnet accounts (10,000 ETH each on a fresh devnet; the keys are public):")
    for r in rows:
        print(f"  {r['index']:>2} {r['address']} {r['privateKey']}"
              + (f"  {r['role']}" if r["role"] else ""))
    return 0


def _down(args: argparse.Namespace) -> int:
    from market.chain import devnet

    print(devnet.down())
    return 0
