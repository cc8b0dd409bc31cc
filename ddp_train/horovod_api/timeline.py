"""Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of the API's collectives, written by rank 0: for
every tensor, the time it waited for the other ranks (NEGOTIATE_<KIND>) and the time its data moved (<KIND>), as
Horovod's timeline shows them; with mark_cycles, an instant at each answer of the coordinator (CYCLE_START), and at
each cycle of rank 0's engine that agreed on cached collectives: CYCLE_AGREED where the agreement's collective ran,
CYCLE_GUESSED where the guess answered it (one round; its `args` name the collectives guessed).

HOROVOD_TIMELINE=path starts it at hvd.init() (HOROVOD_TIMELINE_MARK_CYCLES=1 marks cycles);
hvd.start_timeline(path) / hvd.stop_timeline() start and stop it while training runs (with or without
HOROVOD_TIMELINE=DYNAMIC). This module only records; runtime starts and stops it (hvd.init, hvd.shutdown and the
calls above), so that it imports nothing of the API."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, List, Optional


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
            if phase.startswith("CYCLE_"):
                if self.mark_cycles:
                    event = {"name": phase, "ph": "i", "ts": micros, "pid": 0, "tid": 0, "s": "g"}
                    if name:
                        event["args"] = {"collectives": name}
                    self.events.append(event)
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


#: the timeline recording now (rank 0 only), or None
_current: Optional[Timeline] = None


def start(file_path: str, mark_cycles: bool) -> None:
    """Record into `file_path` from now on (this process is rank 0); a recording already running stops first."""
    global _current
    stop()
    _current = Timeline(file_path, mark_cycles)


def stop() -> None:
    """Stop recording, if it records, and write the file."""
    global _current
    timeline, _current = _current, None
    if timeline is not None:
        timeline.write()


def running() -> bool:
    """Whether a timeline records now."""
    return _current is not None


def record(name: str, phase: str, start: bool) -> None:
    """An event of the coordinator or the engine (their threads), kept if a timeline records."""
    timeline = _current  # read once: another thread may stop it meanwhile
    if timeline is not None:
        timeline.record(name, phase, start)
