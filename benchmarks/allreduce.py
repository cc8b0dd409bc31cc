"""Allreduce latency and bus bandwidth against message size, for torch.distributed (torchrun),
Horovod (horovodrun --gloo / --mpi) and Open MPI alone (mpirun, mpi4py: what Horovod's MPI
controller calls underneath), next to the machine's memory-copy bandwidth as the limit.

    python -m benchmarks.allreduce --np 2,4 --out benchmarks/results
    python -m benchmarks.allreduce --np 2 --min-bytes 4 --max-bytes 1M --iters 2 --out /tmp/ar

busbw = algbw x 2(n-1)/n with algbw = bytes / time per op (nccl-tests' definitions); time per op
is the slowest rank's mean over the timed iterations. Writes DIR/allreduce.json and
DIR/allreduce.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

from .jobs import JobFailed, run_cli, run_job, worker_command
from .machine import cores, load, machine, print_table, under_load, write_json, csv_ints

#: series name -> launcher that starts it
SERIES = {"torch": "torchrun", "horovod-gloo": "horovodrun-gloo", "horovod-mpi": "horovodrun-mpi", "mpi": "mpirun"}
#: series name -> allreduce_worker --backend
WORKER_BACKEND = {"torch": "torch", "horovod-gloo": "horovod", "horovod-mpi": "horovod", "mpi": "mpi"}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(text: str) -> int:
    """'4', '64K', '256M', '1G' (binary units) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text.upper())
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 4, 64K, 256M")
    return int(m.group(1)) * UNITS[m.group(2)]


def human(nbytes: float) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= UNITS[unit]:
            return f"{nbytes / UNITS[unit]:g}{unit}"
    return f"{nbytes:g}"


def copy_bandwidth(nbytes: int, repeats: int = 5) -> Dict[str, float]:
    """Memory-copy bandwidth (bytes copied per second, best of `repeats`) with one thread and with
    all cores; on a GPU also device-to-device. The faster CPU copy is the limit on CPU: a CPU
    allreduce moves every byte through memory at least once, so it cannot beat a plain copy."""

    def best(src: torch.Tensor, dst: torch.Tensor, sync=lambda: None) -> float:
        dst.copy_(src)
        sync()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            dst.copy_(src)
            sync()
            times.append(time.perf_counter() - started)
        return src.numel() * src.element_size() / min(times) / 1e9

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    threads = torch.get_num_threads()
    out = {"bytes": nbytes}
    try:
        torch.set_num_threads(1)
        out["cpu_1thread_GBps"] = best(src, dst)
        torch.set_num_threads(cores())
        out["cpu_all_cores_GBps"] = best(src, dst)
    finally:
        torch.set_num_threads(threads)
    # The better of the two: on a busy or small machine the threads can get in each other's way.
    best_threads = 1 if out["cpu_1thread_GBps"] >= out["cpu_all_cores_GBps"] else cores()
    out["limit_GBps"] = max(out["cpu_1thread_GBps"], out["cpu_all_cores_GBps"])
    out["limit"] = f"CPU memory copy, {best_threads} thread(s), torch.Tensor.copy_ of {human(nbytes)}B"
    if torch.cuda.is_available():
        g_src, g_dst = src.cuda(), dst.cuda()
        out["cuda_device_GBps"] = best(g_src, g_dst, torch.cuda.synchronize)
        out["limit_GBps"] = out["cuda_device_GBps"]
        out["limit"] = f"GPU device memory copy ({human(nbytes)}B)"
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.allreduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", dest="world_sizes", type=csv_ints, default=[2, 4], help="world sizes, e.g. 2,4")
    p.add_argument("--backends", default=",".join(SERIES),
                   help=f"comma-separated, from {', '.join(SERIES)}")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="where the JSON and PNG go")
    p.add_argument("--min-bytes", type=parse_bytes, default=4)
    p.add_argument("--max-bytes", type=parse_bytes, default=256 * 2**20)
    p.add_argument("--factor", type=int, choices=(2, 4), default=4, help="message size step")
    p.add_argument("--warmup", type=int, default=3, help="untimed allreduces before each size")
    p.add_argument("--iters", type=int, default=None,
                   help="timed allreduces per size (default: 200 for small messages down to 5 for large)")
    p.add_argument("--copy-bytes", type=parse_bytes, default=None,
                   help="buffer for the memory-copy limit (default: max(--max-bytes, 64M))")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before one launch is stopped")
    return p


