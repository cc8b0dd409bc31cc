"""--profile STEPS: trace a few optimizer steps after a short warm-up.

What is traced depends on the backend (Backend.trace): a torch.profiler chrome trace (DDP, local)
or a Horovod timeline. This module owns only when a trace starts and stops.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import torch

#: optimizer steps of the run before tracing starts (allocation, first collectives, caches)
WARMUP_STEPS = 2
#: folder of the run directory that traces go to
PROFILE_DIR = "profile"


class Trace:
    """A recording that starts and stops on every rank; `path` is the file it writes."""

    path: str = ""

    def start(self) -> None:
        """Begin recording."""

    def step(self) -> None:
        """Mark the end of one optimizer step and the start of the next inside the recording."""

    def stop(self) -> None:
        """End recording and write (or finish writing) `path`."""


class TorchTrace(Trace):
    """torch.profiler on this process (CPU, and CUDA when there is a GPU), exported as chrome
    trace JSON; `active=False` makes it a no-op (ranks that do not write files)."""

    def __init__(self, path: str, active: bool = True) -> None:
        self.path, self.active = path, active
        self._profiler: Optional[torch.profiler.profile] = None
        self._span: Optional[torch.profiler.record_function] = None
        self._steps = 0

    def start(self) -> None:
        if not self.active:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        else:
            # A CUDA build of torch on a machine without a GPU: kineto would log a harmless
            # "gpuGetDeviceCount failed" ERROR line (read when the profiler starts).
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        self._profiler = profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        profiler.start()
        self._open_span()

    def _open_span(self) -> None:
        # ProfilerStep#N spans are what TensorBoard's profiler plugin and Perfetto show as steps.
        self._steps += 1
        self._span = span = torch.profiler.record_function(f"ProfilerStep#{self._steps}")
        span.__enter__()

    def _close_span(self) -> None:
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None

    def step(self) -> None:
        if self._profiler is not None:
            self._close_span()
            self._open_span()

    def stop(self) -> None:
        if self._profiler is None:
            return
        self._close_span()
        self._profiler.stop()
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._profiler.export_chrome_trace(self.path)
        self._profiler = None


class StepProfiler:
    """Starts `trace` after WARMUP_STEPS optimizer steps of this run and stops it `steps` steps
    later, or when the run ends (close), whichever comes first."""

    def __init__(self, trace: Optional[Trace], steps: int) -> None:
        self.trace, self.steps = trace, steps
        self.done = 0  # optimizer steps of this run so far
        self.state = "waiting" if trace is not None and steps > 0 else "off"

    def after_step(self) -> None:
        """Call after every optimizer step."""
        trace = self.trace
        if self.state == "off" or trace is None:
            return
        self.done += 1
        if self.state == "tracing":
            if self.done >= WARMUP_STEPS + self.steps:
                self.close()
            else:
                trace.step()
        elif self.state == "waiting" and self.done >= WARMUP_STEPS:
            trace.start()
            self.state = "tracing"

    def describe(self) -> Optional[Dict[str, Any]]:
        """What will be traced, for config.json (None when --profile is 0)."""
        if self.state == "off" or self.trace is None:
            return None
        return {"steps": self.steps, "warmup_steps": WARMUP_STEPS, "file": self.trace.path,
                "kind": type(self.trace).__name__}

    def close(self) -> None:
        """Stop a trace that is still recording (the run ended early)."""
        if self.state == "tracing" and self.trace is not None:
            self.trace.stop()
            self.state = "written"
