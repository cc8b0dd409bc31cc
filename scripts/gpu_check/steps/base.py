"""What a step is to the runner: one that runs in its turn, or one started in the background and waited for later."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..context import Context
from ..record import StepRecord


class Step(ABC):
    """A step that runs in its turn: it fills its record's result, and raises StepFailed, TimedOut (from
    Context.run) or Skipped where it does not apply."""

    @abstractmethod
    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """Run the step, within `until` (monotonic seconds)."""

    def left_out(self, ctx: Context, record: StepRecord, until: float) -> None:
        """What a prerequisite does when GPU_CHECK_STEPS leaves it out: nothing, unless it says otherwise."""
        return None


@dataclass(frozen=True)
class Launch:
    """A background step's command."""

    command: list[str]
    shown: str  # what the record keeps
    env: dict[str, str]


class BackgroundStep(ABC):
    """A step whose command runs beside the steps after it: the runner starts it and waits for it."""

    @abstractmethod
    def prepare(self, ctx: Context, record: StepRecord) -> Launch:
        """The command to start; raises Skipped where there is none to run here."""

    @abstractmethod
    def finished(self, ctx: Context, record: StepRecord, output: str) -> None:
        """Record what the command that ended well (exit code 0) did; `output` is its whole log."""
