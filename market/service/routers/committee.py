"""The verifier committee's message relay: signed messages, read by verifiers only."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from market.protocol.messages import (
    MESSAGE_FIELDS,
    READER_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    MalformedMessage,
    recover_committee_message,
    recover_reader,
)
from market.service.board import I64_MAX, checksum, deployment_identity
from market.service.deps import MarketDep
from market.service.http import MessageTooLarge, check_skew, errors, read_body
from market.service.schemas import CommitteeMessageIn, CommitteeMessageOut, MessageIdOut

router = APIRouter(tags=["committee"])

MAX_MESSAGE_BYTES = 1 << 20
"""The largest committee message the relay takes (its JSON body)."""
MAX_TOPIC_CHARS = 256
KIND_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def check_message(msg: Any) -> dict[str, Any]:
    """A committee message's fields checked (HTTPException 400 naming the bad one). Parsed
    by hand, not by the model: the body is read raw under its own 1 MiB limit."""
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


@router.post("/committee/messages", status_code=201, response_model=MessageIdOut,
             responses={200: {"model": MessageIdOut, "description": "an identical repost"},
                        **errors(400, 401, 403, 409, 413, 503)},
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": CommitteeMessageIn.model_json_schema()}}}})
async def post_message(request: Request, response: Response,
                       market: MarketDep) -> dict[str, int]:
    """Relay a verifier's signed message (EIP-191 over the canonical JSON of author, kind,
    epoch, topic, body). 201 `{"id"}`, 200 with the first id for an identical repost;
    401 bad signature, 403 author without a verifier record (see the API description),
    409 another message under the same (author, kind, epoch, topic), 413 over 1 MiB."""
    raw = await read_body(request, MAX_MESSAGE_BYTES, lambda size, so_far: MessageTooLarge(
        f"committee message is {size} bytes{' (so far)' if so_far else ''}, over the "
        f"relay's limit of {MAX_MESSAGE_BYTES} bytes"))
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise HTTPException(400, f"committee message is not JSON: {exc}") from None
    msg = check_message(parsed)
    author = msg["author"]
    try:
        signer = recover_committee_message(msg)
    except MalformedMessage as exc:
        raise HTTPException(401, str(exc)) from exc
    if signer != author:
        raise HTTPException(401, f"committee message from {author} is signed by {signer}")
    q = await run_in_threadpool(market.deployment.quarry)
    await run_in_threadpool(require_verifier, q, author, "post committee messages")
    message_id, created = await run_in_threadpool(
        market.board.put_message, deployment_identity(q), msg)
    if not created:
        response.status_code = 200
    return {"id": message_id}


@router.get("/committee/messages", response_model=list[CommitteeMessageOut],
            responses=errors(400, 401, 403, 503))
def messages(market: MarketDep,
             epoch: int | None = Query(None, ge=0, le=I64_MAX),
             kind: str | None = None, topic: str | None = None,
             afterId: int = Query(0, ge=0, le=I64_MAX),
             limit: int = Query(1000, ge=1, le=10000),
             reader: str | None = Header(None, alias=READER_HEADER),
             timestamp: str | None = Header(None, alias=TIMESTAMP_HEADER),
             signature: str | None = Header(None, alias=SIGNATURE_HEADER),
             ) -> list[dict[str, Any]]:
    """Messages with an id above `afterId`, ascending, filtered by epoch, kind and topic
    when given; verifiers only (seated, joining or leaving, as for posting): headers
    X-Quarry-Reader, X-Quarry-Timestamp and X-Quarry-Signature (EIP-191 over the canonical
    JSON of {"reader", "timestamp"}, the timestamp within 120 s). 401 without a valid
    reader signature, 403 without a verifier record."""
    if reader is None or timestamp is None or signature is None:
        raise HTTPException(401, f"reading committee messages needs the headers "
                            f"{READER_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}, "
                            "signed by a VerifierCommittee member")
    try:
        when = int(timestamp)
    except ValueError:
        raise HTTPException(401, f"{TIMESTAMP_HEADER} {timestamp!r} is not an "
                            "integer") from None
    address = checksum(reader, "reader")
    try:
        signer = recover_reader(reader, when, signature)
    except MalformedMessage as exc:
        raise HTTPException(401, str(exc)) from exc
    if signer != address:
        raise HTTPException(401, f"reader headers for {address} are signed by {signer}")
    check_skew("reader", when, 401)
    q = market.deployment.quarry()
    require_verifier(q, address, "read committee messages")
    return market.board.messages(deployment_identity(q), epoch=epoch, kind=kind, topic=topic,
                          after_id=afterId, limit=limit)
