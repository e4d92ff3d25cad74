"""Reaching the chain and the market from a role's config (miner, verifier).

The contracts' addresses come from the market's `/deployment` (so a role needs only the
market URL), or from the local deployment file when the market does not answer: the chain is
the source of truth, and a role can keep working from it alone. `rpc_url` in the config
overrides the RPC URL either source names (the market may see the chain at another address).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from market.errors import ConfigError

if TYPE_CHECKING:
    from market.chain.deploy import Quarry
    from market.chain.deployment import Deployment
    from market.marketapi import MarketAPI

log = logging.getLogger("quarry")


class RoleConfig(Protocol):
    """What connecting needs from a role's config (read-only, so frozen configs fit)."""

    @property
    def market_url(self) -> str: ...
    @property
    def rpc_url(self) -> str | None: ...
    @property
    def deployment(self) -> Path | None: ...


def resolve_deployment(cfg: RoleConfig, market: MarketAPI) -> Deployment:
    """The deployment from the market, else from the deployment file."""
    from market.chain.deployment import Deployment
    from market.config import deployment_path
    from market.marketapi import MarketError

    try:
        deployment = market.deployment()
    except MarketError as exc:
        path = cfg.deployment or deployment_path()
        try:
            deployment = Deployment.load(path)
        except ConfigError as file_exc:
            raise ConfigError(
                f"cannot find the contracts: the market gave no deployment ({exc}) and "
                f"{file_exc}") from None
        log.warning("market at %s gave no deployment (%s); using %s", market.url, exc, path)
    if cfg.rpc_url:
        deployment = replace(deployment, rpc_url=cfg.rpc_url)
    return deployment


def connect(cfg: RoleConfig) -> tuple[Quarry, MarketAPI]:
    """The contracts (checked: the chain answers, its id matches, the code is there) and the
    market client."""
    from market.chain.deploy import Quarry
    from market.marketapi import MarketAPI

    market = MarketAPI(cfg.market_url)
    try:
        q = Quarry(resolve_deployment(cfg, market))
        q.check()
    except BaseException:
        market.close()
        raise
    return q, market
