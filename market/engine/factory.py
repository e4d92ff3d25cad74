"""Pick an engine by name, importing only the one asked for (vLLM and the pipeline are heavy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from market.engine.base import Engine
from market.errors import QuarryError

ENGINE_KINDS = ("torch", "vllm", "pipeline")
DEFAULT_ENGINE = "torch"


class UnknownEngine(QuarryError):
    """An engine kind that does not exist."""


class EngineOptionError(QuarryError):
    """An option the chosen engine does not accept."""


def load_engine(kind: str | None, model_dir: Path | str, **options: Any) -> Engine:
    """Build the engine `kind` ("torch" default, "vllm", "pipeline") over `model_dir`.

    `options` go to the engine's constructor: e.g. device/dtype/max_batch_size for torch,
    stages/link_latency_ms for the pipeline, dtype/gpu_memory_utilization for vLLM.
    """
    kind = (kind or DEFAULT_ENGINE).strip().lower()
    if kind == "torch":
        from market.engine.torch_engine import TorchEngine as cls
    elif kind == "vllm":
        from market.engine.vllm_engine import VllmEngine as cls  # type: ignore[assignment]
    elif kind == "pipeline":
        from market.engine.pipeline.engine import PipelineEngine as cls  # type: ignore
    else:
        raise UnknownEngine(f"unknown engine {kind!r}; valid engines: {', '.join(ENGINE_KINDS)}")
    try:
        return cls(model_dir, **options)
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc):
            raise
        raise EngineOptionError(f"the {kind} engine does not take that option: {exc}") from exc
