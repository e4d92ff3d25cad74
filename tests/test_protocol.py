"""Canonical JSON, request lines, output hashes and EIP-712, checked against fixed vectors,
JavaScript (ethers v6) and the rules the contracts rely on."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from eth_abi import encode as abi_encode
from eth_account import Account
from hypothesis import example, given, settings
from hypothesis import strategies as st

from market.errors import QuarryError
from market.protocol import (
    CanonicalJSONError,
    ChallengeSet,
    Receipt,
    Report,
    RequestError,
    SignatureError,
    Vote,
    canonical_json,
    keccak,
    output_hash,
    parse_jsonl,
    recover,
    request_hash,
    sampling_params,
    validate_request,
)
from market.protocol.canonical import UnsafeInteger
from market.protocol.canonical import _encode as canonical_encode
from market.protocol.canonical import _plain as canonical_plain
from market.protocol.commitments import commitment_hash
from market.protocol.eip712 import TYPE_STRINGS, TYPES, domain, domain_separator, typed_digest
from market.protocol.requests import MAX_SEED, token_ids_hash

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "tests" / "js"
needs_node = pytest.mark.skipif(
    shutil.which("node") is None or not (ROOT / "node_modules" / "ethers").exists(),
    reason="node and node_modules are needed for the JavaScript cross-check",
)


def run_js(script: str, payload: object) -> object:
    proc = subprocess.run(
        ["node", str(JS / script)], input=json.dumps(payload), capture_output=True, text=True,
        cwd=ROOT, timeout=60, check=True,
    )
    return json.loads(proc.stdout)


def completion(**body: object) -> dict:
    base = {"model": "tiny", "prompt": "Hello", "max_tokens": 16}
    base.update(body)
    return {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": base}


# -- canonical JSON -----------------------------------------------------------------------


def test_canonical_json_sorted_compact_utf8() -> None:
    value = {"b": 1, "a": [True, None, "é\n\"x\""], "c": {"z": 0.5, "y": -3}}
    assert canonical_json(value) == '{"a":[true,null,"é\\n\\"x\\""],"b":1,"c":{"y":-3,"z":0.5}}'


def test_canonical_json_numbers() -> None:
    assert canonical_json([1, 2**53 - 1, -(2**53 - 1), 1.0, 0.7, -0.0, 1e21, 1e-7, 1e20]) == (
        "[1,9007199254740991,-9007199254740991,1,0.7,0,1e+21,1e-7,100000000000000000000]"
    )


@pytest.mark.parametrize("big", [2**53, -(2**53), 2**64 - 1, 10**30])
def test_canonical_json_refuses_integers_other_implementations_would_round(big: int) -> None:
    with pytest.raises(UnsafeInteger, match=rf"body\.seed: integer {big} is outside") as info:
        request_hash(completion(seed=big))
    assert isinstance(info.value, CanonicalJSONError)
    assert (info.value.path, info.value.value) == ("body.seed", big)


@needs_node
def test_integers_past_2_53_do_not_survive_javascript() -> None:
    """Why they are refused: JavaScript (like any RFC 8785 implementation) parses 2**53+1
    and 2**64-1 into the nearest double, so it would hash other bytes than Python did."""
    assert run_js("canonical_json.js", [2**53 + 1, 2**64 - 1]) == [
        "9007199254740992", "18446744073709552000"]


@needs_node
def test_largest_seed_hashes_the_same_in_javascript() -> None:
    line = validate_request(completion(temperature=0.7, seed=MAX_SEED), line=1)
    [js_text] = run_js("canonical_json.js", [line])  # type: ignore[misc]
    assert js_text == canonical_json(line)
    assert keccak(js_text.encode()) == request_hash(line)
    assert '"seed":9007199254740991' in js_text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, b"x", {1, 2}, object()])
def test_canonical_json_rejects_non_json(bad: object) -> None:
    with pytest.raises(CanonicalJSONError) as info:
        canonical_json({"body": {"x": bad}})
    assert "body.x" in str(info.value)
    assert isinstance(info.value, QuarryError)


def test_canonical_json_rejects_non_string_keys_and_lone_surrogates() -> None:
    with pytest.raises(CanonicalJSONError, match="key 1"):
        canonical_json({1: "a"})
    with pytest.raises(CanonicalJSONError, match="Unicode"):
        request_hash({"custom_id": "\ud800"})


_JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2**60), 2**60)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
_JSON_VALUES = st.recursive(_JSON_LEAVES, lambda inner: (
    st.lists(inner, max_size=5) | st.lists(inner, max_size=5).map(tuple)
    | st.lists(st.integers(-(2**54), 2**54), max_size=5)
    | st.dictionaries(st.text(max_size=5), inner, max_size=5)), max_leaves=30)


def _reference_json(value: object) -> str:
    """The rule-by-rule encoder, which the C fast path must match."""
    out: list[str] = []
    canonical_encode(value, "", out)
    return "".join(out)


@settings(max_examples=400, deadline=None)
@given(_JSON_VALUES)
@example([0.0, -0.0, 1.0, 0.7, 123.456, 0.0001, 1e-5, 1e16, 2.0**53, -(2.0**53) + 1, 1e21,
          1.5e15, 2**53 - 1, {"temperature": 0.0, "top_p": 0.95}])
def test_canonical_json_fast_path_writes_what_the_rules_write(value: object) -> None:
    try:
        expected = _reference_json(value)
    except CanonicalJSONError as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def test_canonical_json_shared_and_cyclic_containers() -> None:
    shared = [1, 2]
    assert canonical_json({"a": shared, "b": shared, "c": [], "d": []}) == (
        '{"a":[1,2],"b":[1,2],"c":[],"d":[]}')
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    assert not canonical_plain(cyclic)  # left to the reference encoder, not walked forever


def test_request_hash_is_keccak_of_canonical_bytes_and_key_order_free() -> None:
    a = completion(temperature=0.7, seed=3)
    b = json.loads(json.dumps(dict(reversed(list(a.items())))))
    assert request_hash(a) == request_hash(b) == keccak(canonical_json(a).encode())
    assert request_hash(a) != request_hash(completion(temperature=0.7, seed=4))
    # A fixed vector, so any change to the canonical form is caught.
    assert canonical_json(a) == (
        '{"body":{"max_tokens":16,"model":"tiny","prompt":"Hello","seed":3,"temperature":0.7},'
        '"custom_id":"r1","method":"POST","url":"/v1/completions"}'
    )


@needs_node
def test_canonical_json_matches_javascript() -> None:
    values = [
        completion(temperature=0.7, top_p=0.95, seed=12345),
        {"ü": "日本語 ✓", "a": [1.5, 2.0, 1e-7, 123456.789, 1e21, -0.25], "Z": {"b": None}},
        [0.1 + 0.2, 5e-324, 1.7976931348623157e308, 100.0, 9007199254740991],
    ]
    assert run_js("canonical_json.js", values) == [canonical_json(v) for v in values]


# -- request lines ------------------------------------------------------------------------


def test_validate_accepts_both_endpoints_and_does_not_rewrite() -> None:
    req = completion(temperature=0.0, top_p=1, seed=0)
    assert validate_request(req) is req
    chat = {
        "custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "max_tokens": 4,
                 "messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": "hi"}]},
    }
    validate_request(chat)
    params = sampling_params(chat)
    assert params.messages == (("system", "be brief"), ("user", "hi"))
    assert (params.temperature, params.top_p, params.seed, params.prompt) == (0.0, 1.0, 0, None)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("custom_id"), "custom_id"),
        (lambda r: r.update(custom_id=""), "custom_id"),
        (lambda r: r.update(method="GET"), "method"),
        (lambda r: r.update(url="/v1/embeddings"), "url"),
        (lambda r: r.update(extra=1), "extra"),
        (lambda r: r.update(body=[]), "body"),
        (lambda r: r["body"].pop("model"), "body.model"),
        (lambda r: r["body"].pop("prompt"), "body.prompt"),
        (lambda r: r["body"].update(prompt=["a", "b"]), "body.prompt"),
        (lambda r: r["body"].update(messages=[]), "body.messages"),
        (lambda r: r["body"].pop("max_tokens"), "body.max_tokens"),
        (lambda r: r["body"].update(max_tokens=0), "body.max_tokens"),
        (lambda r: r["body"].update(max_tokens=True), "body.max_tokens"),
        (lambda r: r["body"].update(max_tokens=2.0), "body.max_tokens"),
        (lambda r: r["body"].update(temperature=-0.1), "body.temperature"),
        (lambda r: r["body"].update(temperature=math.nan), "body.temperature"),
        (lambda r: r["body"].update(top_p=0), "body.top_p"),
        (lambda r: r["body"].update(seed=-1), "body.seed"),
        (lambda r: r["body"].update(seed=1.5), "body.seed"),
        (lambda r: r["body"].update(seed=2**53), "body.seed"),
        (lambda r: r["body"].update(seed=2**64 - 1), "body.seed"),
        (lambda r: r["body"].update(n=2), "body.n"),
        (lambda r: r["body"].update(top_k=50), "body.top_k"),
        (lambda r: r["body"].update(min_p=0.05), "body.min_p"),
    ],
)
def test_validate_names_the_bad_field(mutate, field: str) -> None:
    req = completion()
    mutate(req)
    with pytest.raises(RequestError) as info:
        validate_request(req)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    if field in ("body.top_k", "body.min_p"):  # the protocol's one sampling rule, named
        assert "not part of Quarry's sampling rule" in str(info.value)


def test_seed_past_2_53_is_refused_naming_the_line() -> None:
    good = json.dumps(completion(seed=MAX_SEED))
    bad = json.dumps({**completion(seed=2**64 - 1), "custom_id": "r2"})
    with pytest.raises(RequestError, match=r"^line 2: body\.seed: must be an integer in "
                       r"\[0, 2\*\*53-1\]"):
        parse_jsonl(good + "\n" + bad + "\n")
    assert parse_jsonl(good)[0].request["body"]["seed"] == 2**53 - 1


def test_chat_message_errors_name_the_message() -> None:
    req = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "a"},
                                 {"role": "bot", "content": "b"}]}}
    with pytest.raises(RequestError, match=r"body\.messages\[1\]\.role"):
        validate_request(req)


def test_parse_jsonl_hashes_and_names_lines() -> None:
    lines = [json.dumps(completion()), "", json.dumps({**completion(), "custom_id": "r2"})]
    parsed = parse_jsonl("\n".join(lines) + "\n")
    assert [(p.index, p.line, p.custom_id) for p in parsed] == [(0, 1, "r1"), (1, 3, "r2")]
    assert parsed[1].request_hash == request_hash(parsed[1].request)

    with pytest.raises(RequestError, match=r"^line 2: not valid JSON"):
        parse_jsonl(json.dumps(completion()) + "\n{oops\n")
    with pytest.raises(RequestError, match=r"^line 2: body\.max_tokens: "):
        parse_jsonl(json.dumps(completion()) + "\n" + json.dumps(
            {**completion(max_tokens=-1), "custom_id": "x"}))
    with pytest.raises(RequestError, match=r"^line 2: custom_id: duplicate .*line 1"):
        parse_jsonl(json.dumps(completion()) + "\n" + json.dumps(completion()))
    with pytest.raises(RequestError, match=r"^line 1: not valid JSON: NaN"):
        parse_jsonl('{"custom_id": NaN}')
    with pytest.raises(RequestError, match="no requests"):
        parse_jsonl("\n\n")


# -- output hash --------------------------------------------------------------------------


def test_output_hash_encoding() -> None:
    ids = [0, 1, 50256, 2**32 - 1]
    packed = b"".join(i.to_bytes(32, "big") for i in ids)  # encodePacked pads array items
    text_hash = keccak("héllo".encode())
    expected = keccak(abi_encode(["bytes32", "bytes32"], [text_hash, keccak(packed)]))
    assert output_hash("héllo", ids) == expected
    assert token_ids_hash([]) == keccak(b"")
    assert output_hash("héllo", ids) != output_hash("héllo", ids[:-1])
    with pytest.raises(RequestError, match="uint32"):
        output_hash("x", [2**32])
    with pytest.raises(RequestError, match="uint32"):
        output_hash("x", [-1])


@given(st.lists(st.integers(0, 2**32 - 1), max_size=40))
@example([0, 1, 255, 256, 65535, 65536, 2**24, 2**32 - 1])
def test_token_ids_hash_is_keccak_of_32_byte_words(ids: list[int]) -> None:
    assert token_ids_hash(ids) == keccak(b"".join(i.to_bytes(32, "big") for i in ids))
    assert token_ids_hash(tuple(ids)) == token_ids_hash(iter(ids)) == token_ids_hash(ids)


@pytest.mark.parametrize(("bad", "at"), [([1, True], 1), ([1, 2.0], 1), ([3, -1], 1),
                                         ([2**32, 1], 0), (["1"], 0), ([5, 6, 2**40], 2)])
def test_token_ids_hash_names_the_first_id_that_is_not_a_uint32(bad: list[object],
                                                                at: int) -> None:
    with pytest.raises(RequestError, match="is not a uint32") as info:
        token_ids_hash(bad)  # type: ignore[arg-type]
    assert info.value.field == f"token_ids[{at}]"


# -- EIP-712 ------------------------------------------------------------------------------

CHAIN = 31337
TASKS = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
KEY = Account.from_key("0x" + "42" * 32)


def receipt() -> Receipt:
    return Receipt(7, 1, 12, keccak(b"req"), output_hash("out", [1, 2, 3]), 3, keccak(b"model"),
                   commitment_hash(b"\x01" * 258))


def test_type_strings_and_manual_struct_hash() -> None:
    assert TYPE_STRINGS["Receipt"] == (
        "Receipt(uint256 taskId,uint32 shard,uint32 index,bytes32 requestHash,bytes32 outputHash,"
        "uint32 outputTokens,bytes32 modelId,bytes32 commitment)"
    )
    assert TYPE_STRINGS["Vote"] == "Vote(uint256 disputeId,bool minerAtFault)"
    r = receipt()
    manual = keccak(abi_encode(
        ["bytes32", "uint256", "uint32", "uint32", "bytes32", "bytes32", "uint32", "bytes32",
         "bytes32"],
        [keccak(TYPE_STRINGS["Receipt"].encode()), *r.as_tuple()],
    ))
    assert r.struct_hash() == manual
    assert r.commitment == keccak(b"\x01" * 258)
    # no commitment: the zero hash, which is also the field's default
    bare = Receipt(*r.as_tuple()[:7])
    assert bare.commitment == commitment_hash(b"") == b"\x00" * 32
    assert Receipt.from_message(bare.message()) == bare
    assert bare.struct_hash() != r.struct_hash()
    rep = Report(3, (KEY.address,), (9000,), b"\x05" * 32)
    manual_rep = keccak(abi_encode(
        ["bytes32", "uint256", "bytes32", "bytes32", "bytes32"],
        [keccak(TYPE_STRINGS["Report"].encode()), 3,
         keccak(abi_encode(["address"], [KEY.address])), keccak((9000).to_bytes(32, "big")),
         b"\x05" * 32],
    ))
    assert rep.struct_hash() == manual_rep
    domain_hash = keccak(abi_encode(
        ["bytes32", "bytes32", "bytes32", "uint256", "address"],
        [keccak(b"EIP712Domain(string name,string version,uint256 chainId,"
                b"address verifyingContract)"),
         keccak(b"Quarry"), keccak(b"1"), CHAIN, TASKS],
    ))
    assert domain_separator(CHAIN, TASKS) == domain_hash
    assert r.digest(CHAIN, TASKS) == keccak(b"\x19\x01" + domain_hash + manual)


def test_sign_recover_and_domain_binding() -> None:
    for struct in (receipt(), Vote(4, True), Report(3, (KEY.address,), (9000,), b"\x05" * 32),
                   ChallengeSet(2, keccak(b"set"))):
        sig = struct.sign(KEY.key, CHAIN, TASKS)
        assert len(sig) == 65 and sig[64] in (27, 28)
        assert struct.recover(sig, CHAIN, TASKS) == KEY.address
        # Another chain or contract recovers someone else: signatures do not replay.
        assert struct.recover(sig, CHAIN + 1, TASKS) != KEY.address
        assert struct.recover(sig, CHAIN, "0x" + "11" * 20) != KEY.address
    r = receipt()
    assert Receipt.from_message(r.message()) == r


def test_recover_refuses_what_openzeppelin_refuses() -> None:
    """ECDSA.recover takes v in {27, 28} and low s only; so must Python, or a receipt the
    client accepts could be one the contracts reject (or the same signature twice)."""
    r = receipt()
    sig = r.sign(KEY.key, CHAIN, TASKS)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    s = int.from_bytes(sig[32:64], "big")
    high_s = sig[:32] + (n - s).to_bytes(32, "big") + bytes([55 - sig[64]])  # same signer
    with pytest.raises(SignatureError, match="lower half"):
        r.recover(high_s, CHAIN, TASKS)
    with pytest.raises(SignatureError, match="v must be 27 or 28"):
        r.recover(sig[:64] + bytes([sig[64] - 27]), CHAIN, TASKS)
    with pytest.raises(SignatureError, match="does not recover"):
        r.recover(b"\0" * 32 + sig[32:], CHAIN, TASKS)  # r = 0
    # Every way callers hold a key signs the same bytes (libsecp256k1 is deterministic).
    for key in (KEY.key, bytes(KEY.key), KEY.key.hex(), "0x" + KEY.key.hex(),
                int.from_bytes(KEY.key, "big")):
        assert r.sign(key, CHAIN, TASKS) == sig
    for bad in (b"\0" * 32, b"\1" * 31, "zz", n):
        with pytest.raises(SignatureError, match="bad private key"):
            r.sign(bad, CHAIN, TASKS)


def test_eip712_bad_inputs() -> None:
    with pytest.raises(SignatureError, match="unknown struct"):
        recover("Nope", {}, b"\0" * 65, CHAIN, TASKS)
    with pytest.raises(SignatureError, match="needs fields"):
        typed_digest("Vote", {"disputeId": 1}, CHAIN, TASKS)
    with pytest.raises(SignatureError, match="65 bytes"):
        receipt().recover(b"\0" * 64, CHAIN, TASKS)
    with pytest.raises(SignatureError, match="chainId"):
        domain(0, TASKS)
    with pytest.raises(SignatureError, match="verifyingContract"):
        domain(CHAIN, "0x1234")
    with pytest.raises(SignatureError, match="2 miners but 1 scores"):
        Report(1, (KEY.address, TASKS), (1,), b"\0" * 32)
    with pytest.raises(SignatureError, match="cannot encode"):
        Vote(-1, True).struct_hash()


@needs_node
def test_eip712_matches_ethers() -> None:
    structs = [receipt(), Vote(4, False), ChallengeSet(2, keccak(b"set")),
               Report(3, (KEY.address, TASKS), (9000, 1), b"\x05" * 32)]

    def js_value(v: object) -> object:
        if isinstance(v, bytes):
            return "0x" + v.hex()
        if isinstance(v, list):
            return [js_value(x) for x in v]
        return v

    items = [
        {"type": s.TYPE, "message": {k: js_value(v) for k, v in s.message().items()},
         "signature": "0x" + s.sign(KEY.key, CHAIN, TASKS).hex()}
        for s in structs
    ]
    result = run_js("eip712.js", {"domain": domain(CHAIN, TASKS), "types": TYPES, "items": items})
    for s, out in zip(structs, result["items"], strict=True):
        assert out["typeString"] == TYPE_STRINGS[s.TYPE]
        assert out["structHash"] == "0x" + s.struct_hash().hex()
        assert out["digest"] == "0x" + s.digest(CHAIN, TASKS).hex()
        assert out["signer"] == KEY.address


@needs_node
def test_output_hash_matches_ethers_solidity_packing() -> None:
    cases = [{"text": "héllo ✓", "ids": [0, 1, 50256, 2**32 - 1]}, {"text": "", "ids": []},
             {"text": "a\nb", "ids": list(range(300))}]
    assert run_js("output_hash.js", cases) == [
        "0x" + output_hash(c["text"], c["ids"]).hex() for c in cases]
