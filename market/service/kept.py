"""Answers kept at the door: a `GET` of a kept path (`/ui`, `/metrics`) asked again within
`KEPT_S` of a 200 for the same path and query gets that answer's bytes from an ASGI
middleware, without routing, dependencies, a threadpool thread or the route itself.

The page and the scrape cannot change faster than that in any case (`/ui` is drawn anew at
most once per `dashboard.REDRAW_S`, Prometheus scrapes every 15 s or so), so readers lose
nothing; `MAX_KEPT` answers are kept, one per query string (a stranger's made-up query
strings only evict each other's).
"""

from __future__ import annotations

import time
from collections.abc import Collection

from market.guards import ASGIApp, Message, Receive, Scope, Send

KEPT_S = 1.0
"""How long an answer is served again."""
MAX_KEPT = 16
"""Answers kept at once; past that the oldest goes."""


class KeptResponses:
    """ASGI middleware: the latest 200 of each kept `GET` (path and query), served again
    for `kept_s` (see the module doc)."""

    def __init__(self, app: ASGIApp, paths: Collection[str], *, kept_s: float = KEPT_S,
                 max_kept: int = MAX_KEPT) -> None:
        self.app, self.paths, self.kept_s, self.max_kept = app, frozenset(paths), kept_s, max_kept
        self._kept: dict[tuple[str, bytes], tuple[float, list[Message]]] = {}
        self.served = 0  # answers served from what was kept

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or \
                scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        key = (scope["path"], scope.get("query_string", b""))
        now = time.monotonic()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < self.kept_s:
            self.served += 1
            for message in kept[1]:
                await send(message)
            return
        messages: list[Message] = []

        async def keeping(message: Message) -> None:
            messages.append(message)
            await send(message)

        await self.app(scope, receive, keeping)
        if messages and messages[0]["type"] == "http.response.start" and \
                messages[0]["status"] == 200:
            self._kept.pop(key, None)
            while len(self._kept) >= self.max_kept:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = (now, messages)
