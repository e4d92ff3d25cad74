"""Shared CLI plumbing: argparse wiring and the one-line-error exit convention."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from market.errors import QuarryError


def add_log_format(parser: argparse.ArgumentParser) -> None:
    """`--log-format {text,json}` for a command that logs (see `market.logs`)."""
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="text (default) or one JSON object per line on stderr, tagged "
                        "with the task and shard (default: $QUARRY_LOG_FORMAT, else text)")


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port` and `--metrics-host` for a long-running role (`metrics_port` and
    `metrics_host` in its config; see `market.metrics.serve_metrics`)."""
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: "
                        "any free port)")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="address the metrics server binds (default 127.0.0.1)")


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, call the chosen subcommand's `func`, and turn a QuarryError into one line.

    Every subcommand sets `func` (taking the parsed namespace, returning an exit code or None)
    with `parser.set_defaults(func=...)`.
    """
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int | None] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except QuarryError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
