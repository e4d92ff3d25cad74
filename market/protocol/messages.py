"""Signed messages to the market: heartbeats, offers, committee messages, reader headers.

Signatures are EIP-191 (`personal_sign`) over canonical JSON: a heartbeat over {"miner",
"timestamp", "status"}, an offer over {"taskId", "miner", "timestamp"}, a committee message
over {"author", "kind", "epoch", "topic", "body"}, a reader's headers over {"reader",
"timestamp"}, a swarm join over `SWARM_JOIN_FIELDS` (the price as a decimal string: wei
pass canonical JSON's 2^53), a swarm registration report over {"head", "model_id",
"version", "swarm_id", "timestamp"}. Timestamps are unix seconds on the signer's clock.
The market's server and the roles' client (`market.marketapi`) share these, so both sides
agree on every byte.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from market.errors import QuarryError
from market.protocol.canonical import canonical_json_bytes
from market.protocol.eip712 import SwarmConsent


class MalformedMessage(QuarryError, ValueError):
    """A signed message or its signature could not be read."""


def heartbeat_message(miner: str, timestamp: int, status: dict[str, Any]) -> bytes:
    """The bytes a miner signs (EIP-191) for a heartbeat, so no one can speak for it."""
    return canonical_json_bytes({"miner": miner, "timestamp": timestamp, "status": status})


def sign(account: LocalAccount, message: bytes) -> str:
    """The EIP-191 signature of `message` by `account`, as 0x hex."""
    return "0x" + bytes(account.sign_message(encode_defunct(message)).signature).hex()


def _recover(message: bytes, signature: Any) -> str:
    """The EIP-191 signer of `message`; raises on a malformed signature."""
    if not isinstance(signature, str):
        raise ValueError(f"signature must be a 0x hex string, got {type(signature).__name__}")
    return str(Account.recover_message(encode_defunct(message),
                                       signature=bytes.fromhex(signature.removeprefix("0x"))))


def recover_heartbeat(body: dict[str, Any]) -> str:
    """The address that signed a heartbeat body; raises MalformedMessage on a malformed one."""
    try:
        message = heartbeat_message(body["miner"], int(body["timestamp"]), body["status"])
        return _recover(message, body["signature"])
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MalformedMessage(f"malformed heartbeat: {exc}") from exc


def offer_message(task_id: int, miner: str, timestamp: int) -> bytes:
    """The bytes a task's client signs (EIP-191) to offer the task to one miner; the taskId
    is signed too, so an offer cannot be replayed onto another task of the same client."""
    return canonical_json_bytes({"taskId": int(task_id), "miner": miner,
                                 "timestamp": int(timestamp)})


def recover_offer(task_id: int, body: dict[str, Any]) -> str:
    """The address that signed an offer body for `task_id`; MalformedMessage on a malformed one."""
    try:
        return _recover(offer_message(task_id, body["miner"], int(body["timestamp"])),
                        body["signature"])
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MalformedMessage(f"malformed offer: {exc}") from exc


MESSAGE_FIELDS = ("author", "kind", "epoch", "topic", "body")
"""The fields of a committee message its signature covers (all but `signature`)."""


def committee_message_bytes(msg: Mapping[str, Any]) -> bytes:
    """The bytes a verifier signs (EIP-191) for a committee message: the canonical JSON of
    its five content fields."""
    return canonical_json_bytes({k: msg[k] for k in MESSAGE_FIELDS})


def committee_message(account: LocalAccount, kind: str, epoch: int, topic: str,
                      body: dict[str, Any]) -> dict[str, Any]:
    """A committee message from `account`, signed and ready for `MarketAPI.post_message`."""
    msg: dict[str, Any] = {"author": account.address, "kind": kind, "epoch": int(epoch),
                           "topic": topic, "body": body}
    msg["signature"] = sign(account, committee_message_bytes(msg))
    return msg


def recover_committee_message(msg: Mapping[str, Any]) -> str:
    """The address that signed a committee message (compare it with `author`); raises
    MalformedMessage on a malformed message or signature."""
    try:
        return _recover(committee_message_bytes(msg), msg["signature"])
    except Exception as exc:  # KeyError, CanonicalJSONError, ValueError, BadSignature...
        raise MalformedMessage(f"malformed committee message: {exc}") from exc


READER_HEADER = "X-Quarry-Reader"
TIMESTAMP_HEADER = "X-Quarry-Timestamp"
SIGNATURE_HEADER = "X-Quarry-Signature"


def reader_message(reader: str, timestamp: int) -> bytes:
    """The bytes a member signs (EIP-191) to read the committee's messages."""
    return canonical_json_bytes({"reader": reader, "timestamp": int(timestamp)})


