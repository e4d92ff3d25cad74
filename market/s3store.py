"""The content store in an S3-compatible bucket (AWS S3, MinIO, Ceph...), for a market whose
replicas run on several hosts and so cannot share one directory.

Content is addressed exactly as in the local directory (`sha256:<hex>` at key
`<prefix>/<ab>/<hex>`), and every read is checked against its address, so a bucket that
returns other bytes is caught like a corrupted file. boto3 is imported only when such a
store is opened (`pip install 'quarry[s3]'`); credentials come from boto3's usual chain
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws, an instance role), never from the
market's settings. Written against boto3's documented client API; this repository's tests
cannot run it against a real S3 server (none can be installed here), so it is untested.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from market.store import (
    ContentNotFound,
    ContentTooLarge,
    StoreError,
    check_content,
    content_uri,
    parse_uri,
)


class S3Store:
    """Content under `s3://bucket/prefix` (see the module doc)."""

    def __init__(self, url: str, max_file_bytes: int, *, endpoint_url: str | None = None,
                 ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise StoreError(f"{url!r} is not a bucket address (expected s3://bucket/prefix)")
        try:
            import boto3
        except ImportError as exc:
            raise StoreError(f"the store {url} needs boto3: pip install 'quarry[s3]'") from exc
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        self.max_file_bytes = max_file_bytes
        self._s3: Any = boto3.client("s3", endpoint_url=endpoint_url)
        self._lock = threading.Lock()
        self._bytes: int | None = None

    def _key(self, uri: str) -> str:
        digest = parse_uri(uri)
        return "/".join(p for p in (self.prefix, digest[:2], digest) if p)

    def put(self, data: bytes) -> str:
        if len(data) > self.max_file_bytes:
            raise ContentTooLarge(len(data), self.max_file_bytes)
        uri = content_uri(data)
        if self.has(uri):
            return uri
        self._s3.put_object(Bucket=self.bucket, Key=self._key(uri), Body=data)
        with self._lock:
            if self._bytes is not None:
                self._bytes += len(data)
        return uri

    def get(self, uri: str) -> bytes:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=self._key(uri))["Body"]
        except self._s3.exceptions.NoSuchKey:
            raise ContentNotFound(f"the store holds no {uri}") from None
        return check_content(uri, body.read())

    def has(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(uri))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def bytes_stored(self) -> int:
        """The bytes under the prefix: listed once, then each new object adds its size
        (this process's uploads only: other replicas' show at the next start)."""
        with self._lock:
            if self._bytes is None:
                pages = self._s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "")
                self._bytes = sum(o["Size"] for page in pages for o in page.get("Contents", ()))
            return self._bytes
