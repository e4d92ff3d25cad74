"""Every architecture Quarry serves (`market.model.archs`), on a tiny random model of each
(2 layers, hidden 64): a 2-stage chain of pipeline stages computes the single-process
model's logits, prefill and decode, through left padding and past the sliding window; the
torch engine generates greedy and sampled output that the verifier's judgement passes; an
unsupported architecture is refused with one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from market.engine.base import GenerationRequest
from market.engine.pipeline.errors import PipelineError
from market.engine.pipeline.parts import StageModel, load_config, positions_from_mask
from market.engine.torch_engine import TorchEngine, left_pad
from market.model.archs import SUPPORTED_MODEL_TYPES, TINY_SLIDING_WINDOW, arch_of
from market.model.create import create_model
from market.model.manifest import ModelError

PROMPTS = ("The quarry ships stone to the harbour every", "Hello")
DECODE_STEPS = 4


@pytest.fixture(scope="module", params=SUPPORTED_MODEL_TYPES)
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, Path]:
    d = tmp_path_factory.mktemp(request.param) / "tiny"
    create_model(d, arch=request.param, layers=2, hidden=64, seed=3)
    return request.param, d


@pytest.fixture(scope="module")
def engine(arch_dir: tuple[str, Path]) -> TorchEngine:
    return TorchEngine(arch_dir[1], device="cpu", precision="fp32")


def test_the_written_config_is_the_architecture_asked_for(arch_dir: tuple[str, Path]) -> None:
    arch, d = arch_dir
    config = load_config(d)
    assert config.model_type == arch and config.architectures == [arch_of(arch).causal_lm]
    if arch in ("mistral", "gemma2"):
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
    so do one whole-model stage's run as two hops of one layer each (as a swarm route may
    ask), each hop with its own cache, and the stage's cacheless scoring pass."""
    from transformers import DynamicCache

    model = engine.model
    whole = StageModel(str(arch_dir[1]), 0, 2)
    chains = [[(StageModel(str(arch_dir[1]), 0, 1), None), (StageModel(str(arch_dir[1]), 1, 2),
                                                           None)],
              [(whole, (0, 1)), (whole, (1, 2))]]
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


def test_the_torch_engine_output_passes_the_verifier(engine: TorchEngine) -> None:
    """Greedy and sampled generations of the torch engine, judged by the verifier's evidence
    pass on the same engine: honest output passes; its evidence is the engine's logprobs."""
    from verifier.scoring import judge, score_outputs

    reqs = [GenerationRequest(engine.encode_prompt(p), 12, temperature=t, seed=7 + i)
            for i, (p, t) in enumerate((p, t) for t in (0.0, 1.0) for p in PROMPTS)]
    outs = engine.generate(reqs)
    assert all(o.token_ids for o in outs)
    scores = score_outputs(engine, reqs, [o.token_ids for o in outs],
                           [o.finish_reason for o in outs],
                           commitments=[o.commitment for o in outs])
    verdict = judge(scores)
    assert verdict.passed, verdict.reason
    lps = engine.score([r.prompt_ids for r in reqs], [o.token_ids for o in outs])
    for got, out in zip(lps, outs, strict=True):
        assert got.logprobs == pytest.approx(out.logprobs, abs=1e-4)


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
