"""CURVE keys and client allow-lists for stage endpoints (ZeroMQ CURVE + a ZAP handler).

A swarm member's stage accepts hidden states only from the plan's members and the head's
driver. Each party's CURVE keypair is derived from its Ethereum key, so a member needs no
second secret to keep and the market binds the public key to the member's address when
the member publishes it in its signed join message.

Server side: `CurveServer` makes a bound socket a CURVE server and starts a ZAP
authenticator on the socket's context that admits only the public keys of an allow-list,
either a fixed set (the driver: its stages' keys) or a file of one z85 key per line,
re-read when its modification time or size changes (a member: the plan's keys, rewritten
on every re-plan). Client side: `curve_client` sets a connecting socket's keys.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from market.engine.pipeline.errors import PipelineError

CURVE_DOMAIN = "quarry-stage"
_KDF_PREFIX = b"quarry-stage-curve-v1"
Z85_KEY_LEN = 40


def stage_keypair(eth_private_key: bytes) -> tuple[str, str]:
    """(public_z85, secret_z85): a CURVE keypair derived deterministically from an Ethereum key.

    secret = sha256(b"quarry-stage-curve-v1" + key): any 32 bytes are a valid Curve25519
    secret, and hashing with a domain prefix keeps the Ethereum key itself off the wire.
    """
    if not isinstance(eth_private_key, bytes | bytearray) or len(eth_private_key) != 32:
        raise PipelineError("stage_keypair needs the 32-byte Ethereum private key")
    secret = zmq.utils.z85.encode(hashlib.sha256(_KDF_PREFIX + bytes(eth_private_key)).digest())
    return zmq.curve_public(secret).decode(), secret.decode()


def public_key(secret_z85: str) -> str:
    """The public z85 key of a secret z85 key (checks the secret's shape)."""
    check_key(secret_z85, "CURVE secret key")
    return zmq.curve_public(secret_z85.encode()).decode()


def check_key(key: str, what: str = "CURVE public key") -> str:
    """Return `key` if it is a 40-character z85 key, else raise naming it."""
    try:
        ok = len(key) == Z85_KEY_LEN and len(zmq.utils.z85.decode(key.encode())) == 32
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise PipelineError(f"{what} {key!r} is not a 40-character z85 key")
    return key


def read_secret_file(path: str | os.PathLike[str]) -> str:
    """The z85 secret key in `path` (first non-empty line), checked."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PipelineError(f"cannot read CURVE secret file {p}: {exc}") from exc
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise PipelineError(f"CURVE secret file {p} is empty")
    return check_key(lines[0], f"CURVE secret key in {p}")


def read_allow_file(path: str | os.PathLike[str]) -> frozenset[str]:
    """The z85 public keys listed in `path`, one per line (no comments: '#' is a z85 digit)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PipelineError(f"cannot read allow file {p}: {exc}") from exc
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if key:
            keys.append(check_key(key, f"{p}:{n}:"))
    return frozenset(keys)


def write_allow_file(path: str | os.PathLike[str], keys: Iterable[str]) -> Path:
    """Write the allow-list atomically (the stage may re-read it at any moment)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("".join(check_key(k) + "\n" for k in sorted(set(keys))))
    os.replace(tmp, p)
    return p


class _AllowList:
    """ZAP credentials provider: a fixed key set, or a file re-read when it changes."""

    def __init__(self, keys: Iterable[str] = (), path: str | os.PathLike[str] | None = None):
        self._fixed = frozenset(check_key(k) for k in keys)
        self._path = Path(path) if path is not None else None
        self._stamp: tuple[int, int] | None = None
        self._keys = self._fixed
        self._lock = threading.Lock()
        if self._path is not None:
            self._reload()

    def _reload(self) -> None:
        assert self._path is not None
        try:
            st = self._path.stat()
        except OSError:
            self._keys, self._stamp = self._fixed, None  # a removed file admits nobody extra
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._keys = self._fixed | read_allow_file(self._path)
            except PipelineError:
                return  # a half-written file: keep the last good list, retry next time
            self._stamp = stamp

    def allowed(self, key: str) -> bool:
        with self._lock:
            if self._path is not None:
                self._reload()
            return key in self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        return self.allowed(key.decode() if isinstance(key, bytes) else str(key))


class CurveServer:
    """Make `sock` (not yet bound) a CURVE server admitting only allow-listed client keys.

    Starts one ZAP authenticator thread per context; `close()` stops it.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        secret_z85: str,
        *,
        allow: Iterable[str] = (),
        allow_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.secret = check_key(secret_z85, "CURVE secret key")
        self.public = public_key(self.secret)
        self.allow = _AllowList(allow, allow_file)
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain=CURVE_DOMAIN, credentials_provider=self.allow)

    def secure(self, sock: Any) -> None:
        sock.setsockopt(zmq.ZAP_DOMAIN, CURVE_DOMAIN.encode())
        sock.curve_secretkey = self.secret.encode()
        sock.curve_publickey = self.public.encode()
        sock.curve_server = True

    def close(self) -> None:
        self._auth.stop()


def curve_client(sock: Any, secret_z85: str | None, server_public: str | None) -> None:
    """Set a connecting socket's CURVE keys; no-op when either side has no key (plain TCP).

    A keyed client talking to a keyless server (or the reverse) would never handshake, so
    the pairing is checked by the caller, which knows both sides.
    """
    if secret_z85 is None or server_public is None:
        return
    sock.curve_secretkey = secret_z85.encode()
    sock.curve_publickey = public_key(secret_z85).encode()
    sock.curve_serverkey = check_key(server_public, "server CURVE key").encode()
