"""`MarketAPI`: the HTTP client of the market service, which miners and clients share.

The endpoints (JSON unless noted; errors are `{"detail": "..."}` with a 4xx status):

    GET  /health                 {"ok", "chainId", "indexedBlock", "headBlock", "redis"}
    GET  /deployment             the deployment file's JSON (chain id, RPC URL, addresses)
    GET  /limits                 {"maxFileBytes", "maxRequestBytes"}
    POST /store                  raw bytes -> 201 {"uri", "size"}; 413 over the limit
    GET  /store/{uri}            raw bytes; 404 unknown
    POST /models                 a model manifest -> {"modelId", "name"}
    GET  /models                 [{"modelId", "name", "miners", "minPricePerToken",
                                   "probationMiners", "hasManifest"}]: `miners` may claim an
                                 ordinary task (lowest ask among them); `probationMiners` more
                                 only tasks that allow probation
    GET  /models/{modelId}       the manifest; 404 unknown
    GET  /jobs?client=0x..       [job summary]: the board, indexed from chain events
    GET  /jobs/{taskId}          the job (with "allowProbation") and every shard, dispute,
                                 availability challenge and billing fault (see `Board.job`)
    GET  /shards/open?modelId=&miner=&limit=   open shards, best first for that miner (one on
                                 probation: only tasks with "allowProbation")
    POST /miners/heartbeat       {"miner", "timestamp", "status", "signature"}
    GET  /miners                 [{"address", "endpoint", "models", "pricePerToken", "stake",
                                   "reputationBps", "onProbation", "eligible",
                                   "eligibleAllowingProbation", "lastSeen", "alive",
                                   "status"}]
    POST /tasks/{taskId}/offer   {"miner", "timestamp", "signature"} signed by the task's client
                                 -> {"taskId", "miner", "until"}: until the task's deadline its
                                 shards are shown and recommended to that miner only; 401 not
                                 the client, 404 unknown task or miner, 400 stale timestamp or
                                 a miner that could not claim the task (e.g. on probation)
    POST /committee/messages     {"author", "kind", "epoch", "topic", "body", "signature"} ->
                                 201 {"id"} (200 for an identical repost); 401 bad signature,
                                 403 no VerifierCommittee record, 409 another message under
                                 the same (author, kind, epoch, topic), 413 over 1 MiB
    GET  /committee/messages?epoch=&kind=&topic=&afterId=&limit=   verifiers only (headers
                                 X-Quarry-Reader, X-Quarry-Timestamp, X-Quarry-Signature) ->
                                 [{"id", "author", "kind", "epoch", "topic", "body",
                                   "signature", "receivedAt"}] ascending by id

The committee relay serves every verifier with a VerifierCommittee record: seated, joining
(seated at a later epoch boundary) or leaving with its stake still bonded, since a dispute is
judged by the committee of the epoch it was opened in and a member whose seat has ended must
still post its votes on it. A verifier that withdrew its stake, like anyone else, is refused.

Signatures are EIP-191 (`personal_sign`) over canonical JSON: a heartbeat over {"miner",
"timestamp", "status"}, an offer over {"taskId", "miner", "timestamp"}, a committee message
over {"author", "kind", "epoch", "topic", "body"}, a reader's headers over {"reader",
"timestamp"}. Timestamps are unix seconds on the signer's clock.

The chain stays the source of truth: the market only stores bytes, indexes events and
recommends; a client or miner can check everything it says against the contracts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from market import jsonsafe
from market.chain.deployment import Deployment
from market.errors import QuarryError
from market.protocol.canonical import canonical_json_bytes
from market.store import ContentNotFound, ContentTooLarge, check_content, parse_uri


class MarketError(QuarryError):
    """The market refused a request; the message carries its reason, `status` the HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class MarketUnavailable(MarketError):
    """No market answers at the configured URL."""


