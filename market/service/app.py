"""The market's HTTP API (FastAPI): store, models, job board, open shards, miner directory,
task offers and the verifier committee's message relay.

`create_app(settings)` builds the app that `market serve` runs. It only reads the chain (the
head for /health) and never writes to it; the board it serves is filled by the Celery
workers (`market.service.worker`), and every endpoint is documented at `/docs`,
whose `MarketAPI` is its client. The deployment file is read lazily and re-read when it
changes, so the market can start before the devnet and follow a redeploy.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Body, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from market.chain.deploy import WatchedDeployment
from market.chain.errors import ChainError, revert_class
from market.errors import ConfigError, QuarryError
from market.protocol.messages import (
    MESSAGE_FIELDS,
    READER_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    MalformedMessage,
    recover_committee_message,
    recover_heartbeat,
    recover_offer,
    recover_reader,
)
from market.service.board import (
    I64_MAX,
    Board,
    BoardError,
    MessageConflict,
    checksum,
    deployment_identity,
    model_id_bytes,
)
from market.service.guards import JsonBodyGuard
from market.service.matching import eligible, rank_open_shards
from market.service.settings import MarketSettings
from market.store import ContentNotFound, ContentTooLarge, LocalStore

HEARTBEAT_SKEW_S = 60
"""How far a heartbeat's timestamp may be from the market's clock (replays age out)."""
SIGNED_SKEW_S = 120
"""How far an offer's or a committee reader's timestamp may be from the market's clock."""
MAX_MESSAGE_BYTES = 1 << 20
MAX_STATUS_BYTES = 4096  # a heartbeat's status: a few counters, not a store
"""The largest committee message the relay takes (its JSON body)."""
MAX_TOPIC_CHARS = 256
KIND_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")

DESCRIPTION = """
The Quarry market service: a content-addressed store for request and result files, a job
board indexed from the Quarry contracts' events, model manifests, open-shard recommendations
for miners and a miner directory with signed heartbeats.

The chain is the source of truth: the market stores bytes (addressed by their sha256),
indexes events and recommends; clients and miners check everything against the contracts.
Errors are `{"detail": "..."}` with a 4xx status (503 while no deployment is configured).

A task's client may offer the task to one miner (`POST /tasks/{taskId}/offer`): until its
deadline only that miner is shown and recommended its shards. A miner on probation (new or
re-registered, until it passes the committee's challenges) is recommended only tasks that
allow probation.

The verifier committee exchanges signed messages through `/committee/messages`. Membership is
per epoch (a join or exit takes effect at a later boundary) while a dispute is judged by the
committee of the epoch it was opened in, so the relay serves every verifier with a record in
VerifierCommittee: seated, joining (it reads ahead of its first epoch) or leaving with its
stake still bonded (it must still post its votes on the disputes its seat judges, or be
reported absent). Anyone else is refused; a verifier that withdrew its stake is a stranger.
"""


def _redis_up(url: str) -> bool:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure (refused, timeout, auth, bad URL) means "not up"
        return False


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


class MessageTooLarge(QuarryError):
    """A committee message over `MAX_MESSAGE_BYTES`."""


ERROR_STATUS: tuple[tuple[type[QuarryError], int], ...] = (
    (ContentNotFound, 404),
    (ContentTooLarge, 413),
    (MessageTooLarge, 413),
    (MessageConflict, 409),
    (ChainError, 503),  # the chain is down or not the deployment's
    (ConfigError, 503),  # no usable deployment file: the market cannot reach the contracts
    (QuarryError, 400),  # the rest name bad input: store addresses, manifests, board queries
)
"""The HTTP status of each error family, most specific first."""


async def _read_body(request: Request, limit: int,
                     too_large: Callable[[int, bool], QuarryError]) -> bytes:
    """The raw body, refused (`too_large(size, so_far)`) past `limit` bytes: from the
    content-length header before reading when it says so, else once the stream passes it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPException(400, f"bad content-length {declared!r}") from None
        if size > limit:
            raise too_large(size, False)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise too_large(received, True)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_message(msg: Any) -> dict[str, Any]:
    """A committee message's fields checked (HTTPException 400 naming the bad one)."""
    if not isinstance(msg, dict):
        raise HTTPException(400, "a committee message must be a JSON object")
    expected = {*MESSAGE_FIELDS, "signature"}
    missing, unknown = sorted(expected - set(msg)), sorted(set(msg) - expected)
    if missing or unknown:
        raise HTTPException(400, "committee message: " + "; ".join(
            part for part in (missing and f"missing {', '.join(missing)}",
                              unknown and f"unknown field(s) {', '.join(unknown)}") if part))
    if checksum(msg["author"], "author") != msg["author"]:
        raise HTTPException(400, f"committee message author {msg['author']!r} must be written "
                            "checksummed (EIP-55), as it was signed and as readers check it")
    kind, epoch, topic = msg["kind"], msg["epoch"], msg["topic"]
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        raise HTTPException(400, f"committee message kind {kind!r} is not 1-64 of a-z, 0-9 "
                            "and '-'")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= I64_MAX:
        raise HTTPException(400, f"committee message epoch {epoch!r} is not an integer in "
                            f"[0, {I64_MAX}]")
    if not isinstance(topic, str) or len(topic) > MAX_TOPIC_CHARS:
        raise HTTPException(400, f"committee message topic must be a string of at most "
                            f"{MAX_TOPIC_CHARS} characters")
    if not isinstance(msg["body"], dict):
        raise HTTPException(400, "committee message body must be a JSON object")
    return msg


def _check_skew(what: str, timestamp: int, status: int) -> None:
    skew = timestamp - time.time()
    if abs(skew) > SIGNED_SKEW_S:
        raise HTTPException(status, f"{what} timestamp {timestamp} is {skew:+.0f} s off the "
                            f"market's clock (at most {SIGNED_SKEW_S} s)")


