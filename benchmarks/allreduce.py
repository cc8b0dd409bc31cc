"""Allreduce latency and bus bandwidth against message size, for torch.distributed (torchrun),
Horovod (horovodrun --gloo / --mpi) and Open MPI alone (mpirun, mpi4py: what Horovod's MPI
controller calls underneath), next to two bounds measured on the same machine: the memory-copy
bandwidth (the limit) and the copy/add floor of a copy-based ring allreduce.

    python -m benchmarks.allreduce --np 2,4 --out benchmarks/results
    python -m benchmarks.allreduce --np 2 --min-bytes 4 --max-bytes 1M --iters 2 --out /tmp/ar
    python -m benchmarks.allreduce --np 2 --backends mpi,horovod-mpi --min-bytes 64M --max-bytes 64M \
        --mpi-algorithms default,ring,rabenseifner --out /tmp/algorithms
    python -m benchmarks.allreduce --hosts node0:1,node1:1 --np 2 --out /tmp/across   # across hosts

With --hosts (horovodrun's -H syntax) each world size is placed on the hosts in order and the bus
bandwidth is also given against the link that joins them (the speed of the interface that reaches the
second host, from /sys/class/net/IFACE/speed): busbw_of_link.

busbw = algbw x 2(n-1)/n with algbw = bytes / time per op (nccl-tests' definitions); time per op
is the slowest rank's mean over the timed iterations. --mpi-algorithms measures the Open MPI series
once per allreduce algorithm Open MPI is told to use. Writes DIR/allreduce.json and
DIR/allreduce.png and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from common.compare import arguments, tables
from common.errors import print_error
from common.launch.hosts import DEFAULT_PORT

from .allreduce_worker import MPI_ALGORITHM_VARIABLE
from .jobs import Workers, add_np, add_out, add_timeout, run_cli
from .machine import Record, cores, figure_title, load_note, write_json

#: series name -> launcher that starts it
SERIES = {"torch": "torchrun", "horovod-gloo": "horovodrun-gloo", "horovod-mpi": "horovodrun-mpi", "mpi": "mpirun"}
#: series name -> allreduce_worker --backend
WORKER_BACKEND = {"torch": "torch", "horovod-gloo": "horovod", "horovod-mpi": "horovod", "mpi": "mpi"}
#: Open MPI's allreduce algorithms by name -> coll_tuned_allreduce_algorithm (`ompi_info --param coll tuned
#: --level 9`); "default" leaves Open MPI's own decision rules in charge
MPI_ALGORITHMS = {"default": None, "basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
                  "segmented_ring": 5, "rabenseifner": 6}
#: the series whose allreduce is Open MPI's
OPEN_MPI_SERIES = ("mpi", "horovod-mpi")


def _best_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """Fastest of `repeats` timed calls, after one untimed call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    return min(times)


