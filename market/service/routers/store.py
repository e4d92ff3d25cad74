"""The content-addressed store: request and result files by their sha256."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from market.service.deps import SettingsDep, StoreDep
from market.service.http import errors, read_body
from market.service.schemas import StoredOut
from market.store import ContentTooLarge

router = APIRouter(tags=["store"])


@router.post("/store", status_code=201, response_model=StoredOut, responses=errors(400, 413),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string",
                                                         "format": "binary"}}}}})
async def put(request: Request, store: StoreDep, settings: SettingsDep) -> dict[str, Any]:
    """Store the raw body; returns its `sha256:` address. 413 over `maxFileBytes`, refused
    from the content-length header before the body is read when the header says so."""
    limit = settings.max_file_bytes
    data = await read_body(request, limit, lambda size, so_far: ContentTooLarge(
        size, limit, "upload (so far)" if so_far else "file"))
    uri = await run_in_threadpool(store.put, data)
    return {"uri": uri, "size": len(data)}


@router.get("/store/{uri}", response_class=Response, responses={
    200: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                              "format": "binary"}}}},
    **errors(400, 404)})
def get(uri: str, store: StoreDep) -> Response:
    """The bytes at a `sha256:` address; 404 when the store does not hold them."""
    return Response(store.get(uri), media_type="application/octet-stream")
