"""Prometheus metrics shared by the roles: `serve_metrics` puts the default registry on
`/metrics` over HTTP (`miner run` and `verifier run` with `metrics_port`), and `metric`
declares a module-level metric that survives its module being imported twice (the default
registry lives in prometheus_client, which outlives a re-import of ours: tests do that)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, TypeVar

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import CollectorRegistry

from market.errors import ConfigError

__all__ = ["metric", "metrics_url", "queue_depth", "serve_metrics"]

CELERY_PRIORITY_SEP = "\x06\x16"
"""kombu's Redis transport keeps a queue's prioritized messages in lists named
`<queue><sep><priority>` beside `<queue>` itself."""
CELERY_PRIORITIES = (3, 6, 9)

M = TypeVar("M", bound=MetricWrapperBase)
log = logging.getLogger("quarry.metrics")


def metric(kind: type[M], name: str, documentation: str, labelnames: Sequence[str] = (),
           registry: CollectorRegistry = REGISTRY, **options: Any) -> M:
    """`kind(name, documentation, labelnames, **options)` registered in `registry`, or the
    one of that kind and name already there (a second import would otherwise be refused
    as a duplicate time series)."""
    existing = registry._names_to_collectors.get(name)  # no public lookup by name
    if isinstance(existing, kind):
        return existing
    return kind(name, documentation, labelnames, registry=registry, **options)


def queue_depth(client: Any, queue: str) -> float:
    """Celery messages waiting on `queue` in Redis (every priority's list); NaN when Redis
    fails: a scrape never fails for Redis (down, wrong type, timeout)."""
    keys = [queue] + [f"{queue}{CELERY_PRIORITY_SEP}{p}" for p in CELERY_PRIORITIES]
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return float(sum(pipe.execute()))
    except Exception:
        return math.nan


def metrics_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def serve_metrics(port: int, host: str = "127.0.0.1",
                  registry: CollectorRegistry = REGISTRY) -> int:
    """Serve `registry` at http://host:port/metrics from a daemon thread, and log where;
    returns the bound port (`port` 0: any free one). ConfigError naming the address when it
    cannot bind."""
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host} port {port} (metrics_port): "
                          f"{exc.strerror or exc}") from None
    bound = int(server.server_port)
    log.info("metrics on %s", metrics_url(host, bound))
    return bound
