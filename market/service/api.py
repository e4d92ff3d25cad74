"""`MarketAPI`: the HTTP client of the market service, which miners and clients share.

The endpoints (JSON unless noted; errors are `{"detail": "..."}` with a 4xx status):

    GET  /health                 {"ok", "chainId", "indexedBlock", "headBlock", "redis"}
    GET  /deployment             the deployment file's JSON (chain id, RPC URL, addresses)
    GET  /limits                 {"maxFileBytes", "maxRequestBytes"}
    POST /store                  raw bytes -> 201 {"uri", "size"}; 413 over the limit
    GET  /store/{uri}            raw bytes; 404 unknown
    POST /models                 a model manifest -> {"modelId", "name"}
    GET  /models                 [{"modelId", "name", "miners", "minPricePerToken"}]
    GET  /models/{modelId}       the manifest; 404 unknown
    GET  /jobs?client=0x..       [job summary]: the board, indexed from chain events
    GET  /jobs/{taskId}          the job with every shard (see `Board.job`)
    GET  /shards/open?modelId=&miner=&limit=   open shards, best first for that miner
    POST /miners/heartbeat       {"miner", "timestamp", "status", "signature"}
    GET  /miners                 [{"address", "endpoint", "models", "pricePerToken", "stake",
                                   "reputationBps", "lastSeen", "alive", "status"}]

The chain stays the source of truth: the market only stores bytes, indexes events and
recommends; a client or miner can check everything it says against the contracts.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

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


def recover_heartbeat(body: dict[str, Any]) -> str:
    """The address that signed a heartbeat body; raises MarketError on a malformed one."""
    try:
        message = heartbeat_message(body["miner"], int(body["timestamp"]), body["status"])
        return str(Account.recover_message(encode_defunct(message),
                                           signature=bytes.fromhex(
                                               body["signature"].removeprefix("0x"))))
    except Exception as exc:  # KeyError, ValueError, BadSignature...
        raise MarketError(f"malformed heartbeat: {exc}") from exc


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
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            if response.status_code == 404 and path.startswith("/store/"):
                raise ContentNotFound(f"market {self.url} holds no {path[7:]}")
            raise MarketError(f"market {method} {path} failed ({response.status_code}): "
                              f"{detail}", response.status_code)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

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

    # ------------------------------------------------------------------ miners
    def heartbeat(self, account: LocalAccount, status: dict[str, Any]) -> None:
        timestamp = int(time.time())
        message = heartbeat_message(account.address, timestamp, status)
        signature = account.sign_message(encode_defunct(message)).signature
        self._json("POST", "/miners/heartbeat", json={
            "miner": account.address, "timestamp": timestamp, "status": status,
            "signature": "0x" + bytes(signature).hex()})

    def miners(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/miners"))
