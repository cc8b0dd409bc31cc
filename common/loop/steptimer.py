"""Where each step's time goes, and the run's throughput.

A step's time is split into data (the wait for the loader alone), exposed communication (what the
backend reports as gradient exchange that backward did not hide) and compute (the rest, including the
loop's bookkeeping after the previous step). The run's throughput and time split leave out its first
step (allocation, warm-up) and the time spent writing checkpoints.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional, Tuple

import torch

from .metrics import Clock, TimeSplit


class StepTimer:
    """Times steps: start_epoch(), then per step fetched() / stepped() / next_fetch(), paused() around
    checkpoint writes, end_epoch() for the epoch's numbers; samples_per_s() and time_split() for the run."""

    def __init__(self, device: torch.device) -> None:
        self.clock = Clock(device)
        self.run_split, self.first_split = TimeSplit(), TimeSplit()
        self.steps = 0
        self.train_seconds = self.timed_samples = 0.0

    def start_epoch(self) -> None:
        """An epoch starts now."""
        self.epoch_split = TimeSplit()
        self.epoch_start = self.t_prev = self.fetch_start = self.clock.now()
        self.first_step_s = self.paused_s = 0.0
        self.epoch_has_first_step = self.steps == 0

    def fetched(self) -> None:
        """The loader handed over the step's batches."""
        self.data_s = self.clock.now() - self.fetch_start

    def stepped(self, comm_s: float) -> Tuple[float, float, float]:
        """The optimizer step ended; `comm_s` of it was exposed communication. Returns (data seconds,
        step seconds, communication seconds) of the step."""
        t_end = self.clock.now()
        step_s = t_end - self.t_prev
        phases = (self.data_s, max(step_s - self.data_s - comm_s, 0.0), comm_s)
        self.epoch_split.add(*phases)
        (self.run_split if self.steps else self.first_split).add(*phases)
        self.steps += 1
        if self.steps == 1:
            self.first_step_s = t_end - self.epoch_start
        self.t_prev = t_end
        return self.data_s, step_s, comm_s

    def paused(self, seconds: float) -> None:
        """`seconds` just went to a checkpoint: not training time, and not part of the next step."""
        self.paused_s += seconds
        self.t_prev = self.clock.now()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Time spent inside (writing a checkpoint) is not training time, and not part of the next step."""
        started = self.clock.now()
        yield
        self.paused(self.clock.now() - started)

    def next_fetch(self) -> None:
        """The loop asks the loader for the next step's batches now."""
        self.fetch_start = self.clock.now()

    def end_epoch(self, global_batch: int) -> Dict:
        """The epoch's seconds, samples/s and time split; the run's throughput counts the epoch."""
        seconds = self.clock.now() - self.epoch_start
        samples = float(self.epoch_split.steps * global_batch)
        warm = self.first_step_s if self.epoch_has_first_step else 0.0
        if self.epoch_split.steps > (1 if warm else 0):
            self.train_seconds += seconds - warm - self.paused_s
            self.timed_samples += samples - (global_batch if warm else 0)
        return {"epoch_s": seconds, "samples_per_s": samples / seconds if seconds > 0 else None,
                "time_split": self.epoch_split.per_step_ms()}

    def samples_per_s(self) -> Optional[float]:
        """The run's samples per second over all ranks, first step and checkpoint writes left out."""
        return self.timed_samples / self.train_seconds if self.train_seconds > 0 else None

    def time_split(self) -> Dict[str, float]:
        """The run's mean time split per step, first step left out (a run of one step reports that step)."""
        return (self.run_split if self.run_split.steps else self.first_split).per_step_ms()
