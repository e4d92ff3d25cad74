"""One sampling rule on every engine: tokens drawn from softmax(logits / temperature) cut to
the smallest set of the most likely tokens whose mass reaches top_p, renormalised.

The torch engine and a chain of pipeline stages (through the last stage's own sampling
path) each draw many first and second tokens for one prompt of the trained test model, one
seed per draw; a chi-square test compares the counts with the distribution computed here
from the model's logits (float64, by the rule above, not by the engines' code). The seeds
are fixed, so each run is the same run; FALSE_ALARM is the chance that a correct engine
fails at a random choice of seeds, per distribution tested. The same counts are rejected
against the distribution at a slightly wrong temperature, so the test can tell. vLLM is
not installed here: its adapter's `SamplingParams` fields are checked one by one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from market.engine.base import GenerationRequest
from market.engine.pipeline.parts import StageModel
from market.engine.pipeline.stage import _sampling_state
from market.engine.sampling import select_next
from market.engine.torch_engine import TorchEngine, left_pad
from market.engine.vllm_engine import sampling_params

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "testmodels" / "quarry-pydoc"
PROMPT = "class Parser:\n    def "  # 29 tokens in the nucleus, the likeliest at 0.28
TEMPERATURE, TOP_P = 0.8, 0.9
DRAWS = 2000
FALSE_ALARM = 1e-4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rule(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The protocol's distribution over the vocabulary, by token id (float64)."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    sorted_p, order = torch.sort(p, descending=True, stable=True)
    above = torch.cumsum(sorted_p, 0) - sorted_p  # mass strictly above each token
    keep = above < top_p
    margin = (above - top_p).abs().min()
    assert margin > 1e-6, "the nucleus edge sits on top_p: pick another top_p"
    out = torch.zeros_like(p)
    out[order[keep]] = sorted_p[keep]
    return out / out.sum()


def chi2_pvalue(draws: list[int], probs: torch.Tensor) -> float:
    """P(a chi-square this large | the draws follow `probs`); cells of expected count < 5
    are pooled. A draw of a token the rule gives no mass is an outright failure."""
    counts = Counter(draws)
    outside = [t for t in counts if probs[t] == 0]
    assert not outside, f"drew tokens outside the nucleus: {outside}"
    n = len(draws)
    expected = probs * n
    observed = torch.zeros_like(probs)
    for t, c in counts.items():
        observed[t] = c
    big = expected >= 5
    cells_o, cells_e = list(observed[big]), list(expected[big])
    rest_e = float(expected[(~big) & (probs > 0)].sum())
    if rest_e > 0:
        rest_o = float(observed[(~big) & (probs > 0)].sum())
        if rest_e < 5:  # pool with the smallest cell
            i = min(range(len(cells_e)), key=lambda j: float(cells_e[j]))
            cells_o[i], cells_e[i] = cells_o[i] + rest_o, cells_e[i] + rest_e
        else:
            cells_o.append(torch.tensor(rest_o, dtype=probs.dtype))
            cells_e.append(torch.tensor(rest_e, dtype=probs.dtype))
    o, e = torch.stack(cells_o), torch.stack(cells_e)
    assert len(o) >= 3, "too few cells for a meaningful test"
    stat = float(((o - e) ** 2 / e).sum())
    dof = torch.tensor((len(o) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    return TorchEngine(MODEL, device="cpu", precision="fp32", stop_token_ids=(), commit=False,
                       max_batch_size=500)


def _model_logits(engine: TorchEngine, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return engine.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def _check(engine: TorchEngine, prompt: list[int], pairs: list[tuple[int, int]]) -> None:
    """The first tokens, and the second tokens after the most frequent first token, follow
    the rule; the first tokens do not follow it at a temperature 10% off."""
    first = [a for a, _ in pairs]
    logits = _model_logits(engine, prompt)
    assert chi2_pvalue(first, rule(logits, TEMPERATURE, TOP_P)) > FALSE_ALARM
    assert chi2_pvalue(first, rule(logits, TEMPERATURE * 1.1, TOP_P)) < FALSE_ALARM
    top, count = Counter(first).most_common(1)[0]
    assert count >= DRAWS // 5
    second = [b for a, b in pairs if a == top]
    after = _model_logits(engine, [*prompt, top])
    assert chi2_pvalue(second, rule(after, TEMPERATURE, TOP_P)) > FALSE_ALARM


def _requests(prompt: list[int]) -> list[GenerationRequest]:
    return [GenerationRequest(tuple(prompt), 2, temperature=TEMPERATURE, top_p=TOP_P,
                              seed=i) for i in range(DRAWS)]


def test_the_torch_engine_draws_from_the_rule(engine: TorchEngine) -> None:
    prompt = engine.encode_prompt(PROMPT)
    outs = engine.generate(_requests(prompt))
    _check(engine, prompt, [(o.token_ids[0], o.token_ids[1]) for o in outs])


def test_pipeline_stages_draw_from_the_rule(engine: TorchEngine) -> None:
    """Two stages, the last sampling as a stage process does: requests and generators
    rebuilt from the prefill's `sp` field, `select_next` on the last stage's logits."""
    prompt = engine.encode_prompt(PROMPT)
    stages = [StageModel(str(MODEL), 0, 2), StageModel(str(MODEL), 2, 4)]
    pairs: list[tuple[int, int]] = []
    for start in range(0, DRAWS, 500):
        reqs = _requests(prompt)[start : start + 500]
        requests, generators = _sampling_state(
            [[r.temperature, r.top_p, r.seed, r.max_tokens] for r in reqs])
        ids, mask, positions = left_pad([r.prompt_ids for r in reqs], engine.pad_id)
        caches = [s.new_cache(mask, capacity=ids.shape[1] + 2) for s in stages]
        tokens = []
        for _ in range(2):
            h = ids
            for stage, cache in zip(stages, caches, strict=True):
                h = stage(h, positions, cache)
            chosen, _ = select_next(stages[-1].logits(h[:, -1]), requests, generators)
            tokens.append(chosen)
            ids, positions = chosen.unsqueeze(1), positions[:, -1:] + 1
        pairs += list(zip(tokens[0].tolist(), tokens[1].tolist(), strict=True))
    _check(engine, prompt, pairs)


def test_the_vllm_adapter_asks_vllm_for_the_rule_and_nothing_else() -> None:
    neutral = {"n": 1, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
               "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0,
               "ignore_eos": False, "logit_bias": None, "allowed_token_ids": None,
               "bad_words": None}
    sampled = GenerationRequest((5, 6), 17, temperature=0.7, top_p=0.85, seed=-3,
                                stop=("\n\n", "END"))
    assert sampling_params(sampled) == {
        "temperature": 0.7, "top_p": 0.85, "seed": (1 << 63) - 3, "max_tokens": 17,
        "stop": ["\n\n", "END"], "logprobs": 1, **neutral}
    greedy = GenerationRequest((5,), 3)
    assert sampling_params(greedy) == {
        "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_tokens": 3, "stop": [],
        "logprobs": 1, **neutral}
