"""The market's Prometheus metrics, served at `/metrics` (text format).

Two kinds: the HTTP requests the app answers (counted and timed by `RequestMetrics`, an ASGI
middleware, by route template so `/jobs/7` and `/jobs/8` are one series) and gauges read
when Prometheus scrapes (`BoardCollector`): the indexer's lag behind the chain head, the
Celery queue's depth, tasks, shards, disputes and challenges by state, and the store's size.
Each app has its own registry, so two apps in one process (tests) never share series.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from market.metrics import queue_depth
from market.service.matching import miner_alive

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from market.service.deps import Market

log = logging.getLogger("quarry.metrics")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
"""Seconds; the long polls (`waitSeconds`, up to 30 s) land in the last buckets."""
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class MarketMetrics:
    """The registry behind one app's `/metrics` and the request series in it."""

    def __init__(self, market: Market) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("quarry_market_requests", "HTTP requests answered",
                                ("method", "route", "status"), registry=self.registry)
        self.latency = Histogram("quarry_market_request_seconds",
                                 "Time to answer an HTTP request", ("method", "route"),
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.refused = Counter("quarry_market_refused_requests",
                               "Requests answered 429 before the app, by limit",
                               ("limit",), registry=self.registry)
        self.registry.register(BoardCollector(market))

    def scrape(self) -> bytes:
        """The text format of every series (`/metrics` keeps it `kept.KEPT_S`)."""
        return generate_latest(self.registry)

    def count_refused(self, limit: str) -> None:
        """One more request refused by `limit` (`market.admission.Admission`)."""
        self.refused.labels(limit).inc()


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request by method, route template and
    status. Unrouted paths (404s) share the route `<unmatched>` and unknown methods the
    method `other`, so strangers cannot grow the series without bound."""

    def __init__(self, app: ASGIApp, metrics: MarketMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            method = scope.get("method", "")
            if method not in HTTP_METHODS:
                method = "other"  # a client picks the method: unbounded series otherwise
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - began)


class BoardCollector(Collector):
    """Gauges read at scrape time from the board, Redis, the chain and the store (its size
    counted once, then kept by each upload). A part that cannot be read (chain or Redis
    down) is left out of that scrape and logged, so `/metrics` still answers with the rest."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self._client: Any = None

    def collect(self) -> Iterator[Metric]:
        market = self.market
        board = market.board
        counts = board.counts()
        for name, what, label in (("shards", "Shards on the board by state", "state"),
                                  ("tasks", "Tasks on the board: active, done or cancelled",
                                   "status"),
                                  ("disputes", "Disputes by status", "status"),
                                  ("challenges", "Availability challenges by status",
                                   "status")):
            family = GaugeMetricFamily(f"quarry_market_{name}", what, labels=[label])
            for key, n in counts[name].items():
                family.add_metric([_snake(key)], n)
            yield family
        cursor = board.cursor()
        yield GaugeMetricFamily("quarry_market_indexed_block",
                                "The last block the indexer applied", value=cursor)
        head = self._read("the chain head", self._head)
        if head is not None and cursor >= 0:
            yield GaugeMetricFamily("quarry_market_indexer_lag_blocks",
                                    "Blocks between the chain head and the indexed block",
                                    value=max(0, head - cursor))
        from market.service.worker import QUEUE  # Celery loads only when scraped

        depth = queue_depth(self._redis(), QUEUE)
        if not math.isnan(depth):
            family = GaugeMetricFamily("quarry_market_celery_queue_depth",
                                       "Tasks waiting in the market's Celery queue",
                                       labels=["queue"])
            family.add_metric([QUEUE], depth)
            yield family
        yield GaugeMetricFamily("quarry_market_store_bytes",
                                "Bytes in the content store (requests, results, evidence)",
                                value=market.store.bytes_stored())
        miners = board.miners()
        wall, ttl = time.time(), market.settings.heartbeat_ttl_s
        family = GaugeMetricFamily("quarry_market_miners", "Registered miners by liveness",
                                   labels=["alive"])
        alive = sum(1 for m in miners if miner_alive(m, wall, ttl))
        family.add_metric(["true"], alive)
        family.add_metric(["false"], len(miners) - alive)
        yield family

    @staticmethod
    def _read(what: str, read: Any) -> Any:
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - a scrape reports what it can
            log.warning("metrics: cannot read %s: %s", what, exc)
            return None

    def _head(self) -> int:
        return self.market.deployment.quarry().chain.block_number()

    def _redis(self) -> Any:
        """One Redis client for every scrape (short timeouts: a scrape must not hang)."""
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(self.market.settings.redis_url,
                                                socket_timeout=1, socket_connect_timeout=1)
        return self._client


def _snake(name: str) -> str:
    """`MinerAtFault` -> `miner_at_fault`: Prometheus label values in one style."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()

