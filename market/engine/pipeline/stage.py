"""One pipeline stage as its own process: `python -m market.engine.pipeline.stage`.

    python -m market.engine.pipeline.stage --model DIR --layers A:B \
        --listen tcp://0.0.0.0:5555 [--curve-secret-file F --allow-file G] \
        [--slowdown X] [--link-latency-ms D] [--tamper SCALE] [--next tcp://H:P] [--threads 1]

The stage checks the model directory against its manifest (when it has one), loads only
layers [A, B) (plus the embedding on the first stage, final norm + lm_head on the last),
binds a PULL socket on `--listen` and waits for a driver (`PipelineEngine`) to say hello on
it. The hello names the stage's index, where results and heartbeats go, and the injected
link latency. Every data message carries its route (endpoint, CURVE key and layer range of
each hop, the driver picks it per microbatch): the stage runs its hop's layers (a sub-range
of its own is allowed) and forwards to the next hop, or, at the route's end, sends the
tokens to the driver. `--next` overrides the next hop (a fixed chain behind NAT).

With `--curve-secret-file` the PULL socket is a CURVE server: only client keys listed in
`--allow-file` (one z85 key per line, re-read when it changes) may connect, and the stage
connects to the next hop and the driver as a CURVE client with the same key. Emulation and
test knobs: `--slowdown X` sleeps (X - 1) times each forward's compute time (a slower GPU),
`--link-latency-ms` fixes this stage's outgoing latency (a slower link), `--tamper SCALE`
adds Gaussian noise of that scale to the hidden states it sends on (a cheating member).

Per microbatch id the stage keeps a `DecodeCache` of its hop's layers (preallocated K/V and
the masks, built once from the left-padding) and each row's next position; both are created
at prefill, shrunk when the driver drops finished rows, and freed by a `free` message.
The last stage turns hidden states into the next token with
`market.engine.sampling.select_next` and sends only token ids + logprobs back to the driver.

Messages (see wire.py): prefill, decode, score, free, latency flow along the route; hello,
shutdown, release, drop (forget a microbatch being restarted elsewhere) come straight from
the driver; ready, hb, error go straight to the driver.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from market.engine.decode import DecodeCache
from market.engine.pipeline import wire
from market.engine.pipeline.auth import CurveServer, curve_client, read_secret_file
from market.engine.pipeline.delay import DelayedSender
from market.engine.pipeline.errors import PipelineError
from market.engine.pipeline.parts import (
    StageModel,
    mask_from_lengths,
    parse_layers,
    positions_from_mask,
)
from market.engine.threads import set_threads
from market.errors import QuarryError

HEARTBEAT_S = 0.25
ANNOUNCE_LINGER_MS = 30_000
"""How long a locally spawned stage's announcement stays queued for the engine's connection
(zmq's linger: sent once the connection exists, dropped after this)."""


@dataclass
class MicrobatchState:
    """What a stage remembers about one in-flight microbatch."""

    cache: DecodeCache  # the hop's layers' K/V and the microbatch's masks
    next_pos: torch.Tensor  # [B] each row's position id for its next token
    requests: list[Any] = field(default_factory=list)  # last hop: for select_next
    generators: list[Any] = field(default_factory=list)
    layers: tuple[int, int] = (0, 0)  # the hop's layers, fixed for the microbatch's life


class _Control:
    """A lock-guarded PUSH socket to the driver (main thread and heartbeat thread share it)."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, curve: tuple[str | None, str | None] = (None, None)
    ) -> None:
        self._lock = threading.Lock()
        self._sock = ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 1000)
        curve_client(self._sock, *curve)
        self._sock.connect(endpoint)
        self.endpoint = endpoint

    def send(self, header: dict[str, Any]) -> None:
        with self._lock:
            if self._sock.closed:
                return  # released while the heartbeat thread held a reference
            try:
                self._sock.send_multipart(wire.encode(header), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # driver gone or slow; heartbeats are best effort

    def close(self, linger_ms: int = 0) -> None:
        """Close at once; with `linger_ms` > 0, zmq's I/O thread keeps sending the queued
        messages for up to that long (terminating the context waits for them)."""
        with self._lock:
            self._sock.close(linger=linger_ms)


class StageServer:
    def __init__(
        self,
        model_dir: str,
        start: int,
        end: int,
        listen: str,
        *,
        next_override: str | None = None,
        announce: str | None = None,
        parent_pid: int | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_implementation: str = "sdpa",
        curve_secret: str | None = None,
        allow_file: str | None = None,
        slowdown: float = 1.0,
        link_latency_ms: float | None = None,
        tamper: float = 0.0,
    ) -> None:
        if slowdown < 1:
            raise PipelineError(f"slowdown must be >= 1, got {slowdown}")
        if link_latency_ms is not None and not 0 <= link_latency_ms < 60_000:
            raise PipelineError(f"link latency must be in [0, 60000) ms, got {link_latency_ms}")
        if tamper < 0:
            raise PipelineError(f"tamper scale must be >= 0, got {tamper}")
        if curve_secret is not None and allow_file is None:
            raise PipelineError("a CURVE stage needs an allow file (the keys it accepts)")
        self.slowdown = float(slowdown)
        self.fixed_latency_s = None if link_latency_ms is None else link_latency_ms / 1000.0
        self.tamper = float(tamper)
        self._noise = torch.Generator().manual_seed(0x5EED)
        self.curve_secret = curve_secret
        self.ctx: zmq.Context = zmq.Context.instance()
        self.curve: CurveServer | None = None
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        if curve_secret is not None:
            self.curve = CurveServer(self.ctx, curve_secret, allow_file=allow_file)
            self.curve.secure(self.pull)
        self.pull.bind(listen)
        self.listen = self.pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.next_override = next_override
        self.parent_pid = parent_pid
        self.model = StageModel(
            model_dir,
            start,
            end,
            device=device,
            dtype=dtype,
            attn_implementation=attn_implementation,
        )
        self.states: dict[int, MicrobatchState] = {}
        self.dropped: set[int] = set()  # microbatches the driver restarted elsewhere
        self.senders: dict[str, DelayedSender] = {}  # next hop endpoint -> its sender
        self.delay_s = 0.0
        self.ret = ""  # the driver's result endpoint
        self.driver_key: str | None = None
        self.control: _Control | None = None
        self.session = ""
        self.stage = -1
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        if announce:
            # Locally spawned: tell the parent where we listen (the port may have been '*').
            ctl = _Control(self.ctx, announce)
            ctl.send({"t": "announce", "listen": self.listen, "pid": os.getpid()})
            # Wait for it to go out: the engine waits for nothing else, and a connection
            # still being made when a 0-linger close dropped it (a loaded machine starting
            # four stages at once) left a stage "not started" for good.
            ctl.close(linger_ms=ANNOUNCE_LINGER_MS)

    # -- lifecycle ----------------------------------------------------------------------
    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        try:
            while True:
                if self.parent_pid and os.getppid() != self.parent_pid:
                    return  # the engine that started us is gone: do not linger as an orphan
                if not poller.poll(200):
                    continue
                frames = self.pull.recv_multipart(copy=False)
                header: dict[str, Any] = {}
                kind: Any = None
                try:
                    header, tensors = wire.decode(frames)
                    kind = header.get("t")
                    if kind == "shutdown":
                        return
                    self.handle(kind, header, tensors)
                except Exception as exc:  # report, keep serving: the driver decides
                    self._report_error(kind, header, exc)
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self._hb_stop.set()
        self._close_senders()
        if self.control is not None:
            self.control.close()
        self.pull.close(linger=0)
        if self.curve is not None:
            self.curve.close()

    def _close_senders(self) -> None:
        for sender in self.senders.values():
            sender.close(flush_s=0.0)
        self.senders = {}

    def _report_error(self, kind: Any, header: dict[str, Any], exc: Exception) -> None:
        msg = f"{type(exc).__name__}: {exc} (while handling {kind!r} mb={header.get('mb')})"
        print(f"stage {self.stage}: {msg}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if self.control is not None:
            self.control.send({"t": "error", "stage": self.stage, "s": self.session, "msg": msg})

    def _heartbeat(self) -> None:
        while not self._hb_stop.wait(HEARTBEAT_S):
            if self.parent_pid and os.getppid() != self.parent_pid:
                os._exit(0)  # main thread may be mid-compute; a watchdog must not wait for it
            ctl = self.control
            if ctl is not None:
                ctl.send({"t": "hb", "stage": self.stage, "s": self.session})

    # -- dispatch -----------------------------------------------------------------------
    def handle(self, kind: Any, h: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        if kind == "hello":
            self._hello(h)
        elif kind == "release":  # the driver is done with us; wait for the next hello
            if h.get("s", self.session) == self.session:  # not a driver we already left
                self._release()
        elif kind == "prefill":
            self._prefill(h, tensors)
        elif kind == "decode":
            self._decode(h, tensors)
        elif kind == "score":
            self._score(h, tensors)
        elif kind == "free":
            self.states.pop(int(h["mb"]), None)
            if not self._last_hop(h):
                self._forward(h, [])
        elif kind == "drop":
            mb = int(h["mb"])
            self.states.pop(mb, None)
            self.dropped.add(mb)
        elif kind == "latency":  # in-band, so it takes effect in order with the data
            if self.fixed_latency_s is None:
                self.delay_s = max(0.0, float(h["latency_ms"]) / 1000.0)
                for sender in self.senders.values():
                    sender.delay_s = self.delay_s
            if self._last_hop(h):
                h = {"t": "result", "kind": "latency", "mb": h["mb"], "s": h["s"], "times": []}
            self._forward(h, [])
        else:
            raise PipelineError(f"unknown message type {kind!r}")

    def _release(self) -> None:
        self.states.clear()
        self.dropped.clear()
        self._close_senders()
        if self.control is not None:
            ctl, self.control = self.control, None
            ctl.close()

    def _hello(self, h: dict[str, Any]) -> None:
        self._release()
        self.session = str(h["s"])
        self.stage = int(h["stage"])
        self.driver_key = h.get("driver_key")
        if (self.driver_key is None) != (self.curve_secret is None):
            raise PipelineError(
                "driver and stage disagree on CURVE: both need keys, or neither"
            )
        self.control = _Control(self.ctx, h["driver"], (self.curve_secret, self.driver_key))
        self.ret = str(h["ret"])
        self.delay_s = (
            self.fixed_latency_s
            if self.fixed_latency_s is not None
            else max(0.0, float(h["latency_ms"]) / 1000.0)
        )
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeat, daemon=True, name="hb")
            self._hb_thread.start()
        spec = self.model.spec
        self.control.send(
            {
                "t": "ready",
                "stage": self.stage,
                "s": self.session,
                "start": spec.start,
                "end": spec.end,
                "num_layers": spec.num_layers,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "threads": torch.get_num_threads(),
                "slowdown": self.slowdown,
                "curve": self.curve is not None,
            }
        )

    # -- routing -------------------------------------------------------------------------
    @staticmethod
    def _last_hop(h: dict[str, Any]) -> bool:
        return int(h["hop"]) + 1 >= len(h["route"])

    def _hop_layers(self, h: dict[str, Any]) -> tuple[int, int]:
        """The layers this hop runs: a sub-range of the stage's own, as the route says."""
        _, _, a, b = h["route"][int(h["hop"])]
        spec = self.model.spec
        if not spec.start <= a < b <= spec.end:
            raise PipelineError(
                f"route asks for layers {a}:{b}, this stage holds {spec.start}:{spec.end}"
            )
        if a == 0 and not spec.first:
            raise PipelineError("route starts at layer 0 on a stage without the embedding")
        return int(a), int(b)

    def _send_to(self, endpoint: str, key: str | None, frames: list[Any]) -> None:
        if self.control is None:
            raise PipelineError("no hello yet")
        if self.curve_secret is not None and key is None:
            raise PipelineError(f"next hop {endpoint} has no CURVE key; this stage needs one")
        sender = self.senders.get(endpoint)
        if sender is None:
            sender = DelayedSender(
                self.ctx, endpoint, self.delay_s, "next", curve=(self.curve_secret, key)
            )
            self.senders[endpoint] = sender
        sender.send(frames)

    def _forward(self, h: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        """To the route's next hop, or (a result, or the route's end) to the driver."""
        if h.get("t") == "result" or self._last_hop(h):
            h.pop("route", None)
            self._send_to(self.ret, self.driver_key, wire.encode(h, tensors))
            return
        hop = int(h["hop"]) + 1
        endpoint, key = h["route"][hop][0], h["route"][hop][1]
        if self.next_override:
            endpoint = self.next_override
        h["hop"] = hop
        self._send_to(endpoint, key, wire.encode(h, tensors))

    # -- compute ------------------------------------------------------------------------
    def _finish(self, t0: float, out: torch.Tensor) -> torch.Tensor:
        """After a forward: emulate a slower GPU, and (a cheating member) tamper."""
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * (time.perf_counter() - t0))
        if self.tamper > 0:
            noise = torch.randn(out.shape, generator=self._noise, dtype=torch.float32)
            out = out + (self.tamper * noise).to(dtype=out.dtype, device=out.device)
        return out

    def _run(self, h: dict[str, Any], out: torch.Tensor, st: MicrobatchState | None, t0: float):
        """After the layers ran: forward hidden states, or (last hop) pick the next tokens."""
        out = self._finish(t0, out)
        if not self._last_hop(h):
            h["times"].append(time.perf_counter() - t0)
            self._forward(h, [out])
            return
        assert st is not None
        from market.engine.sampling import select_next

        logits = self.model.logits(out[:, -1, :])
        tokens, logprobs = select_next(logits, st.requests, st.generators)
        h["times"].append(time.perf_counter() - t0)
        result = {"t": "result", "kind": h["t"], "mb": h["mb"], "s": h["s"], "times": h["times"]}
        result["sent"] = h.get("sent")
        self._forward(
            result,
            [torch.as_tensor(tokens, dtype=torch.long), torch.as_tensor(logprobs).float()],
        )

    def _prefill(self, h: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        t0 = time.perf_counter()
        (x,) = tensors
        layers = self._hop_layers(h)
        width = int(x.shape[1])
        mask = mask_from_lengths(h["lens"], width)
        positions = positions_from_mask(mask, width)
        room = width + max((int(p[3]) for p in h.get("sp") or ()), default=0)
        st = MicrobatchState(cache=self.model.new_cache(mask, layers, room),
                             next_pos=positions[:, -1] + 1, layers=layers)
        if self._last_hop(h):
            st.requests, st.generators = _sampling_state(h["sp"])
        self.states[int(h["mb"])] = st
        out = self.model(x, positions, st.cache, layers)
        self._run(h, out, st, t0)

    def _decode(self, h: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        t0 = time.perf_counter()
        (x,) = tensors
        mb = int(h["mb"])
        st = self.states.get(mb)
        if st is None:
            if mb in self.dropped:
                return  # restarted elsewhere after a stage on its route was lost
            raise PipelineError(f"decode for unknown microbatch {h['mb']}")
        keep = h.get("keep")
        if keep is not None:  # rows that finished since the last step leave the cache
            idx = torch.tensor(keep, dtype=torch.long)
            st.cache.select(idx)
            st.next_pos = st.next_pos[idx]
            st.requests = [st.requests[i] for i in keep] if st.requests else []
            st.generators = [st.generators[i] for i in keep] if st.generators else []
        if int(x.shape[0]) != int(st.next_pos.shape[0]):
            raise PipelineError(
                f"decode for mb {h['mb']}: {x.shape[0]} rows, cache has {st.next_pos.shape[0]}"
            )
        out = self.model(x, st.next_pos.unsqueeze(1), st.cache, st.layers)
        st.next_pos = st.next_pos + 1
        self._run(h, out, st, t0)

    def _score(self, h: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        """Teacher-forced pass, no cache: the last hop returns each output token's logprob."""
        t0 = time.perf_counter()
        (x,) = tensors
        layers = self._hop_layers(h)
        width = int(x.shape[1])
        mask = mask_from_lengths(h["lens"], width)
        out = self.model.score(x, mask, layers)
        out = self._finish(t0, out)
        if not self._last_hop(h):
            h["times"].append(time.perf_counter() - t0)
            self._forward(h, [out])
            return
        lps, amax = [], []
        for i, targets in enumerate(h["targets"]):
            n = len(targets)
            if n == 0:
                continue
            # Output token j sits at column width-n+j and is predicted by column width-n+j-1.
            logp = torch.log_softmax(self.model.logits(out[i, width - n - 1 : width - 1, :]), -1)
            tgt = torch.tensor(targets, dtype=torch.long)
            lps.append(logp.gather(1, tgt.unsqueeze(1)).squeeze(1))
            amax.append(logp.argmax(-1))
        h["times"].append(time.perf_counter() - t0)
        result = {"t": "result", "kind": "score", "mb": h["mb"], "s": h["s"], "times": h["times"]}
        flat_lp = torch.cat(lps) if lps else torch.zeros(0)
        flat_am = torch.cat(amax) if amax else torch.zeros(0, dtype=torch.long)
        self._forward(result, [flat_lp.float(), flat_am.long()])


def _sampling_state(params: list[list[Any]]) -> tuple[list[Any], list[Any]]:
    """Rebuild each row's request and its seeded generator, as the single-process engine does."""
    from market.engine.base import GenerationRequest
    from market.engine.sampling import make_generators

    requests = [
        GenerationRequest(
            prompt_ids=(),
            max_tokens=int(p[3]),
            temperature=float(p[0]),
            top_p=float(p[1]),
            seed=int(p[2]),
        )
        for p in params
    ]
    return requests, make_generators(requests)


def _verify_manifest(model_dir: str) -> None:
    """Check the directory's files against its manifest before serving any of them."""
    from pathlib import Path

    from market.model.manifest import load_manifest, manifest_path

    path = Path(model_dir)
    if manifest_path(path).is_file():
        load_manifest(path).verify(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m market.engine.pipeline.stage",
        description="Serve decoder layers A:B of a model as one pipeline stage.",
    )
    ap.add_argument("--model", required=True, help="HF-format model directory")
    ap.add_argument("--layers", required=True, help="half-open decoder layer range A:B")
    ap.add_argument("--listen", required=True, help="endpoint to bind, e.g. tcp://0.0.0.0:5555")
    ap.add_argument("--next", default=None, help="override where outputs go (default: driver says)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for this stage")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument(
        "--curve-secret-file",
        default=None,
        help="this member's CURVE secret key (z85); makes the listen socket a CURVE server",
    )
    ap.add_argument(
        "--allow-file", default=None, help="client CURVE public keys to accept, one per line"
    )
    ap.add_argument(
        "--slowdown", type=float, default=1.0, help="emulate a GPU X times slower (X >= 1)"
    )
    ap.add_argument(
        "--link-latency-ms",
        type=float,
        default=None,
        help="fixed one-way latency on this stage's outgoing links (default: the driver's)",
    )
    ap.add_argument("--tamper", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--no-verify", action="store_true", help="skip checking the model files' manifest"
    )
    ap.add_argument("--announce", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    set_threads(args.threads)
    try:
        start, end = parse_layers(args.layers)
        if not args.no_verify:
            _verify_manifest(args.model)
        secret = read_secret_file(args.curve_secret_file) if args.curve_secret_file else None
        server = StageServer(
            args.model,
            start,
            end,
            args.listen,
            next_override=args.next,
            announce=args.announce,
            parent_pid=args.parent_pid,
            device=args.device,
            dtype=getattr(torch, args.dtype),
            attn_implementation=args.attn_implementation,
            curve_secret=secret,
            allow_file=args.allow_file,
            slowdown=args.slowdown,
            link_latency_ms=args.link_latency_ms,
            tamper=args.tamper,
        )
    except (QuarryError, OSError, zmq.ZMQError) as exc:
        print(f"error: stage {args.layers}: {exc}", file=sys.stderr)
        return 2
    print(f"stage layers {start}:{end} listening on {server.listen}", file=sys.stderr, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
