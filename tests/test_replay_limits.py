"""`benchmarks/replay_limits.py`'s replay distance: 0 for the token the protocol's sampler
maps the replayed uniform to, the hand-worked values on small distributions, the least slack
of its definition (against a brute-force check of the sets), and at most 2 delta for a
miner whose logits differ by at most delta around a common shift."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from replay_limits import replay_distances, replay_uniforms, replayed_tokens  # noqa: E402

from market.engine.base import GenerationRequest  # noqa: E402
from market.engine.sampling import _sample_row, make_generator  # noqa: E402


def one(probs: list[float], y: int, u: float, temperature: float = 1.0,
        top_p: float = 1.0) -> float:
    logits = torch.tensor([probs], dtype=torch.float64).log() * temperature
    return float(replay_distances(logits, torch.tensor([y]), torch.tensor([u]),
                                  temperature, top_p)[0])


def test_hand_worked_distances() -> None:
    log3 = math.log(3)
    assert one([0.75, 0.25], 0, 0.5) == 0.0 and one([0.75, 0.25], 1, 0.9) == 0.0
    assert one([0.75, 0.25], 0, 0.9) == pytest.approx(log3)  # needs token 1's mass above
    assert one([0.75, 0.25], 1, 0.5) == pytest.approx(log3)
    assert one([0.75, 0.25], 1, 0.5, temperature=2.0) == pytest.approx(2 * log3)
    assert one([0.75, 0.25], 0, 0.0) == 0.0 and one([0.75, 0.25], 1, 0.0) == pytest.approx(log3)
    assert one([0.75, 0.25], 0, 0.9, top_p=0.5) == 0.0  # a nucleus of token 0 alone
    assert one([0.75, 0.25], 1, 0.3, top_p=0.5) == pytest.approx(log3)
    # mass through token 1 is 0.8 < u = 0.85: 0.8 e^g / (0.8 e^g + 0.2) = 0.85 at 17 / 12
    assert one([0.5, 0.3, 0.2], 1, 0.85) == pytest.approx(math.log(17 / 12))
    assert one([0.5, 0.3, 0.2], 2, 0.85) == 0.0


def _consistent(s: torch.Tensor, y: int, u: float, top_p: float, g: float) -> bool:
    """The definition, set by set: lo(g) <= u and u p <= hi(g) (a gap equal to g, up to
    float rounding, counts as not beyond it)."""
    w = s.exp()
    a = float(w[s - s[y] > g + 1e-12].sum())
    b = float(w[s[y] - s <= g + 1e-12].sum())
    lo = a * math.exp(-g) / (a * math.exp(-g) + 1 - a)
    hi = b * math.exp(g) / (b * math.exp(g) + 1 - b)
    return lo <= u + 1e-12 and u * top_p <= hi + 1e-12


def test_the_distance_is_the_least_consistent_slack() -> None:
    gen = torch.Generator().manual_seed(5)
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5)):
        logits = torch.randn(300, 12, generator=gen, dtype=torch.float64) * 2
        logits[:40, 1] = logits[:40, 0]  # ties
        ys = torch.randint(0, 12, (300,), generator=gen)
        us = torch.rand(300, generator=gen, dtype=torch.float64)
        found = replay_distances(logits, ys, us, temperature, top_p) / temperature
        s = torch.log_softmax(logits / temperature, dim=-1)
        positive = 0
        for i in range(300):
            g, y, u = float(found[i]), int(ys[i]), float(us[i])
            assert _consistent(s[i], y, u, top_p, g)
            if g > 0:
                positive += 1
                assert not _consistent(s[i], y, u, top_p, g * (1 - 1e-6) - 1e-12)
        assert positive > 100


def test_the_samplers_own_token_is_at_distance_zero_and_others_are_not() -> None:
    gen = torch.Generator().manual_seed(11)
    for seed, temperature, top_p in ((1, 1.0, 1.0), (2, 0.7, 0.95), (3, 1.0, 0.8)):
        logits = torch.randn(400, 64, generator=gen) * 3
        draw = make_generator(seed)
        tokens = [_sample_row(row, temperature, top_p, draw) for row in logits]
        assert replayed_tokens(logits, seed, temperature, top_p) == tokens
        u = replay_uniforms(seed, len(tokens))
        d = replay_distances(logits, torch.tensor(tokens), u, temperature, top_p)
        assert float(d.max()) == 0.0
        other = torch.argsort(logits, dim=-1, descending=True)[:, 5]  # the 6th likeliest
        moved = other != torch.tensor(tokens)
        d = replay_distances(logits, other, u, temperature, top_p)
        if top_p == 1.0:
            assert bool((d[moved] > 0).all())
        else:  # the nucleus' unknown mass Z in [p, 1] maps u anywhere in [u p, u]
            assert float((d[moved] > 0).double().mean()) > 0.8


@pytest.mark.parametrize("delta", [0.003, 0.03, 0.3])
def test_a_miner_within_delta_stays_within_two_delta(delta: float) -> None:
    gen = torch.Generator().manual_seed(7)
    for seed, temperature, top_p in ((4, 1.0, 1.0), (5, 0.7, 0.9)):
        logits = torch.randn(500, 40, generator=gen, dtype=torch.float64) * 2
        miner = logits + 1.7 + delta * (2 * torch.rand(500, 40, generator=gen,
                                                       dtype=torch.float64) - 1)
        draw = make_generator(seed)
        tokens = [_sample_row(row, temperature, top_p, draw) for row in miner]
        d = replay_distances(logits, torch.tensor(tokens), replay_uniforms(seed, 500),
                             temperature, top_p)
        assert float(d.max()) <= 2 * delta + 1e-6
        assert float(d.max()) > 0  # the rounding shows, within its bound


def test_the_fp32_verifiers_own_outputs_replay_at_distance_zero(trained_engine) -> None:
    eng = trained_engine
    prompts = ["The built-in function", "A dictionary maps", "Strings are immutable",
               "Return a new list"]
    reqs = [GenerationRequest(eng.encode_chat([{"role": "user", "content": p}]), 24,
                              temperature=t, top_p=p_, seed=100 + i)
            for i, (p, t, p_) in enumerate(zip(prompts, (1.0, 0.7, 1.0, 0.8),
                                               (1.0, 0.9, 0.95, 1.0), strict=True))]
    steps = 0
    for req, out in zip(reqs, eng.generate(reqs), strict=True):
        seq = list(req.prompt_ids) + list(out.token_ids)
        with torch.inference_mode():
            logits = eng.model(torch.tensor([seq])).logits[
                0, len(req.prompt_ids) - 1: len(seq) - 1].float()
        u = replay_uniforms(req.seed, len(out.token_ids))
        d = replay_distances(logits, torch.tensor(out.token_ids), u, req.temperature,
                             req.top_p)
        assert float(d.max()) == 0.0
        steps += len(out.token_ids)
    assert steps > 40
