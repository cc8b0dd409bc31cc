"""The check's clock: monotonic seconds, and the budget's deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass


def now() -> float:
    """Monotonic seconds: what every time box and deadline is measured in."""
    return time.monotonic()


@dataclass(frozen=True)
class Clock:
    """When the check started, and when its budget runs out."""

    start: float
    deadline: float

    @classmethod
    def started(cls, budget: float) -> Clock:
        """A clock started now, with `budget` seconds."""
        start = now()
        return cls(start, start + budget)

    def since_start(self) -> float:
        """Seconds since the check started."""
        return now() - self.start

    def left(self) -> float:
        """Seconds left in the budget."""
        return self.deadline - now()
