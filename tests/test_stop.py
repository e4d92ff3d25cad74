"""Stop strings (`body.stop`) end to end: request validation and hashing, generation in the
single-process and the pipelined engine (real forward passes of the tiny model), and the
checks that catch a miner who stops early or runs past a stop string."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import pytest
from test_protocol import needs_node, run_js  # the JavaScript cross-check's own helper

from market.engine.base import GenerationOutput, GenerationRequest, text_for
from market.engine.pipeline.engine import PipelineEngine
from market.engine.sampling import SamplingError, validate_sampling
from market.engine.torch_engine import EngineError, TorchEngine
from market.model.create import create_model
from market.model.tokenizer import EOS_ID
from market.protocol.canonical import canonical_json, keccak, request_hash
from market.protocol.eip712 import Receipt
from market.protocol.errors import RequestError
from market.protocol.requests import (
    find_stop,
    output_hash,
    parse_jsonl,
    sampling_params,
    stop_strings,
    validate_request,
)
from market.protocol.results import ResultCheckFailed, ResultItem, check_finish_reason
from verifier.scoring import judge, score_outputs

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(300)]

PROMPT = "The capital of France is"
MAX_TOKENS = 24


def line(**body: Any) -> dict[str, Any]:
    return {"custom_id": "r1", "method": "POST", "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": "Hi", "max_tokens": 8, **body}}


# ------------------------------------------------------------------ protocol


def test_stop_accepted_as_string_or_list_and_reaches_sampling_params() -> None:
    assert sampling_params(line()).stop == ()
    assert sampling_params(line(stop="\n")).stop == ("\n",)
    assert sampling_params(line(stop=["a", "é" * 32, "x y", "END"])).stop == (
        "a", "é" * 32, "x y", "END")
    # covered by requestHash: the same line with and without stop hashes differently
    assert request_hash(line(stop=["a"])) != request_hash(line())
    assert request_hash(line(stop="a")) != request_hash(line(stop=["a"]))


@pytest.mark.parametrize(("stop", "field", "message"), [
    ([], "body.stop", "a list of 0"),
    (["a", "b", "c", "d", "e"], "body.stop", "a list of 5"),
    (7, "body.stop", "not int"),
    ({"s": "a"}, "body.stop", "not dict"),
    ("", "body.stop", "non-empty string"),
    (["a", ""], "body.stop[1]", "non-empty string"),
    (["a", 3], "body.stop[1]", "non-empty string"),
    ("x" * 65, "body.stop", "65 UTF-8 bytes, over the limit of 64"),
    (["ok", "é" * 33], "body.stop[1]", "66 UTF-8 bytes"),
    (["a\ufffd"], "body.stop[0]", "U+FFFD"),
    (None, "body.stop", "not NoneType"),
])
def test_bad_stop_names_line_and_field(stop: Any, field: str, message: str) -> None:
    text = json.dumps(line()) + "\n" + json.dumps({**line(stop=stop), "custom_id": "r2"})
    with pytest.raises(RequestError) as info:
        parse_jsonl(text)
    assert info.value.line == 2 and info.value.field == field
    assert message in str(info.value) and str(info.value).startswith(f"line 2: {field}: ")


def test_find_stop_is_the_earliest_occurrence_of_any() -> None:
    assert find_stop("abc", ["x"]) is None
    assert find_stop("hello world. bye", ["bye", ". "]) == 11
    assert text_for(lambda ids: "".join(map(chr, ids)), [104, 105, 33, 33], ["!"]) == ("hi", True)
    assert text_for(lambda ids: "".join(map(chr, ids)), [104, 105], ["!"]) == ("hi", False)
    assert stop_strings(None) == () and stop_strings("a") == ("a",)


def test_engine_requests_check_stop_like_the_protocol() -> None:
    validate_sampling(GenerationRequest((1,), 4, stop=("a", "b")))
    with pytest.raises(SamplingError, match="request 3: body.stop: must be a string or a list"):
        validate_sampling(GenerationRequest((1,), 4, stop=("a",) * 5), 3)
    with pytest.raises(SamplingError, match="stop must be a tuple"):
        validate_sampling(GenerationRequest((1,), 4, stop="a"))  # type: ignore


@needs_node
def test_line_with_stop_hashes_the_same_in_javascript() -> None:
    lines = [validate_request(line(stop=["\n\n", "Ünïcode ✓", "\"quoted\""]), line=1),
             validate_request(line(stop="END", temperature=0.5, seed=3), line=2)]
    texts = cast(list[str], run_js("canonical_json.js", lines))
    assert texts == [canonical_json(x) for x in lines]
    assert [keccak(t.encode()) for t in texts] == [request_hash(x) for x in lines]


# ------------------------------------------------------------------ engines


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stop") / "tiny"
    create_model(d, layers=4, hidden=64, seed=1)
    return d


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TorchEngine:
    return TorchEngine(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def plain(engine: TorchEngine) -> GenerationOutput:
    """The greedy output without stop strings (it must run to max_tokens for the tests)."""
    out = engine.generate([GenerationRequest(engine.encode_prompt(PROMPT), MAX_TOKENS)])[0]
    assert out.finish_reason == "length" and EOS_ID not in out.token_ids
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    stop: str  # occurs in the plain output's text, and ends inside a token
    start: int  # where it first occurs
    tokens: int  # ids up to and including the token that completes it


@pytest.fixture(scope="module")
def case(engine: TorchEngine, plain: GenerationOutput) -> Case:
    """A stop string of the plain output's text that ends strictly inside a token, well
    before the end: the harder case (the returned ids reach past the returned text)."""
    ids, text = plain.token_ids, plain.text
    ends = {len(engine.decode(ids[:k])) for k in range(len(ids) + 1)}
    for start in range(len(text) // 3, len(text)):
        for width in (2, 3, 4):
            stop = text[start:start + width]
            end = start + width
            if len(stop) == width and "\ufffd" not in stop and text.find(stop) == start \
                    and end not in ends and end < len(text) - 4:
                k = next(k for k in range(1, len(ids) + 1) if stop in engine.decode(ids[:k]))
                assert len(engine.decode(ids[:k])) > end  # the token reaches past the stop
                return Case(stop, start, k)
    raise AssertionError(f"no stop string ending inside a token in {text!r}")


def test_torch_engine_stops_at_the_token_completing_a_stop_string(
        engine: TorchEngine, plain: GenerationOutput, case: Case) -> None:
    prompt = engine.encode_prompt(PROMPT)
    out, never, untouched = engine.generate([
        GenerationRequest(prompt, MAX_TOKENS, stop=("zzqq", case.stop)),
        GenerationRequest(prompt, MAX_TOKENS, stop=("\u00a7\u00a7never",)),
        GenerationRequest(prompt, MAX_TOKENS),
    ])
    assert out.finish_reason == "stop"
    assert out.token_ids == plain.token_ids[:case.tokens]
    assert out.logprobs == pytest.approx(plain.logprobs[:case.tokens], abs=1e-4)
    assert out.text == plain.text[:case.start]  # cut before the stop string (OpenAI)
    assert case.stop not in out.text
    assert engine.decode(out.token_ids).startswith(out.text + case.stop)
    for other in (never, untouched):  # rows that never meet one are unaffected
        assert (other.token_ids, other.text, other.finish_reason) == (
            plain.token_ids, plain.text, "length")


def test_stop_string_from_the_request_line(engine: TorchEngine, plain: GenerationOutput,
                                           case: Case) -> None:
    """A batch line's `stop` reaches the engine (as the miner builds requests)."""
    request = engine.request_from_line(line(prompt=PROMPT, max_tokens=MAX_TOKENS,
                                            stop=case.stop))
    assert request.stop == (case.stop,)
    out = engine.generate([request])[0]
    assert (out.token_ids, out.text) == (plain.token_ids[:case.tokens], plain.text[:case.start])
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "stop": [case.stop]}
    assert engine.request_from_body(body) == request
    with pytest.raises(EngineError, match="body.stop"):
        engine.generate([dataclasses.replace(request, stop=("",))])


