"""One rank of the allreduce benchmark, started by torchrun (torch.distributed) or horovodrun
(Horovod). For each message size: warm-up allreduces, then timed ones; the time per op is this
rank's mean, and the reported time is the maximum over ranks (the slowest rank sets the pace).
Rank 0 writes the results as JSON to --result.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.allreduce_worker --backend torch --result r.json
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.allreduce_worker --backend horovod --result r.json
    mpirun -np 2 python -m benchmarks.allreduce_worker --backend mpi --result r.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable, List

import torch

from common.launch.placement import default_threads, detect
from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle

MPI_ALGORITHM_VARIABLE = "OMPI_MCA_coll_tuned_allreduce_algorithm"


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> List[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes (whole float32 elements, at least one)."""
    sizes, size = [], max(4, min_bytes)
    while size <= max_bytes:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def iterations_for(nbytes: int, budget_bytes: int, lo: int, hi: int) -> int:
    """Many iterations for small messages (latency is noisy), few for large ones (each takes long)."""
    return max(lo, min(hi, budget_bytes // max(nbytes, 1)))


class TorchComm:
    """torch.distributed: gloo on CPU, nccl on GPU, group formed from torchrun's environment."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.device = torch.device("cpu")
        if torch.cuda.is_available():
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(self.backend)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.name = f"torch-{self.backend}"

    def allreduce(self, tensor: torch.Tensor, key: str) -> None:
        self.dist.all_reduce(tensor)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


class HorovodComm:
    """Horovod with whichever controller horovodrun chose (--gloo or --mpi)."""

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        # Open MPI's waiting as hvd_train sets it, so the MPI series measures what training gets.
        yield_mpi_when_idle(not torch.cuda.is_available(), "the benchmark: on CPU")
        hvd.init()
        self.device = torch.device("cpu")
        if torch.cuda.is_available() and hvd.nccl_built():
            self.device = torch.device("cuda", hvd.local_rank())
            torch.cuda.set_device(self.device)
        self.rank, self.size = hvd.rank(), hvd.size()
        controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "unknown"
        self.name = f"horovod-{controller}"

    def allreduce(self, tensor: torch.Tensor, key: str) -> None:
        # A fixed name per size, as training names tensors after parameters: Horovod's response
        # cache then skips renegotiating the same tensor every iteration.
        self.hvd.allreduce_(tensor, op=self.hvd.Sum, name=key)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        return float(self.hvd.allreduce(t, op=self.hvd.Max, name="bench.max").item())

    def shutdown(self) -> None:
        self.hvd.shutdown()


class MPIComm:
    """Open MPI alone (mpi4py, MPI_Allreduce in place on the tensor's memory): what Horovod's MPI
    controller calls underneath, without Horovod's background thread, negotiation and fusion."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.device = torch.device("cpu")
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.name = "mpi"

    def allreduce(self, tensor: torch.Tensor, key: str) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE, tensor.numpy(), op=self.MPI.SUM)

    def sync(self) -> None:
        pass

    def max(self, value: float) -> float:
        return float(self.comm.allreduce(value, op=self.MPI.MAX))

    def shutdown(self) -> None:
        pass  # mpi4py finalizes MPI at exit


COMMS = {"torch": TorchComm, "horovod": HorovodComm, "mpi": MPIComm}


def measure(comm, sizes: List[int], warmup: int, iters: Callable[[int], int]) -> List[dict]:
    """Time allreduce at each size; seconds per op is the max over ranks of each rank's mean."""
    results = []
    for nbytes in sizes:
        # Zeros: sums stay zero, so no overflow or denormals slow the arithmetic down.
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=comm.device)
        key = f"bench.{nbytes}"
        n = iters(nbytes)
        for _ in range(warmup):
            comm.allreduce(tensor, key)
        comm.sync()
        comm.max(0.0)  # line the ranks up before the clock starts
        started = time.perf_counter()
        for _ in range(n):
            comm.allreduce(tensor, key)
        comm.sync()
        mine = (time.perf_counter() - started) / n
        slowest = comm.max(mine)
        algbw = nbytes / slowest
        results.append({"bytes": nbytes, "iterations": n, "time_s": slowest, "algbw_GBps": algbw / 1e9,
                        # nccl-tests' bus bandwidth: what each link carries in a ring allreduce.
                        "busbw_GBps": algbw * 2 * (comm.size - 1) / comm.size / 1e9})
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.allreduce_worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=tuple(COMMS), required=True)
    p.add_argument("--result", type=Path, required=True, help="JSON file rank 0 writes")
    p.add_argument("--min-bytes", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=256 * 2**20)
    p.add_argument("--factor", type=int, default=4, help="size step: 2 or 4")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=None, help="timed iterations at every size (default: by size)")
    p.add_argument("--budget-mb", type=float, default=512,
                   help="without --iters: about this many MB reduced per size, 5 to 200 iterations")
    args = p.parse_args(argv)

    comm = COMMS[args.backend]()
    # Same intra-op threads per rank under every launcher (torchrun sets 1, horovodrun nothing).
    torch.set_num_threads(default_threads(detect().local_world_size))
    budget = int(args.budget_mb * 2**20)
    iters = (lambda nbytes: args.iters) if args.iters else (lambda nbytes: iterations_for(nbytes, budget, 5, 200))
    results = measure(comm, message_sizes(args.min_bytes, args.max_bytes, args.factor), args.warmup, iters)
    if comm.rank == 0:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps({"backend": comm.name, "world_size": comm.size,
                                           "device": str(comm.device), "warmup": args.warmup,
                                           "mpi_yield_when_idle": os.environ.get(MPI_YIELD_VARIABLE),
                                           # what Open MPI was told (benchmarks.allreduce --mpi-algorithms)
                                           "mpi_algorithm_env": os.environ.get(MPI_ALGORITHM_VARIABLE),
                                           "results": results}, indent=2) + "\n")
    comm.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