def copy_bandwidth(nbytes: int, repeats: int = 5) -> Dict[str, float]:
    """Memory-copy bandwidth (bytes copied per second, best of `repeats`) with one thread and with
    all cores; on a GPU also device-to-device. The faster CPU copy is the limit on CPU: a CPU
    allreduce moves every byte through memory at least once, so it cannot beat a plain copy."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731
    threads = torch.get_num_threads()
    out = {"bytes": nbytes}
    try:
        torch.set_num_threads(1)
        out["cpu_1thread_GBps"] = gbps(_best_seconds(lambda: dst.copy_(src), repeats))
        torch.set_num_threads(cores())
        out["cpu_all_cores_GBps"] = gbps(_best_seconds(lambda: dst.copy_(src), repeats))
    finally:
        torch.set_num_threads(threads)
    # The better of the two: on a busy or small machine the threads can get in each other's way.
    best_threads = 1 if out["cpu_1thread_GBps"] >= out["cpu_all_cores_GBps"] else cores()
    out["limit_GBps"] = max(out["cpu_1thread_GBps"], out["cpu_all_cores_GBps"])
    size = tables.size(nbytes, spaced=False)
    out["limit"] = f"CPU memory copy, {best_threads} thread(s), torch.Tensor.copy_ of {size}B"
    if torch.cuda.is_available():
        g_src, g_dst = src.cuda(), dst.cuda()
        out["cuda_device_GBps"] = gbps(_best_seconds(lambda: g_dst.copy_(g_src), repeats, torch.cuda.synchronize))
        out["limit_GBps"] = out["cuda_device_GBps"]
        out["limit"] = f"GPU device memory copy ({size}B)"
    return out


def copy_add_floor(nbytes: int, limit_GBps: float, repeats: int = 5) -> Dict:
    """The least time a copy-based ring allreduce can take on this CPU, from what one thread (one rank's
    share of the cores, two ranks on two cores) copies and adds per second on `nbytes` buffers.

    Per rank, a ring allreduce of S bytes over n ranks receives (n-1)/n x S into its memory (a copy), adds
    it into its own (reads both, writes one) and copies the reduced rest back out: (n-1)/n x S bytes
    copied twice and added once. So time >= (n-1)/n x S x (2/copy + 1/add) and busbw = algbw x 2(n-1)/n
    <= 2 / (2/copy + 1/add), whatever S and n."""
    src = torch.zeros(nbytes // 4, dtype=torch.float32)  # zeros: sums stay zero, no denormals
    dst = torch.zeros_like(src)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        copy_s = _best_seconds(lambda: dst.copy_(src), repeats)
        add_s = _best_seconds(lambda: dst.add_(src), repeats)
    finally:
        torch.set_num_threads(threads)
    copy, add = nbytes / copy_s / 1e9, nbytes / add_s / 1e9
    busbw = 2 / (2 / copy + 1 / add)
    return {"bytes": nbytes, "threads": 1, "copy_s": copy_s, "add_s": add_s, "copy_GBps": copy, "add_GBps": add,
            "busbw_GBps": busbw, "of_limit": busbw / limit_GBps}


def floor_seconds(nbytes: int, world_size: int, floor: Dict) -> float:
    """The copy/add floor's time for one allreduce of `nbytes` over `world_size` ranks."""
    return nbytes * 2 * (world_size - 1) / world_size / floor["busbw_GBps"] / 1e9


