"""Result documents on their own (no chain): what a miner builds verifies, survives a round
trip through its bytes, and each tampering fails the check it should, naming it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from eth_account import Account

from market.protocol import keccak, output_hash
from market.protocol.eip712 import Receipt
from market.protocol.merkle import receipts_tree
from market.protocol.results import (
    Completion,
    ResultCheckFailed,
    ShardResult,
    build_shard_result,
    verify_shard_result,
)

CHAIN_ID, REGISTRY = 31337, "0x" + "ab" * 20
MINER = Account.from_key(b"\x01" * 32)
MODEL = keccak(b"model")
START, N, CAP = 40, 5, 8


def completions() -> list[Completion]:
    return [Completion(START + j, f"r{j}", keccak(b"req%d" % j), f"answer {j}",
                       tuple(range(1, 2 + j)), "stop", 3) for j in range(N)]


def build() -> ShardResult:
    return build_shard_result(task_id=7, shard=8, model_id=MODEL, completions=completions(),
                              private_key=MINER.key, miner=MINER.address, chain_id=CHAIN_ID,
                              task_registry=REGISTRY)


def verify(doc: ShardResult, *, root: bytes | None = None, tokens: int | None = None) -> None:
    verify_shard_result(
        doc, task_id=7, shard=8, start=START, miner=MINER.address, model_id=MODEL,
        result_root=doc.result_root if root is None else root,
        tokens_used=doc.tokens_used if tokens is None else tokens,
        request_hashes=[c.request_hash for c in completions()], chain_id=CHAIN_ID,
        task_registry=REGISTRY, max_tokens_per_request=CAP)


def resigned(doc: ShardResult, j: int, receipt: Receipt) -> ShardResult:
    """The document with item j's receipt replaced, re-signed and re-committed, as a miner
    that bills differently would publish it: only the billing rules can catch it."""
    receipts = [receipt if k == j else it.receipt for k, it in enumerate(doc.items)]
    tree = receipts_tree(receipts)
    items = tuple(dataclasses.replace(
        it, receipt=r, signature=r.sign(MINER.key, CHAIN_ID, REGISTRY),
        proof=tuple(tree.proof(k))) for k, (it, r) in enumerate(zip(doc.items, receipts,
                                                                     strict=True)))
    return dataclasses.replace(doc, items=items, result_root=tree.root,
                               tokens_used=tree.total)


def test_built_document_verifies_and_round_trips() -> None:
    doc = build()
    assert doc.tokens_used == sum(len(c.token_ids) for c in completions())
    verify(doc)
    again = ShardResult.from_bytes(doc.to_bytes())
    assert again == doc
    verify(again)


def test_a_total_that_is_not_the_receipts_sum_proves_nothing() -> None:
    doc = build()
    with pytest.raises(ResultCheckFailed, match="merkle proof check failed: request 40"):
        verify(doc, tokens=doc.tokens_used + 1)


def test_over_billing_fails_and_under_billing_is_the_miner_s_loss() -> None:
    doc = build()
    r = doc.items[2].receipt
    over = resigned(doc, 2, dataclasses.replace(r, output_tokens=r.output_tokens + 1))
    with pytest.raises(ResultCheckFailed) as info:
        verify(over)
    assert (info.value.check, info.value.index) == ("token count", START + 2)
    assert info.value.detail == "receipt bills 4 tokens, output has 3"
    verify(resigned(doc, 2, dataclasses.replace(r, output_tokens=r.output_tokens - 1)))


def test_over_the_task_cap_fails_even_when_the_output_has_the_tokens() -> None:
    many = tuple(range(CAP + 1))
    items = list(completions())
    items[1] = dataclasses.replace(items[1], token_ids=many)
    doc = build_shard_result(task_id=7, shard=8, model_id=MODEL, completions=items,
                             private_key=MINER.key, miner=MINER.address, chain_id=CHAIN_ID,
                             task_registry=REGISTRY)
    with pytest.raises(ResultCheckFailed, match=f"over the task's {CAP} per request"):
        verify(doc)


def test_tampered_output_and_foreign_signature_fail_by_name() -> None:
    doc = build()
    altered = dataclasses.replace(doc, items=(dataclasses.replace(doc.items[0], text="x"),
                                              *doc.items[1:]))
    with pytest.raises(ResultCheckFailed, match="output hash check failed"):
        verify(altered)
    stranger = Account.from_key(b"\x02" * 32)
    r = doc.items[0].receipt
    foreign = dataclasses.replace(doc, items=(dataclasses.replace(
        doc.items[0], signature=r.sign(stranger.key, CHAIN_ID, REGISTRY)), *doc.items[1:]))
    with pytest.raises(ResultCheckFailed, match="signature check failed"):
        verify(foreign)
    assert output_hash("answer 0", (1,)) == r.output_hash


def test_finish_reason_must_match_the_tokens() -> None:
    """"length" means max_tokens tokens, "stop" a final stop token (when the model's stop ids
    are known, from its manifest), nothing else; every lie names the check and request."""
    from market.model.manifest import Manifest
    from market.protocol.results import check_finish_reason

    item = build().items[1]
    stops = frozenset({2})

    def check(ids: tuple[int, ...], reason: str, cap: int, stop_ids: Any = stops) -> None:
        check_finish_reason(dataclasses.replace(item, token_ids=ids, finish_reason=reason),
                            cap, stop_ids)

    check((5, 6, 7), "length", 3)
    check((5, 2), "stop", 3)
    check((5, 6, 2), "stop", 3)  # a stop token at the last position is still "stop"
    check((5, 6), "stop", 3, None)  # stop ids unknown: only lengths are checked
    check((), "length", 0)
    for ids, reason, cap, message in [
        ((5, 6), "length", 3, "finish_reason 'length' after 2 of 3 tokens"),
        ((5, 6), "stop", 3, "does not end with a stop token"),
        ((), "stop", 3, "does not end with a stop token"),
        ((2, 6, 2), "stop", 3, "a stop token before the end"),
        ((5, 6, 2), "length", 3, "'length' but the output ends with a stop token"),
        ((5, 6, 7), "content_filter", 3, "neither 'stop' nor 'length'"),
    ]:
        with pytest.raises(ResultCheckFailed, match=message) as info:
            check(ids, reason, cap)
        assert info.value.check == "finish reason" and info.value.index == item.index

    arch = {"model_type": "llama", "eos_token_id": 2}
    assert Manifest("m", arch).stop_token_ids == frozenset({2})
    assert Manifest("m", {**arch, "eos_token_id": [2, 9]}).stop_token_ids == frozenset({2, 9})
    assert Manifest("m", {"model_type": "llama"}).stop_token_ids is None
