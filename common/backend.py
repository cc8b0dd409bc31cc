"""The seam between the one training loop and a way of running it in parallel.

The loop in common.train talks to a Backend only. A backend owns: the process group (init,
barrier, shutdown), who this process is (rank, local rank, world size, device), how a model
and optimizer are wrapped so gradients are averaged, and small collectives for metrics.
Nothing here imports horovod or torch.distributed; hvd_train and ddp_train do, lazily.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any, Callable, ContextManager, Iterator, List, Sequence

import torch


class Backend:
    """Interface every backend implements. Methods are called on every rank unless noted."""

    #: short name written into config.json and summary.json ("ddp", "horovod", "local")
    name: str = "abstract"

    def __init__(self) -> None:
        self._comm_seconds = 0.0
        self.current_step = 0
        self.compression = "none"
        self.bucket_mb = 25.0
        self.accumulate = 1
        self.profile = False
        self.gradient_bytes = 0

    # --- identity ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Global rank of this process, 0 .. world_size-1 (known from the launcher before init)."""
        raise NotImplementedError

    @property
    def local_rank(self) -> int:
        """Rank of this process among the processes on its host."""
        raise NotImplementedError

    @property
    def local_world_size(self) -> int:
        """Number of processes of the job on this host."""
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        raise NotImplementedError

    @property
    def is_main(self) -> bool:
        """True on the one process that writes files (rank 0)."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """The device this rank computes on: one CUDA device per local rank, else CPU."""
        return self._device

    def select_device(self, requested: str) -> torch.device:
        """Pick (and on CUDA, bind) this rank's device from --device."""
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

    # --- lifecycle -----------------------------------------------------------------------
    def check_environment(self) -> None:
        """Raise common.config.UsageError when this backend cannot run here (before init)."""

    def configure(self, *, compression: str = "none", bucket_mb: float = 25.0, accumulate: int = 1,
                  profile: bool = False, gradient_bytes: int = 0) -> None:
        """Take the tuning options this backend applies itself; called before init() and wrap().

        compression: "none" or "fp16" (gradients travel as float16); bucket_mb: megabytes
        (2**20 bytes) of gradients reduced together; accumulate: backward passes per optimizer
        step; profile: a trace() will be asked for (some backends must know before init);
        gradient_bytes: what one step reduces (the model's trainable parameters).
        """
        self.compression, self.bucket_mb, self.accumulate, self.profile, self.gradient_bytes = (
            compression, bucket_mb, accumulate, profile, gradient_bytes)

    def init(self, timeout_s: float) -> None:
        """Join the job (collective). Called once, after inputs were checked and select_device().
        A collective that waits longer than `timeout_s` for another rank fails instead of hanging."""
        raise NotImplementedError

    def note_step(self, step: int) -> None:
        """Record the step this rank is on (read by explain_stall; must be cheap)."""
        self.current_step = step

    def explain_stall(self) -> str | None:
        """After a failed collective: which ranks stopped taking part, if this backend can tell."""
        return None

    # --- elastic membership (Horovod elastic) -------------------------------------------------
    #: True when the launcher may change the job's members while it runs (horovodrun --min-np/--max-np)
    elastic: bool = False

    def run_training(self, train: Callable[[], int], trainer: Any) -> int:
        """Run `train()` and return its exit code. An elastic backend runs it again after the job's
        members changed, first bringing every rank to the last committed state (trainer.restore)."""
        return train()

    def commit(self, state: dict) -> None:
        """The checkpoint state every rank just agreed on; an elastic backend keeps it (on every
        rank) as the state to go back to after a failure, and may stop here to take in new members."""

    def shutdown(self) -> None:
        """Leave the job cleanly."""

    def describe(self) -> dict:
        """Backend name and options, for config.json."""
        return {"name": self.name}

    # --- training ------------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """Return (model, optimizer) that average gradients over all ranks on backward/step.

        Must broadcast rank 0's parameters and buffers so every rank starts identical, and must
        not touch a fresh optimizer's state.
        """
        raise NotImplementedError

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
        """The profiler of this backend, writing into `folder` (a common.profiling.Trace; started
        and stopped on every rank). Default: a torch.profiler chrome trace of rank 0."""
        from .profiling import TorchTrace

        return TorchTrace(os.path.join(folder, f"{self.name}-rank{self.rank}.pt.trace.json"), active=self.is_main)

    def take_comm_seconds(self) -> float:
        """Exposed gradient-communication time since the last call: the time a step waited
        for gradient exchange after its last gradient was computed."""
        seconds, self._comm_seconds = self._comm_seconds, 0.0
        return seconds

    # --- collectives for metrics and control ---------------------------------------------
    def all_reduce_sum(self, values: Sequence[float]) -> List[float]:
        """Element-wise sum of a few float64 numbers over all ranks."""
        raise NotImplementedError

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Copy rank 0's buffers (BatchNorm running statistics) into every rank's module.

        Neither backend synchronises buffers during training (DDP runs with
        broadcast_buffers=False, as Horovod does); the loop calls this before every evaluation
        and before saving, so the model that is evaluated is the model that is saved.
        """
        raise NotImplementedError

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's (small, picklable, job-internal) object, in rank order."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait until every rank arrives."""
        self.all_reduce_sum([0.0])

    def host(self) -> str:
        """This host's name."""
        return socket.gethostname()


class LocalBackend(Backend):
    """World size 1 in this process, no communication: the loop's reference and test double."""

    name = "local"

    @property
    def rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def local_world_size(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 1

    def init(self, timeout_s: float) -> None:
        pass

    def wrap(self, model, optimizer):
        return model, optimizer

    def all_reduce_sum(self, values):
        return [float(v) for v in values]

    def broadcast_buffers(self, module):
        pass

    def all_gather_object(self, obj):
        return [obj]


def env_int(*names: str, default: int | None = None) -> int | None:
    """The first of the named environment variables that is set, as an int."""
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default

