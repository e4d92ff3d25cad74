"""Batch files in the OpenAI Batch shapes: request lines in, output lines out.

A client's batch is the JSONL file itself: its exact bytes are what goes to the store, and
each line's `requestHash` (canonical JSON of the parsed object) is what goes into the input
tree. Output lines follow the OpenAI Batch *output* shape, so tools that read OpenAI's
results read these, plus a `quarry` object with everything needed to re-verify a line (or
dispute it) without trusting whoever handed it over.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_utils import encode_hex

from market.protocol.eip712 import Receipt
from market.protocol.errors import RequestError
from market.protocol.merkle import SumNode
from market.protocol.requests import (
    CHAT_COMPLETIONS_URL,
    BatchError,
    ParsedRequest,
    RequestTooLarge,
    chat_lines,
    check_line_sizes,
    encode_jsonl,
    parse_jsonl,
    prompt_lines,
    request_line_sizes,
)
from market.store import ContentTooLarge

__all__ = [  # the request-line helpers live in market.protocol.requests (verifiers use them)
    "Batch", "BatchError", "Output", "RequestTooLarge", "chat_lines", "encode_jsonl",
    "output_line", "parse_batch", "prompt_lines", "read_batch", "write_output_lines",
]


@dataclass(frozen=True)
class Batch:
    """A validated batch: the exact bytes to upload, and each parsed request (in order)."""

    data: bytes
    requests: tuple[ParsedRequest, ...]
    line_sizes: tuple[int, ...] = field(repr=False)  # UTF-8 bytes of each request's line

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def request_hashes(self) -> list[bytes]:
        return [r.request_hash for r in self.requests]

    @property
    def max_tokens(self) -> int:
        """The task's `maxTokensPerRequest`: the largest `body.max_tokens` of any line."""
        return max(int(r.request["body"]["max_tokens"]) for r in self.requests)

    def check_sizes(self, limit: int) -> None:
        """Raise `RequestTooLarge` for the first line over `limit` bytes."""
        check_line_sizes(((r.line, size) for r, size in
                          zip(self.requests, self.line_sizes, strict=True)), limit)

    def models(self) -> dict[str, int]:
        """Each `body.model` named in the batch, with the first line that names it."""
        out: dict[str, int] = {}
        for r in self.requests:
            out.setdefault(str(r.request["body"]["model"]), r.line)
        return out


def parse_batch(data: bytes, source: str | None = None) -> Batch:
    """Validate a batch's bytes (errors name the line, and `source` when given)."""
    try:
        requests = parse_jsonl(data)
    except RequestError as exc:
        if source is None:
            raise
        named = RequestError(f"{source}: {exc}")
        named.line, named.field = exc.line, exc.field  # keep them for callers that look
        raise named from exc
    # request_line_sizes splits as parse_jsonl does, so sizes refer to the same lines.
    sizes = tuple(size for _, size in request_line_sizes(data))
    return Batch(data, tuple(requests), sizes)


def read_batch(path: str | Path, max_bytes: int | None = None) -> Batch:
    """A JSONL batch file, read once: its bytes are what gets uploaded and hashed.

    With `max_bytes` (the store's `maxFileBytes`), a larger file is refused from its size
    alone, before a byte is read or parsed, and the read itself stops one byte past the limit
    (a file still growing cannot slip through): a file the store would refuse costs neither
    the time nor the memory of parsing it.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if max_bytes is None:
                data = f.read()
            else:
                _check_file_size(os.fstat(f.fileno()).st_size, max_bytes, path)
                data = f.read(max_bytes + 1)
                _check_file_size(len(data), max_bytes, path)
    except OSError as exc:
        raise RequestError(f"cannot read batch file {path}: {exc.strerror}") from exc
    return parse_batch(data, str(path))


def _check_file_size(size: int, limit: int, path: Path) -> None:
    if size > limit:
        raise ContentTooLarge(size, limit, f"batch file {path}")


@dataclass(frozen=True)
class Output:
    """One verified answer: the text and tokens, and the signed evidence behind them."""

    task_id: int
    shard: int
    index: int
    custom_id: str
    url: str
    model: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    miner: str
    receipt: Receipt
    signature: bytes
    proof: tuple[SumNode, ...]  # the receipt's result-tree proof, leaf to root
    created: int  # chain time the shard's result was submitted
    result_uri: str
    chain_id: int
    task_registry: str

    @property
    def usage(self) -> dict[str, int]:
        completion = len(self.token_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}


def output_line(out: Output) -> dict[str, Any]:
    """The OpenAI Batch output line for one output, with a `quarry` proof object."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason}
    if out.url == CHAT_COMPLETIONS_URL:
        kind, prefix = "chat.completion", "chatcmpl"
        choice["message"] = {"role": "assistant", "content": out.text}
    else:
        kind, prefix = "text_completion", "cmpl"
        choice["text"] = out.text
        choice["logprobs"] = None
    body = {
        "id": f"{prefix}-{out.task_id}-{out.index}",
        "object": kind,
        "created": out.created,
        "model": out.model,
        "choices": [choice],
        "usage": out.usage,
    }
    receipt = {k: encode_hex(v) if isinstance(v, bytes) else v
               for k, v in out.receipt.message().items()}
    return {
        "id": f"batch_req_{out.task_id}_{out.index}",
        "custom_id": out.custom_id,
        "response": {"status_code": 200, "request_id": encode_hex(out.receipt.request_hash),
                     "body": body},
        "error": None,
        "quarry": {
            "taskId": out.task_id,
            "shard": out.shard,
            "index": out.index,
            "miner": out.miner,
            "tokenIds": list(out.token_ids),
            "receipt": receipt,
            "signature": encode_hex(out.signature),
            "proof": [p.to_json() for p in out.proof],
            "resultUri": out.result_uri,
            "chainId": out.chain_id,
            "taskRegistry": out.task_registry,
        },
    }


def write_output_lines(outputs: Sequence[Output], path: str | Path) -> Path:
    """Write OpenAI Batch output JSONL atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(encode_jsonl([output_line(o) for o in outputs]))
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BatchError(f"cannot write {path}: {exc.strerror}") from exc
    return path