def algorithm_env(name: Optional[str]) -> Dict[str, str]:
    """The environment that makes Open MPI (and mpirun's ranks) use allreduce algorithm `name`."""
    number = MPI_ALGORITHMS[name] if name else None
    if number is None:
        return {}
    return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", MPI_ALGORITHM_VARIABLE: str(number)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.allreduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, [2, 4], "world sizes, e.g. 2,4", dest="world_sizes")
    p.add_argument("--backends", default=",".join(SERIES),
                   help=f"comma-separated, from {', '.join(SERIES)}")
    add_out(p, "where the JSON and PNG go")
    p.add_argument("--min-bytes", type=arguments.byte_size, default=4)
    p.add_argument("--max-bytes", type=arguments.byte_size, default=256 * 2**20)
    p.add_argument("--factor", type=int, choices=(2, 4), default=4, help="message size step")
    p.add_argument("--warmup", type=int, default=3, help="untimed allreduces before each size")
    p.add_argument("--iters", type=int, default=None,
                   help="timed allreduces per size (default: 200 for small messages down to 5 for large)")
    p.add_argument("--copy-bytes", type=arguments.byte_size, default=None,
                   help="buffer for the memory-copy limit (default: max(--max-bytes, 64M)); the copy/add floor "
                        "is measured on half of it (one rank's half of the largest message at world size 2)")
    p.add_argument("--mpi-algorithms", type=arguments.csv_list(str, tuple(MPI_ALGORITHMS)), default=None,
                   help="measure the Open MPI series (mpi, horovod-mpi) once per allreduce algorithm, e.g. "
                        "default,ring,rabenseifner (sets OMPI_MCA_coll_tuned_use_dynamic_rules=1 and "
                        "OMPI_MCA_coll_tuned_allreduce_algorithm=N)")
    add_timeout(p, 1800, "seconds before one launch is stopped")
    p.add_argument("--hosts", "-H", default=None, metavar="HOST:SLOTS,...",
                   help="run across these hosts (node0:1,node1:1), each world size placed on them in order; needs "
                        "passwordless ssh and the same paths on every host (check with python -m common.doctor)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="with --hosts: torchrun's rendezvous port on the first host for the first job (job i: +i)")
    return p


def link_speed(hosts: str) -> Optional[Dict]:
    """The link from this host to the first other host of `hosts`: interface, address and speed (bytes/s
    from /sys/class/net/IFACE/speed, None where the interface does not report one). None on one host."""
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


def _fail(message: str) -> int:
    print_error("allreduce", message, ranked=False)
    return 2


def main(argv=None) -> int:
    """Run every backend at every world size; exit 1 when a launch failed (the rest is still written)."""
    args = build_parser().parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in SERIES]
    if unknown or not backends:
        return _fail(f"unknown backend {', '.join(unknown) or '(none)'}; choose from {', '.join(SERIES)}")
    if args.min_bytes > args.max_bytes:
        return _fail("--min-bytes is larger than --max-bytes; swap them")
    not_mpi = [b for b in backends if b not in OPEN_MPI_SERIES]
    if args.mpi_algorithms and not_mpi:
        return _fail(f"--mpi-algorithms chooses Open MPI's algorithm; {','.join(not_mpi)} do not use Open MPI, "
                     f"so measure them without it (--backends {','.join(OPEN_MPI_SERIES)})")
    if args.hosts:
        from common.launch.hosts import parse_hosts, place

        try:
            for np in args.world_sizes:
                place(parse_hosts(args.hosts), np)
        except ValueError as exc:
            return _fail(str(exc))
    record = Record("allreduce", argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    copy_bytes = args.copy_bytes or max(args.max_bytes, 64 * 2**20)
    limit = copy_bandwidth(copy_bytes)
    floor = copy_add_floor(copy_bytes // 2, limit["limit_GBps"])
    print(f"memory copy: {limit['cpu_1thread_GBps']:.1f} GB/s one thread, {limit['cpu_all_cores_GBps']:.1f} GB/s "
          f"{cores()} threads; limit {limit['limit_GBps']:.1f} GB/s; copy/add floor of a ring allreduce "
          f"{floor['busbw_GBps']:.1f} GB/s busbw", flush=True)

    worker_args = ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                   "--factor", str(args.factor), "--warmup", str(args.warmup)]
    if args.iters:
        worker_args += ["--iters", str(args.iters)]
    series = []
    workers = Workers("allreduce", out, args.timeout, hosts=args.hosts, port=args.port)
    link = link_speed(args.hosts) if args.hosts else None
    if link:
        speed = f"{link['speed_Mbps']} Mb/s = {link['GBps']:.3f} GB/s" if link["GBps"] else "speed not reported"
        print(f"link: {link['interface']} ({link['address']}) to {link['to']}, {speed}", flush=True)
    for np in args.world_sizes:
        for name in backends:
            for algorithm in args.mpi_algorithms or [None]:
                shown = f"{name} {algorithm}" if algorithm else name
                print(f"allreduce: {shown} x{np} via {SERIES[name]} ...", flush=True)
                started = time.monotonic()
                data = workers.run(f"{name}-{algorithm}-{np}" if algorithm else f"{name}-{np}", SERIES[name], np,
                                   "benchmarks.allreduce_worker", ["--backend", WORKER_BACKEND[name], *worker_args],
                                   env=algorithm_env(algorithm), backend=name, world_size=np, mpi_algorithm=algorithm)
                if data is None:
                    continue
                for row in data["results"]:
                    row["busbw_of_limit"] = row["busbw_GBps"] / limit["limit_GBps"]
                    row["floor_time_s"] = floor_seconds(row["bytes"], np, floor)
                    if link and link["GBps"]:
                        row["busbw_of_link"] = row["busbw_GBps"] / link["GBps"]
                series.append({"name": data["backend"], "launcher": SERIES[name], "world_size": np,
                               "device": data["device"], "command": workers.last_command,
                               "seconds": time.monotonic() - started, "mpi_algorithm": algorithm,
                               "mpi_algorithm_env": data.get("mpi_algorithm_env"),
                               "mpi_yield_when_idle": data.get("mpi_yield_when_idle"),
                               "placement": workers.last_placement,
                               "results": data["results"]})

    report = {**record.header(),
              "definitions": {"time_s": "slowest rank's mean seconds per allreduce",
                              "algbw_GBps": "bytes / time_s / 1e9",
                              "busbw_GBps": "algbw x 2(n-1)/n (nccl-tests)",
                              "busbw_of_limit": "busbw / memory-copy limit",
                              "floor": "least time of a copy-based ring allreduce: per rank (n-1)/n of the bytes "
                                       "copied twice and added once, at one thread's copy_ and add_ speed",
                              "floor_time_s": "that least time for this message and world size",
                              "busbw_of_link": "busbw / the speed of the link to the other hosts (--hosts)"},
              "hosts": args.hosts, "link": link, "memcpy": limit, "floor": floor, "series": series, "failures": workers.failures}
    report["plot"] = plot(report, out)
    write_json(out / "allreduce.json", report)
    print_summary(report)
    print(f"allreduce: wrote {(out / 'allreduce.json').resolve()} and {(out / report['plot']).resolve()}")
    return 1 if workers.failures else 0


def print_summary(report: Dict) -> None:
    """One row per size: time (µs) and busbw (GB/s, % of the limit) of every series."""
    series = report["series"]
    if not series:
        print("allreduce: nothing measured")
        return
    sizes = sorted({r["bytes"] for s in series for r in s["results"]})
    headers = ["bytes"]
    for s in series:
        tag = f"{s['name']}{'-' + s['mpi_algorithm'] if s.get('mpi_algorithm') else ''}x{s['world_size']}"
        headers += [f"{tag} us", f"{tag} busbw", "%lim"]
    rows = []
    for size in sizes:
        row: List = [tables.size(size, spaced=False)]
        for s in series:
            r = next((r for r in s["results"] if r["bytes"] == size), None)
            row += ["-", "-", "-"] if r is None else [
                f"{r['time_s'] * 1e6:.1f}", f"{r['busbw_GBps']:.3f}", f"{100 * r['busbw_of_limit']:.1f}" +
                (f" ({100 * r['busbw_of_link']:.1f}% link)" if "busbw_of_link" in r else "")]
        rows.append(row)
    print(tables.text(headers, rows))
    note = load_note(report)
    if note:
        print(note)


def plot(report: Dict, out: Path) -> str:
    """allreduce.png: latency and bus bandwidth against message size, the copy limit and the copy/add
    floor dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.compare import speed_plots

    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in report["series"]:
        xs = [r["bytes"] for r in s["results"]]
        label = f"{s['name']}{' ' + s['mpi_algorithm'] if s.get('mpi_algorithm') else ''} x{s['world_size']}"
        line, = ax_t.plot(xs, [r["time_s"] * 1e6 for r in s["results"]], marker="o", ms=3, label=label)
        ax_bw.plot(xs, [r["busbw_GBps"] for r in s["results"]], marker="o", ms=3, label=label,
                   color=line.get_color())
    ax_bw.axhline(report["memcpy"]["limit_GBps"], color="gray", ls=":",
                  label=f"memory copy {report['memcpy']['limit_GBps']:.1f} GB/s")
    ax_bw.axhline(report["floor"]["busbw_GBps"], color="black", ls=":",
                  label=f"copy/add floor {report['floor']['busbw_GBps']:.1f} GB/s")
    link = report.get("link") or {}
    if link.get("GBps"):
        ax_bw.axhline(link["GBps"], color="tab:red", ls="--",
                      label=f"link {link['interface']} {link['speed_Mbps']} Mb/s ({link['GBps']:.2f} GB/s)")
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time per allreduce (µs)",
             title="Allreduce latency")
    ax_bw.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
              title="Allreduce bus bandwidth vs memory-copy limit")
    fig.suptitle(figure_title(report), fontsize=9)
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return speed_plots.save(fig, out / "allreduce.png")


if __name__ == "__main__":
    sys.exit(run_cli(main, "allreduce"))
