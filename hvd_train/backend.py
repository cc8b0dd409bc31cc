"""HorovodBackend: ring-allreduce through Horovod. The only module that imports horovod.

Runs under `horovodrun` (Gloo or MPI controller), plain `mpirun`, `srun` with PMI, or alone.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from common.backend import Backend, env_int
from common.config import UsageError

HOROVOD_MISSING = ("Horovod is not importable in this environment ({error}); run `make setup`, which "
                   "builds horovod 0.28.1 against this torch, or use ddp_train")


def import_horovod():
    """horovod.torch, or UsageError saying how to get it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:  # also the extension failing to load against another torch
        raise UsageError(HOROVOD_MISSING.format(error=exc)) from None
    return hvd


class HorovodBackend(Backend):
    """Horovod's DistributedOptimizer averages gradients with hooks fired during backward."""

    name = "horovod"

    def __init__(self) -> None:
        super().__init__()
        self.hvd = None
        # Before hvd.init() the launcher's variables tell who we are (needed to check inputs).
        self._env_rank = env_int("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                 "SLURM_PROCID", default=0)
        self._env_local_rank = env_int("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "MPI_LOCALRANKID", "SLURM_LOCALID", default=0)

    def check_environment(self) -> None:
        """Raise UsageError when Horovod cannot be used here."""
        self.hvd = import_horovod()

    @property
    def rank(self) -> int:
        return self.hvd.rank() if self._initialised() else self._env_rank

    @property
    def local_rank(self) -> int:
        return self.hvd.local_rank() if self._initialised() else self._env_local_rank

    @property
    def local_world_size(self) -> int:
        return self.hvd.local_size()

    @property
    def world_size(self) -> int:
        return self.hvd.size()

    def _initialised(self) -> bool:
        return self.hvd is not None and self.hvd.is_initialized()

    def init(self, timeout_s: float) -> None:
        # Horovod's stall inspector names the ranks missing from a collective, and with a shutdown
        # time ends the job instead of waiting forever. Both are read by hvd.init().
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(timeout_s // 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(2, int(timeout_s))))
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, int(timeout_s))))
        self.hvd.init()

    def shutdown(self) -> None:
        if self._initialised():
            self.hvd.shutdown()

    def describe(self) -> dict:
        hvd = self.hvd
        return {
            "name": self.name,
            "controller": "gloo" if hvd.gloo_enabled() else ("mpi" if hvd.mpi_enabled() else "unknown"),
            "nccl_built": bool(hvd.nccl_built()),
            "fusion_threshold_bytes": env_int("HOROVOD_FUSION_THRESHOLD", default=64 * 1024 * 1024),
            "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", "1") or 1),
            "gradient_average": "allreduce sum, then scale by 1/world size (op=Average)",
        }

    # --- training ------------------------------------------------------------------------
    def wrap(self, model, optimizer):
        hvd = self.hvd
        # Parameters and buffers from rank 0. A fresh optimizer's state is NOT broadcast:
        # broadcast_optimizer_state would run a zero-gradient step, which moves weights under
        # Adam or weight decay and breaks parity with DDP.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             op=hvd.Average)
        return model, optimizer

    @contextlib.contextmanager
    def gradients_ready(self, optimizer):
        # Allreduces were launched by hooks during backward; synchronize() waits for the ones
        # still in flight, which is the communication that compute did not hide.
        started = time.perf_counter()
        optimizer.synchronize()
        self._comm_seconds += time.perf_counter() - started
        yield

    def step(self, optimizer) -> None:
        with optimizer.skip_synchronize():
            optimizer.step()

    # --- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, values):
        tensor = torch.tensor(list(values), dtype=torch.float64)
        return [float(v) for v in self.hvd.allreduce(tensor, op=self.hvd.Sum)]

    def broadcast_buffers(self, module):
        if self.world_size == 1:
            return
        self.hvd.broadcast_parameters(list(module.named_buffers()), root_rank=0)

    def all_gather_object(self, obj):
        return self.hvd.allgather_object(obj)

    def barrier(self) -> None:
        self.hvd.barrier()