def heartbeat_message(miner: str, timestamp: int, status: dict[str, Any]) -> bytes:
    """The bytes a miner signs (EIP-191) for a heartbeat, so no one can speak for it."""
    return canonical_json_bytes({"miner": miner, "timestamp": timestamp, "status": status})


def _sign(account: LocalAccount, message: bytes) -> str:
    return "0x" + bytes(account.sign_message(encode_defunct(message)).signature).hex()


def _recover(message: bytes, signature: Any) -> str:
    """The EIP-191 signer of `message`; raises on a malformed signature."""
    if not isinstance(signature, str):
        raise ValueError(f"signature must be a 0x hex string, got {type(signature).__name__}")
    return str(Account.recover_message(encode_defunct(message),
                                       signature=bytes.fromhex(signature.removeprefix("0x"))))


def recover_heartbeat(body: dict[str, Any]) -> str:
    """The address that signed a heartbeat body; raises MarketError on a malformed one."""
    try:
        message = heartbeat_message(body["miner"], int(body["timestamp"]), body["status"])
        return _recover(message, body["signature"])
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MarketError(f"malformed heartbeat: {exc}") from exc


def offer_message(task_id: int, miner: str, timestamp: int) -> bytes:
    """The bytes a task's client signs (EIP-191) to offer the task to one miner; the taskId
    is signed too, so an offer cannot be replayed onto another task of the same client."""
    return canonical_json_bytes({"taskId": int(task_id), "miner": miner,
                                 "timestamp": int(timestamp)})


def recover_offer(task_id: int, body: dict[str, Any]) -> str:
    """The address that signed an offer body for `task_id`; MarketError on a malformed one."""
    try:
        return _recover(offer_message(task_id, body["miner"], int(body["timestamp"])),
                        body["signature"])
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MarketError(f"malformed offer: {exc}") from exc


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
    msg["signature"] = _sign(account, committee_message_bytes(msg))
    return msg


def recover_committee_message(msg: Mapping[str, Any]) -> str:
    """The address that signed a committee message (compare it with `author`); raises
    MarketError on a malformed message or signature."""
    try:
        return _recover(committee_message_bytes(msg), msg["signature"])
    except Exception as exc:  # KeyError, CanonicalJSONError, ValueError, BadSignature...
        raise MarketError(f"malformed committee message: {exc}") from exc


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
            SIGNATURE_HEADER: _sign(account, reader_message(account.address, timestamp))}


def recover_reader(reader: str, timestamp: int, signature: str) -> str:
    """The address that signed a reader's headers; MarketError on a malformed signature."""
    try:
        return _recover(reader_message(reader, timestamp), signature)
    except Exception as exc:  # ValueError, BadSignature...
        raise MarketError(f"malformed reader signature: {exc}") from exc


MESSAGE_PAGE = 500
"""How many committee messages `MarketAPI.messages` asks for per request."""


