"""Admission control: how often, and how many at once, anyone may ask a server for what it
pays for (the market's dashboard, `/metrics` and swarm joins; the client gateway's
uploads), decided before any of that work is done.

A `Limit` is a rate with a burst (a token bucket: `burst` requests at once, then one every
1/`per_s` seconds; kept as one number per key, GCRA's theoretical arrival time) and at most
`at_once` requests inside the app together (a sync route holds one of the threadpool's 40
threads while it runs, so the limited routes together can never take them all from the
API). `Admission`, an ASGI middleware, matches each request's path against its `Rule`s and
answers one over its rule's limit with 429 and `Retry-After` (whole seconds until it would
pass), without reading its body or reaching the app. A route that limits by a key of its
own (a swarm join by its signing miner) asks a `Limiter` and answers 429 with
`retry_after(wait)` itself.

A 429 costs a Python server little, but not nothing: a caller that ignores Retry-After and
asks again at once would keep a one-process server busy answering them. So every 429 that
passes through `Admission`, its own and the app's, is held on the event loop for the wait
it names (at most `HOLD_S`) before it is sent: a held answer is a sleeping coroutine, no
thread and no CPU, and one connection then asks at most about once a second. Past
`MAX_HELD` held answers the rest are sent at once.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from market.guards import ASGIApp, Message, Receive, Scope, Send, detail_body, reply

HOLD_S = 1.0
"""The longest a 429 is held before it is sent (it is held for the Retry-After it names)."""
MAX_HELD = 256
"""429s held at once, at most; past that they are sent without waiting."""
MAX_KEYS = 4096
"""Keys a `Limiter` tracks; past that the longest-idle are dropped (a full bucket needs no
state, so only a key that asked within its last burst loses anything)."""


@dataclass(frozen=True)
class Limit:
    """`per_s` requests a second with bursts of `burst`; at most `at_once` inside at once
    (None: no such cap)."""

    per_s: float
    burst: int = 1
    at_once: int | None = None

    def __post_init__(self) -> None:
        if not self.per_s > 0 or self.burst < 1 or (self.at_once is not None
                                                      and self.at_once < 1):
            raise ValueError(f"a limit needs per_s > 0, burst >= 1 and at_once >= 1: {self}")

    @classmethod
    def over(cls, per_s: float, burst_s: float, at_once: int | None = None) -> Limit:
        """`per_s` with bursts of `burst_s` seconds' worth (at least one request)."""
        return cls(per_s, max(1, math.floor(per_s * burst_s)), at_once)

    def describe(self) -> str:
        at_once = "" if self.at_once is None else f", {self.at_once} at once"
        return f"{self.per_s:g} a second, bursts of {self.burst}{at_once}"


def retry_after(wait_s: float) -> str:
    """A `Retry-After` value: the whole seconds to wait, at least 1."""
    return str(max(1, math.ceil(wait_s)))


class Limiter:
    """Token buckets for one `Limit`, one per key (GCRA: a key's state is the time its
    bucket is full again). Safe from any thread."""

    def __init__(self, limit: Limit, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        self.limit, self._clock, self._max_keys = limit, clock, max_keys
        self._interval = 1.0 / limit.per_s
        self._tolerance = (limit.burst - 1) * self._interval
        self._full_at: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, key: Hashable = None) -> float:
        """0.0 when `key` may go now (its token taken), else the seconds until it may
        (nothing taken)."""
        with self._lock:
            now = self._clock()
            due = max(self._full_at.get(key, now), now)
            early = due - self._tolerance - now
            if early > 0:
                return early
            self._full_at[key] = due + self._interval
            self._full_at.move_to_end(key)
            while len(self._full_at) > self._max_keys:
                self._full_at.popitem(last=False)
            return 0.0


class SignedLimiter(Limiter):
    """A `Limiter` for signed, timestamped messages, keyed by their signer: a message newer
    than the signer's last one let through takes a token; one no newer (a replay, by anyone,
    which the route ignores in any case) takes none and passes, so replaying a signer's
    messages cannot use up the signer's bucket."""

    def __init__(self, limit: Limit, **kw: Any) -> None:
        super().__init__(limit, **kw)
        self._last: OrderedDict[str, int] = OrderedDict()

    def wait_signed(self, signer: str, timestamp: int) -> float:
        """`wait(signer)` for a message signed at `timestamp` newer than the last let
        through, else 0.0 with nothing taken."""
        with self._lock:
            if timestamp <= self._last.get(signer, -1):
                return 0.0
        wait = self.wait(signer)
        if wait == 0.0:
            with self._lock:
                self._last[signer] = max(timestamp, self._last.get(signer, -1))
                self._last.move_to_end(signer)
                while len(self._last) > self._max_keys:
                    self._last.popitem(last=False)
        return wait


@dataclass(frozen=True)
class Rule:
    """Requests whose path matches `path` whole (and whose method is `method`, or any
    method when None) share `limit`; `name` goes in the refusal and the count of
    refusals."""

    name: str
    path: str
    limit: Limit
    method: str | None = None


class _Kind:
    """One rule's state in an `Admission`: its bucket and how many are inside."""

    def __init__(self, rule: Rule) -> None:
        self.rule, self.bucket, self.inside = rule, Limiter(rule.limit), 0
        self.pattern = re.compile(rule.path)


class Admission:
    """ASGI middleware: each rule's limit before the app, and every 429 held (see the
    module doc). `on_refused(name)` counts each refusal by rule name; `error_body` makes the
    server's error object, as `JsonBodyGuard`'s does."""

    def __init__(self, app: ASGIApp, rules: Sequence[Rule], *,
                 error_body: Callable[[int, str], dict[str, Any]] = detail_body,
                 on_refused: Callable[[str], None] | None = None,
                 hold_s: float = HOLD_S, max_held: int = MAX_HELD) -> None:
        self.app, self.error_body, self.on_refused = app, error_body, on_refused
        self.hold_s, self.max_held, self.held = hold_s, max_held, 0
        self._kinds = [_Kind(rule) for rule in rules]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        kind = next((k for k in self._kinds if k.pattern.fullmatch(path) and
                     k.rule.method in (None, method)), None)
        if kind is None:
            await self.app(scope, receive, self._holding(send))
            return
        limit = kind.rule.limit
        if limit.at_once is not None and kind.inside >= limit.at_once:
            wait, why = 1.0, f"{kind.inside} are being answered"
        else:
            wait, why = kind.bucket.wait(), "over the rate"
        if wait > 0:
            if self.on_refused is not None:
                self.on_refused(kind.rule.name)
            after = retry_after(wait)
            detail = (f"too many requests for {kind.rule.name} ({why}; at most "
                      f"{limit.describe()}): retry after {after} s")
            await self._hold(float(after))
            await reply(send, 429, self.error_body(429, detail),
                        ((b"retry-after", after.encode()),))
            return
        kind.inside += 1
        try:
            await self.app(scope, receive, self._holding(send))
        finally:
            kind.inside -= 1

    def _holding(self, send: Send) -> Send:
        """`send`, holding an answer of the app's that is a 429 with Retry-After."""
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 429:
                after = next((v for k, v in message.get("headers", ())
                              if k.lower() == b"retry-after"), b"")
                if after.isdigit():
                    await self._hold(float(after))
            await send(message)

        return sending

    async def _hold(self, seconds: float) -> None:
        if self.held >= self.max_held:
            return
        self.held += 1
        try:
            await asyncio.sleep(min(seconds, self.hold_s))
        finally:
            self.held -= 1
