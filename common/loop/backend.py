"""The seam between the one training loop and a way of running it in parallel.

The loop (common.trainer) talks to a Backend only. A backend owns: the process group (init,
barrier, shutdown), who this process is (rank, local rank, world size, device), how a model
and optimizer are wrapped so gradients are averaged, and small collectives for metrics.
Nothing here imports horovod or torch.distributed; hvd_train and ddp_train do, lazily.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Sequence

import torch

from common.config import Config
from common.launch.placement import Placement

from .activity import Activity


@dataclass(frozen=True)
class Tuning:
    """What a backend applies itself (set by configure() before init() and wrap()): the run's options (`config`:
    its compression, bucket_mb, accumulate, profile, deterministic and predivide are the backend's to apply), and
    what one step reduces (`gradient_bytes`: the model's trainable parameters)."""

    config: Config = field(default_factory=Config)
    gradient_bytes: int = 0


#: the collectives every backend implements, and what a rank in one is said to wait in (common.faults.liveness);
#: all_reduce_ is the base class's own, and marks the wait for its sum
COLLECTIVES = {"all_reduce_sum": "an allreduce of metrics", "all_reduce_": "an allreduce",
               "broadcast_module": "a broadcast of the weights", "broadcast_buffers": "a broadcast of the buffers",
               "all_gather_object": "an allgather", "barrier": "a barrier"}


def _waiting_in(doing: str, collective):
    """`collective`, marking the rank as waiting on the other ranks while it runs."""
    @functools.wraps(collective)
    def marked(self, *args, **kwargs):
        with self.activity.waiting(doing):
            return collective(self, *args, **kwargs)

    return marked


class Backend(abc.ABC):
    """Interface every backend implements. Methods are called on every rank unless noted.

    Every collective a backend defines (COLLECTIVES) marks the rank as waiting on the others while it
    runs, so the watchdog and the other ranks can tell a wait from a computation."""

    #: short name written into config.json and summary.json ("ddp", "horovod", "local")
    name: str = "abstract"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for method, doing in COLLECTIVES.items():
            if method in cls.__dict__:
                setattr(cls, method, _waiting_in(doing, cls.__dict__[method]))

    def __init__(self) -> None:
        self.tuning = Tuning()
        self.activity = Activity()  # what this rank does, for the watchdog and the other ranks
        self._comm_seconds = 0.0
        self._device = torch.device("cpu")

    # --- identity ------------------------------------------------------------------------
    @abc.abstractmethod
    def placement(self) -> Placement:
        """Who this process is in the job: rank, world size, local rank and local world size (known from
        the launcher before init; from the backend itself once it knows better)."""

    rank = property(lambda self: self.placement().rank, doc="Global rank of this process, 0 .. world_size-1.")
    local_rank = property(lambda self: self.placement().local_rank,
                          doc="Rank of this process among the processes on its host.")
    world_size = property(lambda self: self.placement().world_size, doc="Number of processes in the job.")
    local_world_size = property(lambda self: self.placement().local_world_size,
                                doc="Number of processes of the job on this host.")

    @property
    def is_main(self) -> bool:
        """True on the one process that writes files (rank 0)."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """The device this rank computes on: one CUDA device per local rank, else CPU."""
        return self._device

    def select_device(self, requested: str) -> torch.device:
        """Pick (and on CUDA, bind) this rank's device from --device; RuntimeError when it is not there."""
        use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
        if use_cuda:
            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda was asked for but torch sees no CUDA device")
            index = self.local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            self._device = torch.device("cuda", index)
        else:
            self._device = torch.device("cpu")
        return self._device

    def host(self) -> str:
        """This host's name."""
        return socket.gethostname()

    # --- lifecycle -----------------------------------------------------------------------
    def check_environment(self) -> None:  # noqa: B027 - optional: a backend with nothing to check keeps it
        """Raise common.errors.UsageError when this backend cannot run here (before init)."""

    def configure(self, tuning: Tuning) -> None:
        """Take the tuning options; called before init() and wrap()."""
        self.tuning = tuning

    @abc.abstractmethod
    def init(self, timeout_s: float) -> None:
        """Join the job (collective). Called once, after inputs were checked and select_device().
        A collective that waits longer than `timeout_s` for another rank fails instead of hanging."""

    def shutdown(self) -> None:  # noqa: B027 - optional: a backend with nothing to leave keeps it
        """Leave the job cleanly."""

    def describe(self) -> Dict[str, Any]:
        """Backend name and options, for config.json."""
        return {"name": self.name}

    @property
    def elastic(self) -> bool:
        """Whether the job's members may change while it runs (a rank that leaves is then no failure)."""
        return False

    # --- training ------------------------------------------------------------------------
    @abc.abstractmethod
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """Return (model, optimizer) that average gradients over all ranks on backward/step.

        Must broadcast rank 0's parameters and buffers so every rank starts identical, and must
        not touch a fresh optimizer's state.
        """

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The plain module inside a wrapped one (its state_dict has no prefixes)."""
        return model

    @contextlib.contextmanager
    def gradients_ready(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Inside this context the averaged gradients are in .grad and may be read or clipped.

        The time spent waiting for gradient exchange here or in backward is what
        take_comm_seconds() reports.
        """
        yield

    def accumulating(self, model: torch.nn.Module) -> ContextManager:
        """Context for the backward passes of an optimizer step that are not its last: gradients
        accumulate locally and are not exchanged (DDP's no_sync). The last backward pass runs
        outside it and exchanges the accumulated sum."""
        return contextlib.nullcontext()

    def step(self, optimizer: torch.optim.Optimizer, scaler=None) -> None:
        """Apply the optimizer step after gradients_ready(). With a torch.amp.GradScaler, the
        scaler steps (skipping the step when gradients overflowed) and updates its scale."""
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def trace(self, folder: str):
        """The profiler of this backend, writing into `folder` (a common.loop.profiling.Trace; started
        and stopped on every rank). Default: a torch.profiler chrome trace of rank 0."""
        from .profiling import TorchTrace

        return TorchTrace(os.path.join(folder, f"{self.name}-rank{self.rank}.pt.trace.json"), active=self.is_main)

    def take_comm_seconds(self) -> float:
        """Exposed gradient-communication time since the last call: the time a step waited
        for gradient exchange after its last gradient was computed."""
        seconds, self._comm_seconds = self._comm_seconds, 0.0
        return seconds

    # --- collectives for metrics and control ---------------------------------------------
    @abc.abstractmethod
    def all_reduce_sum(self, values: Sequence[float]) -> List[float]:
        """Element-wise sum of a few float64 numbers over all ranks."""

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` (any dtype, integers included) over all ranks, in place."""
        self.all_reduce_start_(tensor)()

    def all_reduce_start_(self, tensor: torch.Tensor) -> Callable[[], None]:
        """Start summing `tensor` (any dtype) over all ranks, in place, and return the call that waits for the
        sum: the computation in between overlaps it. Every rank starts its sums in the same order and waits
        for each before it reads the tensor."""
        wait = self._started_all_reduce(tensor)

        def finish() -> None:
            with self.activity.waiting(COLLECTIVES["all_reduce_"]):
                wait()

        return finish

    @abc.abstractmethod
    def _started_all_reduce(self, tensor: torch.Tensor) -> Callable[[], None]:
        """The backend's asynchronous in-place sum over all ranks: started, and its wait returned."""

    @abc.abstractmethod
    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's module (a model not wrapped by wrap())."""

    @abc.abstractmethod
    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Copy rank 0's buffers (BatchNorm running statistics) into every rank's module.

        Neither backend synchronises buffers during training (DDP runs with
        broadcast_buffers=False, as Horovod does); the loop calls this before every evaluation
        and before saving, so the model that is evaluated is the model that is saved.
        """

    @abc.abstractmethod
    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's (small, picklable, job-internal) object, in rank order."""

    def barrier(self) -> None:
        """Wait until every rank arrives."""
        with self.activity.waiting("a barrier"):
            self.all_reduce_sum([0.0])


class LocalBackend(Backend):
    """World size 1 in this process, no communication: the loop's reference and test double."""

    name = "local"

    def placement(self) -> Placement:
        return Placement("none", None, 0, 1, 0, 1)

    def init(self, timeout_s: float) -> None:
        pass

    def wrap(self, model, optimizer):
        return model, optimizer

    def all_reduce_sum(self, values):
        return [float(v) for v in values]

    def _started_all_reduce(self, tensor):
        return lambda: None

    def broadcast_module(self, module):
        pass

    def broadcast_buffers(self, module):
        pass

    def all_gather_object(self, obj):
        return [obj]
