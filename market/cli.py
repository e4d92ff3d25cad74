"""The `market` command: devnet, model tools and the placement planner.

Each area registers its own subcommands through `add_commands(subparsers)` in a module that
is cheap to import; heavy imports (torch, web3) happen inside the command handlers.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from market.cliutil import run_cli

AREAS = ("market.chain.cli", "market.model.cli", "market.scheduler.cli", "market.service.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="market", description="Quarry market tools: the local devnet, models and placement."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in AREAS:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
