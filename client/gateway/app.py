"""The gateway's HTTP API: OpenAI's Files, Batches and Models endpoints over Quarry.

Shapes follow the `openai` SDK's types (`FileObject`, `FileDeleted`, `Batch`,
`BatchRequestCounts`, `BatchError`, `Model`, cursor pages); Quarry's extras ride in fields the
SDK keeps (`quarry` on a batch and a model). Every error, including a wrong token and a body
FastAPI refuses, is OpenAI's error object `{"error": {"message", "type", "param", "code"}}`.

Hostile callers meet, in order, before any parser: the bearer token (`BearerAuth`, an ASGI
middleware: no body is read without it), the limit on uploads (`market.admission`: a 429
with Retry-After past `UPLOADS`), then the market's `JsonBodyGuard` (size and nesting of
JSON bodies), and uploads stream to disk off the event loop (`client.gateway.uploads`).
"""

from __future__ import annotations

import contextlib
import hmac
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from client.gateway.runner import WINDOW_S, OptionError, Runner, parse_options
from client.gateway.store import GatewayStore
from client.gateway.translate import ENDPOINTS
from client.gateway.uploads import UploadError, receive_upload, too_large
from client.sdk import Client
from market.admission import Admission, Limit, Rule
from market.guards import JsonBodyGuard, reply

MAX_UPLOAD_BYTES = 200 * 1024 * 1024
"""OpenAI's limit for a batch input file; the market's `maxFileBytes` is checked at submit."""
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
MAX_JSON_BYTES = 256 * 1024
"""A batch's JSON body: four fields and at most 16 metadata pairs."""
UPLOAD_BURST_S = 2.0
UPLOADS = Limit.over(2.0, UPLOAD_BURST_S, 2)
"""Uploads a second and at once (`gateway_uploads_per_s`, `gateway_uploads_at_once`): each
one is parsed in a threadpool thread and written to disk."""


class APIError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def guard_error(status: int, message: str) -> dict[str, Any]:
    """`JsonBodyGuard`'s and `Admission`'s refusals as OpenAI's error object."""
    if status == 429:
        return APIError(429, message, code="rate_limit_exceeded", type="requests").body()
    return APIError(status, message, code="file_too_large" if status == 413 else
                    "invalid_value").body()


UNAUTHORIZED = APIError(401, "Incorrect API key provided. The gateway takes the gateway_token "
                        "of its [client] settings (QUARRY_CLIENT_GATEWAY_TOKEN) as the bearer "
                        "token.", code="invalid_api_key")


