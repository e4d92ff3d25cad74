"""What every router shares about HTTP: the error families' statuses, the declared error
responses, bounded raw bodies and the signed-timestamp skew check."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request

from market.chain.errors import ChainError
from market.errors import ConfigError, QuarryError
from market.protocol.messages import MalformedMessage
from market.service.board import MessageConflict
from market.service.boarddb import checksum
from market.service.boardsql import DatabaseUnusable
from market.service.schemas import ErrorOut
from market.store import ContentNotFound, ContentTooLarge

SIGNED_SKEW_S = 120
"""How far an offer's or a committee reader's timestamp may be from the market's clock."""


class MessageTooLarge(QuarryError):
    """A committee message over the relay's limit."""


ERROR_STATUS: tuple[tuple[type[QuarryError], int], ...] = (
    (ContentNotFound, 404),
    (ContentTooLarge, 413),
    (MessageTooLarge, 413),
    (MessageConflict, 409),
    (ChainError, 503),  # the chain is down or not the deployment's
    (ConfigError, 503),  # no usable deployment file: the market cannot reach the contracts
    (DatabaseUnusable, 503),  # the board's database is down or unreachable
    (QuarryError, 400),  # the rest name bad input: store addresses, manifests, board queries
)
"""The HTTP status of each error family, most specific first."""

_WHY = {
    400: "bad input (named in `detail`)",
    401: "the signature is not the signer's",
    403: "the signer may not do this",
    404: "not found",
    409: "conflicts with what is stored",
    413: "body over its limit",
    422: "a parameter or body field out of its type or bounds",
    429: "too many requests: retry after the `Retry-After` header's seconds",
    503: "no usable deployment, or its chain does not answer",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each status with the `{"detail": str}` error model."""
    return {code: {"model": ErrorOut, "description": _WHY[code]} for code in (*codes, 422)}


async def read_body(request: Request, limit: int,
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


def check_skew(what: str, timestamp: int, status: int, limit_s: int = SIGNED_SKEW_S) -> None:
    """HTTPException(`status`) when a signed `timestamp` is over `limit_s` off the clock."""
    skew = timestamp - time.time()
    if abs(skew) > limit_s:
        raise HTTPException(status, f"{what} timestamp {timestamp} is {skew:+.0f} s off the "
                            f"market's clock (at most {limit_s} s)")


def require_signer(what: str, claimed: str, recover: Callable[[], str],
                   field: str = "miner") -> str:
    """The checksummed `claimed` address once `recover()` (the message's signer) is it: 400
    for a malformed message, 401 when another key signed it (`what` names the message)."""
    try:
        signer = recover()
    except MalformedMessage as exc:
        raise HTTPException(400, str(exc)) from exc
    address = checksum(claimed, field)
    if signer != address:
        raise HTTPException(401, f"{what} for {address} is signed by {signer}")
    return address