def main(argv=None) -> int:
    """Run every backend at every world size; exit 1 when a launch failed (the rest is still written)."""
    args = build_parser().parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in SERIES]
    if unknown or not backends:
        print(f"allreduce: error: unknown backend {', '.join(unknown) or '(none)'}; choose from "
              f"{', '.join(SERIES)}", file=sys.stderr)
        return 2
    if args.min_bytes > args.max_bytes:
        print("allreduce: error: --min-bytes is larger than --max-bytes; swap them", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    load_before = load()
    started = time.time()
    limit = copy_bandwidth(args.copy_bytes or max(args.max_bytes, 64 * 2**20))
    print(f"memory copy: {limit['cpu_1thread_GBps']:.1f} GB/s one thread, {limit['cpu_all_cores_GBps']:.1f} GB/s "
          f"{cores()} threads; limit {limit['limit_GBps']:.1f} GB/s", flush=True)

    worker_args = ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                   "--factor", str(args.factor), "--warmup", str(args.warmup)]
    if args.iters:
        worker_args += ["--iters", str(args.iters)]
    series, failures = [], []
    for np in args.world_sizes:
        for name in backends:
            launcher = SERIES[name]
            result_file = out / f"allreduce-{name}-{np}.part.json"
            cmd = worker_command(launcher, np, "benchmarks.allreduce_worker",
                                 ["--backend", WORKER_BACKEND[name],
                                  "--result", str(result_file.resolve()), *worker_args])
            print(f"allreduce: {name} x{np} via {launcher} ...", flush=True)
            try:
                seconds = run_job(cmd, logs / f"allreduce-{name}-{np}.log", args.timeout)
                data = json.loads(result_file.read_text())
                result_file.unlink()
            except (JobFailed, OSError, ValueError) as exc:
                print(f"allreduce: FAILED {name} x{np}: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
                failures.append({"backend": name, "world_size": np, "launcher": launcher,
                                 "command": " ".join(cmd), "error": str(exc)[-2000:]})
                continue
            for row in data["results"]:
                row["busbw_of_limit"] = row["busbw_GBps"] / limit["limit_GBps"]
            series.append({"name": data["backend"], "launcher": launcher, "world_size": np,
                           "device": data["device"], "command": " ".join(cmd), "seconds": seconds,
                           "mpi_yield_when_idle": data.get("mpi_yield_when_idle"),
                           "results": data["results"]})

    load_after = load()
    n_cores = cores()
    report = {"benchmark": "allreduce", "started": started, "machine": machine(),
              "command": "python -m benchmarks.allreduce " + " ".join(argv if argv is not None else sys.argv[1:]),
              "load_before": load_before, "load_after": load_after,
              "under_load": under_load(load_before, n_cores),
              "definitions": {"time_s": "slowest rank's mean seconds per allreduce",
                              "algbw_GBps": "bytes / time_s / 1e9",
                              "busbw_GBps": "algbw x 2(n-1)/n (nccl-tests)",
                              "busbw_of_limit": "busbw / memory-copy limit"},
              "memcpy": limit, "series": series, "failures": failures}
    report["plot"] = plot(report, out)
    write_json(out / "allreduce.json", report)
    print_summary(report)
    print(f"allreduce: wrote {(out / 'allreduce.json').resolve()} and {(out / report['plot']).resolve()}")
    return 1 if failures else 0


def print_summary(report: Dict) -> None:
    """One row per size: time (µs) and busbw (GB/s, % of the limit) of every series."""
    series = report["series"]
    if not series:
        print("allreduce: nothing measured")
        return
    sizes = sorted({r["bytes"] for s in series for r in s["results"]})
    headers = ["bytes"]
    for s in series:
        tag = f"{s['name']}x{s['world_size']}"
        headers += [f"{tag} us", f"{tag} busbw", "%lim"]
    rows = []
    for size in sizes:
        row: List = [human(size)]
        for s in series:
            r = next((r for r in s["results"] if r["bytes"] == size), None)
            row += ["-", "-", "-"] if r is None else [
                f"{r['time_s'] * 1e6:.1f}", f"{r['busbw_GBps']:.3f}", f"{100 * r['busbw_of_limit']:.1f}"]
        rows.append(row)
    print_table(headers, rows)
    if report["under_load"]:
        print(f"note: measured under load (1-minute load {report['load_before']['1m']} on "
              f"{report['machine']['cores']} cores before starting)")


def plot(report: Dict, out: Path) -> str:
    """allreduce.png: latency and bus bandwidth against message size, the copy limit dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in report["series"]:
        xs = [r["bytes"] for r in s["results"]]
        label = f"{s['name']} x{s['world_size']}"
        line, = ax_t.plot(xs, [r["time_s"] * 1e6 for r in s["results"]], marker="o", ms=3, label=label)
        ax_bw.plot(xs, [r["busbw_GBps"] for r in s["results"]], marker="o", ms=3, label=label,
                   color=line.get_color())
    ax_bw.axhline(report["memcpy"]["limit_GBps"], color="gray", ls=":",
                  label=f"memory copy {report['memcpy']['limit_GBps']:.1f} GB/s")
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time per allreduce (µs)",
             title="Allreduce latency")
    ax_bw.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
              title="Allreduce bus bandwidth vs memory-copy limit")
    loaded = " (under load)" if report["under_load"] else ""
    fig.suptitle(f"{report['machine']['cpu_model']}, {report['machine']['cores']} cores{loaded}", fontsize=9)
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "allreduce.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


if __name__ == "__main__":
    sys.exit(run_cli(main, "allreduce"))
