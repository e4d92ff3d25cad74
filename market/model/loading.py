"""Load a model from a local Hugging Face directory, only after its files match the manifest.

Nothing is fetched from a hub (`local_files_only`), no code from the directory runs
(`trust_remote_code=False`), only safetensors weights load, and every parameter must come
from the file: a missing or unexpected tensor is an error, never a silent random init.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from market.model.manifest import Manifest, ModelError, load_manifest
from market.protocol.precision import Precision, PrecisionError, parse_precision

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def resolve_device(device: Any = None) -> torch.device:
    """`None` means the GPU when there is one, else the CPU."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelError(f"unknown device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    """`None` means fp32 on CPU and bf16 on GPU; names like "bf16" are accepted."""
    import torch

    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    name = DTYPE_NAMES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {sorted(set(DTYPE_NAMES))}")
    return getattr(torch, name)


def resolve_precision(precision: Any, dtype: Any, device: torch.device
                      ) -> tuple[Precision, torch.dtype, str | None]:
    """(precision served, compute dtype, weight quantisation or None) from an engine's
    `precision` and `dtype` options: a precision sets the dtype (int8 and fp8 compute in
    bf16 over 8-bit weights, `market.engine.quantize`); without one the dtype decides
    (`resolve_dtype`'s default) and names the precision. Both given must agree."""
    import torch

    if precision is None:
        resolved = resolve_dtype(dtype, device)
        by_dtype = {torch.float32: Precision.FP32, torch.float16: Precision.FP16,
                    torch.bfloat16: Precision.BF16}
        if resolved not in by_dtype:
            raise ModelError(f"dtype {resolved} is not a precision Quarry verifies "
                             "(fp32, fp16, bf16; int8 and fp8 through precision=)")
        return by_dtype[resolved], resolved, None
    try:
        declared = parse_precision(precision)
    except PrecisionError as exc:
        raise ModelError(str(exc)) from exc
    compute = getattr(torch, declared.torch_dtype_name)
    if dtype is not None and resolve_dtype(dtype, device) != compute:
        raise ModelError(f"dtype {dtype!r} contradicts precision {declared.label!r} "
                         f"(which computes in {declared.torch_dtype_name}); give one of them")
    quantize = declared.label if declared in (Precision.INT8, Precision.FP8) else None
    return declared, compute, quantize


def _dtype_kwarg() -> str:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; older versions ignore `dtype`."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_model(
    model_dir: Path,
    manifest: Manifest | None = None,
    device: Any = None,
    dtype: Any = None,
    attention: str | None = None,
) -> tuple[Any, Any]:
    """Verify `model_dir` against `manifest` (default: its quarry-manifest.json), then load.

    Returns `(model, tokenizer)`: an eval-mode `AutoModelForCausalLM` on `device` in `dtype`
    and its fast tokenizer. `attention` picks the attention kernel ("eager"; "sdpa" or None:
    SDPA with native grouped-query attention; eager where only it is exact: see
    `archs.attention_for`).
    Raises ModelFileMismatch naming any file whose sha256 differs.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {model_dir} does not exist")
    if manifest is None:
        manifest = load_manifest(model_dir)
    manifest.verify(model_dir)

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from market.model.archs import attention_for

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True,
                                            trust_remote_code=False)
        attention = attention_for(config, attention)
        # With output_loading_info the call returns (model, info), which its stubs do not say.
        loaded = AutoModelForCausalLM.from_pretrained(
            model_dir,
            **{_dtype_kwarg(): torch_dtype},
            **({"attn_implementation": attention} if attention else {}),
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
        )
        model, info = cast(tuple[Any, dict[str, list[Any]]], loaded)
        tokenizer = AutoTokenizer.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load the model in {model_dir}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in info.get("missing_keys", ()) if k not in tied]
    problems = {
        "missing": missing,
        "unexpected": list(info.get("unexpected_keys", ())),
        "mismatched": [str(m[0]) if isinstance(m, tuple) else str(m)
                       for m in info.get("mismatched_keys", ())],
    }
    bad = {k: v for k, v in problems.items() if v}
    if bad:
        detail = "; ".join(f"{k} tensors: {', '.join(v[:5])}" for k, v in bad.items())
        raise ModelError(f"weights in {model_dir} do not fit the architecture ({detail})")
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer
