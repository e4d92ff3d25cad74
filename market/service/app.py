"""The market's HTTP API (FastAPI): `create_app(settings)` mounts one router per resource
(`market.service.routers`: service, store, models, jobs and shards, tasks and offers, miners,
swarms, committee, and the dashboard with /metrics) over one `Market` (board, store,
settings, deployment; `market.service.deps`) that the routers get through `Depends`.

The app only reads the chain (the head for /health, eligibility and verifier seats) and never
writes to it; the board it serves is filled by the Celery workers (`market.service.worker`).
Every request and response body is a pydantic model (`market.service.schemas`) and every
error is declared, so `/docs` and `/openapi.json` document the whole API, whose client is
`market.marketapi.MarketAPI`. The deployment file is read lazily and re-read when it
changes, so the market can start before the devnet and follow a redeploy.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from market.admission import Admission, Limit, Rule
from market.chain.deploy import WatchedDeployment
from market.errors import QuarryError
from market.guards import JsonBodyGuard
from market.service.board import Board, BoardError
from market.service.dashboard import Pages
from market.service.deps import Market
from market.service.http import ERROR_STATUS
from market.service.kept import KeptResponses
from market.service.metrics import MarketMetrics, RequestMetrics
from market.service.routers import (
    committee,
    jobs,
    miners,
    models,
    service,
    store,
    swarms,
    tasks,
    ui,
)
from market.service.settings import MarketSettings

KEPT_PATHS = ("/ui", "/metrics")
"""Pages whose answers are kept a moment and served again without the route (`kept`)."""

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

Swarms (`/swarms/{modelId}/...`): registered miners that list a model join its swarm with
signed declarations (memory, speed, stage endpoint and key, RTTs) repeated as heartbeats;
the market plans the layers over the live members (Parallax by default), re-plans on joins
and leaves, relays the members' EIP-712 consents to each plan's terms and serves the
on-chain swarm id once the head reports it and swarmInfo matches.

Outside this document: the read-only dashboard at `/ui` (jobs, miners, committee, disputes
and challenges, linked to the transactions behind them) and Prometheus metrics at `/metrics`.
"""


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _reload_manifests(market: Market) -> None:
    """Manifests are the one thing the chain cannot give back (it holds only modelIds), so
    they live beside the store's files and refill a rebuilt board."""
    for path in sorted(market.manifests_dir.glob("0x*.json")):
        try:
            market.board.put_model(json.loads(path.read_text()))
        except (OSError, ValueError, BoardError) as exc:
            print(f"market: skipping unreadable manifest {path}: {exc}", flush=True)


def create_app(settings: MarketSettings) -> FastAPI:
    """The market's FastAPI app over `settings` (store directory, board file, deployment)."""
    # No redirects to the path without its trailing slash: `GET /store/` answered 307 to
    # the POST-only `/store`; an unknown path is a 404 like any other.
    app = FastAPI(title="Quarry market", description=DESCRIPTION, version="1",
                  redirect_slashes=False)
    market = Market(settings=settings, board=Board(settings.board_location),
                    store=settings.open_store(),
                    deployment=WatchedDeployment(settings.deployment, timeout=5.0))
    app.state.market = market
    app.state.metrics = MarketMetrics(market)
    app.state.pages = Pages(market)
    # The last added runs first: the limits (refusals cost nothing more), the request
    # metrics (they time all the rest), the kept pages, the JSON limits, then FastAPI.
    app.add_middleware(JsonBodyGuard)  # size and nesting limits before any JSON is parsed
    app.add_middleware(KeptResponses, paths=KEPT_PATHS)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    app.add_middleware(Admission, rules=admission_rules(settings),
                       on_refused=app.state.metrics.count_refused)
    app.state.settings, app.state.board, app.state.store = settings, market.board, market.store
    _reload_manifests(market)

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

    for module in (service, store, models, jobs, tasks, miners, swarms, committee, ui):
        app.include_router(module.router)
    return app


def admission_rules(settings: MarketSettings) -> list[Rule]:
    """The surfaces whose cost the caller picks, each with its limit from `settings` (see
    `market.admission`; a swarm join is limited per miner too, by its route)."""
    def limit(per_s: float) -> Limit:
        return Limit.over(per_s, settings.limit_burst_s, settings.limited_at_once)

    return [Rule("GET /ui", "/ui", limit(settings.ui_per_s)),
            Rule("GET /ui/tx/{hash}", "/ui/tx/[^/]*", limit(settings.ui_tx_per_s)),
            Rule("GET /metrics", "/metrics", limit(settings.metrics_per_s)),
            Rule("swarm joins", "/swarms/[^/]*/members", limit(settings.swarm_joins_per_s))]


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
