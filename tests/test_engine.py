"""Engines on real forward passes of the tiny model: batching, stops, sampling, score."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from market.engine import torch_engine
from market.engine.base import GenerationRequest
from market.engine.factory import EngineOptionError, UnknownEngine, load_engine
from market.engine.sampling import SamplingError, make_generators, select_next
from market.engine.torch_engine import EngineError, TorchEngine, left_pad
from market.errors import QuarryError
from market.model.create import create_model
from market.model.tokenizer import EOS_ID

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "Hello world",
    "The capital of France is",
    "Once upon a time there was",
    "def add(a, b):",
    "Water boils at",
    "Tell me a story about a cat",
    "x",
    "The market opens early. Clients post batches of prompts, and miners compete",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("engine") / "tiny"
    create_model(d, name="quarry-tiny", seed=0)  # the default size
    return d


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TorchEngine:
    return TorchEngine(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def prompts(engine: TorchEngine) -> list[tuple[int, ...]]:
    return [engine.encode_prompt(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def greedy(engine: TorchEngine, prompts):
    return engine.generate([GenerationRequest(p, 24) for p in prompts])


def test_left_pad_positions_count_real_tokens() -> None:
    ids, mask, pos = left_pad([(5, 6, 7), (9,)], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_batched_greedy_equals_one_by_one(engine: TorchEngine, prompts, greedy) -> None:
    for p, batched in zip(prompts, greedy, strict=True):
        alone = engine.generate([GenerationRequest(p, 24)])[0]
        assert alone.token_ids == batched.token_ids
        assert alone.finish_reason == batched.finish_reason
        assert max(abs(a - b) for a, b in zip(alone.logprobs, batched.logprobs, strict=True)) < 1e-4


def test_greedy_output_is_varied_text(engine: TorchEngine, greedy) -> None:
    for out in greedy:
        assert len(out.token_ids) == len(out.logprobs) > 0
        assert all(lp <= 0 for lp in out.logprobs)
        assert out.text == engine.decode(out.token_ids)
    distinct = {t for out in greedy for t in out.token_ids}
    assert len(distinct) > 50  # not a constant repeated token
    assert len({out.token_ids for out in greedy}) == len(greedy)


def test_max_tokens_stop_and_zero(engine: TorchEngine, prompts) -> None:
    outs = engine.generate([GenerationRequest(prompts[0], n) for n in (0, 1, 5)])
    assert [len(o.token_ids) for o in outs] == [0, 1, 5]
    assert outs[0] == outs[0].__class__((), "", (), "length")
    assert outs[2].finish_reason == "length"
    full = engine.generate([GenerationRequest(prompts[0], 12)])[0]
    assert full.token_ids[:5] == outs[2].token_ids


def test_natural_eos_stops_and_is_kept_out_of_text(engine: TorchEngine, prompts) -> None:
    outs = engine.generate([GenerationRequest(p, 64) for p in prompts])
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert stopped, "the default model should end some generations with EOS"
    for o in stopped:
        assert o.token_ids[-1] == EOS_ID and EOS_ID not in o.token_ids[:-1]
        assert o.text == engine.decode(o.token_ids[:-1])
    for o in outs:
        if o.finish_reason == "length":
            assert len(o.token_ids) == 64 and EOS_ID not in o.token_ids


def test_custom_stop_token_mid_batch(model_dir: Path, prompts, greedy) -> None:
    out = greedy[1].token_ids
    stop = next(t for i, t in enumerate(out) if i >= 3 and t not in out[:i])
    cut = out.index(stop) + 1
    eng = TorchEngine(model_dir, stop_token_ids=[EOS_ID, stop])
    res = eng.generate([GenerationRequest(p, 24) for p in prompts])
    assert res[1].token_ids == out[:cut] and res[1].finish_reason == "stop"
    for r, g in zip(res, greedy, strict=True):  # rows that never meet it are unaffected
        if stop not in g.token_ids:
            assert r.token_ids == g.token_ids


def test_logprobs_taken_many_steps_at_once_equal_step_by_step(
        engine: TorchEngine, prompts, monkeypatch) -> None:
    """The engine keeps each step's logits and takes their tokens' logprobs in one
    log-softmax at the end; a keep budget of one logit flushes every step, as a per-step
    `select_next` would: every output identical, rows leaving mid-batch included."""
    reqs = [GenerationRequest(p, 4 + 3 * i, temperature=0.0 if i % 2 else 0.9, seed=i)
            for i, p in enumerate(prompts)]
    batched = engine.generate(reqs)
    monkeypatch.setattr(torch_engine, "LOGITS_KEPT", 1)
    assert engine.generate(reqs) == batched
    assert len({len(o.token_ids) for o in batched}) > 2


def test_score_equals_sum_of_generation_logprobs(engine: TorchEngine, prompts, greedy) -> None:
    scores = engine.score(prompts, [o.token_ids for o in greedy])
    for out, sc in zip(greedy, scores, strict=True):
        assert len(sc.logprobs) == len(out.token_ids)
        assert sc.total_logprob == pytest.approx(sum(out.logprobs), abs=1e-4)
        assert sc.argmax_ids == out.token_ids  # greedy agrees with the reference argmax
        assert math.isfinite(sc.perplexity) and sc.perplexity >= 1.0


def test_score_of_sampled_output_uses_untempered_logprobs(engine: TorchEngine, prompts) -> None:
    reqs = [GenerationRequest(p, 20, temperature=1.3, top_p=0.95, seed=11) for p in prompts]
    outs = engine.generate(reqs)
    scores = engine.score(prompts, [o.token_ids for o in outs])
    for out, sc in zip(outs, scores, strict=True):
        assert sc.total_logprob == pytest.approx(sum(out.logprobs), abs=1e-4)
    disagree = sum(a != b for o, s in zip(outs, scores, strict=True)
                   for a, b in zip(o.token_ids, s.argmax_ids, strict=True))
    assert disagree > 0


def test_score_edge_cases(engine: TorchEngine, prompts) -> None:
    res = engine.score([prompts[0], prompts[1]], [(), (5,)])
    assert res[0].logprobs == () and len(res[1].logprobs) == 1
    with pytest.raises(EngineError, match="pair up"):
        engine.score([prompts[0]], [])
    with pytest.raises(EngineError, match="empty prompt"):
        engine.score([()], [(1,)])
    with pytest.raises(EngineError, match="token id"):
        engine.score([prompts[0]], [(engine.vocab_size,)])


def test_same_seed_reproduces_sample_whatever_the_batch(
    engine: TorchEngine, prompts, greedy
) -> None:
    reqs = [GenerationRequest(p, 24, temperature=1.0, seed=5) for p in prompts]
    batched = engine.generate(reqs)
    reversed_batch = engine.generate(reqs[::-1])[::-1]
    mixed = engine.generate([GenerationRequest(prompts[0], 7), reqs[3], reqs[5]])
    assert [o.token_ids for o in batched] == [o.token_ids for o in reversed_batch]
    assert mixed[1].token_ids == batched[3].token_ids
    assert mixed[2].token_ids == batched[5].token_ids
    other_seed = engine.generate([GenerationRequest(p, 24, temperature=1.0, seed=6)
                                  for p in prompts])
    assert sum(a.token_ids != b.token_ids for a, b in zip(batched, other_seed, strict=True)) >= 6
    assert sum(a.token_ids != g.token_ids for a, g in zip(batched, greedy, strict=True)) >= 6


def test_tiny_top_p_is_greedy(engine: TorchEngine, prompts, greedy) -> None:
    outs = engine.generate([GenerationRequest(p, 24, temperature=1.0, top_p=1e-6, seed=s)
                            for s, p in enumerate(prompts)])
    assert [o.token_ids for o in outs] == [g.token_ids for g in greedy]


def test_request_validation(engine: TorchEngine, prompts) -> None:
    with pytest.raises(EngineError, match="request 1: empty prompt"):
        engine.generate([GenerationRequest(prompts[0], 2), GenerationRequest((), 2)])
    with pytest.raises(EngineError, match="top_p"):
        engine.generate([GenerationRequest(prompts[0], 2, temperature=1.0, top_p=0.0)])
    with pytest.raises(EngineError, match="positions"):
        engine.generate([GenerationRequest(prompts[0], engine.max_positions)])
    with pytest.raises(EngineError, match="token id"):
        engine.generate([GenerationRequest((1, -3), 2)])
    assert engine.generate([]) == []


def test_model_is_peaked_with_a_clear_top1_margin(engine: TorchEngine, prompts, greedy) -> None:
    """Margin between the top two logits along greedy paths (the report's figure)."""
    seqs = [p + o.token_ids for p, o in zip(prompts, greedy, strict=True)]
    ids, mask, pos = left_pad(seqs, engine.pad_id)
    with torch.inference_mode():
        logits = engine.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    top2 = logits[mask.bool()].topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    assert statistics.median(margins) > 1.0
    top1_prob = torch.softmax(logits[mask.bool()], -1).max(-1).values
    assert 0.5 < float(top1_prob.median()) < 0.999  # peaked, yet sampling can depart


def test_select_next_unit() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 2.9]])
    reqs = [GenerationRequest((1,), 1), GenerationRequest((1,), 1, temperature=0.01, seed=1)]
    ids, lps = select_next(logits, reqs, make_generators(reqs))
    assert ids.tolist() == [1, 0]
    assert torch.allclose(lps, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])
    with pytest.raises(SamplingError, match="generator"):
        select_next(logits, reqs, [None, None])
    with pytest.raises(SamplingError, match="rows"):
        select_next(logits, reqs[:1], [None])
    hot = GenerationRequest((1,), 1, temperature=50.0, seed=3)
    draws = {int(select_next(logits[1:], [hot], make_generators([hot]))[0]) for _ in range(1)}
    again = {int(select_next(logits[1:], [hot], make_generators([hot]))[0]) for _ in range(1)}
    assert draws == again
    seen = {int(select_next(logits[1:], [GenerationRequest((1,), 1, temperature=50.0, seed=s)],
                            make_generators([GenerationRequest((1,), 1, temperature=50.0,
                                                               seed=s)]))[0])
            for s in range(40)}
    assert seen == {0, 1, 2}


