"""Model manifests: uploaded here, addressed by their modelId (keccak256 of canonical JSON)."""

from __future__ import annotations

import json
import threading
from typing import Any

from fastapi import APIRouter, Body, HTTPException

from market.service.deps import BoardDep, MarketDep
from market.service.http import errors
from market.service.schemas import ModelOut, ModelRegisteredOut

router = APIRouter(tags=["models"])


@router.post("/models", response_model=ModelRegisteredOut, responses=errors(400, 413))
def register_model(market: MarketDep,
                   manifest: dict[str, Any] = Body(...)) -> dict[str, Any]:
    """Store a model manifest under its modelId (keccak256 of its canonical JSON)."""
    board = market.board
    model_id = board.put_model(manifest)
    directory = market.manifests_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{model_id}.json"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(json.dumps(board.model(model_id), sort_keys=True))
        tmp.replace(path)
    return {"modelId": model_id, "name": manifest["name"]}


@router.get("/models", response_model=list[ModelOut])
def models(board: BoardDep) -> list[dict[str, Any]]:
    """Known models with how many registered miners may claim an ordinary task for each
    and their lowest price, and how many more are on probation (`probationMiners`: they
    claim only tasks that allow probation); manifests uploaded here, and modelIds miners
    registered on-chain."""
    return board.models()


@router.get("/models/{model_id}", response_model=dict[str, Any], responses=errors(400, 404))
def model(model_id: str, board: BoardDep) -> dict[str, Any]:
    """The manifest stored for a modelId (0x + 64 hex digits)."""
    manifest = board.model(model_id)
    if manifest is None:
        raise HTTPException(404, f"no manifest for model {model_id} on this market; "
                            "upload it with POST /models")
    return manifest
