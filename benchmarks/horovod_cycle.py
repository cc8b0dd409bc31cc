"""What Horovod's background thread costs the compute beside it, per HOROVOD_CYCLE_TIME and controller.

Horovod's background thread wakes every HOROVOD_CYCLE_TIME ms (default 1) and, even with nothing to
reduce, agrees with the other ranks on the response cache (a small collective). On a machine whose
cores are all busy computing, each wake-up takes the core from the compute threads. This measures,
per rank, with no training involved:

- idle CPU: CPU seconds the process uses per wall second while Horovod is initialised and idle
  (CPU time, so it is not disturbed much by other load on the machine);
- compute slowdown: time of a fixed amount of single-thread matrix multiplication with Horovod idle
  in the background, against the same work timed before hvd.init() in the same process.

    python -m benchmarks.horovod_cycle --np 2 --cycle-ms 1,5,10,20 --out benchmarks/results

Writes DIR/horovod_cycle.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from common.compare import arguments, tables


DEFINITIONS = {"idle_cpu_mean": "CPU seconds per wall second of an idle initialised Horovod rank",
               "compute_slowdown": "single-thread matmul time with idle Horovod / without, minus 1"}


def _matmul_seconds(n_iters: int, size: int = 384) -> float:
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    started = time.perf_counter()
    for _ in range(n_iters):
        a @ b
    return time.perf_counter() - started


def worker(args) -> int:
    """One rank: time compute without Horovod, init Horovod, measure idle CPU, time compute again."""
    torch.set_num_threads(1)
    _matmul_seconds(20)  # warm-up
    before = min(_matmul_seconds(args.matmuls) for _ in range(3))
    import horovod.torch as hvd

    from common.launch.openmpi import MPI_YIELD_VARIABLE, yield_mpi_when_idle

    yield_mpi_when_idle(True, "the benchmark: on CPU")  # Open MPI waits as under hvd_train
    hvd.init()
    hvd.allreduce(torch.zeros(1), name="sync")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(args.idle_s)
    idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    after = min(_matmul_seconds(args.matmuls) for _ in range(3))
    row = torch.tensor([idle_cpu, before, after], dtype=torch.float64)
    rows = hvd.allgather(row.unsqueeze(0), name="rows")
    if hvd.rank() == 0:
        Path(args.result).write_text(json.dumps({
            "controller": "gloo" if hvd.gloo_enabled() else "mpi", "world_size": hvd.size(),
            "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", "1")),
            "mpi_yield_when_idle": os.environ[MPI_YIELD_VARIABLE] if hvd.mpi_enabled() else None,
            "idle_cpu_per_s": [float(r[0]) for r in rows],
            "compute_s_without": [float(r[1]) for r in rows], "compute_s_with": [float(r[2]) for r in rows]}))
    hvd.shutdown()
    return 0


def main(argv=None) -> int:
    from .jobs import add_np, add_out
    p = argparse.ArgumentParser(prog="python -m benchmarks.horovod_cycle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, 2)
    p.add_argument("--cycle-ms", type=arguments.csv_list(float, minimum=0), default=[1, 5, 10, 20],
                   help="HOROVOD_CYCLE_TIME values to measure, e.g. 1,5,10,20")
    p.add_argument("--controllers", type=arguments.csv_list(str, ("gloo", "mpi")), default=["gloo", "mpi"])
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle Horovod measured")
    p.add_argument("--matmuls", type=int, default=400, help="384x384 matrix products per compute timing")
    add_out(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from .jobs import Workers
    from .machine import Record, publish

    record = Record("horovod_cycle", argv)
    rows = []
    workers = Workers("horovod_cycle", args.out, timeout_s=600)
    for controller in args.controllers:
        for cycle in (f"{ms:g}" for ms in args.cycle_ms):
            data = workers.run(f"{controller}-{cycle}", f"horovodrun-{controller}", args.np, "benchmarks.horovod_cycle",
                               ["--worker", "--idle-s", str(args.idle_s), "--matmuls", str(args.matmuls)],
                               env={"HOROVOD_CYCLE_TIME": cycle}, controller=controller, cycle_time_ms=cycle)
            if data is not None:
                data["idle_cpu_mean"] = sum(data["idle_cpu_per_s"]) / len(data["idle_cpu_per_s"])
                data["compute_slowdown"] = (sum(data["compute_s_with"]) / sum(data["compute_s_without"])) - 1
                rows.append(data)
    report = {**record.header(), "definitions": DEFINITIONS, "rows": rows, "failures": workers.failures}
    return publish(report, args.out / "horovod_cycle.json", tables.text(
        ["controller", "cycle ms", "idle CPU % of a core", "compute slowdown"],
        [[r["controller"], f"{r['cycle_time_ms']:g}", f"{100 * r['idle_cpu_mean']:.1f}",
          f"{100 * r['compute_slowdown']:+.1f}%"] for r in rows]))


if __name__ == "__main__":
    sys.exit(main())
