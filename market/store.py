"""The content-addressed store for request and result files.

A file's address is `sha256:<64 hex>` of its bytes, so the URI written on-chain (a task's
`inputURI`, a shard's `resultURI`) names the content, not a location: any market holding the
bytes can serve them, and a reader checks what it fetched against the address
(`check_content`). Backends implement `ContentStore`: a local directory, one file per
address (the default, `LocalStore`), or an S3-compatible bucket (`market.s3store.S3Store`,
for replicas on several hosts); `MarketSettings.open_store` picks one.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

from market.errors import QuarryError

URI_PREFIX = "sha256:"
_URI = re.compile(r"sha256:([0-9a-f]{64})")

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
"""The largest file the store accepts (a whole batch or one shard's results)."""
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024
"""The largest single request line a batch may hold (the prompt size limit)."""


class StoreError(QuarryError):
    """A bad address, a missing file, or content that does not match its address."""


class ContentTooLarge(StoreError):
    def __init__(self, size: int, limit: int, what: str = "file") -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"{what} is {size} bytes, over the store's limit of {limit} bytes")


class ContentNotFound(StoreError):
    pass


def content_uri(data: bytes) -> str:
    """The address of `data`: `sha256:<hex>`."""
    return URI_PREFIX + hashlib.sha256(data).hexdigest()


def parse_uri(uri: str) -> str:
    """The hex digest of a store URI; raises StoreError naming a malformed one."""
    m = _URI.fullmatch(uri or "")
    if not m:
        raise StoreError(f"{uri!r} is not a store address (expected sha256:<64 hex digits>)")
    return m.group(1)


def check_content(uri: str, data: bytes) -> bytes:
    """`data` if it hashes to `uri`; fetched bytes are never trusted otherwise."""
    if content_uri(data) != URI_PREFIX + parse_uri(uri):
        raise StoreError(f"content fetched for {uri} does not hash to that address")
    return data


@runtime_checkable
class ContentStore(Protocol):
    """What the market needs of a store: content in and out by address, checked."""

    max_file_bytes: int

    def put(self, data: bytes) -> str:
        """Store `data` (ContentTooLarge past `max_file_bytes`); its address."""
        ...

    def get(self, uri: str) -> bytes:
        """The bytes at `uri`, checked against it (ContentNotFound when absent)."""
        ...

    def has(self, uri: str) -> bool:
        ...

    def bytes_stored(self) -> int:
        """The bytes held (for the market's gauge)."""
        ...


class LocalStore:
    """Files under `root/ab/abcdef...`; writes are atomic, so a crash leaves no partial file."""

    def __init__(self, root: Path | str, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self._lock = threading.Lock()
        self._bytes: int | None = None  # bytes held, once counted (`bytes_stored`)

    def bytes_stored(self) -> int:
        """The bytes of every file held: the directory is walked once, then each new file
        adds its size, so asking costs the same however many files strangers uploaded."""
        with self._lock:
            if self._bytes is None:
                self._bytes = _content_bytes(self.root)
            return self._bytes

    def _path(self, uri: str) -> Path:
        digest = parse_uri(uri)
        return self.root / digest[:2] / digest

    def put(self, data: bytes) -> str:
        if len(data) > self.max_file_bytes:
            raise ContentTooLarge(len(data), self.max_file_bytes)
        uri = content_uri(data)
        path = self._path(uri)
        if path.exists():
            return uri
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            with self._lock:
                new = not path.exists()
                os.replace(tmp, path)
                if new and self._bytes is not None:
                    self._bytes += len(data)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return uri

    def get(self, uri: str) -> bytes:
        path = self._path(uri)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ContentNotFound(f"the store holds no {uri}") from None
        return check_content(uri, data)

    def has(self, uri: str) -> bool:
        return self._path(uri).exists()


def _content_bytes(root: Path) -> int:
    """The size of the content files under `root` (its `ab/` directories; 0 before any)."""
    total = 0
    for sub in root.glob("[0-9a-f][0-9a-f]"):
        for entry in os.scandir(sub):
            if entry.is_file() and not entry.name.startswith(".tmp-"):
                try:
                    total += entry.stat().st_size
                except OSError:
                    continue  # removed meanwhile
    return total
