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

    from hvd_train.backend import MPI_YIELD_VARIABLE, yield_mpi_when_idle

    yield_mpi_when_idle(torch.device("cpu"))  # Open MPI waits as under hvd_train
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
    p = argparse.ArgumentParser(prog="python -m benchmarks.horovod_cycle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--cycle-ms", default="1,5,10,20", help="HOROVOD_CYCLE_TIME values to measure")
    p.add_argument("--controllers", default="gloo,mpi")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle Horovod measured")
    p.add_argument("--matmuls", type=int, default=400, help="384x384 matrix products per compute timing")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from .jobs import JobFailed, run_job, worker_command
    from .machine import cores, load, machine, print_table, under_load, write_json

    load_before = load()
    rows, failures = [], []
    for controller in [c for c in args.controllers.split(",") if c]:
        for cycle in [c for c in args.cycle_ms.split(",") if c]:
            result = args.out / f"horovod_cycle-{controller}-{cycle}.part.json"
            cmd = worker_command(f"horovodrun-{controller}", args.np, "benchmarks.horovod_cycle",
                                 ["--worker", "--result", str(result.resolve()), "--idle-s", str(args.idle_s),
                                  "--matmuls", str(args.matmuls)])
            try:
                run_job(cmd, args.out / "logs" / f"horovod_cycle-{controller}-{cycle}.log", 600,
                        env={"HOROVOD_CYCLE_TIME": cycle})
                data = json.loads(result.read_text())
                result.unlink()
            except (JobFailed, OSError, ValueError) as exc:
                failures.append({"controller": controller, "cycle_time_ms": cycle, "error": str(exc)[-2000:]})
                print(f"horovod_cycle: FAILED {controller} {cycle} ms: {str(exc).splitlines()[0]}", file=sys.stderr)
                continue
            data["idle_cpu_mean"] = sum(data["idle_cpu_per_s"]) / len(data["idle_cpu_per_s"])
            data["compute_slowdown"] = (sum(data["compute_s_with"]) / sum(data["compute_s_without"])) - 1
            rows.append(data)
    report = {"benchmark": "horovod_cycle", "machine": machine(), "load_before": load_before, "load_after": load(),
              "under_load": under_load(load_before, cores()),
              "command": "python -m benchmarks.horovod_cycle " + " ".join(sys.argv[1:] if argv is None else argv),
              "definitions": {"idle_cpu_mean": "CPU seconds per wall second of an idle initialised Horovod rank",
                              "compute_slowdown": "single-thread matmul time with idle Horovod / without, minus 1"},
              "rows": rows, "failures": failures}
    write_json(args.out / "horovod_cycle.json", report)
    print_table(["controller", "cycle ms", "idle CPU % of a core", "compute slowdown"],
                [[r["controller"], f"{r['cycle_time_ms']:g}", f"{100 * r['idle_cpu_mean']:.1f}",
                  f"{100 * r['compute_slowdown']:+.1f}%"] for r in rows])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
