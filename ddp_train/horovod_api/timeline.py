"""Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of the API's collectives, written by rank 0: for
every tensor, the time it waited for the other ranks (NEGOTIATE_<KIND>) and the time its data moved (<KIND>), as
Horovod's timeline shows them; with mark_cycles, an instant at each answer of the coordinator (CYCLE_START).

HOROVOD_TIMELINE=path starts it at hvd.init() (HOROVOD_TIMELINE_MARK_CYCLES=1 marks cycles);
hvd.start_timeline(path) / hvd.stop_timeline() start and stop it while training runs (with or without
HOROVOD_TIMELINE=DYNAMIC)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, List, Optional

from . import runtime


class Timeline:
    """Events of rank 0's coordinator and engine, kept in memory until the timeline stops."""

    def __init__(self, path: str, mark_cycles: bool) -> None:
        self.path = path
        self.mark_cycles = mark_cycles
        self.start_s = time.time()
        self.start = time.perf_counter()
        self.events: List[Dict] = []
        self.tids: Dict[str, int] = {}
        self.lock = threading.Lock()

    def _tid(self, name: str) -> int:
        if name not in self.tids:
            self.tids[name] = len(self.tids) + 1
            self.events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": self.tids[name],
                                "args": {"name": name}})
        return self.tids[name]

    def record(self, name: str, phase: str, start: bool) -> None:
        micros = int((time.perf_counter() - self.start) * 1e6)
        with self.lock:
            if phase == "CYCLE_START":
                if self.mark_cycles:
                    self.events.append({"name": "CYCLE_START", "ph": "i", "ts": micros, "pid": 0, "tid": 0,
                                        "s": "g"})
                return
            tid = self._tid(name)
            if start:
                self.events.append({"name": phase, "ph": "B", "ts": micros, "pid": 0, "tid": tid})
            else:
                self.events.append({"ph": "E", "ts": micros, "pid": 0, "tid": tid})

    def write(self) -> None:
        header = {"name": "process_name", "ph": "M", "pid": 0,
                  "args": {"name": "horovod_api rank 0",
                           "start_time_since_epoch_in_micros": int(self.start_s * 1e6)}}
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        with self.lock, open(self.path, "w") as out:
            json.dump([header, *self.events], out)


_current: Optional[Timeline] = None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording the timeline into `file_path` (rank 0 writes it when it stops); a running one stops first."""
    global _current
    state = runtime.active()
    if _current is not None:
        stop_timeline()
    if runtime.rank() != 0:
        return
    _current = Timeline(file_path, mark_cycles)
    state.timeline_hook = _current.record


def stop_timeline() -> None:
    """Stop recording and write the timeline."""
    global _current
    runtime.active()
    timeline, _current = _current, None
    runtime.STATE.timeline_hook = None
    if timeline is not None:
        timeline.write()


def start_from_environment() -> None:
    """HOROVOD_TIMELINE=path at init() (DYNAMIC only allows start_timeline)."""
    path = os.environ.get("HOROVOD_TIMELINE", "").strip()
    if path and path.upper() != "DYNAMIC" and _current is None:
        mark = os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "").strip().lower() in ("1", "true", "yes")
        start_timeline(path, mark)


def stop_at_shutdown() -> None:
    if _current is not None:
        stop_timeline()


runtime.AFTER_INIT.append(start_from_environment)
runtime.BEFORE_SHUTDOWN.append(stop_at_shutdown)
