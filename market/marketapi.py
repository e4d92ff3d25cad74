"""`MarketAPI`: the HTTP client of the market service, which miners, verifiers and clients
share. The endpoints and their schemas are the service's OpenAPI document (`/docs`,
`/openapi.json`); roles import this module, never the server package `market.service`.

The chain stays the source of truth: the market only stores bytes, indexes events and
recommends; a client or miner can check everything it says against the contracts.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount

from market import jsonsafe
from market.chain.deployment import Deployment
from market.errors import QuarryError
from market.protocol.messages import (
    heartbeat_message,
    offer_message,
    reader_headers,
    sign,
    swarm_join,
    swarm_registered_message,
)
from market.store import ContentNotFound, ContentTooLarge, check_content, parse_uri


class MarketError(QuarryError):
    """The market refused a request; the message carries its reason, `status` the HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class MarketUnavailable(MarketError):
    """No market answers at the configured URL."""


MESSAGE_PAGE = 500
"""How many committee messages `MarketAPI.messages` asks for per request."""
LIMITS_TTL_S = 60.0
"""How long `MarketAPI.limits` reuses the market's answer: the limits are its settings,
which change only with a restart, and an upload over a lowered limit is refused (413) and
reported with the limits read afresh."""


class MarketAPI:
    """A typed wrapper over the market's endpoints; every failure is a `MarketError`."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._limits: tuple[float, dict[str, int]] | None = None  # (read at, limits)

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

    def limits(self, fresh: bool = False) -> dict[str, int]:
        """The market's size limits (read at most every `LIMITS_TTL_S` unless `fresh`)."""
        now = time.monotonic()
        if fresh or self._limits is None or now - self._limits[0] > LIMITS_TTL_S:
            self._limits = (now, {k: int(v) for k, v in self._json("GET", "/limits").items()})
        return dict(self._limits[1])

    # ------------------------------------------------------------------ store
    def put(self, data: bytes) -> str:
        """Upload bytes; returns their `sha256:` address."""
        try:
            return str(self._json("POST", "/store", content=data,
                                  headers={"content-type": "application/octet-stream"})["uri"])
        except MarketError as exc:
            if exc.status == 413:
                limit = self.limits(fresh=True)["maxFileBytes"]
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

    def open_shards(self, model_id: str, miner: str, limit: int = 20, *,
                    wait_seconds: float = 0.0) -> list[dict[str, Any]]:
        """The open shards the market recommends to `miner` for a model, best first. With
        `wait_seconds` > 0 (a long poll) a market with none holds the answer up to that long
        and answers as soon as one opens; an older market ignores it and answers at once."""
        if wait_seconds < 0:
            raise QuarryError(f"wait_seconds must be >= 0, got {wait_seconds}")
        params: dict[str, Any] = {"modelId": model_id, "miner": miner, "limit": limit}
        kwargs: dict[str, Any] = {}
        if wait_seconds > 0:
            params["waitSeconds"] = wait_seconds
            kwargs["timeout"] = (self._http.timeout.read or 30.0) + wait_seconds
        return list(self._json("GET", "/shards/open", params=params, **kwargs))

    def offer(self, client: LocalAccount, task_id: int, miner: str) -> None:
        """Offer task `task_id` (whose client is `client`) to `miner` alone: until the task's
        deadline the market shows and recommends its shards to no other miner. A later offer
        replaces an earlier one. The market only recommends: the contract lets any eligible
        miner claim, so this directs honest miners, it does not bind them."""
        timestamp = int(time.time())
        self._json("POST", f"/tasks/{int(task_id)}/offer", json={
            "miner": miner, "timestamp": timestamp,
            "signature": sign(client, offer_message(task_id, miner, timestamp))})

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
        signature = sign(account, heartbeat_message(account.address, timestamp, status))
        self._json("POST", "/miners/heartbeat", json={
            "miner": account.address, "timestamp": timestamp, "status": status,
            "signature": signature})

    def miners(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/miners"))

    # ------------------------------------------------------------------ swarms
    def swarm_join(self, account: LocalAccount, model_id: str, *, memory_mib: int,
                   tflops: float, endpoint: str, public_key: str,
                   rtts: dict[str, float] | None = None,
                   price_per_token: int) -> dict[str, Any]:
        """Join the model's swarm, or stay in it: send this again well within the market's
        `ttl_s` (in the answer). Answers {miner, model_id, version, layers, ttl_s}: the
        current plan's version and the [start, end) this miner serves in it (None: standby,
        or no plan covers the model yet)."""
        body = swarm_join(account, model_id, memory_mib=memory_mib, tflops=tflops,
                          endpoint=endpoint, public_key=public_key, rtts=rtts,
                          price_per_token=price_per_token)
        return dict(self._json("POST", f"/swarms/{model_id}/members", json=body))

    def swarm_plan(self, model_id: str) -> dict[str, Any]:
        """The live plan of the model's swarm (see `GET /swarms/{model_id}/plan`); a member
        checks it (`market.scheduler.live.check_plan`) before loading its layers.
        MarketError 404: no members, 409: they cannot hold the model."""
        return dict(self._json("GET", f"/swarms/{model_id}/plan"))

    def swarm_consent(self, account: LocalAccount, model_id: str, version: int, nonce: int,
                      signature: bytes | str) -> dict[str, Any]:
        """Hand the market `account`'s EIP-712 SwarmConsent signature of plan `version`'s
        terms at its GPURegistry `nonce` (e.g. `gpu.sign_swarm_consent(
        swarm_terms_consent(plan["terms"]), account)` and `gpu.nonces(account.address)`)."""
        sig = signature if isinstance(signature, str) else "0x" + bytes(signature).hex()
        return dict(self._json("POST", f"/swarms/{model_id}/consents", json={
            "member": account.address, "version": int(version), "nonce": int(nonce),
            "signature": sig}))

    def swarm_consents(self, model_id: str, version: int | None = None) -> dict[str, Any]:
        """{version, signatures: {member: {nonce, signature}}, complete} of plan `version`
        (the latest by default)."""
        params = None if version is None else {"version": int(version)}
        return dict(self._json("GET", f"/swarms/{model_id}/consents", params=params))

    def swarm_registered(self, account: LocalAccount, model_id: str, version: int,
                         swarm_id: int) -> dict[str, Any]:
        """The head (`account`) reports plan `version` registered on-chain as `swarm_id`;
        the market checks GPURegistry.swarmInfo against the plan's terms before serving it."""
        timestamp = int(time.time())
        return dict(self._json("POST", f"/swarms/{model_id}/registered", json={
            "head": account.address, "version": int(version), "swarm_id": int(swarm_id),
            "timestamp": timestamp,
            "signature": sign(account, swarm_registered_message(
                account.address, model_id, version, swarm_id, timestamp))}))
