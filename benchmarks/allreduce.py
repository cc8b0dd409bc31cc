"""Allreduce latency and bus bandwidth against message size: torch.distributed (torchrun), Horovod (horovodrun
--gloo / --mpi) and Open MPI alone (mpirun, mpi4py), against the memory-copy bandwidth (the limit) and the copy/add
floor of a copy-based ring allreduce, both measured here. busbw = algbw x 2(n-1)/n (nccl-tests).

    python -m benchmarks.allreduce --np 2,4 --out benchmarks/results
    python -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi --min-bytes 64M --max-bytes 64M \\
        --mpi-algorithms default,ring,rabenseifner --out /tmp/algorithms
    python -m benchmarks.allreduce --hosts node0:1,node1:1 --np 2 --out /tmp/across   # also against the link

Writes DIR/allreduce.json and DIR/allreduce.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from argparse import ArgumentParser
from typing import Any, Callable, Sequence

import torch

from common.compare import arguments, tables
from common.launch.hosts import DEFAULT_PORT

from .allreduce_worker import MPI_ALGORITHM_VARIABLE
from .jobs import Env, Workers, add_np, add_out, add_timeout, parser, refuse, run_cli
from .machine import cores, figure_title, publish

#: series name -> (launcher that starts it, allreduce_worker --backend)
SERIES = {"torch": ("torchrun", "torch"), "horovod-gloo": ("horovodrun-gloo", "horovod"),
          "horovod-mpi": ("horovodrun-mpi", "horovod"), "mpi": ("mpirun", "mpi")}
#: Open MPI's allreduce algorithms -> coll_tuned_allreduce_algorithm (`ompi_info --param coll tuned --level 9`);
#: "default" leaves Open MPI's own decision rules in charge
MPI_ALGORITHMS = {"default": None, "basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
                  "segmented_ring": 5, "rabenseifner": 6}
OPEN_MPI_SERIES = ("mpi", "horovod-mpi")


def best_seconds(fn: Callable[[], object], repeats: int, threads: int = 1,
                 sync: Callable[[], object] = lambda: None) -> float:
    """Fastest of `repeats` timed calls with `threads` intra-op threads, after one untimed call."""
    before, times = torch.get_num_threads(), []
    try:
        torch.set_num_threads(threads)
        fn()
        for _ in range(repeats):
            sync()
            started = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(before)
    return min(times)


def copy_bandwidth(nbytes: int, repeats: int = 5) -> dict[str, Any]:
    """Memory-copy bandwidth (bytes copied per second) with one thread and with all cores, the better of the two
    the limit on CPU (a CPU allreduce moves every byte through memory at least once); on a GPU device to device."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    one, every = (nbytes / best_seconds(lambda: dst.copy_(src), repeats, n) / 1e9 for n in (1, cores()))
    size = tables.size(nbytes, spaced=False)
    out = {"bytes": nbytes, "cpu_1thread_GBps": one, "cpu_all_cores_GBps": every, "limit_GBps": max(one, every),
           "limit": f"CPU memory copy, {1 if one >= every else cores()} thread(s), torch.Tensor.copy_ of {size}B"}
    if torch.cuda.is_available():
        g_src, g_dst = src.cuda(), dst.cuda()
        out["cuda_device_GBps"] = out["limit_GBps"] = nbytes / best_seconds(
            lambda: g_dst.copy_(g_src), repeats, sync=torch.cuda.synchronize) / 1e9
        out["limit"] = f"GPU device memory copy ({size}B)"
    return out