def test_factory(model_dir: Path) -> None:
    eng = load_engine("torch", model_dir, max_batch_size=2)
    assert isinstance(eng, TorchEngine) and eng.max_batch_size == 2
    with pytest.raises(UnknownEngine, match="torch, vllm, pipeline"):
        load_engine("tensorrt", model_dir)
    with pytest.raises(EngineOptionError, match="torch"):
        load_engine("torch", model_dir, stages=2)
    with pytest.raises(QuarryError, match="does not exist"):
        load_engine(None, model_dir.parent / "missing")


def test_vllm_absent_gives_a_clear_error(model_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail here
    from market.engine.vllm_engine import VllmNotInstalled

    with pytest.raises(VllmNotInstalled, match=r"pip install 'quarry\[vllm\]'"):
        load_engine("vllm", model_dir)


def test_vllm_output_conversion() -> None:
    from market.engine.vllm_engine import output_from_vllm, score_from_prompt_logprobs

    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731
    completion = SimpleNamespace(
        token_ids=[7, 2], finish_reason="stop",
        logprobs=[{7: lp(-0.5, 1)}, {2: lp(-1.5, 2), 9: lp(-0.4, 1)}],
    )
    out = output_from_vllm(completion, lambda ids: f"{len(ids)}")
    assert out.token_ids == (7, 2) and out.logprobs == (-0.5, -1.5) and out.finish_reason == "stop"
    prompt_lps = [None, {4: lp(-2.0, 3), 5: lp(-0.1, 1)}, {7: lp(-0.3, 1)}, {2: lp(-3.0, 4),
                                                                           8: lp(-0.2, 1)}]
    sc = score_from_prompt_logprobs(prompt_lps, 2, [7, 2])
    assert sc.logprobs == (-0.3, -3.0) and sc.argmax_ids == (7, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_engine_matches_torch_greedy(model_dir: Path, prompts, greedy) -> None:
    pytest.importorskip("vllm")
    eng = load_engine("vllm", model_dir, dtype="float32", gpu_memory_utilization=0.3)
    try:
        outs = eng.generate([GenerationRequest(p, 24) for p in prompts])
        same = sum(o.token_ids == g.token_ids for o, g in zip(outs, greedy, strict=True))
        assert same >= len(prompts) - 1
        scores = eng.score(prompts, [o.token_ids for o in outs])
        for o, s in zip(outs, scores, strict=True):
            assert s.total_logprob == pytest.approx(sum(o.logprobs), abs=1e-2)
    finally:
        eng.close()


def test_freeze_startup_heap_takes_the_loaded_model_out_of_full_collections(
        model_dir: Path) -> None:
    """In a fresh process (freezing this one would keep the tests' garbage forever): after
    loading a model, everything alive is frozen, and a full collection no longer walks it."""
    import subprocess

    code = (
        "import gc, sys\n"
        "from market.engine.factory import load_engine\n"
        "from market.engine.heap import freeze_startup_heap\n"
        "engine = load_engine('torch', sys.argv[1])\n"
        "frozen = freeze_startup_heap()\n"
        "assert frozen == gc.get_freeze_count() > 10_000, frozen\n"
        "gc.collect()\n"
        "assert len(gc.get_objects()) < frozen // 10, len(gc.get_objects())\n"
        "print(frozen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 10_000
