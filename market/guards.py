"""What hostile request bodies meet before any endpoint parses them, on every server Quarry
ships (the market, and the client's OpenAI gateway).

`JsonBodyGuard` is a plain ASGI middleware in front of every JSON endpoint (every POST, PUT
and PATCH except the paths exempted, such as raw or multipart uploads with limits of their
own): it reads the body up to `max_bytes` (a declared content-length over the limit is
refused before a byte is read, a stream that passes it is cut off there) and measures its
nesting with `market.jsonsafe` before the framework's JSON parser sees it. Too large is
413, too deep is 400, each with an error body naming the limit (the market's
`{"detail": ...}` unless the server passes its own `error_body`); the body then reaches the
app unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from market.jsonsafe import MAX_DEPTH, JsonTooDeep, check_depth

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_JSON_BYTES = 2 << 20
"""2 MiB: manifests and heartbeats are far smaller; committee messages have their own 1 MiB
limit, which that endpoint enforces and names itself below this one."""


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        self.status, self.detail = status, detail


def detail_body(status: int, detail: str) -> dict[str, Any]:
    """The market's error body: `{"detail": ...}`."""
    return {"detail": detail}


class JsonBodyGuard:
    """Size and depth limits on JSON request bodies (see the module doc)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_JSON_BYTES,
                 max_depth: int = MAX_DEPTH, exempt: tuple[str, ...] = ("/store",),
                 error_body: Callable[[int, str], dict[str, Any]] = detail_body) -> None:
        self.app, self.max_bytes, self.max_depth, self.exempt = app, max_bytes, max_depth, exempt
        self.error_body = error_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH") or \
                scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            check_depth(body, self.max_depth, "the request body")
        except _Refused as exc:
            await reply(send, exc.status, self.error_body(exc.status, exc.detail))
            return
        except JsonTooDeep as exc:
            await reply(send, 400, self.error_body(400, str(exc)))
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # a disconnect, if the client goes away
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise _Refused(400, f"bad content-length {value.decode()!r}") from None
                if declared > self.max_bytes:
                    raise _Refused(413, f"request body of {declared} bytes is over the "
                                        f"{self.max_bytes}-byte limit for JSON bodies")
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "the client went away mid-body")
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                raise _Refused(413, f"request body passed the {self.max_bytes}-byte limit "
                                    "for JSON bodies")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def reply(send: Send, status: int, body: dict[str, Any],
                headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer with `body` as JSON, without reading the request's body."""
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode()), *headers]})
    await send({"type": "http.response.body", "body": raw})
