"""A per-rank watchdog that ends a rank which has made no progress for too long.

Some waits have no timeout of their own (an MPI collective whose peer stopped), so a stuck peer
would hang the job silently. The loop calls beat() on every step, evaluation batch and
checkpoint; if none comes for `timeout_s`, `on_timeout` runs (it reports and exits).
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class ProgressWatchdog:
    """Calls on_timeout(seconds_without_progress) once if beat() is not called for timeout_s."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[float], None]) -> None:
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        """Progress was made."""
        self._last = time.monotonic()

    def stop(self) -> None:
        """Stop watching (training is over)."""
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(timeout=min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                self.on_timeout(idle)
                return
