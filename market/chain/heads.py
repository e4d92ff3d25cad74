"""New blocks as the node pushes them, for the waits that follow the chain.

A wait that polls `eth_blockNumber` every `interval` hears of a block about `interval / 2`
after it is mined, on average. Over WebSocket the node pushes each new head as it is
mined (`eth_subscribe("newHeads")`), so `HeadFeed.next_head` returns at once. Anvil and a
Hardhat node serve WebSocket on their HTTP port; for a node that does not (or a dropped
connection), the feed sleeps the interval and reads the head, which is what the waits did
before. While pushes come, an interval without one reads the head only every `CHECK_S`
(so an idle wait makes about one request a second instead of one per interval), and a
push the node failed to send costs at most that.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

    from market.chain.client import Chain

log = logging.getLogger("quarry.heads")

OPEN_TIMEOUT_S = 2.0
RETRY_S = 5.0
"""After a failed or dropped connection, how long the feed polls before trying again."""
CHECK_S = 1.0
"""While heads are pushed, how often an interval without one still reads the head (a push
the node failed to send is then noticed within this, not lost)."""


def ws_url_of(rpc_url: str) -> str | None:
    """The WebSocket URL a node serving JSON-RPC over HTTP at `rpc_url` serves on the same
    port (Anvil, Hardhat), or None for another scheme."""
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if rpc_url.startswith(http):
            return ws + rpc_url[len(http):]
    return None


class HeadFeed:
    """The chain's new heads, pushed over WebSocket where the node can, else polled.

    One feed serves one waiting thread (a WebSocket's messages go to whoever reads first);
    `close` ends its subscription."""

    def __init__(self, chain: Chain, ws_url: str | None = None) -> None:
        self.chain = chain
        self.ws_url = ws_url or ws_url_of(chain.rpc_url)
        self._ws: ClientConnection | None = None
        self._retry_at = 0.0
        self._checked_at = 0.0  # when the head was last read while subscribed
        self.pushed = 0  # heads the node pushed (read by the tests and the benchmark)

    def __enter__(self) -> HeadFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def live(self) -> bool:
        """Whether heads are pushed (a subscription is open)."""
        return self._ws is not None

    def next_head(self, seen: int, interval: float) -> int:
        """The head once it is past block `seen` (as soon as the node pushes one), or after
        `interval` seconds without one, the head as read then (while subscribed, read only
        every `CHECK_S`: `seen` otherwise)."""
        ws = self._subscription()
        if ws is None:
            time.sleep(interval)
            return self.chain.block_number()
        deadline = time.monotonic() + interval
        head = seen
        try:
            while head <= seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                head = max(head, self._number(ws.recv(timeout=left)))
            while True:  # heads that queued up meanwhile: skip to the newest
                head = max(head, self._number(ws.recv(timeout=0)))
        except TimeoutError:
            pass
        except Exception as exc:  # closed or garbled: poll, and subscribe again later
            log.info("head subscription at %s dropped (%s); polling", self.ws_url, exc)
            self._drop()
        if head > seen:
            return head
        now = time.monotonic()
        if self._ws is not None and now - self._checked_at < CHECK_S:
            return seen
        self._checked_at = now
        return self.chain.block_number()

    def close(self) -> None:
        self._drop()
        self._retry_at = float("inf")

    def _number(self, message: Any) -> int:
        params = json.loads(message).get("params") or {}
        number = int(params["result"]["number"], 16)
        self.pushed += 1
        return number

    def _subscription(self) -> ClientConnection | None:
        if self._ws is not None or self.ws_url is None or time.monotonic() < self._retry_at:
            return self._ws
        from websockets.sync.client import connect

        try:
            ws = connect(self.ws_url, open_timeout=OPEN_TIMEOUT_S, compression=None,
                         max_size=2**20)
        except Exception as exc:  # no WebSocket there (refused, not upgraded, timed out)
            log.debug("no WebSocket at %s (%s): polling", self.ws_url, exc)
            self._retry_at = time.monotonic() + RETRY_S
            return None
        try:
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe",
                                "params": ["newHeads"]}))
            answer = json.loads(ws.recv(timeout=OPEN_TIMEOUT_S))
            if not answer.get("result"):
                raise ValueError(f"eth_subscribe answered {answer!r}")
        except Exception as exc:
            log.debug("no newHeads subscription at %s (%s): polling", self.ws_url, exc)
            ws.close()
            self._retry_at = time.monotonic() + RETRY_S
            return None
        self._ws = ws
        return ws

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        self._retry_at = time.monotonic() + RETRY_S
        if ws is not None:
            try:
                ws.close()
            except Exception:  # already gone
                pass
