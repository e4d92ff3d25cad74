"""Health, the deployment and the limits: what a role reads before anything else."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from market.errors import QuarryError
from market.service.deps import BoardDep, MarketDep, SettingsDep
from market.service.http import errors
from market.service.schemas import DeploymentOut, HealthOut, LimitsOut

router = APIRouter(tags=["service"])


def _redis_workers(url: str) -> tuple[bool, list[str]]:
    """Whether Redis answers, and the live workers' node names (their liveness keys)."""
    import redis

    from market.service.worker import live_workers

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            client.ping()
            return True, live_workers(client)
        finally:
            client.close()
    except Exception:  # any failure (refused, timeout, auth, bad URL) means "not up"
        return False, []


@router.get("/health", response_model=HealthOut, response_model_exclude_unset=True)
def health(market: MarketDep, board: BoardDep, settings: SettingsDep) -> dict[str, Any]:
    """`ok` when the deployment is loaded and its chain answers; `status` is `degraded` when
    no worker is alive (a worker's liveness key lapses within 10 s of its death) or Redis
    does not answer, since the board then stops following the chain."""
    cursor = board.cursor()
    up, workers = _redis_workers(settings.redis_url)
    out: dict[str, Any] = {"ok": False, "chainId": None,
                           "indexedBlock": cursor if cursor >= 0 else None,
                           "headBlock": None, "redis": up, "workers": len(workers),
                           "workerNames": workers, "settler": settings.settler_address}
    try:
        q = market.deployment.quarry()
        out["chainId"] = q.deployment.chain_id
        out["headBlock"] = q.chain.block_number()
        out["ok"] = True
    except QuarryError as exc:
        out["detail"] = str(exc)
    out["status"] = "down" if not out["ok"] else "ok" if up and workers else "degraded"
    return out


@router.get("/deployment", response_model=DeploymentOut, responses=errors(503))
def get_deployment(market: MarketDep) -> dict[str, Any]:
    """The deployment file's JSON: chain id, RPC URL, contract addresses."""
    return dict(market.deployment.quarry().deployment.to_json())


@router.get("/limits", response_model=LimitsOut)
def limits(settings: SettingsDep) -> dict[str, int]:
    """The store's limits: a file, and one request of a batch."""
    return {"maxFileBytes": settings.max_file_bytes,
            "maxRequestBytes": settings.max_request_bytes}
