"""One rank of the allreduce benchmark: for each message size, warm-up allreduces, then timed ones; the time per op
is the slowest rank's mean. Rank 0 writes the results as JSON to --result.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.allreduce_worker --backend torch --result r.json
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.allreduce_worker --backend horovod --result r.json
    mpirun -np 2 python -m benchmarks.allreduce_worker --backend mpi --result r.json
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle
from common.launch.placement import default_threads, detect

from .jobs import parser

MPI_ALGORITHM_VARIABLE = "OMPI_MCA_coll_tuned_allreduce_algorithm"


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> List[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes (whole float32 elements, at least one)."""
    sizes, size = [], max(4, min_bytes)
    while size <= max_bytes:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def iterations_for(nbytes: int, budget_bytes: int, lo: int = 5, hi: int = 200) -> int:
    """Many iterations for small messages (latency is noisy), few for large ones (each takes long)."""
    return max(lo, min(hi, budget_bytes // max(nbytes, 1)))


@dataclass
class Comm:
    """A rank's collectives: `allreduce(tensor, name)` in place, `max` of one number over the ranks."""

    name: str
    rank: int
    size: int
    allreduce: Callable[[torch.Tensor, str], object]
    max: Callable[[float], float]
    shutdown: Callable[[], object] = lambda: None
    device: torch.device = torch.device("cpu")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def torch_comm() -> Comm:
    """torch.distributed: gloo on CPU, nccl on GPU, the group formed from torchrun's environment."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")

    def most(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    return Comm(f"torch-{'nccl' if cuda else 'gloo'}", dist.get_rank(), dist.get_world_size(),
                lambda t, key: dist.all_reduce(t), most, dist.destroy_process_group, device)


def horovod_comm() -> Comm:
    """Horovod with whichever controller horovodrun chose, Open MPI waiting as hvd_train makes it wait; a fixed name
    per size, as training names its tensors, so that Horovod's response cache skips renegotiating."""
    import horovod.torch as hvd

    yield_mpi_when_idle(not torch.cuda.is_available(), "the benchmark: on CPU")
    hvd.init()
    cuda = torch.cuda.is_available() and hvd.nccl_built()
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return Comm(f"horovod-{'gloo' if hvd.gloo_enabled() else 'mpi' if hvd.mpi_enabled() else 'unknown'}", hvd.rank(),
                hvd.size(), lambda t, key: hvd.allreduce_(t, op=hvd.Sum, name=key),
                lambda v: float(hvd.allreduce(torch.tensor([v], dtype=torch.float64), op=hvd.Max, name="bench.max")),
                hvd.shutdown, device)


def mpi_comm() -> Comm:
    """Open MPI alone (mpi4py, MPI_Allreduce in place on the tensor's memory): what Horovod's MPI controller calls
    underneath, without its background thread, negotiation and fusion. mpi4py finalizes MPI at exit."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return Comm("mpi", world.Get_rank(), world.Get_size(),
                lambda t, key: world.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM),
                lambda v: float(world.allreduce(v, op=MPI.MAX)))


COMMS = {"torch": torch_comm, "horovod": horovod_comm, "mpi": mpi_comm}


def measure(comm: Comm, sizes: List[int], warmup: int, iters: Callable[[int], int]) -> List[Dict[str, Any]]:
    """Time allreduce at each size; seconds per op is the max over ranks of each rank's mean."""
    results = []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=comm.device)  # sums stay zero: no denormals
        n, key = iters(nbytes), f"bench.{nbytes}"
        for _ in range(warmup):
            comm.allreduce(tensor, key)
        comm.sync()
        comm.max(0.0)  # line the ranks up before the clock starts
        started = time.perf_counter()
        for _ in range(n):
            comm.allreduce(tensor, key)
        comm.sync()
        slowest = comm.max((time.perf_counter() - started) / n)
        results.append({"bytes": nbytes, "iterations": n, "time_s": slowest, "algbw_GBps": nbytes / slowest / 1e9,
                        # nccl-tests' bus bandwidth: what each link carries in a ring allreduce
                        "busbw_GBps": nbytes / slowest * 2 * (comm.size - 1) / comm.size / 1e9})
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser("allreduce_worker", __doc__)
    p.add_argument("--backend", choices=tuple(COMMS), required=True)
    p.add_argument("--result", type=Path, required=True, help="JSON file rank 0 writes")
    p.add_argument("--min-bytes", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=256 * 2**20)
    p.add_argument("--factor", type=int, default=4, help="size step: 2 or 4")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=None, help="timed iterations at every size (default: by size)")
    p.add_argument("--budget-mb", type=float, default=512, help="without --iters: MB reduced per size, 5 to 200 times")
    args = p.parse_args(argv)
    comm = COMMS[args.backend]()
    torch.set_num_threads(default_threads(detect().local_world_size))  # torchrun sets 1, horovodrun nothing
    results = measure(comm, message_sizes(args.min_bytes, args.max_bytes, args.factor), args.warmup,
                      lambda nbytes: args.iters or iterations_for(nbytes, int(args.budget_mb * 2**20)))
    if comm.rank == 0:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps({
            "backend": comm.name, "world_size": comm.size, "device": str(comm.device), "warmup": args.warmup,
            "mpi_yield_when_idle": os.environ.get(MPI_YIELD_VARIABLE), "results": results,
            "mpi_algorithm_env": os.environ.get(MPI_ALGORITHM_VARIABLE)}, indent=2) + "\n")  # what Open MPI was told
    comm.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
