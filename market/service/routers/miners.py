"""The miner directory: registered miners (from GPURegistry events) and their heartbeats."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.encoders import jsonable_encoder

from market.protocol.messages import recover_heartbeat
from market.service.deps import BoardDep, MarketDep, SettingsDep
from market.service.http import check_skew, errors, require_signer
from market.service.matching import miner_alive
from market.service.schemas import HeartbeatIn, HeartbeatOut, MinerOut

router = APIRouter(tags=["miners"])

HEARTBEAT_SKEW_S = 60
"""How far a heartbeat's timestamp may be from the market's clock (replays age out)."""
MAX_STATUS_BYTES = 4096
"""A heartbeat's status: a few counters, not a store."""


@router.post("/miners/heartbeat", response_model=HeartbeatOut,
             responses=errors(400, 401, 403, 413, 503))
def heartbeat(body: HeartbeatIn, market: MarketDep) -> dict[str, Any]:
    """A registered miner's signed liveness report: 401 when the signature is not the
    miner's, 400 when its timestamp is more than 60 s off the market's clock, 403 from a
    key that is not a registered miner, 413 for a status over 4096 bytes."""
    miner = require_signer("heartbeat", body.miner, lambda: recover_heartbeat(body.model_dump()))
    size = len(json.dumps(body.status, separators=(",", ":")))
    if size > MAX_STATUS_BYTES:
        raise HTTPException(413, f"heartbeat status of {size} bytes is over the "
                            f"{MAX_STATUS_BYTES}-byte limit")
    check_skew("heartbeat", body.timestamp, 400, HEARTBEAT_SKEW_S)
    board = market.board
    # Only registered miners: the board (indexed a moment behind) or else the chain.
    if board.miner(miner) is None and not market.deployment.quarry().gpu.is_registered(miner):
        raise HTTPException(403, f"{miner} is not a registered miner: heartbeats come "
                            "from miners registered in GPURegistry (`miner register`)")
    board.record_heartbeat(miner, body.timestamp, body.status)
    return {"miner": miner, "timestamp": body.timestamp, "registered": True}


@router.get("/miners", response_model=list[MinerOut])
def miners(board: BoardDep, settings: SettingsDep) -> list[dict[str, Any]]:
    """Registered miners (from GPURegistry events) with their last heartbeat; `alive`
    when it is younger than `heartbeat_ttl_s`."""
    wall = time.time()
    rows = board.miners()
    for row in rows:
        row["alive"] = miner_alive(row, wall, settings.heartbeat_ttl_s)
    return list(jsonable_encoder(rows))
