"""Activation commitments (TOPLOC) with real forward passes: the byte format, honest
commitments checked against the verifier's own hidden states in every precision, the
commitments of another model or another prompt failing nearly every chunk, and malformed
commitments refused by name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from market.engine.base import GenerationRequest
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.protocol import commitments
from market.protocol.commitments import (
    CHUNK_TOKENS,
    MOD_N,
    TOPK,
    CommitmentError,
    check,
    commitment_hash,
    expected_length,
)
from miner.cheats import cheating_engine
from verifier.scoring import EXPONENTS, error_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(("rows", "points"), [(3, TOPK), (9, TOPK), (5, 97), (2, 2), (1, 1)])
def test_interpolation_goes_through_every_point(rows: int, points: int) -> None:
    """Degree < points through `points` points: the unique polynomial TOPLOC's Newton form
    gives, in groups of rows of every remainder."""
    rng = np.random.default_rng(7)
    x = np.stack([rng.choice(MOD_N, size=points, replace=False) for _ in range(rows)])
    y = rng.integers(0, 1 << 16, size=(rows, points))
    coeffs = commitments._interpolate(x.copy(), y.copy())
    assert coeffs.shape == (rows, points)
    assert (commitments._evaluate(coeffs, x) == y % MOD_N).all()


def test_outputs_built_together_are_the_outputs_built_alone() -> None:
    """build_many groups chunks of every output by size; each output's bytes are its own,
    also where magnitudes tie at the top-k boundary (values on a coarse grid)."""
    gen = torch.Generator().manual_seed(3)
    hidden = [(torch.randn(t, 48, generator=gen) * 4).round() / 4 for t in (70, 1, 32, 33, 5)]
    together = commitments.build_many(hidden)
    assert together == [commitments.build(h) for h in hidden]
    assert all(c.mismatches == 0 for h, d in zip(hidden, together, strict=True)
               for c in check(h, d))


def test_format_and_lengths() -> None:
    hidden = torch.randn(70, 16, generator=torch.Generator().manual_seed(1))
    data = commitments.build(hidden)
    # 70 tokens: chunks of 32, 32 and 6 tokens; the last holds 96 values, under TOPK.
    assert commitments.chunk_sizes(70, 16) == [TOPK, TOPK, 96]
    assert len(data) == expected_length(70, 16) == 258 + 258 + 2 + 2 * 96
    assert commitments.build(torch.empty(0, 16)) == b""
    assert commitment_hash(b"") == b"\x00" * 32 and len(commitment_hash(data)) == 32
    assert [c.mismatches for c in check(hidden, data)] == [0, 0, 0]
    with pytest.raises(CommitmentError, match="258 expected"):
        check(hidden[:CHUNK_TOKENS], data)
    with pytest.raises(CommitmentError, match="modulus"):
        check(hidden[:1], b"\x00\x01" + data[2:34])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("commit") / "tiny"
    create_model(path)
    return path


def _requests(engine: TorchEngine) -> list[GenerationRequest]:
    prompts = ("Tell me about the ocean.", "Why is the sky blue?", "The library was quiet.",
               "Once upon a time")
    return [GenerationRequest(engine.encode_prompt(p), 40) for p in prompts]


def _checks(reference: TorchEngine, requests: list[GenerationRequest], outputs: list
            ) -> list:
    results = reference.evidence([r.prompt_ids for r in requests],
                                 [o.token_ids for o in outputs],
                                 [(0.0, 1.0)] * len(outputs), EXPONENTS,
                                 commitments=[o.commitment for o in outputs])
    return [c for r in results for c in r.commitment_checks]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "int8", "fp8"])
def test_honest_commitments_are_within_their_precision(model_dir: Path, precision: str) -> None:
    reference = TorchEngine(model_dir, precision="fp32")
    miner = TorchEngine(model_dir, precision=precision)
    requests = _requests(miner)
    outputs = miner.generate(requests)
    assert all(len(o.commitment) == expected_length(len(o.token_ids), miner.hidden_size)
               for o in outputs)
    checks = _checks(reference, requests, outputs)
    tolerance = error_model(precision, "fp32").chunks
    assert checks and all(tolerance.passes(c) for c in checks), checks
    if precision == "fp32":  # the same arithmetic: the same bf16 values
        assert all(c.mismatches == 0 and c.mant_err_mean == 0 for c in checks)


@pytest.mark.parametrize("mode", ["substitute", "wrong-prompt"])
def test_another_model_or_prompt_fails_its_chunks(model_dir: Path, tmp_path: Path,
                                                  mode: str) -> None:
    reference = TorchEngine(model_dir, precision="fp32")
    cheat = cheating_engine(mode, TorchEngine(model_dir), model_dir, cache_dir=tmp_path)
    requests = _requests(reference)
    outputs = cheat.generate(requests)
    checks = _checks(reference, requests, outputs)
    tolerance = error_model("fp32", "fp32").chunks
    failed = sum(not tolerance.passes(c) for c in checks)
    assert failed >= len(checks) - 1, checks
    assert sum(c.mismatches for c in checks) > len(checks) * TOPK // 4


def test_a_commitment_that_does_not_fit_is_an_impossible_output(model_dir: Path) -> None:
    from verifier.scoring import judge, score_outputs

    engine = TorchEngine(model_dir)
    requests = _requests(engine)
    outputs = engine.generate(requests)
    ids = [o.token_ids for o in outputs]
    good = [o.commitment for o in outputs]
    scores = score_outputs(engine, requests, ids, commitments=good)
    assert judge(scores).passed and all(s.chunks == 2 for s in scores)
    cut = [good[0][:-2], *good[1:]]
    bad = score_outputs(engine, requests, ids, commitments=cut)
    assert "a commitment of" in bad[0].problem and not judge(bad).passed
    partial = score_outputs(engine, requests, ids, commitments=[b"", *good[1:]])
    assert "carries no activation commitment while 3 other(s) do" in judge(partial).reason
    empty = replace(requests[0], max_tokens=0)
    (none,) = score_outputs(engine, [empty], [()], commitments=[good[0]])
    assert none.problem == "a commitment for an empty output"


@pytest.mark.parametrize("width", [100, 4096, 8192, 40000])
def test_top_k_over_magnitude_bits_selects_what_bf16_magnitudes_select(width: int) -> None:
    """`_top_rows` ranks int16 keys (the bf16 bits, sign cleared), unsorted; its selection
    is torch's top-k of the bf16 magnitudes, ties at the boundary included (values on a
    coarse grid), on both of torch's selection paths (nth_element, partial sort), and on
    a row holding NaNs."""
    gen = torch.Generator().manual_seed(width)
    rows = (torch.randn(6, width, generator=gen) * 4).round() / 4
    rows[5, :: max(1, width // 7)] = float("nan")
    idx, bits = commitments._top_rows(rows)
    values = rows.to(torch.bfloat16)
    want = values.abs().topk(min(TOPK, width), dim=1).indices
    assert (np.sort(idx, axis=1) == np.sort(want.numpy(), axis=1)).all()
    got = values.gather(1, torch.from_numpy(idx)).view(torch.int16).numpy().astype(np.int64)
    assert (bits == got & 0xFFFF).all()
