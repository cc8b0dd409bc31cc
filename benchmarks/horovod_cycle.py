"""What Horovod's background thread costs the compute beside it, per HOROVOD_CYCLE_TIME and controller: per rank,
with nothing to reduce, the idle CPU (CPU seconds per wall second of an initialised Horovod) and the compute slowdown
(single-thread matrix products with Horovod idle beside them, against the same work before hvd.init()).

    python -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5,10,20 --out benchmarks/results
"""

from __future__ import annotations

import json
import os
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Sequence

import torch

from common.compare import arguments

from .jobs import Workers, add_np, add_out, add_worker, parser


def matmul_seconds(n_iters: int, size: int = 384) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    started = time.perf_counter()
    for _ in range(n_iters):
        a @ b
    return time.perf_counter() - started


def worker(args: Namespace) -> int:
    """One rank: time compute without Horovod, init Horovod, measure idle CPU, time compute again."""
    torch.set_num_threads(1)
    matmul_seconds(20)  # warm-up
    before = min(matmul_seconds(args.matmuls) for _ in range(3))
    import horovod.torch as hvd

    from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle

    yield_mpi_when_idle(True, "the benchmark: on CPU")  # Open MPI waits as under hvd_train
    hvd.init()
    hvd.allreduce(torch.zeros(1), name="sync")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(args.idle_s)
    idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    after = min(matmul_seconds(args.matmuls) for _ in range(3))
    rows = hvd.allgather(torch.tensor([[idle_cpu, before, after]], dtype=torch.float64), name="rows")
    if hvd.rank() == 0:
        Path(args.result).write_text(json.dumps({
            "controller": "gloo" if hvd.gloo_enabled() else "mpi", "world_size": hvd.size(),
            "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", "1")),
            "mpi_yield_when_idle": os.environ[MPI_YIELD_VARIABLE] if hvd.mpi_enabled() else None,
            **{key: [float(r[i]) for r in rows] for i, key in enumerate(("idle_cpu_per_s", "compute_s_without",
                                                                         "compute_s_with"))}}))
    hvd.shutdown()
    return 0


def summarised(row: dict[str, Any]) -> dict[str, Any]:
    """A worker's row with the ranks' mean idle CPU and the compute slowdown of their summed times."""
    return {**row, "idle_cpu_mean": sum(row["idle_cpu_per_s"]) / len(row["idle_cpu_per_s"]),
            "compute_slowdown": sum(row["compute_s_with"]) / sum(row["compute_s_without"]) - 1}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every controller at every cycle time (or be one rank, with --worker)."""
    p = parser("horovod_cycle", __doc__)
    add_np(p, 2)
    p.add_argument("--cycle-ms", type=arguments.csv_list(float, minimum=0), default=[1, 5, 10, 20],
                   help="HOROVOD_CYCLE_TIME values to measure, e.g. 1,5,10,20")
    p.add_argument("--controllers", type=arguments.csv_list(str, ("gloo", "mpi")), default=["gloo", "mpi"])
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle Horovod measured")
    p.add_argument("--matmuls", type=int, default=400, help="384x384 matrix products per compute timing")
    add_out(p)
    add_worker(p)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    workers = Workers("horovod_cycle", argv, args.out, timeout_s=600)
    rows = [summarised(data) for controller in args.controllers for cycle in (f"{ms:g}" for ms in args.cycle_ms)
            for data in [workers.run(f"{controller}-{cycle}", f"horovodrun-{controller}", args.np,
                                     "benchmarks.horovod_cycle",
                                     ["--worker", "--idle-s", str(args.idle_s), "--matmuls", str(args.matmuls)],
                                     env={"HOROVOD_CYCLE_TIME": cycle}, controller=controller, cycle_time_ms=cycle)]
            if data is not None]
    return workers.publish(rows=rows)


if __name__ == "__main__":
    sys.exit(main())
