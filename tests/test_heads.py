"""`HeadFeed` on the devnet: heads pushed over Anvil's WebSocket as they are mined, the newest
of those that queued up, and polling where the node has no WebSocket or the connection
drops."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from market.chain import heads
from market.chain.client import Chain
from market.chain.heads import HeadFeed, ws_url_of

pytestmark = [pytest.mark.chain, pytest.mark.timeout(120)]


def test_ws_url_is_the_rpc_port() -> None:
    assert ws_url_of("http://127.0.0.1:8545") == "ws://127.0.0.1:8545"
    assert ws_url_of("https://node.example/v3/key") == "wss://node.example/v3/key"
    assert ws_url_of("ipc:///tmp/geth.ipc") is None


def test_heads_are_pushed_as_they_are_mined(devnet: Any) -> None:
    chain = devnet.chain
    with HeadFeed(chain) as feed:
        seen = chain.block_number()
        assert feed.next_head(seen, 0.01) == seen  # subscribes; nothing new yet
        assert feed.live and feed.pushed == 0
        timer = threading.Timer(0.2, chain.mine)
        timer.start()
        try:
            # Pushed: it returns with the block, long before the interval (polling would
            # return only after it, having read the same head).
            assert feed.next_head(seen, 60) == seen + 1
        finally:
            timer.join()
        assert feed.pushed == 1
        chain.mine(3)
        head = seen + 1
        while head < seen + 4:  # each call skips to the newest head that has come so far
            head = feed.next_head(head, 5)
        assert head == seen + 4 and feed.pushed == 4


def test_without_websocket_or_after_a_drop_it_polls(devnet: Any, rpc_front: Any) -> None:
    chain = devnet.chain
    with HeadFeed(Chain(rpc_front.url)) as plain:  # HTTP only: the upgrade is refused
        seen = chain.block_number()
        chain.mine()
        assert plain.next_head(seen, 0.01) == seen + 1
        assert not plain.live and plain.pushed == 0
    with HeadFeed(chain) as feed:
        seen = chain.block_number()
        feed.next_head(seen, 0.01)
        assert feed.live
        assert feed._ws is not None
        feed._ws.close()  # as when the node restarts
        chain.mine()
        assert feed.next_head(seen, 0.01) == seen + 1  # read, not pushed
        assert not feed.live and feed.pushed == 0


def test_while_pushed_an_idle_interval_reads_the_head_once_per_check(
        devnet: Any, rpc_front: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribed, an interval without a push reads the head only every `CHECK_S` (reads go
    through a counting front; pushes come from Anvil's WebSocket). `CHECK_S` is raised so
    that a slow machine cannot let it pass between the intervals."""
    monkeypatch.setattr(heads, "CHECK_S", 600.0)
    chain = devnet.chain
    with HeadFeed(Chain(rpc_front.url), ws_url_of(chain.rpc_url)) as feed:
        seen = chain.block_number()
        for _ in range(5):
            assert feed.next_head(seen, 0.01) == seen
        assert feed.live and rpc_front.singles == 1  # the first interval's read only
        chain.mine()
        assert feed.next_head(seen, 60) == seen + 1 and rpc_front.singles == 1  # pushed
