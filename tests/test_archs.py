"""Every architecture Quarry serves (`market.model.archs`), on a tiny random model of each
(3 layers, hidden 64): a 2-stage chain of pipeline stages computes the single-process
model's logits, prefill and decode, through left padding and past the sliding window; the
torch engine generates greedy and sampled output that the verifier's judgement passes; the
`PipelineEngine` over 2 and over 3 stage servers generates the torch engine's tokens, and
the verifier's evidence pass gives its logprobs; an unsupported architecture is refused with
one line naming it.

The stage servers here are `StageServer`s on threads of the test process (the class and the
sockets a stage process runs; starting 5 processes per architecture would cost ~20 s each):
tests/test_pipeline.py and tests/test_swarm_devnet.py run them as processes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from market.engine.base import GenerationOutput, GenerationRequest
from market.engine.pipeline import wire
from market.engine.pipeline.engine import PipelineEngine
from market.engine.pipeline.errors import PipelineError
from market.engine.pipeline.parts import StageModel, load_config, positions_from_mask
from market.engine.pipeline.stage import StageServer
from market.engine.torch_engine import TorchEngine, left_pad
from market.model.archs import SUPPORTED_MODEL_TYPES, TINY_SLIDING_WINDOW, arch_of
from market.model.create import create_model
from market.model.manifest import ModelError

PROMPTS = ("The quarry ships stone to the harbour every", "Hello")
DECODE_STEPS = 4
LAYERS = 3
# Stage servers per architecture: (0:1, 1:3) is the 2-stage pipeline, (0:1, 1:2, 2:3) the
# 3-stage one.
STAGE_RANGES = ((0, 1), (1, 3), (1, 2), (2, 3))
PIPELINES = {"2 stages": ((0, 1), (1, 3)), "3 stages": ((0, 1), (1, 2), (2, 3))}


@pytest.fixture(scope="module", params=SUPPORTED_MODEL_TYPES)
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, Path]:
    d = tmp_path_factory.mktemp(request.param) / "tiny"
    create_model(d, arch=request.param, layers=LAYERS, hidden=64, seed=3)
    return request.param, d


@pytest.fixture(scope="module")
def engine(arch_dir: tuple[str, Path]) -> TorchEngine:
    return TorchEngine(arch_dir[1], device="cpu", precision="fp32")


def test_the_written_config_is_the_architecture_asked_for(arch_dir: tuple[str, Path]) -> None:
    arch, d = arch_dir
    config = load_config(d)
    assert config.model_type == arch and config.architectures == [arch_of(arch).causal_lm]
    if arch in ("mistral", "gemma2", "gemma3_text"):
        assert config.sliding_window == TINY_SLIDING_WINDOW


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_default_tiny_model_keeps_its_id_under_the_generic_writer(tmp_path: Path,
                                                                    arch: str) -> None:
    """Llama is the default, and `--arch llama` is the same model; another arch is another
    model."""
    default = create_model(tmp_path / "d", layers=1, hidden=64)
    named = create_model(tmp_path / arch, layers=1, hidden=64, arch=arch)
    assert (named.model_id == default.model_id) == (arch == "llama")


def test_two_stages_compute_the_models_logits(arch_dir: tuple[str, Path],
                                              engine: TorchEngine) -> None:
    """Prefill of a left-padded batch longer than the sliding window, then decode steps fed
    the argmax: a 2-stage chain's logits equal the HF model class's (fp32) at every step, and
    so do one whole-model stage's run as two hops (as a swarm route may ask), each hop with
    its own cache, and the stage's cacheless scoring pass."""
    from transformers import DynamicCache

    model = engine.model
    whole = StageModel(str(arch_dir[1]), 0, LAYERS)
    chains = [[(StageModel(str(arch_dir[1]), 0, 1), None),
               (StageModel(str(arch_dir[1]), 1, LAYERS), None)],
              [(whole, (0, 2)), (whole, (2, LAYERS))]]
    prompts = [engine.encode_prompt(p) for p in PROMPTS]
    assert max(len(p) for p in prompts) > TINY_SLIDING_WINDOW
    ids, mask, positions = left_pad(prompts, engine.pad_id)
    caches = [[s.new_cache(mask, hop, capacity=4) for s, hop in chain] for chain in chains]
    ref_cache = DynamicCache(config=model.config)
    for step in range(DECODE_STEPS + 1):
        with torch.inference_mode():
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         past_key_values=ref_cache, use_cache=True).logits[:, -1].float()
        for chain, chain_caches in zip(chains, caches, strict=True):
            h = ids
            for (stage, hop), cache in zip(chain, chain_caches, strict=True):
                h = stage(h, positions, cache, hop)  # the cache outgrows its 4 columns
            got = chain[-1][0].logits(h[:, -1])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {step}")
        if step == 0:  # the torch engine's own head (soft-capped where the model caps)
            with torch.inference_mode():
                last = model.get_decoder()(input_ids=ids, attention_mask=mask,
                                           position_ids=positions).last_hidden_state[:, -1]
            torch.testing.assert_close(engine.logits(last), want, atol=1e-5, rtol=1e-5)
            scored = whole.score(ids, mask)  # the teacher-forced pass, no cache
            torch.testing.assert_close(whole.logits(scored[:, -1]), want, atol=1e-5, rtol=1e-5)
        ids = want.argmax(-1, keepdim=True)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
        positions = positions_from_mask(mask, 1)
    last = chains[0][-1][0]
    assert last.lm_head is not None and last.embed_tokens is None
    assert (whole.lm_head.weight is whole.embed_tokens.weight) == model.config.tie_word_embeddings


