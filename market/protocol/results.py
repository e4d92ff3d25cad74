"""Shard result documents: what a miner uploads for a shard and what a client checks.

A miner builds one `ShardResult` per shard (`build_shard_result`): for each request, the
exact output tokens and text, its activation commitment (`market.protocol.commitments`; empty
when the engine made none), one EIP-712 `Receipt` signed by the miner, and the receipt's
proof under the shard's result tree, a Merkle sum tree whose root hash and root sum are what
`submitResult` puts on-chain as `resultRoot` and `tokensUsed`. The document travels as
canonical JSON through the content-addressed store.

A client trusts nothing in it: `verify_shard_result` rechecks every item against the chain
(root, sum, miner, token counts) and the task's own inputs (request hashes), and raises
`ResultCheckFailed` naming the first check that fails. What passes is what Arbitration can
later prove on-chain: the same receipt under the same (resultRoot, tokensUsed).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_utils import encode_hex, to_checksum_address

from market import jsonsafe
from market.protocol.canonical import canonical_json_bytes
from market.protocol.commitments import commitment_hash
from market.protocol.eip712 import Receipt
from market.protocol.errors import MerkleError, ProtocolError, SignatureError
from market.protocol.merkle import SumNode, receipt_leaf, receipts_tree, verify_sum_proof
from market.protocol.requests import find_stop, output_hash

FORMAT = "quarry-shard-result/3"


class ResultFormatError(ProtocolError):
    """A result document that cannot be parsed."""


class ResultCheckFailed(ProtocolError):
    """A result that fails one named check (`check`), at request `index` when per item."""

    def __init__(self, check: str, message: str, *, index: int | None = None) -> None:
        self.check = check
        self.index = index
        self.detail = message  # the message without the check's name and request index
        where = f"request {index}: " if index is not None else ""
        super().__init__(f"{check} check failed: {where}{message}")



def _unhex(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ResultFormatError(f"{what} must be a 0x-prefixed hex string")
    try:
        return bytes.fromhex(value[2:])
    except ValueError as exc:
        raise ResultFormatError(f"{what} is not hex: {exc}") from exc


def _unbase64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ResultFormatError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ResultFormatError(f"{what} is not base64: {exc}") from exc


@dataclass(frozen=True)
class ResultItem:
    """One request's answer, with its activation commitment, signed receipt and proof.
    `commitment` is b"" when the engine made none (the receipt then signs the zero hash)."""

    index: int
    custom_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    receipt: Receipt
    signature: bytes
    proof: tuple[SumNode, ...]
    commitment: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "custom_id": self.custom_id,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "receipt": {k: encode_hex(v) if isinstance(v, bytes) else v
                        for k, v in self.receipt.message().items()},
            "signature": encode_hex(self.signature),
            "proof": [p.to_json() for p in self.proof],
            "commitment": base64.b64encode(self.commitment).decode("ascii"),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> ResultItem:
        try:
            return cls(
                index=int(d["index"]),
                custom_id=str(d["custom_id"]),
                text=str(d["text"]),
                token_ids=tuple(int(t) for t in d["token_ids"]),
                finish_reason=str(d["finish_reason"]),
                prompt_tokens=int(d["prompt_tokens"]),
                receipt=Receipt.from_message(d["receipt"]),
                signature=_unhex(d["signature"], f"{where}.signature"),
                proof=tuple(SumNode.from_json(p) for p in d["proof"]),
                commitment=_unbase64(d["commitment"], f"{where}.commitment"),
            )
        except (KeyError, TypeError, ValueError, SignatureError, MerkleError) as exc:
            raise ResultFormatError(f"{where}: malformed result item ({exc!r})") from exc


@dataclass(frozen=True)
class ShardResult:
    """Every output of one shard, as uploaded by its miner."""

    task_id: int
    shard: int
    miner: str
    model_id: bytes
    result_root: bytes
    tokens_used: int
    items: tuple[ResultItem, ...]

    def to_bytes(self) -> bytes:
        return canonical_json_bytes({
            "format": FORMAT,
            "taskId": self.task_id,
            "shard": self.shard,
            "miner": self.miner,
            "modelId": encode_hex(self.model_id),
            "resultRoot": encode_hex(self.result_root),
            "tokensUsed": self.tokens_used,
            "items": [item.to_json() for item in self.items],
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardResult:
        try:
            d = jsonsafe.loads(data, what="the result document")
        except (UnicodeDecodeError, json.JSONDecodeError, jsonsafe.JsonTooDeep) as exc:
            raise ResultFormatError(f"result document is not JSON: {exc}") from exc
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ResultFormatError(f"result document is not {FORMAT}")
        try:
            return cls(
                task_id=int(d["taskId"]),
                shard=int(d["shard"]),
                miner=to_checksum_address(d["miner"]),
                model_id=_unhex(d["modelId"], "modelId"),
                result_root=_unhex(d["resultRoot"], "resultRoot"),
                tokens_used=int(d["tokensUsed"]),
                items=tuple(ResultItem.from_json(it, f"items[{i}]")
                            for i, it in enumerate(d["items"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultFormatError(f"malformed result document ({exc!r})") from exc


@dataclass(frozen=True)
class Completion:
    """What the engine produced for one request, in the shape receipts need."""

    index: int  # the request's index in the whole task
    custom_id: str
    request_hash: bytes
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    commitment: bytes = b""  # the engine's activation commitment; b"" when it made none


def build_shard_result(
    *,
    task_id: int,
    shard: int,
    model_id: bytes,
    completions: Sequence[Completion],
    private_key: Any,
    miner: str,
    chain_id: int,
    task_registry: str,
) -> ShardResult:
    """Sign one receipt per completion, build the result tree, and attach each proof.

    `completions` must be the shard's requests in index order; `result_root` and
    `tokens_used` (the tree's root hash and root sum) go on-chain with `submitResult`. Each
    receipt signs `commitment_hash` of its completion's commitment, binding the activations
    into the result tree.
    """
    receipts = [
        Receipt(task_id, shard, c.index, c.request_hash, output_hash(c.text, c.token_ids),
                len(c.token_ids), model_id, commitment_hash(c.commitment))
        for c in completions
    ]
    tree = receipts_tree(receipts)
    items = tuple(
        ResultItem(
            index=c.index, custom_id=c.custom_id, text=c.text, token_ids=tuple(c.token_ids),
            finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens, receipt=r,
            signature=r.sign(private_key, chain_id, task_registry), proof=tuple(tree.proof(j)),
            commitment=c.commitment,
        )
        for j, (c, r) in enumerate(zip(completions, receipts, strict=True))
    )
    return ShardResult(task_id, shard, to_checksum_address(miner), model_id, tree.root,
                       tree.total, items)


def receipt_proven(receipt: Receipt, proof: Sequence[SumNode], *, result_root: bytes,
                   tokens_used: int, start: int, size: int) -> bool:
    """Whether `proof` proves `receipt` under a shard's on-chain commitment (`resultRoot`,
    `tokensUsed`) whose requests are `start .. start + size - 1`: what Arbitration checks
    before a dispute, an availability answer or a billing proof."""
    return verify_sum_proof(result_root, tokens_used, receipt.index - start, size,
                            receipt_leaf(receipt), proof)


def check_finish_reason(item: ResultItem, max_tokens: int,
                        stop_ids: frozenset[int] | None = None,
                        stop: Sequence[str] = ()) -> None:
    """Raise `ResultCheckFailed` ("finish reason") when `item.finish_reason` does not match
    its tokens: the engines stop at a stop token ("stop", the token kept as the last id), at
    a stop string of the request (`stop`: "stop", every id kept, the text cut before it), or
    after `max_tokens` tokens ("length"). `max_tokens` is the request's own cap (after the
    task's); `stop_ids`, when known (the model manifest's eos ids), are checked too.

    Without the tokenizer a client cannot decode the ids, so for stop strings it checks the
    text (it must hold none: it ends before the first) and lets "stop" end short of
    max_tokens without a stop token; that the ids do complete a stop string, and do not run
    past one, is the verifiers' check (`verifier.scoring`), which a dispute invokes."""
    ids, reason, i = item.token_ids, item.finish_reason, item.index
    if reason not in ("stop", "length"):
        raise ResultCheckFailed("finish reason", f"finish_reason {reason!r} is neither 'stop' "
                                "nor 'length'", index=i)
    if stop and find_stop(item.text, stop) is not None:
        found = min((s for s in stop if s in item.text), key=item.text.find)
        raise ResultCheckFailed("finish reason", f"the text contains the stop string "
                                f"{found!r} (it must end before the first)", index=i)
    ended = bool(ids) and (stop_ids is None or ids[-1] in stop_ids or (
        bool(stop) and reason == "stop"))
    if reason == "length" and len(ids) != max_tokens:
        raise ResultCheckFailed("finish reason", f"finish_reason 'length' after {len(ids)} of "
                                f"{max_tokens} tokens", index=i)
    if reason == "stop" and max_tokens > 0 and not ended:
        raise ResultCheckFailed("finish reason", "finish_reason 'stop' but the output does not "
                                "end with a stop token" + (" (and is empty)" if stop else ""),
                                index=i)
    if stop_ids is not None and any(t in stop_ids for t in ids[:-1]):
        raise ResultCheckFailed("finish reason", "a stop token before the end of the output",
                                index=i)
    if reason == "length" and stop_ids is not None and ids and ids[-1] in stop_ids:
        raise ResultCheckFailed("finish reason", "finish_reason 'length' but the output ends "
                                "with a stop token", index=i)