def test_pipeline_engine_stops_identically(model_dir: Path, engine: TorchEngine,
                                           case: Case) -> None:
    prompt = engine.encode_prompt(PROMPT)
    requests = [GenerationRequest(prompt, MAX_TOKENS, stop=(case.stop,)),
                GenerationRequest(engine.encode_prompt("Hello world"), 12, stop=("\n", "e ")),
                GenerationRequest(prompt, MAX_TOKENS),
                GenerationRequest(prompt, MAX_TOKENS, temperature=0.9, seed=7,
                                  stop=(case.stop[:1],))]
    expected = engine.generate(requests)
    with PipelineEngine(model_dir, stages=2, microbatch_size=2) as pipe:
        got = pipe.generate(requests)
    for e, g in zip(expected, got, strict=True):
        assert (g.token_ids, g.text, g.finish_reason) == (e.token_ids, e.text, e.finish_reason)
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) == case.tokens


# ------------------------------------------------------------------ verification


def test_verifier_accepts_honest_stops_and_catches_early_stops_and_overruns(
        engine: TorchEngine, plain: GenerationOutput, case: Case) -> None:
    prompt = engine.encode_prompt(PROMPT)
    request = GenerationRequest(prompt, MAX_TOKENS, stop=(case.stop,))
    honest = engine.generate([request])[0]
    short = honest.token_ids[:-1]
    rows = [
        # (ids, finish_reason, text, expected problem or "")
        (honest.token_ids, "stop", honest.text, ""),
        (honest.token_ids, "stop", None, ""),  # texts not given: the ids alone
        # truncated, claiming a stop string it did not produce
        (short, "stop", engine.decode(short), "without a stop token or a stop string"),
        (short, "stop", None, f"stopped after {case.tokens - 1} of {MAX_TOKENS} tokens"),
        (plain.token_ids, "length", plain.text, "ran past a stop string"),  # overrun
        (honest.token_ids, "length", honest.text, "'length' but the output completes"),
        (honest.token_ids, "stop", plain.text, "the text contains a stop string"),
        (honest.token_ids, "stop", honest.text[:-1], "the text is not the output's tokens"),
    ]
    with_text = [r for r in rows if r[2] is not None]
    ids_only = [r for r in rows if r[2] is None]
    scores = score_outputs(engine, [request] * len(with_text), [r[0] for r in with_text],
                           [r[1] for r in with_text], [str(r[2]) for r in with_text])
    scores += score_outputs(engine, [request] * len(ids_only), [r[0] for r in ids_only],
                            [r[1] for r in ids_only])
    for (_, reason, text, problem), score in zip(with_text + ids_only, scores, strict=True):
        if problem:
            assert problem in score.problem, (reason, text, score.problem)
            assert not judge([score]).passed
        else:
            assert score.possible and score.mismatches() == 0, score.problem
            assert judge([score]).passed and score.tokens == case.tokens
    # without stop strings the honest stop-string output is a truncation
    [bare] = score_outputs(engine, [dataclasses.replace(request, stop=())],
                           [honest.token_ids], ["stop"])
    assert bare.problem == (f"stopped after {case.tokens} of {MAX_TOKENS} tokens without a "
                            "stop token")
    # max_tokens reached, but "stop" claimed for a stop string the ids do not complete
    [early] = score_outputs(engine, [dataclasses.replace(request, max_tokens=len(short))],
                            [short], ["stop"], [engine.decode(short)])
    assert "finish_reason 'stop' but the output ends with neither" in early.problem


