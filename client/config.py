"""The client's settings: a TOML file's `[client]` table, then `QUARRY_CLIENT_*`, then flags.

    [client]
    market_url = "http://127.0.0.1:8600"
    rpc_url = "http://127.0.0.1:8545"     # optional: default is the market deployment's RPC
    key_file = "~/.quarry/client.key"     # or: key = "0x..." (a file keeps it out of ps)
    gateway_token = "..."                 # `client gateway`: the bearer token it requires
    gateway_uploads_per_s = 2.0           # its uploads a second (bursts of 2 s worth) ...
    gateway_uploads_at_once = 2           # ... and at once; past either: 429, Retry-After

Environment: QUARRY_CLIENT_MARKET_URL, QUARRY_CLIENT_RPC_URL, QUARRY_CLIENT_KEY,
QUARRY_CLIENT_KEY_FILE, QUARRY_CLIENT_GATEWAY_TOKEN. A key given by a later source replaces
a key or key file from an earlier one. Kept free of web3 (and of `client.sdk`) so the CLI
starts fast.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from market.roleconfig import KeyedSettings, OptionalUrl, Url

DEFAULT_MARKET_URL = "http://127.0.0.1:8600"


def format_eth(wei: int) -> str:
    """Wei as an exact decimal ETH amount (no float rounding): 27000000000 -> 0.000000027 ETH."""
    whole, frac = divmod(int(wei), 10**18)
    return f"{whole}.{frac:018d}".rstrip("0").rstrip(".") + " ETH"


class ClientConfig(KeyedSettings):
    """Where the client finds the market and the chain, and the key it pays with."""

    role = "client"

    market_url: Url = DEFAULT_MARKET_URL
    rpc_url: OptionalUrl = None
    gateway_token: Annotated[str, Field(repr=False)] = ""  # `client gateway`'s bearer token
    # `client gateway`'s uploads (`POST /v1/files`): a second, in bursts of two seconds'
    # worth, and at once; past either a 429 with Retry-After (`market.admission`)
    gateway_uploads_per_s: Annotated[float, Field(gt=0)] = 2.0
    gateway_uploads_at_once: Annotated[int, Field(ge=1, le=16)] = 2