def create_app(settings: MarketSettings) -> FastAPI:
    """The market's FastAPI app over `settings` (store directory, board file, deployment)."""
    app = FastAPI(title="Quarry market", description=DESCRIPTION, version="1")
    app.add_middleware(JsonBodyGuard)  # size and nesting limits before any JSON is parsed
    board = Board(settings.db_path)
    store = LocalStore(settings.store_dir, settings.max_file_bytes)
    deployment = WatchedDeployment(settings.deployment, timeout=5.0)
    app.state.settings = settings
    app.state.board = board
    app.state.store = store
    # Manifests are the one thing the chain cannot give back (it holds only modelIds), so
    # they live beside the store's files and refill a rebuilt board.
    manifests_dir = settings.store_dir / "manifests"
    for path in sorted(manifests_dir.glob("0x*.json")):
        try:
            board.put_model(json.loads(path.read_text()))
        except (OSError, ValueError, BoardError) as exc:
            print(f"market: skipping unreadable manifest {path}: {exc}", flush=True)

    # -- errors: always {"detail": "<one line naming the problem>"} -----------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return _error(422, "invalid request: " + "; ".join(parts))

    @app.exception_handler(QuarryError)
    async def _quarry(request: Request, exc: QuarryError) -> JSONResponse:
        status = next(code for cls, code in ERROR_STATUS if isinstance(exc, cls))
        return _error(status, str(exc))

    def now() -> int:
        """The later of the wall clock and the last indexed block's time (a devnet's clock
        may run ahead), for deadlines."""
        return max(int(time.time()), board.cursor_time())

    # -- service -----------------------------------------------------------------------
    @app.get("/health", tags=["service"])
    def health() -> dict[str, Any]:
        """`ok` when the deployment is loaded and its chain answers; `indexedBlock` is the
        board's cursor (null before the first index), `redis` whether the broker answers."""
        cursor = board.cursor()
        out: dict[str, Any] = {"ok": False, "chainId": None,
                               "indexedBlock": cursor if cursor >= 0 else None,
                               "headBlock": None, "redis": _redis_up(settings.redis_url)}
        try:
            q = deployment.quarry()
            out["chainId"] = q.deployment.chain_id
            out["headBlock"] = q.chain.block_number()
            out["ok"] = True
        except QuarryError as exc:
            out["detail"] = str(exc)
        return out

    @app.get("/deployment", tags=["service"])
    def get_deployment() -> dict[str, Any]:
        """The deployment file's JSON: chain id, RPC URL, contract addresses."""
        return dict(deployment.quarry().deployment.to_json())

    @app.get("/limits", tags=["service"])
    def limits() -> dict[str, int]:
        return {"maxFileBytes": settings.max_file_bytes,
                "maxRequestBytes": settings.max_request_bytes}

    # -- store -------------------------------------------------------------------------
    @app.post("/store", status_code=201, tags=["store"])
    async def put(request: Request) -> dict[str, Any]:
        """Store the raw body; returns its `sha256:` address. 413 over `maxFileBytes`, refused
        from the content-length header before the body is read when the header says so."""
        limit = settings.max_file_bytes
        data = await _read_body(request, limit, lambda size, so_far: ContentTooLarge(
            size, limit, "upload (so far)" if so_far else "file"))
        uri = await run_in_threadpool(store.put, data)
        return {"uri": uri, "size": len(data)}

    @app.get("/store/{uri}", tags=["store"],
             response_class=Response, responses={200: {"content": {
                 "application/octet-stream": {}}}})
    def get(uri: str) -> Response:
        """The bytes at a `sha256:` address; 404 when the store does not hold them."""
        return Response(store.get(uri), media_type="application/octet-stream")

    # -- models ------------------------------------------------------------------------
    @app.post("/models", tags=["models"])
    def register_model(manifest: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """Store a model manifest under its modelId (keccak256 of its canonical JSON)."""
        model_id = board.put_model(manifest)
        manifests_dir.mkdir(parents=True, exist_ok=True)
        path = manifests_dir / f"{model_id}.json"
        if not path.exists():
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(json.dumps(board.model(model_id), sort_keys=True))
            tmp.replace(path)
        return {"modelId": model_id, "name": manifest["name"]}

    @app.get("/models", tags=["models"])
    def models() -> list[dict[str, Any]]:
        """Known models with how many registered miners may claim an ordinary task for each
        and their lowest price, and how many more are on probation (`probationMiners`: they
        claim only tasks that allow probation); manifests uploaded here, and modelIds miners
        registered on-chain."""
        return board.models()

    @app.get("/models/{model_id}", tags=["models"])
    def model(model_id: str) -> dict[str, Any]:
        manifest = board.model(model_id)
        if manifest is None:
            raise HTTPException(404, f"no manifest for model {model_id} on this market; "
                                "upload it with POST /models")
        return manifest

    # -- jobs --------------------------------------------------------------------------
    @app.get("/jobs", tags=["jobs"])
    def jobs(client: str | None = None) -> list[dict[str, Any]]:
        """Every task on the board (of `client` when given), without the shard list."""
        return board.jobs(client)

    @app.get("/jobs/{task_id}", tags=["jobs"])
    def job(task_id: int = Path(ge=0, le=I64_MAX)) -> dict[str, Any]:
        """The task with every shard (state, miner, claimExpiry, windowEnd, tokensUsed,
        resultUri, payment, refund...), its disputes (status, deadline, committee epoch and
        votes by weight, absences reported), availability challenges (status, deadline) and
        proven billing faults."""
        found = board.job(task_id)
        if found is None:
            raise HTTPException(404, f"task {task_id} is not on the board: unknown, or not "
                                f"indexed yet (indexed up to block {board.cursor()})")
        return found

    @app.get("/shards/open", tags=["jobs"])
    def open_shards(modelId: str | None = None, miner: str | None = None,
                    limit: int = Query(20, ge=1, le=1000)) -> list[dict[str, Any]]:
        """Open shards, best first. With `miner`: only those it may claim, in its own order
        (the workers' fresh recommendations when there are, else ranked now); a miner on
        probation sees only tasks that allow probation. A task offered to one miner shows only
        with that `miner`."""
        model_bytes = model_id_bytes(modelId) if modelId else None
        at = now()
        candidates = board.open_shards(model_bytes, at)
        if miner is None:
            candidates = [s for s in candidates if s["offeredTo"] is None]
            candidates.sort(key=lambda s: (-s["pricePerToken"], s["deadline"]))
            return candidates[:limit]
        row = board.miner(miner)
        if row is None:
            raise HTTPException(404, f"miner {checksum(miner, 'miner')} is not registered in "
                                f"GPURegistry (board indexed up to block {board.cursor()})")
        stored = board.fresh_recommendations(row["address"], 3 * settings.index_interval_s)
        if stored is not None:
            by_key = {(s["taskId"], s["shard"]): s for s in candidates}
            picked = [by_key[k] for r in stored
                      if (k := (r.get("taskId"), r.get("shard"))) in by_key]
            return [s for s in picked if eligible(s, row, at)][:limit]
        return rank_open_shards(candidates, row, at, limit)

    @app.post("/tasks/{task_id}/offer", tags=["jobs"])
    def offer(task_id: int = Path(ge=0, le=I64_MAX),
              body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """The task's client offers it to one registered miner: until the task's deadline its
        shards are shown and recommended to that miner alone (the contract still lets any
        eligible miner claim). 401 when not signed by the task's client (TaskRegistry), 404
        for an unknown task or miner, 400 when the timestamp is over 120 s off or the miner
        could not claim the task (`isEligible` with the task's model, reputation floor and
        allowProbation: an offer to it would hide the task from every miner that could). A
        newer offer replaces an older one."""
        try:
            signer = recover_offer(task_id, body)
        except MalformedMessage as exc:
            raise HTTPException(400, str(exc)) from exc
        miner = checksum(body["miner"], "miner")
        timestamp = int(body["timestamp"])
        _check_skew(f"offer for task {task_id}", timestamp, 400)
        q = deployment.quarry()
        try:
            task = q.tasks.get_task(task_id)
        except revert_class("UnknownTask"):
            raise HTTPException(404, f"task {task_id} does not exist in TaskRegistry "
                                f"{q.tasks.address}") from None
        if signer != task.client:
            raise HTTPException(401, f"offer for task {task_id} is signed by {signer}, not "
                                f"its client {task.client}")
        if not q.gpu.is_registered(miner):
            raise HTTPException(404, f"miner {miner} is not registered in GPURegistry "
                                f"{q.gpu.address}")
        if not q.gpu.is_eligible(miner, task.model_id, task.min_reputation_bps,
                                 task.allow_probation):
            why = ("it is on probation and the task does not allow probation"
                   if not task.allow_probation and q.gpu.on_probation(miner) else
                   "GPURegistry.isEligible says no (model, reputation floor, stake or exit)")
            raise HTTPException(400, f"miner {miner} could not claim task {task_id}: {why}")
        identity = deployment_identity(q)
        board.put_offer(identity, task_id, task.client, miner, task.deadline, timestamp,
                        str(body["signature"]))
        stored = board.offer(identity, task_id)
        assert stored is not None
        return {"taskId": task_id, "miner": stored["miner"], "until": stored["until"]}

    # -- committee -----------------------------------------------------------------------
    def require_verifier(q: Any, address: str, action: str) -> None:
        """403 unless `address` has a verifier seat (read live from the chain): seated,
        joining, or left with its stake still bonded. Not "a member of the current epoch":
        a member whose seat ended must still post its votes on the disputes opened while it
        sat (or be reported absent), and one seated at the next boundary must read ahead.
        A join withdrawn before it took effect never sits, so it is a stranger."""
        if not q.committee.verifier_info(address).sits:
            raise HTTPException(403, f"{address} is not a verifier of VerifierCommittee "
                                f"{q.committee.address} (seated, joining, or leaving with its "
                                f"stake still bonded), so it may not {action}")

    @app.post("/committee/messages", status_code=201, tags=["committee"])
    async def post_message(request: Request, response: Response) -> dict[str, int]:
        """Relay a verifier's signed message (EIP-191 over the canonical JSON of author, kind,
        epoch, topic, body). 201 `{"id"}`, 200 with the first id for an identical repost;
        401 bad signature, 403 author without a verifier record (see the API description),
        409 another message under the same (author, kind, epoch, topic), 413 over 1 MiB."""
        raw = await _read_body(request, MAX_MESSAGE_BYTES, lambda size, so_far: MessageTooLarge(
            f"committee message is {size} bytes{' (so far)' if so_far else ''}, over the "
            f"relay's limit of {MAX_MESSAGE_BYTES} bytes"))
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise HTTPException(400, f"committee message is not JSON: {exc}") from None
        msg = _check_message(parsed)
        author = msg["author"]
        try:
            signer = recover_committee_message(msg)
        except MalformedMessage as exc:
            raise HTTPException(401, str(exc)) from exc
        if signer != author:
            raise HTTPException(401, f"committee message from {author} is signed by {signer}")
        q = await run_in_threadpool(deployment.quarry)
        await run_in_threadpool(require_verifier, q, author, "post committee messages")
        message_id, created = await run_in_threadpool(
            board.put_message, deployment_identity(q), msg)
        if not created:
            response.status_code = 200
        return {"id": message_id}

    @app.get("/committee/messages", tags=["committee"])
    def messages(request: Request, epoch: int | None = Query(None, ge=0, le=I64_MAX),
                 kind: str | None = None, topic: str | None = None,
                 afterId: int = Query(0, ge=0, le=I64_MAX),
                 limit: int = Query(1000, ge=1, le=10000),
                 ) -> list[dict[str, Any]]:
        """Messages with an id above `afterId`, ascending, filtered by epoch, kind and topic
        when given; verifiers only (seated, joining or leaving, as for posting): headers
        X-Quarry-Reader, X-Quarry-Timestamp and X-Quarry-Signature (EIP-191 over the canonical
        JSON of {"reader", "timestamp"}, the timestamp within 120 s). 401 without a valid
        reader signature, 403 without a verifier record."""
        values = [request.headers.get(h)
                  for h in (READER_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)]
        if any(v is None for v in values):
            raise HTTPException(401, f"reading committee messages needs the headers "
                                f"{READER_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}, "
                                "signed by a VerifierCommittee member")
        reader_text, timestamp_text, signature = (str(v) for v in values)
        try:
            timestamp = int(timestamp_text)
        except ValueError:
            raise HTTPException(401, f"{TIMESTAMP_HEADER} {timestamp_text!r} is not an "
                                "integer") from None
        reader = checksum(reader_text, "reader")
        try:
            signer = recover_reader(reader_text, timestamp, signature)
        except MalformedMessage as exc:
            raise HTTPException(401, str(exc)) from exc
        if signer != reader:
            raise HTTPException(401, f"reader headers for {reader} are signed by {signer}")
        _check_skew("reader", timestamp, 401)
        q = deployment.quarry()
        require_verifier(q, reader, "read committee messages")
        return board.messages(deployment_identity(q), epoch=epoch, kind=kind, topic=topic,
                              after_id=afterId, limit=limit)

    # -- miners ------------------------------------------------------------------------
    @app.post("/miners/heartbeat", tags=["miners"])
    def heartbeat(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        """A registered miner's signed liveness report: 401 when the signature is not the
        miner's, 400 when its timestamp is more than 60 s off the market's clock, 403 from a
        key that is not a registered miner, 413 for a status over 4096 bytes."""
        try:
            signer = recover_heartbeat(body)
        except MalformedMessage as exc:
            raise HTTPException(400, str(exc)) from exc
        miner = checksum(body["miner"], "miner")
        if signer != miner:
            raise HTTPException(401, f"heartbeat for {miner} is signed by {signer}")
        if not isinstance(body["status"], dict):
            raise HTTPException(400, "heartbeat status must be a JSON object")
        size = len(json.dumps(body["status"], separators=(",", ":")))
        if size > MAX_STATUS_BYTES:
            raise HTTPException(413, f"heartbeat status of {size} bytes is over the "
                                f"{MAX_STATUS_BYTES}-byte limit")
        timestamp = int(body["timestamp"])
        skew = timestamp - time.time()
        if abs(skew) > HEARTBEAT_SKEW_S:
            raise HTTPException(400, f"heartbeat timestamp {timestamp} is {skew:+.0f} s off "
                                f"the market's clock (at most {HEARTBEAT_SKEW_S} s)")
        # Only registered miners: the board (indexed a moment behind) or else the chain.
        if board.miner(miner) is None and not deployment.quarry().gpu.is_registered(miner):
            raise HTTPException(403, f"{miner} is not a registered miner: heartbeats come "
                                "from miners registered in GPURegistry (`miner register`)")
        board.record_heartbeat(miner, timestamp, body["status"])
        return {"miner": miner, "timestamp": timestamp, "registered": True}

    @app.get("/miners", tags=["miners"])
    def miners() -> list[dict[str, Any]]:
        """Registered miners (from GPURegistry events) with their last heartbeat; `alive`
        when it is younger than `heartbeat_ttl_s`."""
        wall = time.time()
        rows = board.miners()
        for row in rows:
            seen = row["lastSeen"]
            row["alive"] = seen is not None and wall - seen < settings.heartbeat_ttl_s
        return jsonable_encoder(rows)

    return app


@contextmanager
def serve_in_thread(settings: MarketSettings, timeout: float = 30.0) -> Iterator[str]:
    """Run the app under uvicorn in a daemon thread on `settings.host:port` and yield its
    URL; stops it on exit. For embedding a market in another process (tests, notebooks);
    `market serve` is the service itself."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=settings.host,
                                           port=settings.port, log_level="warning",
                                           lifespan="off", ws="none"))
    thread = threading.Thread(target=server.run, daemon=True, name="market-app")
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise QuarryError(f"the market app did not start on {settings.url}")
            time.sleep(0.01)
        yield settings.url
    finally:
        server.should_exit = True
        thread.join(timeout)