@pytest.fixture(scope="module")
def generated(engine: TorchEngine) -> tuple[list[GenerationRequest], list[GenerationOutput]]:
    """The torch engine's greedy and sampled generations of the prompts."""
    reqs = [GenerationRequest(engine.encode_prompt(p), 12, temperature=t, seed=7 + i)
            for i, (p, t) in enumerate((p, t) for t in (0.0, 1.0) for p in PROMPTS)]
    outs = engine.generate(reqs)
    assert all(o.token_ids for o in outs)
    return reqs, outs


def assert_the_verifier_passes(engine: TorchEngine, reqs: list[GenerationRequest],
                               outs: list[GenerationOutput]) -> None:
    """The verifier's evidence pass (on the torch engine) judges `outs` honest, and its
    teacher-forced logprobs are the ones the generating engine reported."""
    from verifier.scoring import judge, score_outputs

    scores = score_outputs(engine, reqs, [o.token_ids for o in outs],
                           [o.finish_reason for o in outs],
                           commitments=[o.commitment for o in outs])
    verdict = judge(scores)
    assert verdict.passed, verdict.reason
    lps = engine.score([r.prompt_ids for r in reqs], [o.token_ids for o in outs])
    for got, out in zip(lps, outs, strict=True):
        assert got.logprobs == pytest.approx(out.logprobs, abs=1e-4)


def test_the_torch_engine_output_passes_the_verifier(
        engine: TorchEngine,
        generated: tuple[list[GenerationRequest], list[GenerationOutput]]) -> None:
    """Greedy and sampled generations of the torch engine, judged by the verifier's evidence
    pass on the same engine: honest output passes; its evidence is the engine's logprobs."""
    assert_the_verifier_passes(engine, *generated)


def test_the_fused_decode_generates_what_the_modules_generate(
        arch_dir: tuple[str, Path], engine: TorchEngine,
        generated: tuple[list[GenerationRequest], list[GenerationOutput]]) -> None:
    """The Llama family decodes through `market.engine.fused` (in the torch engine and in
    pipeline stages), the others through transformers' modules. The fused path's greedy
    and seeded sampled tokens equal the modules' (`fused=False`) token for token, logprobs
    within 1e-4, in a padded batch (past Mistral's sliding window) and in a row alone; its
    weights stay the modules' own, so quantising the model in place after loading reaches
    it; eager attention takes the modules' path."""
    from market.engine.fused import FUSED_MODEL_TYPES
    from market.engine.quantize import quantize_weights_

    arch, d = arch_dir
    fused = arch in FUSED_MODEL_TYPES
    assert (engine.fused is not None) == fused
    assert (StageModel(str(d), 1, LAYERS).fused is not None) == fused
    if not fused:
        return
    modules = TorchEngine(d, device="cpu", precision="fp32", fused=False)
    assert modules.fused is None
    reqs, outs = generated
    alone = [replace(reqs[0], max_tokens=6), replace(reqs[-1], max_tokens=6)]
    for batch, want in ((reqs, modules.generate(reqs)), (alone[:1], modules.generate(alone[:1])),
                        (alone[1:], modules.generate(alone[1:]))):
        got = outs if batch is reqs else engine.generate(batch)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        for g, w in zip(got, want, strict=True):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    rounded = TorchEngine(d, device="cpu", precision="fp32")
    for e in (rounded, modules):
        quantize_weights_(e.model, "int8")
    assert ([o.token_ids for o in rounded.generate(reqs)]
            == [o.token_ids for o in modules.generate(reqs)])
    assert TorchEngine(d, device="cpu", precision="fp32", attention="eager").fused is None


@pytest.fixture(scope="module")
def stage_servers(arch_dir: tuple[str, Path]) -> Iterator[dict[tuple[int, int], str]]:
    """A `StageServer` per range of `STAGE_RANGES` serving on its own thread: range ->
    endpoint. Each is told to shut down (the message a stage process ends on) at the end."""
    import zmq

    servers = {r: StageServer(str(arch_dir[1]), *r, "tcp://127.0.0.1:*") for r in STAGE_RANGES}
    threads = [threading.Thread(target=s.serve, daemon=True, name=f"stage {r}")
               for r, s in servers.items()]
    for t in threads:
        t.start()
    try:
        yield {r: s.listen for r, s in servers.items()}
    finally:
        ctx = zmq.Context.instance()
        for s in servers.values():
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(s.listen)
            push.send_multipart(wire.encode({"t": "shutdown"}))
            push.close()
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("ranges", PIPELINES.values(), ids=PIPELINES)
def test_a_pipeline_generates_the_torch_engines_tokens(
        arch_dir: tuple[str, Path], engine: TorchEngine,
        generated: tuple[list[GenerationRequest], list[GenerationOutput]],
        stage_servers: dict[tuple[int, int], str],
        ranges: tuple[tuple[int, int], ...]) -> None:
    """The `PipelineEngine` driving stage servers of these ranges (microbatches of 2, so rows
    are padded and finish apart): greedy and seeded sampled outputs equal the torch engine's
    token for token (fp32), and the verifier's evidence pass passes them with their logprobs."""
    reqs, want = generated
    with PipelineEngine(arch_dir[1], stages=[stage_servers[r] for r in ranges],
                        microbatch_size=2, calibrate=False, driver_host="127.0.0.1") as pipe:
        got = pipe.generate(reqs)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    assert_the_verifier_passes(engine, reqs, got)


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    d = tmp_path / "gpt2"
    create_model(d, layers=1, hidden=64)
    config = json.loads((d / "config.json").read_text())
    config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(PipelineError) as err:
        load_config(d)
    message = str(err.value)
    assert "'gpt2'" in message and ", ".join(SUPPORTED_MODEL_TYPES) in message
    assert "\n" not in message
    with pytest.raises(ModelError, match="'gpt2'.*supported: llama, qwen2"):
        arch_of("gpt2")
