"""The one exception family every Quarry layer raises, so CLIs can print one line and exit."""

from __future__ import annotations


class QuarryError(Exception):
    """A problem the user can act on; its message names the problem."""


class ConfigError(QuarryError):
    """Missing or invalid configuration (deployment file, TOML, environment)."""
