"""A sender that releases each message `delay_s` after it was queued, off the compute thread.

This is how `link_latency_ms` is injected: the stage's compute loop hands a finished message
to the queue and goes straight on to the next microbatch, while this thread holds the message
until `queued_at + delay` and then sends it, so latency overlaps with compute the way it does
on a real wide-area link (a blocking sleep in the compute loop would serialize them).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import zmq

from market.engine.pipeline.auth import curve_client


class DelayedSender:
    """Owns one PUSH socket; `send(frames)` returns at once, the frames leave after the delay.

    Messages keep their order (FIFO with monotonically increasing release times).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        delay_s: float,
        name: str,
        *,
        curve: tuple[str | None, str | None] = (None, None),
    ) -> None:
        """`curve` = (our secret z85, the peer's public z85): connect as a CURVE client."""
        self.endpoint = endpoint
        self._curve = curve
        self.delay_s = max(0.0, float(delay_s))
        self._ctx = ctx
        self._queue: collections.deque[tuple[float, list[Any]]] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"send-{name}", daemon=True)
        self._thread.start()

    def send(self, frames: list[Any]) -> None:
        if self.error is not None:
            raise RuntimeError(f"sender to {self.endpoint} failed: {self.error}")
        with self._cond:
            self._queue.append((time.monotonic() + self.delay_s, frames))
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, flush_s: float = 0.0) -> None:
        """Stop the thread; with `flush_s`, wait that long for queued messages to go out."""
        deadline = time.monotonic() + flush_s
        while flush_s and self.pending() and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop or block on a slow peer: the queue is ours
        try:
            curve_client(sock, *self._curve)
            sock.connect(self.endpoint)
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    release, frames = self._queue[0]
                    wait = release - time.monotonic()
                    if wait > 0:
                        self._cond.wait(timeout=wait)
                        continue
                    self._queue.popleft()
                sock.send_multipart(frames, copy=False)
        except BaseException as exc:  # reported to the owner on its next send
            self.error = exc
        finally:
            sock.close(linger=0)
