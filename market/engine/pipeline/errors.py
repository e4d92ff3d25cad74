"""Errors of the pipelined engine; all are QuarryErrors so CLIs print one line and exit."""

from __future__ import annotations

from market.errors import QuarryError


class PipelineError(QuarryError):
    """The pipeline cannot be built or used (bad stage split, bad input, closed engine)."""


class StageFailedError(PipelineError):
    """A stage process died, crashed or stopped answering; `stage` names which one."""

    def __init__(self, stage: int, reason: str) -> None:
        super().__init__(f"pipeline stage {stage} failed: {reason}")
        self.stage = stage
        self.reason = reason
