"""A per-rank watchdog over this rank's waits on the other ranks.

Some waits have no timeout of their own (an MPI collective whose peer stopped or died), so a stuck or
dead peer would hang the job. The watchdog reads the rank's Activity (common.faults.liveness) once a second:
- a collective that has waited longer than its limit ends the rank (`on_timeout`, which says where
  every other rank is and exits);
- a collective that has waited a few seconds has its peers asked whether any has ended (`gone`): a
  collective with a process that is gone cannot complete, so the rank leaves at once (`on_gone`)
  instead of waiting out its timeout, or a launcher's grace, in it.
Time this rank spends computing never counts: a slow rank is not stalled, its peers wait for it. Time
this process spends stopped (SIGSTOP, a suspended machine) is left out of its waits.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from common.loop.activity import Activity

from .liveness import PeerState

#: a collective that waits this long has its peers asked whether one is gone
GONE_CHECK_AFTER_S = 2.0
#: and asked again this often while it goes on waiting
GONE_CHECK_EVERY_S = 2.0
#: a wake-up this much later than due means this process was not running (stopped) in between
PAUSE_S = 2.0


class CollectiveWatchdog:
    """Calls on_timeout(seconds waited) once a collective has waited longer than timeout_s, or
    on_gone(ranks that are gone) once a waiting collective has a peer whose process ended."""

    def __init__(self, activity: Activity, timeout_s: float, on_timeout: Callable[[float], None],
                 gone: Optional[Callable[[], List[PeerState]]] = None,
                 on_gone: Optional[Callable[[List[PeerState]], None]] = None) -> None:
        self.activity, self.timeout_s = activity, timeout_s
        self.on_timeout, self.gone, self.on_gone = on_timeout, gone, on_gone
        self.tick_s = min(1.0, timeout_s / 4)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="collective-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (training is over)."""
        self._stopped.set()

    def _watch(self) -> None:
        last = time.monotonic()
        next_gone_check = 0.0
        while not self._stopped.wait(timeout=self.tick_s):
            now = time.monotonic()
            paused = now - last - self.tick_s
            last = now
            if paused > PAUSE_S:
                self.activity.shift(paused)
            waited = self.activity.waited_s()
            if waited > self.timeout_s:
                self.on_timeout(waited)
                return
            if (self.gone is not None and self.on_gone is not None and waited >= GONE_CHECK_AFTER_S
                    and now >= next_gone_check):
                gone = self.gone()
                if gone and self.activity.waits and not self._stopped.is_set():
                    self.on_gone(gone)
                    return
                last = time.monotonic()  # the question took time of this thread's, not a pause of the process
                next_gone_check = last + GONE_CHECK_EVERY_S