def reader_headers(account: LocalAccount, timestamp: int | None = None) -> dict[str, str]:
    """The headers that let `account` read the committee's messages (valid for a couple of
    minutes around `timestamp`, default now)."""
    timestamp = int(time.time()) if timestamp is None else int(timestamp)
    return {READER_HEADER: account.address, TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(account, reader_message(account.address, timestamp))}


def recover_reader(reader: str, timestamp: int, signature: str) -> str:
    """The address that signed a reader's headers; MalformedMessage on a malformed signature."""
    try:
        return _recover(reader_message(reader, timestamp), signature)
    except Exception as exc:  # ValueError, BadSignature...
        raise MalformedMessage(f"malformed reader signature: {exc}") from exc


SWARM_JOIN_FIELDS = ("miner", "model_id", "memory_mib", "tflops", "endpoint", "public_key",
                     "rtts", "price_per_token", "timestamp")
"""The fields of a swarm join (or its heartbeat) its signature covers (all but `signature`)."""


def swarm_join_message(miner: str, model_id: str, memory_mib: int, tflops: float,
                       endpoint: str, public_key: str, rtts: Mapping[str, float],
                       price_per_token: int, timestamp: int) -> bytes:
    """The bytes a miner signs (EIP-191) to join a model's swarm or stay in it: what it
    declares (memory, speed, stage endpoint, CURVE public key, ask) and the RTTs it measured
    to the other members, so the market binds the stage key to the miner's address."""
    return canonical_json_bytes({
        "miner": miner, "model_id": str(model_id).lower(), "memory_mib": int(memory_mib),
        "tflops": float(tflops), "endpoint": endpoint, "public_key": public_key,
        "rtts": {str(a): float(s) for a, s in rtts.items()},
        "price_per_token": str(int(price_per_token)), "timestamp": int(timestamp)})


def swarm_join(account: LocalAccount, model_id: str, *, memory_mib: int, tflops: float,
               endpoint: str, public_key: str, rtts: Mapping[str, float] | None = None,
               price_per_token: int, timestamp: int | None = None) -> dict[str, Any]:
    """A swarm join body from `account`, signed and ready for `POST /swarms/{model_id}/members`
    (`MarketAPI.swarm_join` sends it)."""
    timestamp = int(time.time()) if timestamp is None else int(timestamp)
    body: dict[str, Any] = {
        "miner": account.address, "model_id": str(model_id).lower(),
        "memory_mib": int(memory_mib), "tflops": float(tflops), "endpoint": endpoint,
        "public_key": public_key, "rtts": {str(a): float(s) for a, s in (rtts or {}).items()},
        "price_per_token": int(price_per_token), "timestamp": timestamp}
    body["signature"] = sign(account, swarm_join_message(
        *(body[k] for k in SWARM_JOIN_FIELDS)))
    return body


def recover_swarm_join(body: Mapping[str, Any]) -> str:
    """The address that signed a swarm join body (compare it with `miner`); raises
    MalformedMessage on a malformed body or signature."""
    try:
        return _recover(swarm_join_message(*(body[k] for k in SWARM_JOIN_FIELDS)),
                        body["signature"])
    except Exception as exc:  # KeyError, CanonicalJSONError, ValueError, BadSignature...
        raise MalformedMessage(f"malformed swarm join: {exc}") from exc


def swarm_registered_message(head: str, model_id: str, version: int, swarm_id: int,
                             timestamp: int) -> bytes:
    """The bytes a swarm's head signs (EIP-191) to report plan `version` registered on-chain
    as `swarm_id`."""
    return canonical_json_bytes({"head": head, "model_id": str(model_id).lower(),
                                 "version": int(version), "swarm_id": int(swarm_id),
                                 "timestamp": int(timestamp)})


def recover_swarm_registered(body: Mapping[str, Any], model_id: str) -> str:
    """The address that signed a registration report for `model_id`; MalformedMessage on a
    malformed one."""
    try:
        return _recover(swarm_registered_message(body["head"], model_id, int(body["version"]),
                                                 int(body["swarm_id"]), int(body["timestamp"])),
                        body["signature"])
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MalformedMessage(f"malformed swarm registration: {exc}") from exc


def swarm_terms_consent(terms: Mapping[str, Any], nonce: int = 0) -> SwarmConsent:
    """The EIP-712 SwarmConsent of a live plan's `terms` (as `GET /swarms/{id}/plan` serves
    them) at `nonce`: what each member signs with its own GPURegistry nonce, and what the
    market checks consents against. SignatureError on terms the contract would refuse."""
    return SwarmConsent(bytes.fromhex(str(terms["model_id"]).removeprefix("0x")),
                        terms["head"], tuple(terms["members"]),
                        tuple(int(s) for s in terms["shares"]), int(terms["price_per_token"]),
                        int(nonce), int(terms["deadline"]))