class MarketAPI:
    """A typed wrapper over the market's endpoints; every failure is a `MarketError`."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MarketAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise MarketUnavailable(
                f"no market answers at {self.url} ({type(exc).__name__}); is `market serve` "
                "running?") from exc
        if response.status_code >= 400:
            try:
                detail = jsonsafe.loads(response.content).get("detail", response.text)
            except (ValueError, AttributeError, QuarryError):
                detail = response.text
            if response.status_code == 404 and path.startswith("/store/"):
                raise ContentNotFound(f"market {self.url} holds no {path[7:]}")
            raise MarketError(f"market {method} {path} failed ({response.status_code}): "
                              f"{detail}", response.status_code)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return jsonsafe.loads(response.content, what=f"the market's answer to {path}")
        except jsonsafe.JsonTooDeep as exc:
            raise MarketError(str(exc)) from exc

    # ------------------------------------------------------------------ service
    def health(self) -> dict[str, Any]:
        return dict(self._json("GET", "/health"))

    def deployment(self) -> Deployment:
        return Deployment.from_json(self._json("GET", "/deployment"), f"{self.url}/deployment")

    def limits(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._json("GET", "/limits").items()}

    # ------------------------------------------------------------------ store
    def put(self, data: bytes) -> str:
        """Upload bytes; returns their `sha256:` address."""
        try:
            return str(self._json("POST", "/store", content=data,
                                  headers={"content-type": "application/octet-stream"})["uri"])
        except MarketError as exc:
            if exc.status == 413:
                limit = self.limits()["maxFileBytes"]
                raise ContentTooLarge(len(data), limit) from exc
            raise

    def get(self, uri: str) -> bytes:
        """Download the bytes at a `sha256:` address, checked against it."""
        parse_uri(uri)
        return check_content(uri, self._request("GET", f"/store/{uri}").content)

    # ------------------------------------------------------------------ models
    def register_model(self, manifest: dict[str, Any]) -> str:
        return str(self._json("POST", "/models", json=manifest)["modelId"])

    def models(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/models"))

    def model(self, model_id: str) -> dict[str, Any]:
        return dict(self._json("GET", f"/models/{model_id}"))

    # ------------------------------------------------------------------ jobs
    def jobs(self, client: str | None = None) -> list[dict[str, Any]]:
        return list(self._json("GET", "/jobs", params={"client": client} if client else None))

    def job(self, task_id: int) -> dict[str, Any]:
        return dict(self._json("GET", f"/jobs/{task_id}"))

    def open_shards(self, model_id: str, miner: str, limit: int = 20) -> list[dict[str, Any]]:
        return list(self._json("GET", "/shards/open",
                               params={"modelId": model_id, "miner": miner, "limit": limit}))

    def offer(self, client: LocalAccount, task_id: int, miner: str) -> None:
        """Offer task `task_id` (whose client is `client`) to `miner` alone: until the task's
        deadline the market shows and recommends its shards to no other miner. A later offer
        replaces an earlier one. The market only recommends: the contract lets any eligible
        miner claim, so this directs honest miners, it does not bind them."""
        timestamp = int(time.time())
        self._json("POST", f"/tasks/{int(task_id)}/offer", json={
            "miner": miner, "timestamp": timestamp,
            "signature": _sign(client, offer_message(task_id, miner, timestamp))})

    # ------------------------------------------------------------------ committee
    def post_message(self, msg: dict[str, Any]) -> int:
        """Relay a signed committee message (see `committee_message`); returns its id. An
        identical repost returns the first id; another message under the same (author, kind,
        epoch, topic) is refused (MarketError, status 409)."""
        return int(self._json("POST", "/committee/messages", json=msg)["id"])

    def messages(self, reader: LocalAccount, *, epoch: int | None = None,
                 kind: str | None = None, topic: str | None = None, after_id: int = 0,
                 ) -> list[dict[str, Any]]:
        """The committee's messages with an id above `after_id` (filtered by epoch, kind and
        topic when given), ascending by id, each with `id` and `receivedAt`. `reader` must be
        a verifier with a VerifierCommittee record (seated, joining or leaving). Fetched page
        by page, so this returns all of them."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": MESSAGE_PAGE}
        for key, value in (("epoch", epoch), ("kind", kind), ("topic", topic)):
            if value is not None:
                params[key] = value
        while True:
            page = list(self._json("GET", "/committee/messages",
                                   params={**params, "afterId": after_id},
                                   headers=reader_headers(reader)))
            out += page
            if len(page) < MESSAGE_PAGE:
                return out
            after_id = int(page[-1]["id"])

    # ------------------------------------------------------------------ miners
    def heartbeat(self, account: LocalAccount, status: dict[str, Any]) -> None:
        timestamp = int(time.time())
        signature = _sign(account, heartbeat_message(account.address, timestamp, status))
        self._json("POST", "/miners/heartbeat", json={
            "miner": account.address, "timestamp": timestamp, "status": status,
            "signature": signature})

    def miners(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/miners"))