def copy_add_floor(nbytes: int, limit_GBps: float, repeats: int = 5) -> dict[str, Any]:
    """The least time a copy-based ring allreduce can take on this CPU, from what one thread (one rank's share of
    the cores) copies and adds per second on `nbytes` buffers. Per rank, a ring allreduce of S bytes over n ranks
    copies (n-1)/n x S in, adds it into its own and copies the reduced rest out: time >= (n-1)/n x S x (2/copy +
    1/add), so busbw <= 2 / (2/copy + 1/add), whatever S and n."""
    src = torch.zeros(nbytes // 4, dtype=torch.float32)  # zeros: sums stay zero, no denormals
    dst = torch.zeros_like(src)
    copy_s, add_s = best_seconds(lambda: dst.copy_(src), repeats), best_seconds(lambda: dst.add_(src), repeats)
    copy, add = nbytes / copy_s / 1e9, nbytes / add_s / 1e9
    busbw = 2 / (2 / copy + 1 / add)
    return {"bytes": nbytes, "threads": 1, "copy_s": copy_s, "add_s": add_s, "copy_GBps": copy, "add_GBps": add,
            "busbw_GBps": busbw, "of_limit": busbw / limit_GBps}


def against_bounds(rows: list[dict[str, Any]], world_size: int, limit_GBps: float, floor_busbw_GBps: float,
                   link_GBps: float | None = None) -> list[dict[str, Any]]:
    """A worker's rows with busbw against the limit (and the link), and the copy/add floor's time for each size."""
    for row in rows:
        row["busbw_of_limit"] = row["busbw_GBps"] / limit_GBps
        row["floor_time_s"] = row["bytes"] * 2 * (world_size - 1) / world_size / floor_busbw_GBps / 1e9
        if link_GBps:
            row["busbw_of_link"] = row["busbw_GBps"] / link_GBps
    return rows


def link_speed(hosts: str) -> dict[str, Any] | None:
    """The link from this host to the first other host of `hosts`: interface, address and speed (None where the
    interface reports none). None on one host."""
    from common.launch.hosts import is_local, parse_hosts, resolve, route_to

    remote = next((h for h, _ in parse_hosts(hosts) if not is_local(h)), None)
    addresses = resolve(remote) if remote else []
    if not addresses:
        return None
    interface, source = route_to(addresses[0])
    try:
        mbps = int(Path(f"/sys/class/net/{interface}/speed").read_text().strip())
    except (OSError, ValueError):
        mbps = -1
    return {"interface": interface, "address": source, "to": remote, "speed_Mbps": mbps if mbps > 0 else None,
            "GBps": mbps / 8 / 1000 if mbps > 0 else None}


def build_parser() -> ArgumentParser:
    p = parser("allreduce", __doc__)
    add_np(p, [2, 4], "world sizes, e.g. 2,4", dest="world_sizes")
    p.add_argument("--backends", type=arguments.csv_list(str, tuple(SERIES)), default=",".join(SERIES),
                   help=f"comma-separated, from {', '.join(SERIES)}")
    add_out(p, "where the JSON and PNG go")
    p.add_argument("--min-bytes", type=arguments.byte_size, default=4)
    p.add_argument("--max-bytes", type=arguments.byte_size, default=256 * 2**20)
    p.add_argument("--factor", type=int, choices=(2, 4), default=4, help="message size step")
    p.add_argument("--warmup", type=int, default=3, help="untimed allreduces before each size")
    p.add_argument("--iters", type=int, default=None, help="timed allreduces per size (default: 200 down to 5 by size)")
    p.add_argument("--copy-bytes", type=arguments.byte_size, default=None,
                   help="buffer of the limit (default: max(--max-bytes, 64M)); the floor's is half of it")
    p.add_argument("--mpi-algorithms", type=arguments.csv_list(str, tuple(MPI_ALGORITHMS)), default=None,
                   help="the Open MPI series once per allreduce algorithm, e.g. default,ring,rabenseifner")
    add_timeout(p, 1800, "seconds before one launch is stopped")
    p.add_argument("--hosts", "-H", default=None, metavar="HOST:SLOTS,...",
                   help="run across these hosts (node0:1,node1:1), each world size placed on them in order")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="with --hosts: torchrun's first rendezvous port")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run every backend at every world size; exit 1 when a launch failed (the rest is still written)."""
    args = build_parser().parse_args(argv)
    backends = args.backends
    if args.min_bytes > args.max_bytes:
        return refuse("allreduce", "--min-bytes is larger than --max-bytes; swap them")
    not_mpi = [b for b in backends if b not in OPEN_MPI_SERIES]
    if args.mpi_algorithms and not_mpi:
        return refuse("allreduce", f"--mpi-algorithms chooses Open MPI's algorithm; {','.join(not_mpi)} do not use "
                                   f"Open MPI, so measure them without it (--backends {','.join(OPEN_MPI_SERIES)})")
    if args.hosts:
        from common.launch.hosts import parse_hosts, place

        try:
            for np in args.world_sizes:
                place(parse_hosts(args.hosts), np)
        except ValueError as exc:
            return refuse("allreduce", str(exc))
    workers = Workers("allreduce", argv, args.out, args.timeout, hosts=args.hosts, port=args.port)
    copy_bytes = args.copy_bytes or max(args.max_bytes, 64 * 2**20)
    limit = copy_bandwidth(copy_bytes)
    floor = copy_add_floor(copy_bytes // 2, limit["limit_GBps"])
    link = link_speed(args.hosts) if args.hosts else None
    worker_args = ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--factor",
                   str(args.factor), "--warmup", str(args.warmup)]
    worker_args += ["--iters", str(args.iters)] if args.iters else []
    series = []
    for np in args.world_sizes:
        for name in backends:
            for algorithm in args.mpi_algorithms or [None]:
                launcher, backend = SERIES[name]
                print(f"allreduce: {name} {algorithm or ''} x{np} via {launcher} ...", flush=True)
                number = MPI_ALGORITHMS[algorithm] if algorithm else None
                env: Env = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", MPI_ALGORITHM_VARIABLE: str(number)} \
                    if number else {}
                started = time.monotonic()
                data = workers.run("-".join(map(str, filter(None, (name, algorithm, np)))), launcher, np,
                                   "benchmarks.allreduce_worker", ["--backend", backend, *worker_args], env=env,
                                   backend=name, world_size=np, mpi_algorithm=algorithm)
                if data is not None:
                    series.append({"name": data["backend"], "launcher": launcher, "world_size": np,
                                   "device": data["device"], "command": workers.last_command,
                                   "seconds": time.monotonic() - started, "mpi_algorithm": algorithm,
                                   "mpi_algorithm_env": data.get("mpi_algorithm_env"),
                                   "mpi_yield_when_idle": data.get("mpi_yield_when_idle"),
                                   "placement": workers.last_placement,
                                   "results": against_bounds(data["results"], np, limit["limit_GBps"],
                                                             floor["busbw_GBps"], (link or {}).get("GBps"))})
    report = {**workers.record.header(), "hosts": args.hosts, "link": link, "memcpy": limit,
              "floor": floor, "series": series, "failures": workers.failures}
    report["plot"] = plot(report, args.out)
    return publish(report, args.out / "allreduce.json")


def plot(report: dict[str, Any], out: Path) -> str:
    """allreduce.png: latency and bus bandwidth against message size, the limit, the floor and the link dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.compare import speed_plots

    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in report["series"]:
        xs, label = [r["bytes"] for r in s["results"]], f"{s['name']} {s['mpi_algorithm'] or ''} x{s['world_size']}"
        line, = ax_t.plot(xs, [r["time_s"] * 1e6 for r in s["results"]], marker="o", ms=3, label=label)
        ax_bw.plot(xs, [r["busbw_GBps"] for r in s["results"]], marker="o", ms=3, label=label, color=line.get_color())
    link = report["link"] or {}
    for value, style, label in ((report["memcpy"]["limit_GBps"], ("gray", ":"), "memory copy"),
                                (report["floor"]["busbw_GBps"], ("black", ":"), "copy/add floor"),
                                (link.get("GBps"), ("tab:red", "--"), f"link {link.get('interface')}")):
        if value:
            ax_bw.axhline(value, color=style[0], ls=style[1], label=f"{label} {value:.2f} GB/s")
    ax_t.set(yscale="log", ylabel="time per allreduce (µs)", title="Allreduce latency")
    ax_bw.set(ylabel="bus bandwidth (GB/s)", title="Allreduce bus bandwidth vs memory-copy limit")
    fig.suptitle(figure_title(report), fontsize=9)
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return speed_plots.save(fig, out / "allreduce.png")


if __name__ == "__main__":
    sys.exit(run_cli(main, "allreduce"))
