"""Client batch files and settings, without a chain: prompt lists into request lines, JSONL
reading and size checks, and the OpenAI Batch output line (re-verifiable from its own
fields). The [client] settings: tests/test_client_config.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_account import Account

from client.batch import (
    BatchError,
    Output,
    RequestTooLarge,
    chat_lines,
    encode_jsonl,
    output_line,
    parse_batch,
    prompt_lines,
    read_batch,
    write_output_lines,
)
from market.protocol.canonical import request_hash
from market.protocol.eip712 import Receipt
from market.protocol.errors import RequestError
from market.protocol.merkle import SumNode, input_tree
from market.protocol.requests import output_hash
from market.protocol.results import Completion, build_shard_result, receipt_proven
from market.store import ContentNotFound, content_uri

REGISTRY = "0x" + "ab" * 20
CHAIN_ID = 31337


def test_prompt_list_becomes_completion_lines() -> None:
    lines = prompt_lines(["Hello", "The sky is"], model="tiny", max_tokens=8, temperature=0.5,
                         seed=7)
    assert lines == [
        {"custom_id": "request-0", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "max_tokens": 8, "temperature": 0.5, "seed": 7,
                  "prompt": "Hello"}},
        {"custom_id": "request-1", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "max_tokens": 8, "temperature": 0.5, "seed": 7,
                  "prompt": "The sky is"}},
    ]
    batch = parse_batch(encode_jsonl(lines))
    assert len(batch) == 2 and batch.max_tokens == 8
    assert batch.request_hashes == [request_hash(line) for line in lines]
    assert [r.line for r in batch.requests] == [1, 2]
    assert batch.models() == {"tiny": 1}


def test_chat_lines_and_bad_prompt_lists() -> None:
    lines = chat_lines([[{"role": "user", "content": "hi"}]], model="tiny", max_tokens=4)
    assert lines[0]["url"] == "/v1/chat/completions"
    assert lines[0]["body"]["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(BatchError, match="not one string"):
        prompt_lines("Hello", model="tiny", max_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(BatchError, match="prompt 1 is a int"):
        prompt_lines(["a", 3], model="tiny", max_tokens=4)  # type: ignore[list-item]
    with pytest.raises(RequestError, match="body.max_tokens"):
        prompt_lines(["a"], model="tiny", max_tokens=0)
    with pytest.raises(BatchError, match="conversation 0"):
        chat_lines(["hi"], model="tiny", max_tokens=4)  # type: ignore[list-item]


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    good = encode_jsonl(prompt_lines(["a", "b"], model="tiny", max_tokens=4))
    path = tmp_path / "batch.jsonl"
    path.write_bytes(good + b"\n{not json\n")
    with pytest.raises(RequestError, match=r"batch\.jsonl: line 4: not valid JSON") as info:
        read_batch(path)
    assert info.value.line == 4
    with pytest.raises(RequestError, match="cannot read batch file"):
        read_batch(tmp_path / "missing.jsonl")
    ok = tmp_path / "ok.jsonl"
    ok.write_bytes(good)
    assert read_batch(ok).data == good  # the exact bytes, to upload as they are


def test_size_limit_counts_utf8_bytes_of_the_line() -> None:
    lines = prompt_lines(["short", "é" * 100], model="tiny", max_tokens=4)
    data = encode_jsonl(lines)
    batch = parse_batch(b"\n" + data)  # a blank first line: requests are on lines 2 and 3
    second = len(json.dumps(lines[1], ensure_ascii=False, separators=(",", ":")).encode())
    assert batch.line_sizes[1] == second
    batch.check_sizes(second)
    with pytest.raises(RequestTooLarge) as info:
        batch.check_sizes(second - 1)
    assert (info.value.line, info.value.size, info.value.limit) == (3, second, second - 1)
    assert f"line 3: request is {second} bytes" in str(info.value)


def _outputs(url: str) -> tuple[list[Output], bytes, int]:
    key = Account.create()
    lines = (prompt_lines(["x", "y"], model="tiny", max_tokens=4) if url == "/v1/completions"
             else chat_lines([[{"role": "user", "content": "x"}]] * 2, model="tiny",
                             max_tokens=4))
    for i, line in enumerate(lines):
        line["custom_id"] = f"c{i}"
    batch = parse_batch(encode_jsonl(lines))
    model_id = b"\x11" * 32
    completions = [Completion(i, f"c{i}", h, f"out {i}", (5, 6 + i), "length", 3)
                   for i, h in enumerate(batch.request_hashes)]
    doc = build_shard_result(task_id=9, shard=0, model_id=model_id, completions=completions,
                             private_key=key.key, miner=key.address, chain_id=CHAIN_ID,
                             task_registry=REGISTRY)
    outs = [Output(task_id=9, shard=0, index=it.index, custom_id=it.custom_id, url=url,
                   model="tiny", text=it.text, token_ids=it.token_ids,
                   finish_reason=it.finish_reason, prompt_tokens=it.prompt_tokens,
                   miner=key.address, receipt=it.receipt, signature=it.signature,
                   proof=it.proof, created=1234, result_uri="sha256:" + "0" * 64,
                   chain_id=CHAIN_ID, task_registry=REGISTRY)
            for it in doc.items]
    assert input_tree(batch.request_hashes).root  # the same hashes a task commits to
    return outs, doc.result_root, doc.tokens_used


def test_output_line_has_the_openai_batch_shape_and_reverifies() -> None:
    outs, root, tokens_used = _outputs("/v1/completions")
    line = output_line(outs[1])
    assert line["id"] == "batch_req_9_1" and line["custom_id"] == "c1"
    assert line["error"] is None
    response = line["response"]
    assert response["status_code"] == 200
    assert response["request_id"] == "0x" + outs[1].receipt.request_hash.hex()
    body = response["body"]
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["created"] == 1234
    assert body["choices"] == [{"index": 0, "text": "out 1", "finish_reason": "length",
                                "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

    # Anyone holding the line and the shard's on-chain commitment (resultRoot, tokensUsed)
    # can re-check it: hash, signature, sum-tree proof.
    quarry = json.loads(json.dumps(line))["quarry"]
    receipt = Receipt.from_message(quarry["receipt"])
    assert receipt.output_hash == output_hash(body["choices"][0]["text"], quarry["tokenIds"])
    signature = bytes.fromhex(quarry["signature"][2:])
    assert receipt.recover(signature, quarry["chainId"], quarry["taskRegistry"]) == \
        quarry["miner"]
    proof = [SumNode.from_json(p) for p in quarry["proof"]]
    assert quarry["proof"] == [{"hash": "0x" + p.hash.hex(), "sum": p.sum} for p in proof]
    assert proof == list(outs[1].proof)
    assert receipt_proven(receipt, proof, result_root=root, tokens_used=tokens_used, start=0,
                          size=2)
    assert not receipt_proven(receipt, proof, result_root=root, tokens_used=tokens_used + 1,
                              start=0, size=2)  # the proof binds the shard's billed total
    assert (quarry["taskId"], quarry["shard"], quarry["index"]) == (9, 0, 1)


def test_chat_output_line_and_atomic_write(tmp_path: Path) -> None:
    outs, _, _ = _outputs("/v1/chat/completions")
    body = output_line(outs[0])["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "out 0"}
    path = write_output_lines(outs, tmp_path / "out.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["c0", "c1"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temp file left
    with pytest.raises(BatchError, match="cannot write"):
        write_output_lines(outs, tmp_path / "no-such-dir" / "out.jsonl")


class _DictStore:
    """A content store in memory (the market's `put`/`get` by sha256 address)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        uri = content_uri(data)
        self.blobs[uri] = data
        return uri

    def get(self, uri: str) -> bytes:
        if uri not in self.blobs:
            raise ContentNotFound(uri)
        return self.blobs[uri]


def test_prompt_counts_from_the_store_match_the_miners_tokenizer(tmp_path: Path) -> None:
    """The client counts prompt tokens from tokenizer.json and the chat template alone (no
    transformers import); a miner encodes with AutoTokenizer. They must agree."""
    from transformers import AutoTokenizer

    from market.engine.text import request_from_line
    from market.model.context import ContextCheck, publish_tokenizer, store_tokenizer
    from market.model.manifest import Manifest, sha256_file
    from market.model.tokenizer import TOKENIZER_FILES, write_tokenizer

    write_tokenizer(tmp_path)
    manifest = Manifest("m", {"max_position_embeddings": 32},
                        {n: sha256_file(tmp_path / n) for n in TOKENIZER_FILES})
    store = _DictStore()
    assert store_tokenizer(store, manifest) is None  # not published yet: no counter
    publish_tokenizer(store, tmp_path, manifest)
    counter = store_tokenizer(store, manifest)
    assert counter is not None
    miner = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    chat = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": 4, "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me about the market, é ✓."}]}}
    requests = [*prompt_lines(["Hello", "the market " * 9, "日本語 ✓"], model="m",
                              max_tokens=4), chat]
    for r in requests:
        assert counter.count(r) == len(request_from_line(miner, r).prompt_ids)
    fits = [r for r in requests if counter.count(r) + 4 <= 32]
    ContextCheck("m", 32, counter).check(enumerate(fits, start=1))
    with pytest.raises(RequestError, match=r"line 1: \d+ prompt tokens \+ max_tokens 4 = \d+ "
                       r"is over the 8-position context of model m"):
        ContextCheck("m", 8, counter).check([(1, requests[1])])
    with pytest.raises(RequestError, match=r"line 3: at least 1 prompt token \+ max_tokens 4 "
                       r"= 5 is over the 4-position"):
        ContextCheck("m", 4, None).check([(3, requests[0])])
