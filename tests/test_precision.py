"""Declared precisions and what the torch engine runs for each: names and contract numbers,
task masks, the dtype and weight grid of every precision, and contradictions refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from market.engine.quantize import QuantizeError, quantize_weights_
from market.engine.torch_engine import TorchEngine
from market.model.create import create_model
from market.model.manifest import ModelError
from market.protocol.precision import (
    ANY,
    Precision,
    PrecisionError,
    accepts,
    mask_labels,
    parse_precision,
    precision_mask,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_names_numbers_and_masks() -> None:
    assert [p.label for p in Precision] == ["fp32", "fp16", "bf16", "fp8", "int8"]
    assert parse_precision("BFloat16") is Precision.BF16
    assert parse_precision("torch.float32") is Precision.FP32
    assert parse_precision(2) is Precision.FP16 and parse_precision("half") is Precision.FP16
    for bad in ("fp4", 0, 6, True, None, 1.0):
        with pytest.raises(PrecisionError, match="unknown precision"):
            parse_precision(bad)
    mask = precision_mask(["fp32", "bf16"])
    assert mask == (1 << 1) | (1 << 3)
    assert accepts(mask, "bf16") and not accepts(mask, Precision.INT8)
    assert accepts(ANY, "int8") and precision_mask([]) == ANY
    assert mask_labels(mask) == ["fp32", "bf16"] and len(mask_labels(ANY)) == 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("precision") / "tiny"
    create_model(path)
    return path


def test_each_precision_sets_its_dtype_and_weights(model_dir: Path) -> None:
    expected = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "int8": torch.bfloat16, "fp8": torch.bfloat16}
    plain = TorchEngine(model_dir, precision="bf16")
    for name, dtype in expected.items():
        engine = TorchEngine(model_dir, precision=name)
        assert engine.precision is parse_precision(name) and engine.dtype == dtype
        w = engine.model.model.layers[0].mlp.up_proj.weight.float()
        if name == "int8":  # every row on a grid of 255 levels of its own scale
            steps = w / (w.abs().amax(1, keepdim=True) / 127)
            assert ((steps - steps.round()).abs() <= steps.abs() * 2**-8 + 1e-3).all()
            assert not torch.equal(w, plain.model.model.layers[0].mlp.up_proj.weight.float())
        if name in ("int8", "fp8"):  # the head stays as it was
            assert torch.equal(engine.model.lm_head.weight, plain.model.lm_head.weight)
    assert TorchEngine(model_dir).precision is Precision.FP32  # CPU default
    assert TorchEngine(model_dir, dtype="bf16").precision is Precision.BF16
    with pytest.raises(ModelError, match="contradicts precision 'int8'"):
        TorchEngine(model_dir, precision="int8", dtype="fp32")
    with pytest.raises(QuantizeError, match="unknown quantisation"):
        quantize_weights_(plain.model, "int4")