def test_token_test_covers_sampled_outputs_ended_by_stop_strings(engine: TorchEngine) -> None:
    """Sampled rows that stop at a stop string still carry the likelihood-ratio evidence
    over every returned id, and honest ones pass the test."""
    requests = [GenerationRequest(engine.encode_prompt(p), 20, temperature=1.0, seed=s,
                                  stop=("e", " t"))
                for s in range(6) for p in ("Hello world", PROMPT)]
    outs = engine.generate(requests)
    assert any(o.finish_reason == "stop" and o.token_ids[-1] != EOS_ID for o in outs)
    scores = score_outputs(engine, requests, [o.token_ids for o in outs],
                           [o.finish_reason for o in outs], [o.text for o in outs])
    assert all(s.possible and len(s.log_ratios) > 0 for s in scores if s.tokens)
    assert judge(scores).passed


def _item(ids: tuple[int, ...], text: str, reason: str) -> ResultItem:
    receipt = Receipt(1, 0, 0, b"\x01" * 32, output_hash(text, ids), len(ids), b"\x02" * 32)
    return ResultItem(index=0, custom_id="r1", text=text, token_ids=ids, finish_reason=reason,
                      prompt_tokens=3, receipt=receipt, signature=b"", proof=())


def test_client_finish_reason_check_with_stop_strings() -> None:
    stops = frozenset({EOS_ID})
    check_finish_reason(_item((5, 6), "Paris", "stop"), 8, stops, ("\n",))  # a stop string
    check_finish_reason(_item((5, 6, EOS_ID), "Paris", "stop"), 8, stops, ("\n",))
    check_finish_reason(_item((5,) * 8, "Paris is", "length"), 8, stops, ("\n",))
    for item, message in [
        (_item((5, 6), "Paris\n", "stop"), "contains the stop string '\\n'"),  # not cut
        (_item((5,) * 8, "Paris\nis", "length"), "contains the stop string"),  # ran past
        (_item((), "", "stop"), "does not end with a stop token (and is empty)"),
        (_item((5, 6), "Paris", "length"), "finish_reason 'length' after 2 of 8"),
    ]:
        with pytest.raises(ResultCheckFailed, match="finish reason check failed") as info:
            check_finish_reason(item, 8, stops, ("\n",))
        assert message in str(info.value)
    with pytest.raises(ResultCheckFailed, match="does not end with a stop token"):
        check_finish_reason(_item((5, 6), "Paris", "stop"), 8, stops)  # no stop strings


