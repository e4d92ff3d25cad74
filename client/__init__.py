"""Quarry client: the SDK (`from client import Client`) and the `client` CLI.

Names load on first use, so `client --help` does not pay for web3.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Client", "Job", "JobStatus", "Output", "ResultCheckFailed"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "Job", "JobStatus", "ResultCheckFailed"):
        from client import sdk

        return getattr(sdk, name)
    if name == "Output":
        from client.batch import Output

        return Output
    raise AttributeError(f"module 'client' has no attribute {name!r}")