class BearerAuth:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>`; one
    without it gets OpenAI's 401 before a byte of its body is read."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            await reply(send, 401, UNAUTHORIZED.body(), ((b"www-authenticate", b"Bearer"),))
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)


def not_found(what: str, ident: str) -> APIError:
    return APIError(404, f"No such {what}: '{ident}'", param="id", code="not_found")


# ---------------------------------------------------------------------------- bodies


class BatchCreate(BaseModel):
    """`POST /v1/batches` (OpenAI's `BatchCreateParams`, `output_expires_after` refused)."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


# ---------------------------------------------------------------------------- views


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"],
            "created_at": row["created_at"], "filename": row["filename"],
            "purpose": row["purpose"], "status": "processed", "expires_at": None,
            "status_details": None}


def batch_object(row: dict[str, Any]) -> dict[str, Any]:
    quarry = dict(row["quarry"] or {})
    usage = quarry.pop("usage", None)
    out = {k: row[k] for k in (
        "id", "endpoint", "input_file_id", "completion_window", "status", "output_file_id",
        "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at",
        "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at",
        "metadata", "model", "errors")}
    out["object"] = "batch"
    out["request_counts"] = {"total": row["total"], "completed": row["completed"],
                             "failed": row["failed"]}
    out["usage"] = None if usage is None else {
        "input_tokens": usage["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["input_tokens"] + usage["output_tokens"]}
    out["quarry"] = quarry or None
    return out


def page(rows: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": rows, "first_id": rows[0]["id"] if rows else None,
            "last_id": rows[-1]["id"] if rows else None, "has_more": has_more}


# ---------------------------------------------------------------------------- app


class Gateway:
    """What the routes share: the store, the runner and a read-only client."""

    def __init__(self, store: GatewayStore, runner: Runner,
                 connect: Callable[[], Client]) -> None:
        self.store, self.runner = store, runner
        self._connect = connect
        self._client: Client | None = None
        self._lock = threading.Lock()

    def client(self) -> Client:
        """A second `Client` for reads (`/v1/models`), apart from the runner's."""
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client


def create_app(store: GatewayStore, connect: Callable[[], Client], token: str, *,
               poll_s: float = 0.5, uploads: Limit = UPLOADS) -> FastAPI:
    """The gateway app; its lifespan starts and stops the runner. `token` must be set;
    `uploads` limits `POST /v1/files`."""
    if not token:
        raise ValueError("the gateway needs a bearer token (gateway_token)")
    gw = Gateway(store, Runner(store, connect, poll_s), connect)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw.runner.start()
        try:
            yield
        finally:
            gw.runner.stop()

    app = FastAPI(title="Quarry OpenAI Batch gateway", lifespan=lifespan)
    app.state.gateway = gw

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        message = f"{param}: {err['msg']}" if param else err["msg"]
        return APIError(400, message, param=param, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "Unknown request URL" if exc.status_code == 404 else str(exc.detail)
        return APIError(exc.status_code, f"{message}: {request.method} {request.url.path}",
                        code="unknown_url" if exc.status_code == 404 else None).response()

    for router in (files, batches, models):
        app.include_router(router)
    # The last added runs first: the token, the upload limit, the JSON limits, FastAPI.
    app.add_middleware(JsonBodyGuard, max_bytes=MAX_JSON_BYTES, exempt=("/v1/files",),
                       error_body=guard_error)
    app.add_middleware(Admission, rules=[Rule("uploads", "/v1/files", uploads, "POST")],
                       error_body=guard_error)
    app.add_middleware(BearerAuth, token=token)
    return app


def gateway(request: Request) -> Gateway:
    """The app's `Gateway` (`BearerAuth` has checked the token already)."""
    gw: Gateway = request.app.state.gateway
    return gw


Auth = Annotated[Gateway, Depends(gateway)]


files = APIRouter(prefix="/v1/files", tags=["files"])


@files.post("")
async def create_file(request: Request, gw: Auth) -> dict[str, Any]:
    """A multipart upload (`file`, `purpose=batch`), streamed to disk (`uploads`)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_UPLOAD_BYTES:
        raise APIError(413, str(too_large(int(size), MAX_UPLOAD_BYTES)),
                       code="file_too_large")
    try:
        upload = await receive_upload(request.stream(), request.headers.get("content-type", ""),
                                      gw.store.files_dir, MAX_UPLOAD_BYTES)
    except UploadError as exc:
        raise APIError(exc.status, exc.message, param=exc.param, code=exc.code) from None
    purpose = upload.fields.get("purpose")
    if purpose != "batch":
        upload.path.unlink(missing_ok=True)
        raise APIError(400, "purpose: only 'batch' files are accepted by this gateway, "
                       f"got {purpose!r}", param="purpose", code="invalid_value")
    row = await run_in_threadpool(gw.store.add_file_from, upload.path, upload.filename,
                                  purpose, upload.size)
    return file_object(row)


@files.get("")
def list_files(gw: Auth, purpose: str | None = None, after: str | None = None,
               limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
               order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc"
               ) -> dict[str, Any]:
    try:
        rows, more = gw.store.files(purpose=purpose, after=after, limit=limit,
                                    ascending=order == "asc")
    except KeyError:
        raise not_found("file", str(after)) from None
    return page([file_object(r) for r in rows], more)


@files.get("/{file_id}")
def retrieve_file(file_id: str, gw: Auth) -> dict[str, Any]:
    row = gw.store.file(file_id)
    if row is None:
        raise not_found("file", file_id)
    return file_object(row)


@files.get("/{file_id}/content")
def file_content(file_id: str, gw: Auth) -> FileResponse:
    path = gw.store.file_path(file_id)
    if path is None:
        raise not_found("file", file_id)
    return FileResponse(path, media_type="application/octet-stream")


@files.delete("/{file_id}")
def delete_file(file_id: str, gw: Auth) -> dict[str, Any]:
    if not gw.store.delete_file(file_id):
        raise not_found("file", file_id)
    return {"id": file_id, "object": "file", "deleted": True}


batches = APIRouter(prefix="/v1/batches", tags=["batches"])


@batches.post("")
def create_batch(body: BatchCreate, gw: Auth) -> dict[str, Any]:
    if body.endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint: {body.endpoint!r} is not supported by Quarry "
                       f"(supported: {', '.join(ENDPOINTS)})", param="endpoint",
                       code="invalid_value")
    if body.completion_window not in WINDOW_S:
        raise APIError(400, f"completion_window: {body.completion_window!r} is not "
                       f"supported (supported: {', '.join(WINDOW_S)})",
                       param="completion_window", code="invalid_value")
    _check_metadata(body.metadata)
    row = gw.store.file(body.input_file_id)
    if row is None:
        raise not_found("file", body.input_file_id)
    if row["purpose"] != "batch":
        raise APIError(400, f"input_file_id: file {body.input_file_id} has purpose "
                       f"{row['purpose']!r}, not 'batch'", param="input_file_id",
                       code="invalid_value")
    now = int(time.time())
    return batch_object(gw.store.add_batch(
        endpoint=body.endpoint, input_file_id=body.input_file_id,
        completion_window=body.completion_window, metadata=body.metadata,
        expires_at=now + WINDOW_S[body.completion_window]))


@batches.get("")
def list_batches(gw: Auth, after: str | None = None,
                 limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    try:
        rows, more = gw.store.batches(after=after, limit=limit)
    except KeyError:
        raise not_found("batch", str(after)) from None
    return page([batch_object(r) for r in rows], more)


@batches.get("/{batch_id}")
def retrieve_batch(batch_id: str, gw: Auth) -> dict[str, Any]:
    row = gw.store.batch(batch_id)
    if row is None:
        raise not_found("batch", batch_id)
    return batch_object(row)


@batches.post("/{batch_id}/cancel")
def cancel_batch(batch_id: str, gw: Auth) -> dict[str, Any]:
    row = gw.store.batch(batch_id)
    if row is None:
        raise not_found("batch", batch_id)
    if row["status"] not in ("validating", "in_progress", "cancelling"):
        raise APIError(409, f"Cannot cancel a batch with status '{row['status']}'",
                       code="batch_not_cancellable")
    for state in ("validating", "in_progress"):
        if gw.store.update_batch(batch_id, only_if=state, status="cancelling",
                                 cancelling_at=int(time.time())):
            break
    return batch_object(gw.store.batch(batch_id) or row)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's metadata limits, then the `quarry_*` knobs' values."""
    if metadata is None:
        return
    if len(metadata) > METADATA_PAIRS:
        raise APIError(400, f"metadata: at most {METADATA_PAIRS} pairs, got {len(metadata)}",
                       param="metadata", code="invalid_value")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY or len(value) > METADATA_VALUE:
            raise APIError(400, f"metadata.{key}: keys are at most {METADATA_KEY} characters, "
                           f"values at most {METADATA_VALUE}", param=f"metadata.{key}",
                           code="invalid_value")
    try:
        parse_options(metadata)
    except OptionError as exc:
        raise APIError(400, str(exc), param=f"metadata.{exc.key}",
                       code="invalid_value") from None


models = APIRouter(prefix="/v1/models", tags=["models"])


@models.get("")
def list_models(gw: Auth) -> dict[str, Any]:
    data = []
    for o in gw.client().offers(allow_probation=True):
        established = o.established
        data.append({
            "id": o.name or "0x" + o.model_id.hex(), "object": "model", "created": 0,
            "owned_by": "quarry",
            "quarry": {"model_id": "0x" + o.model_id.hex(),
                       "lowest_ask_wei_per_token": o.min_price,
                       "lowest_established_ask_wei_per_token":
                           min(m.price_per_token for m in established)
                           if established else None,
                       "miners": len(o.miners), "alive": o.alive,
                       "on_probation": len(o.on_probation)}})
    return {"object": "list", "data": data}