def test_vllm_output_text_follows_the_same_rule() -> None:
    """vLLM keeps every id (the one completing the stop string too); the text and the
    finish reason are re-derived by `text_for`, so they match the torch engines'."""
    from types import SimpleNamespace

    from market.engine.vllm_engine import output_from_vllm

    decode = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731
    completion = SimpleNamespace(token_ids=[ord(c) for c in "ab\nc"], finish_reason="stop",
                                 logprobs=[{ord(c): -0.5} for c in "ab\nc"])
    out = output_from_vllm(completion, decode, ("\nc",))
    assert (out.text, out.finish_reason, len(out.token_ids)) == ("ab", "stop", 4)
    # vLLM's own detokenizer said "length" but the ids complete a stop string: "stop"
    completion.finish_reason = "length"
    out = output_from_vllm(completion, decode, ("b\n",))
    assert (out.text, out.finish_reason) == ("a", "stop")
    assert output_from_vllm(completion, decode).text == "ab\nc"


def test_verifier_scoring_stays_free_of_torch() -> None:
    """The verifier process imports the scoring worker's client; the stop-string rule it
    shares with the engines must not pull torch in with it."""
    import subprocess
    import sys

    code = ("import sys, verifier.scoring_worker, verifier.scoring, market.engine.base; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ through a real miner


@pytest.mark.chain
@pytest.mark.timeout(180)
def test_stop_lines_through_a_real_miner_pass_every_check(
        devnet: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines with `stop` on a real Anvil: the miner's worker generates with the tiny model and
    signs the cut text with every generated id; the client's checks and the verifier's
    scoring accept it, and the same ids claimed past the stop are caught."""
    from test_miner import MAX_TOKENS, post_task, register  # the miner tests' own helpers

    from market.chain.client import anvil_account
    from market.chain.devnet import free_port
    from market.marketapi import MarketAPI
    from market.protocol.results import ShardResult, verify_shard_result
    from market.store import LocalStore
    from miner.worker import Worker

    monkeypatch.setenv("QUARRY_HOME", str(tmp_path / "home"))
    model_dir = tmp_path / "quarry-stop-test"
    create_model(model_dir, name="quarry-stop-test", layers=2, hidden=64, max_positions=256)
    engine = TorchEngine(model_dir, max_batch_size=4)
    bodies = [{"model": "quarry-stop-test", "prompt": f"the river {i}",
               "max_tokens": MAX_TOKENS + 4} for i in range(3)]  # capped by the task
    plain = engine.generate([GenerationRequest(engine.encode_prompt(str(b["prompt"])),
                                               MAX_TOKENS) for b in bodies])
    # row 0 stops at a character its greedy text reaches before its last token
    text, before_last = plain[0].text, len(engine.decode(plain[0].token_ids[:-1]))
    cut = next(i for i in range(1, before_last)
               if text[i] != "\ufffd" and text[i] not in text[:i])
    bodies[0]["stop"] = [text[cut], "\u00a7\u00a7"]
    bodies[2]["stop"] = "\u00a7never"
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": b}
             for i, b in enumerate(bodies)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()

    miner, market_url = anvil_account(15), f"http://127.0.0.1:{free_port()}"
    register(devnet, miner, model_dir, market_url)
    store = LocalStore(tmp_path / "store")
    task_id = post_task(devnet, store, engine.model_id, data)
    worker = Worker(account=miner, quarry=devnet.q, engines={engine.model_id: engine},
                    store=store, market=MarketAPI(market_url), progress=False)
    outcome = worker.process_shard(task_id, 0)
    assert outcome.submitted, outcome.reason
    sh = devnet.q.tasks.get_shard(task_id, 0)
    parsed = parse_jsonl(data)
    items = verify_shard_result(
        ShardResult.from_bytes(store.get(sh.result_uri)), task_id=task_id, shard=0, start=0,
        miner=sh.miner, model_id=engine.model_id, result_root=sh.result_root,
        tokens_used=sh.tokens_used, request_hashes=[r.request_hash for r in parsed],
        chain_id=devnet.q.chain_id, task_registry=devnet.q.tasks.address)
    stopped = items[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[:cut]
    assert stopped.token_ids == plain[0].token_ids[:len(stopped.token_ids)]
    assert engine.decode(stopped.token_ids).startswith(text[:cut + 1])
    assert stopped.receipt.output_tokens == len(stopped.token_ids)  # completion_tokens
    assert (items[2].token_ids, items[2].text) == (plain[2].token_ids, plain[2].text)

    requests = [dataclasses.replace(engine.request_from_line(x), max_tokens=MAX_TOKENS)
                for x in lines]
    for item, request in zip(items, requests, strict=True):
        check_finish_reason(item, MAX_TOKENS, engine.stop_token_ids, request.stop)
    scores = score_outputs(engine, requests, [it.token_ids for it in items],
                           [it.finish_reason for it in items], [it.text for it in items])
    assert judge(scores).passed, [s.problem for s in scores]
    # The full greedy output under row 0's stop: it ran past the stop string.
    [overrun] = score_outputs(engine, requests[:1], [plain[0].token_ids],
                              [plain[0].finish_reason], [plain[0].text])
    assert "ran past a stop string" in overrun.problem
    with pytest.raises(ResultCheckFailed, match="contains the stop string"):
        check_finish_reason(dataclasses.replace(stopped, text=plain[0].text,
                                                token_ids=plain[0].token_ids,
                                                finish_reason="length"),
                            MAX_TOKENS, engine.stop_token_ids, requests[0].stop)
