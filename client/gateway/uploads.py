"""`POST /v1/files` bodies, streamed to disk with python-multipart (FastAPI's form parser).

The body is never held whole: chunks are gathered up to `BATCH_BYTES` and fed to
python-multipart's push parser in a worker thread, which writes the `file` part straight
into a temporary file beside the gateway's files, so the event loop stays free for other
requests and memory stays at a chunk or two, whatever the upload's size. Limits apply while
the bytes arrive, not after: the file part past `max_file_bytes`, the whole body past that
plus `FORM_OVERHEAD_BYTES` (a chunked upload has no content-length to refuse up front), more
than `MAX_PARTS` parts, a text field over `MAX_FIELD_BYTES`. Anything refused is an
`UploadError` (OpenAI's status, message, param and code), and its temporary file is gone.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

MAX_PARTS = 8
"""The SDK sends two (`file`, `purpose`); a few more fields are tolerated and ignored."""
MAX_FIELD_BYTES = 1024
FORM_OVERHEAD_BYTES = 64 * 1024
"""What the form adds around the file: boundaries, part headers, the text fields."""
BATCH_BYTES = 256 * 1024
"""Chunks are handed to the parser's thread this many bytes at a time (one hop each)."""


class UploadError(Exception):
    """An upload refused: OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass
class Upload:
    """A parsed upload: its text fields and the file part, on disk at `path`."""

    fields: dict[str, str]
    filename: str
    path: Path
    size: int


def too_large(size: int, limit: int, so_far: bool = False) -> UploadError:
    what = "the upload (so far)" if so_far else "the upload"
    return UploadError(413, f"{what} is {size} bytes, over the limit of {limit}",
                       code="file_too_large")


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a `multipart/form-data` content type; UploadError else."""
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary or len(boundary) > 200:
        raise UploadError(400, "the upload must be multipart/form-data (with its boundary) "
                          "holding a 'file' and a 'purpose' field")
    return boundary


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str | None = None
    text: bytearray = field(default_factory=bytearray)


class FormSink:
    """python-multipart's callbacks: text fields in memory (bounded), the `file` part into
    a temporary file under `directory`. Not thread-safe; one thread at a time feeds it."""

    def __init__(self, boundary: bytes, directory: Path, max_file_bytes: int) -> None:
        self.directory, self.max_file_bytes = directory, max_file_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.size = 0
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._parts = 0
        self._part = _Part()
        self._header = (bytearray(), bytearray())
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._data,
            "on_part_end": self._end})

    def write(self, data: bytes) -> None:
        try:
            self._parser.write(data)
        except MultipartParseError as exc:
            raise UploadError(400, f"the multipart body cannot be parsed: {exc}") from None

    def finish(self) -> Upload:
        self._parser.finalize()
        if self._file is not None:  # the body ended inside the file part
            raise UploadError(400, "the multipart body ends before its closing boundary")
        if self.path is None or self.filename is None:
            raise UploadError(400, "file: missing (send the JSONL file as the 'file' field)",
                              param="file")
        return Upload(self.fields, self.filename, self.path, self.size)

    def discard(self) -> None:
        """Close and remove the temporary file (a refused or abandoned upload)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    # -- callbacks
    def _begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise UploadError(400, f"the upload has more than {MAX_PARTS} form parts")
        self._part = _Part()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header[0].extend(data[start:end])

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header[1].extend(data[start:end])

    def _header_end(self) -> None:
        name, value = self._header
        self._part.headers[bytes(name).lower()] = bytes(value)
        self._header = (bytearray(), bytearray())

    def _headers_finished(self) -> None:
        disposition, params = parse_options_header(
            self._part.headers.get(b"content-disposition", b""))
        name = params.get(b"name")
        if disposition != b"form-data" or name is None:
            raise UploadError(400, "a form part without a form-data name")
        self._part.name = name.decode("utf-8", errors="replace")
        if self._part.name != "file":
            return
        if self.path is not None:
            raise UploadError(400, "file: sent twice", param="file")
        filename = params.get(b"filename", b"upload.jsonl").decode("utf-8", errors="replace")
        self.filename = os.path.basename(filename.replace("\\", "/"))[:255] or "upload.jsonl"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".upload-")
        self.path, self._file = Path(tmp), os.fdopen(fd, "wb")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._part.name == "file":
            assert self._file is not None
            self.size += end - start
            if self.size > self.max_file_bytes:
                raise too_large(self.size, self.max_file_bytes, so_far=True)
            self._file.write(data[start:end])
            return
        if len(self._part.text) + end - start > MAX_FIELD_BYTES:
            raise UploadError(400, f"{self._part.name}: over {MAX_FIELD_BYTES} bytes",
                              param=self._part.name)
        self._part.text.extend(data[start:end])

    def _end(self) -> None:
        name = self._part.name
        if name == "file":
            assert self._file is not None
            self._file.close()
            self._file = None
        elif name is not None:
            self.fields[name] = self._part.text.decode("utf-8", errors="replace")


async def receive_upload(chunks: AsyncIterator[bytes], content_type: str,
                         directory: Path, max_file_bytes: int) -> Upload:
    """Stream a multipart body into a temporary file under `directory` (see the module doc).
    The caller owns the returned file (move or delete it)."""
    directory.mkdir(parents=True, exist_ok=True)
    sink = FormSink(boundary_of(content_type), directory, max_file_bytes)
    limit = max_file_bytes + FORM_OVERHEAD_BYTES
    received = 0
    pending: list[bytes] = []
    pending_bytes = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > limit:
                raise too_large(received, limit, so_far=True)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= BATCH_BYTES:
                await run_in_threadpool(sink.write, b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            await run_in_threadpool(sink.write, b"".join(pending))
        return await run_in_threadpool(sink.finish)
    except BaseException:
        await run_in_threadpool(sink.discard)
        raise