def verify_shard_result(
    result: ShardResult,
    *,
    task_id: int,
    shard: int,
    start: int,
    miner: str,
    model_id: bytes,
    result_root: bytes,
    tokens_used: int,
    request_hashes: Sequence[bytes],
    chain_id: int,
    task_registry: str,
    max_tokens_per_request: int | None = None,
    require_commitments: bool = False,
) -> list[ResultItem]:
    """Check a shard's document against the chain and the inputs; returns its items.

    `miner`, `result_root` and `tokens_used` come from the chain (`getShard`), `start` from
    `shardRange`, `max_tokens_per_request` and `require_commitments` from the task, and
    `request_hashes` are the hashes of the shard's own requests (indices `start .. start +
    len - 1`) from the client's batch. Checks, in order: header, coverage, then per item
    receipt fields, token count (against the output and the task's cap), output hash,
    commitment (the receipt signs its hash; present on every non-empty output when the task
    requires commitments), signature, Merkle proof (under the root hash and the root sum);
    finally billing. The first failure raises `ResultCheckFailed` naming it. Whether a
    commitment fits the model (its length, its values) is the verifiers' check: they know
    the model.
    """
    if (result.task_id, result.shard) != (task_id, shard):
        raise ResultCheckFailed(
            "header", f"document is for task {result.task_id} shard {result.shard}, "
            f"expected task {task_id} shard {shard}")
    indices = [item.index for item in result.items]
    expected = list(range(start, start + len(request_hashes)))
    if indices != expected:
        raise ResultCheckFailed(
            "coverage", f"document answers requests {indices[:5]}..., expected {start}.."
            f"{start + len(request_hashes) - 1} in order")
    want_miner = to_checksum_address(miner)
    for item, request_hash in zip(result.items, request_hashes, strict=True):
        r, i = item.receipt, item.index
        fields = {"taskId": (r.task_id, task_id), "shard": (r.shard, shard),
                  "index": (r.index, i), "requestHash": (r.request_hash, request_hash),
                  "modelId": (r.model_id, model_id)}
        for name, (got, want) in fields.items():
            if got != want:
                raise ResultCheckFailed("receipt", f"receipt.{name} does not match the task",
                                        index=i)
        if r.output_tokens > len(item.token_ids):  # billing fewer is the miner's loss only
            raise ResultCheckFailed(
                "token count", f"receipt bills {r.output_tokens} tokens, output has "
                f"{len(item.token_ids)}", index=i)
        if max_tokens_per_request is not None and r.output_tokens > max_tokens_per_request:
            raise ResultCheckFailed(
                "token count", f"receipt bills {r.output_tokens} tokens, over the task's "
                f"{max_tokens_per_request} per request", index=i)
        if r.output_hash != output_hash(item.text, item.token_ids):
            raise ResultCheckFailed("output hash", "output does not hash to the receipt's "
                                    "outputHash (altered text or tokens)", index=i)
        if r.commitment != commitment_hash(item.commitment):
            raise ResultCheckFailed("commitment", "the commitment does not hash to the "
                                    "receipt's commitment (altered or missing)", index=i)
        if require_commitments and item.token_ids and not item.commitment:
            raise ResultCheckFailed("commitment", "the task requires activation commitments "
                                    "and this output has none", index=i)
        try:
            signer = r.recover(item.signature, chain_id, task_registry)
        except SignatureError as exc:
            raise ResultCheckFailed("signature", str(exc), index=i) from exc
        if signer != want_miner:
            raise ResultCheckFailed(
                "signature", f"receipt signed by {signer}, not the shard's miner {want_miner}",
                index=i)
        if not receipt_proven(r, item.proof, result_root=result_root, tokens_used=tokens_used,
                              start=start, size=len(request_hashes)):
            raise ResultCheckFailed("merkle proof", "receipt is not under the shard's on-chain "
                                    "resultRoot and tokensUsed", index=i)
    billed = sum(item.receipt.output_tokens for item in result.items)
    if billed != tokens_used:
        raise ResultCheckFailed(
            "billing", f"shard billed {tokens_used} tokens on-chain, receipts add up to {billed}")
    return list(result.items)
