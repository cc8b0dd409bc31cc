"""What this rank is doing, for the ones who ask: the watchdog over its waits and the other ranks, through its
answering port (common.faults.liveness). Written by the loop, its steps and the backend's collectives."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator


class Activity:
    """What this rank's main thread is doing: its step, a few words, whether it waits on the other ranks
    (a collective), and since when (time.monotonic). Written by the loop and the backend, read by the
    answering thread and the watchdog; each field is one assignment, so a reader sees a recent state."""

    def __init__(self) -> None:
        self.step = 0
        self.doing = "starting"
        self.waits = False
        self.since = time.monotonic()

    def set(self, doing: str, waits: bool = False) -> None:
        """From now on the rank does `doing` (waiting on the other ranks when `waits`)."""
        self.doing, self.waits, self.since = doing, waits, time.monotonic()

    @contextlib.contextmanager
    def waiting(self, doing: str) -> Iterator[None]:
        """Inside, the rank waits on the other ranks in `doing`; then it is back to what it did before."""
        before, waits_before, since_before = self.doing, self.waits, self.since
        if waits_before:  # a collective made of collectives: the outer one is what the rank waits in
            yield
            return
        self.set(doing, waits=True)
        try:
            yield
        finally:
            self.doing, self.waits, self.since = before, waits_before, since_before

    def waited_s(self) -> float:
        """Seconds this rank has waited in its current collective (0 while it computes)."""
        return time.monotonic() - self.since if self.waits else 0.0

    def shift(self, seconds: float) -> None:
        """Leave `seconds` out of the current wait (this process was not running then)."""
        self.since += seconds
