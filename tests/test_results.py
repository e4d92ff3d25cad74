"""Result documents on their own (no chain): what a miner builds verifies, survives a round
trip through its bytes, and each tampering fails the check it should, naming it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from eth_account import Account

from market.protocol import keccak, output_hash
from market.protocol.commitments import ZERO_HASH, commitment_hash, expected_length
from market.protocol.eip712 import Receipt
from market.protocol.merkle import receipts_tree
from market.protocol.results import (
    FORMAT,
    Completion,
    ResultCheckFailed,
    ResultFormatError,
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


def verify(doc: ShardResult, *, root: bytes | None = None, tokens: int | None = None,
           require_commitments: bool = False) -> None:
    verify_shard_result(
        doc, task_id=7, shard=8, start=START, miner=MINER.address, model_id=MODEL,
        result_root=doc.result_root if root is None else root,
        tokens_used=doc.tokens_used if tokens is None else tokens,
        request_hashes=[c.request_hash for c in completions()], chain_id=CHAIN_ID,
        task_registry=REGISTRY, max_tokens_per_request=CAP,
        require_commitments=require_commitments)


def committed(empty: frozenset[int] = frozenset()) -> list[Completion]:
    """`completions()` with commitment bytes of the length a 64-wide model's would have
    (the bytes are the verifier's to check, not the client's), none for the `empty` ones."""
    return [dataclasses.replace(c, commitment=b"" if j in empty else bytes(
        (j + k) % 256 for k in range(expected_length(len(c.token_ids), 64))))
        for j, c in enumerate(completions())]


def build_committed(items: list[Completion]) -> ShardResult:
    return build_shard_result(task_id=7, shard=8, model_id=MODEL, completions=items,
                              private_key=MINER.key, miner=MINER.address, chain_id=CHAIN_ID,
                              task_registry=REGISTRY)


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


def test_commitments_are_signed_into_the_receipts_and_round_trip_as_base64() -> None:
    """Each receipt signs keccak256 of its output's commitment bytes (zero for none); the
    document carries the bytes as standard padded base64 ("" for none), format /3."""
    import base64
    import json

    items = committed(empty=frozenset({3}))
    doc = build_committed(items)
    assert FORMAT == "quarry-shard-result/3"
    for it, c in zip(doc.items, items, strict=True):
        assert it.commitment == c.commitment
        assert it.receipt.commitment == commitment_hash(c.commitment)
    assert doc.items[3].receipt.commitment == ZERO_HASH
    raw = json.loads(doc.to_bytes())
    assert raw["format"] == "quarry-shard-result/3"
    assert raw["items"][3]["commitment"] == ""
    assert raw["items"][0]["commitment"] == base64.b64encode(items[0].commitment).decode()
    assert raw["items"][0]["commitment"].endswith("=")  # 258 bytes: padded
    again = ShardResult.from_bytes(doc.to_bytes())
    assert again == doc
    verify(again)
    # commitments change the receipts, so the result root: they are bound into the tree
    assert doc.result_root != build().result_root


def test_an_altered_or_dropped_commitment_fails_the_commitment_check() -> None:
    doc = build_committed(committed())
    it = doc.items[1]
    for bad in (b"", it.commitment[:-2], bytes([it.commitment[0] ^ 1]) + it.commitment[1:]):
        altered = dataclasses.replace(doc, items=(doc.items[0], dataclasses.replace(
            it, commitment=bad), *doc.items[2:]))
        with pytest.raises(ResultCheckFailed) as info:
            verify(altered)
        assert (info.value.check, info.value.index) == ("commitment", START + 1)
    # a commitment added to an output whose receipt signed none fails alike
    plain = build()
    added = dataclasses.replace(plain, items=(dataclasses.replace(
        plain.items[0], commitment=b"\x01" * 258), *plain.items[1:]))
    with pytest.raises(ResultCheckFailed, match="commitment check failed: request 40"):
        verify(added)


def test_a_task_requiring_commitments_fails_an_output_without_one() -> None:
    """When the task requires commitments every non-empty output needs one; an empty output
    has no activations to commit to."""
    verify(build_committed(committed()), require_commitments=True)
    with pytest.raises(ResultCheckFailed) as info:
        verify(build_committed(committed(empty=frozenset({2}))), require_commitments=True)
    assert (info.value.check, info.value.index) == ("commitment", START + 2)
    assert "requires activation commitments" in info.value.detail
    with pytest.raises(ResultCheckFailed, match="commitment check failed: request 40"):
        verify(build(), require_commitments=True)
    verify(build())  # not required: an engine without commitments passes
    items = committed(empty=frozenset({0}))
    items[0] = dataclasses.replace(items[0], token_ids=(), finish_reason="length")
    doc = build_committed(items)
    verify_shard_result(
        doc, task_id=7, shard=8, start=START, miner=MINER.address, model_id=MODEL,
        result_root=doc.result_root, tokens_used=doc.tokens_used,
        request_hashes=[c.request_hash for c in completions()], chain_id=CHAIN_ID,
        task_registry=REGISTRY, require_commitments=True)


def test_an_older_format_or_a_bad_commitment_encoding_is_refused() -> None:
    import json

    raw = json.loads(build().to_bytes())
    with pytest.raises(ResultFormatError, match="not quarry-shard-result/3"):
        ShardResult.from_bytes(json.dumps({**raw, "format": "quarry-shard-result/2"}).encode())
    for bad in ("AQ", "not base64!", 7):
        raw["items"][0]["commitment"] = bad
        with pytest.raises(ResultFormatError, match=r"items\[0\]"):
            ShardResult.from_bytes(json.dumps(raw).encode())
    del raw["items"][0]["commitment"]
    with pytest.raises(ResultFormatError, match="malformed result item"):
        ShardResult.from_bytes(json.dumps(raw).encode())
