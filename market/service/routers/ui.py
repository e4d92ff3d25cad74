"""The read-only dashboard (`/ui`: jobs, miners, the committee, disputes and challenges, each
row linked to `/ui/tx/{hash}`, the transaction behind it) and Prometheus' `/metrics`.

Server-rendered HTML (Jinja2 templates in `market/service/templates`) with a small inline
script that redraws the page every few seconds; nothing is fetched from outside the market,
so it works offline. Neither is part of the OpenAPI document: they are views, not the API.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST

from market.service.dashboard import Pages

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")
REFRESH_S = 3
MIN_REFRESH_S = 1.0
"""The shortest redraw interval a page may ask for (each redraw is a request)."""
_TX = re.compile(r"0x[0-9a-fA-F]{64}")


def eth(wei: Any) -> str:
    """Wei as a person reads it: ETH with enough digits, or gwei / wei when small."""
    value = int(wei or 0)
    if value == 0:
        return "0"
    if value >= 10**15:
        return f"{value / 10**18:.6f} ETH"
    if value >= 10**6:
        return f"{value / 10**9:,.3f} gwei".replace(".000 gwei", " gwei")
    return f"{value} wei"


def short(address: Any) -> str:
    """0x1234…abcd for an address or hash (the full value is in the title and the link)."""
    text = str(address or "")
    return text if len(text) <= 14 else f"{text[:6]}…{text[-4:]}"


def utc(timestamp: Any) -> str:
    """A chain timestamp as UTC (a devnet's clock may run ahead of the wall clock)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(timestamp or 0)))


templates.env.filters["eth"] = eth
templates.env.filters["utc"] = utc
templates.env.filters["short"] = short


@router.get("/ui", response_class=HTMLResponse)
def ui(request: Request, refresh: float = Query(REFRESH_S, ge=0, le=3600)) -> HTMLResponse:
    """The dashboard; it redraws itself every `refresh` seconds (0: never, else at least
    `MIN_REFRESH_S`)."""
    if 0 < refresh < MIN_REFRESH_S:
        raise HTTPException(422, f"refresh: {refresh:g} s is below the floor of "
                            f"{MIN_REFRESH_S:g} s (0 holds the page still)")
    page = pages(request).dashboard(
        lambda v, refresh_s: templates.get_template("dashboard.html").render(
            v=v, refresh_s=refresh_s).encode(), refresh)
    return HTMLResponse(page)


@router.get("/ui/tx/{tx}", response_class=HTMLResponse)
def ui_transaction(request: Request, tx: str) -> HTMLResponse:
    """One transaction the board indexed: the chain's receipt and the Quarry events it
    emitted. 404 for any other, without asking the node."""
    if not _TX.fullmatch(tx):
        raise HTTPException(404, f"{tx!r} is not a transaction hash (0x + 64 hex digits)")
    t = pages(request).transaction(tx)
    if t is None:
        raise HTTPException(404, f"the board has indexed no Quarry event from transaction "
                            f"{tx}")
    return templates.TemplateResponse(request, "transaction.html", {"t": t})


def pages(request: Request) -> Pages:
    page_cache: Pages = request.app.state.pages
    return page_cache


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus text format: request counts and latencies, board gauges (see
    `market.service.metrics`; a scrape within `kept.KEPT_S` of the last gets its text)."""
    return Response(request.app.state.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)
