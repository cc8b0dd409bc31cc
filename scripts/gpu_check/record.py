"""A step's record as it runs (gpu_check.json's `steps`), and how a step says it failed, ran out of time or does
not apply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .spec import StepSpec


@dataclass
class StepRecord:
    """What became of one step."""

    spec: StepSpec
    outcome: str = "skipped"             # ok, failed, timeout, skipped
    started_s: float | None = None       # from the start of the check
    seconds: float = 0.0
    limit_s: float | None = None
    commands: list[str] = field(default_factory=list)
    error: str | None = None
    reason: str | None = None            # why it was skipped
    result: dict[str, Any] = field(default_factory=dict)  # what it measured, as the JSON has it
    log: str | None = None               # relative to the work folder

    @property
    def name(self) -> str:
        """The step's name."""
        return self.spec.name

    @property
    def failed(self) -> bool:
        """Whether it failed or ran out of time."""
        return self.outcome in ("failed", "timeout")


class StepFailed(Exception):
    """A step found something wrong: its error line."""


class TimedOut(Exception):
    """A step's command was stopped at the end of its time box: the error line."""


class Skipped(Exception):
    """A step that does not apply here: the reason."""
