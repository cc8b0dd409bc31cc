"""How a rank waits for Horovod's collectives.

Horovod's synchronize() waits in C++ by spinning on the calling thread (a loop of sched_yield) until its
background thread has done the operation. On a GPU that keeps the latency of a step low. On CPU the spinning
thread takes the core that the background thread needs to do the allreduce, and, with more ranks than cores,
the core of the rank everyone waits for. So on CPU hvd_train waits by polling the operation with short
sleeps (50 µs, doubling up to Horovod's default cycle time of 1 ms): the same operations in the same order,
the same numbers, and the core left to the work.

HVD_TRAIN_WAIT=spin or poll chooses; unset, a rank polls on CPU and spins on a GPU. config.json records
the choice and where it came from (backend_options: wait, wait_source).
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Tuple

import torch

from common.errors import UsageError

WAIT_VARIABLE = "HVD_TRAIN_WAIT"
WAITS = ("spin", "poll")
FIRST_SLEEP_S = 50e-6
LONGEST_SLEEP_S = 1e-3


def choose_wait(device: torch.device) -> Tuple[str, str]:
    """(spin or poll, where the choice came from); UsageError naming the fix for another value."""
    value = os.environ.get(WAIT_VARIABLE, "").strip().lower()
    if value:
        if value not in WAITS:
            raise UsageError(f"{WAIT_VARIABLE}={value!r}: choose spin or poll, or unset it (poll on CPU, spin "
                             "on a GPU)")
        return value, "environment"
    if device.type == "cpu":
        return "poll", "hvd_train: training on CPU"
    return "spin", "Horovod's default"


class Waiter:
    """Waits for Horovod's asynchronous operations, spinning as Horovod does or polling."""

    def __init__(self, hvd, mode: str) -> None:
        self.hvd, self.mode = hvd, mode

    def result(self, handle):
        """The result of an asynchronous operation, once it is done."""
        self._until_done(handle)
        return self.hvd.synchronize(handle)

    def before_synchronize(self, optimizer) -> None:
        """Until the allreduces that the DistributedOptimizer's hooks started are done; its synchronize()
        then returns at once. (Horovod 0.28.1 keeps them in `_handles`: parameter -> (handle, context);
        a handle is None until the last backward pass of an accumulation.)"""
        if self.mode == "poll":
            for handle, _ in list(optimizer._handles.values()):
                if isinstance(handle, int):
                    self._until_done(handle)

    def broadcast(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """hvd.broadcast_parameters from rank 0, in place: every broadcast started, then waited for."""
        handles = [self.hvd.broadcast_async_(tensor, 0, name) for name, tensor in sorted(named_tensors)]
        for handle in handles:
            self.result(handle)

    def _until_done(self, handle) -> None:
        if self.mode != "poll":
            return
        sleep = FIRST_SLEEP_S
        while not self.hvd.poll(handle):
            time.sleep(sleep)
            sleep = min(2 * sleep, LONGEST_SLEEP_S)
