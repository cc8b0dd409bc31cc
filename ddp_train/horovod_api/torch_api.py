"""The module a script gets as `horovod.torch` (and `horovod.torch.mpi_ops`): Horovod 0.28.1's torch API, on
torch.distributed. Its name is its own (ddp_train.horovod_api.torch_api), so a program can tell it from Horovod's."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import elastic
from .compression import Compression
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                      broadcast_parameters)
from .enqueue import poll, synchronize
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                      allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async, handle_average_backwards_compatibility,
                      init, join, reducescatter, reducescatter_async, sparse_allreduce_async)
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .runtime import (cross_rank, cross_size, is_homogeneous, is_initialized, local_rank, local_size, rank, shutdown,
                      size, start_timeline, stop_timeline)
from .sync_batch_norm import SyncBatchNorm

# What `import horovod.torch as hvd` offers: Horovod's names, from the modules that implement them here.
__all__ = ["elastic", "Compression", "HorovodInternalError", "HostsUpdatedInterrupt", "allgather_object",
           "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "Adasum", "Average", "Max",
           "Min", "Product", "Sum", "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
           "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
           "grouped_reducescatter_async", "handle_average_backwards_compatibility", "join", "poll", "reducescatter",
           "reducescatter_async", "sparse_allreduce_async", "synchronize", "DistributedOptimizer", "ProcessSet",
           "global_process_set", "cross_rank", "cross_size", "init", "is_homogeneous", "is_initialized",
           "local_rank", "local_size", "rank", "shutdown", "size", "add_process_set", "remove_process_set",
           "SyncBatchNorm", "start_timeline", "stop_timeline", "mpi_built", "mpi_enabled", "mpi_threads_supported",
           "gloo_built", "gloo_enabled", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built"]


def mpi_built() -> bool:
    """False: the API runs on torch.distributed, without MPI."""
    return False


def mpi_enabled() -> bool:
    """False: no MPI."""
    return False


def mpi_threads_supported() -> bool:
    """Raises, as Horovod does without MPI."""
    raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")


def gloo_built() -> bool:
    """True: CPU tensors travel on Gloo."""
    return dist.is_gloo_available()


def gloo_enabled() -> bool:
    """True: the API's collectives run on Gloo (and NCCL for CUDA tensors)."""
    return dist.is_gloo_available()


def nccl_built() -> int:
    """NCCL's version code (as Horovod's: 2.18.3 is 21803) where CUDA tensors travel on NCCL, else 0."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return 0
    major, minor, patch = torch.cuda.nccl.version()[:3]
    return major * 10000 + minor * 100 + patch


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """Whether CUDA tensors can be reduced (torch sees a CUDA device)."""
    return torch.cuda.is_available()


def rocm_built() -> bool:
    """Whether torch runs on ROCm (HIP) with a device."""
    return torch.cuda.is_available() and getattr(torch.version, "hip", None) is not None


def _check_has_gpu() -> bool:
    return torch.cuda.is_available()
