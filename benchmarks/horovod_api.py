"""Horovod's own pytorch_synthetic_benchmark.py, unchanged, on the project's Horovod API (python -m
ddp_train.horovod_api under torchrun) against real Horovod with its Gloo and its MPI controller.

    python -m benchmarks.horovod_api --script HOROVOD/examples/pytorch/pytorch_synthetic_benchmark.py --repeats 3

Every run is the script at 2 ranks with one thread per rank (OMP_NUM_THREADS=1 for every launcher: torchrun sets it,
horovodrun does not), on synthetic images (resnet18 at 224 by default), as a user launches it:

- api:           torchrun --rdzv-backend loopback --nproc-per-node=2 -m ddp_train.horovod_api SCRIPT ARGS
- horovod-gloo:  horovodrun -np 2 -H localhost:2 --gloo python SCRIPT ARGS
- horovod-mpi:   horovodrun -np 2 -H localhost:2 --mpi python SCRIPT ARGS (Open MPI as it comes)

Each repeat runs the three once, every other repeat in the opposite order, so that the machine's drift falls on all
alike. A run's throughput is what the script prints: its total img/sec (ranks x the mean of its iterations). Reported
per backend: every repeat, the median, and the API's median over each Horovod's. Writes DIR/horovod_api.json.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common import launch
from common.compare import tables

from .jobs import JobFailed, add_out, add_timeout, run_cli, run_job
from .machine import Record, cores, publish

#: run label -> the registered launcher that starts it
LAUNCHERS = {"api": "torchrun", "horovod-gloo": "horovodrun-gloo", "horovod-mpi": "horovodrun-mpi"}
API_MODULE = "ddp_train.horovod_api"
TOTAL = re.compile(r"Total img/sec on (\d+) \S+: ([0-9.]+) \+-([0-9.]+)")


def command(label: str, np: int, script: Path, args: Sequence[str]) -> List[str]:
    """The command of one run: the API's module running the script under torchrun, or the script itself under
    horovodrun (the registered launcher's command with `-m hvd_train` replaced by the script)."""
    launcher = launch.get(LAUNCHERS[label])
    if label == "api":
        return launcher.command(np, [str(script), *args], module=API_MODULE, python=sys.executable)
    cmd = launcher.command(np, list(args), python=sys.executable)
    at = cmd.index("-m")
    return cmd[:at] + [str(script)] + cmd[at + 2:]


def throughput(output: str) -> Optional[float]:
    """The total img/sec the script printed, None when it printed none."""
    found = TOTAL.findall(output)
    return float(found[-1][1]) if found else None


def order(labels: Sequence[str], repeat: int) -> List[str]:
    """The runs of one repeat: in order, every other repeat reversed."""
    return list(labels) if repeat % 2 == 0 else list(reversed(labels))


def summarize(runs: Dict[str, List[float]]) -> Dict[str, Dict]:
    """Per backend: its repeats and their median and spread (max/min - 1)."""
    return {label: {"img_s": values, "median": statistics.median(values),
                    "spread": (max(values) / min(values) - 1) if min(values) > 0 else None}
            for label, values in runs.items() if values}


def ratios(summary: Dict[str, Dict]) -> Dict[str, float]:
    """The API's median img/s over each Horovod's."""
    if "api" not in summary:
        return {}
    return {f"api/{label}": summary["api"]["median"] / entry["median"]
            for label, entry in summary.items() if label != "api" and entry["median"]}


def table(report: Dict) -> str:
    rows = [[label, f"{entry['median']:.2f}", f"{100 * entry['spread']:.1f}%" if entry["spread"] is not None else "-",
             " ".join(f"{v:.2f}" for v in entry["img_s"])] for label, entry in report["backends"].items()]
    rows += [[name, f"{value:.3f}x", "", ""] for name, value in report["ratios"].items()]
    return tables.text(["backend", "img/s (median)", "spread", "repeats"], rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.horovod_api", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", type=Path, required=True,
                   help="Horovod's examples/pytorch/pytorch_synthetic_benchmark.py (from a Horovod checkout)")
    p.add_argument("--np", type=int, default=2, help="ranks of every run")
    p.add_argument("--repeats", type=int, default=3, help="runs of every backend, interleaved")
    p.add_argument("--backends", default=",".join(LAUNCHERS), help=f"which of {', '.join(LAUNCHERS)}")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup-batches", type=int, default=2)
    p.add_argument("--batches-per-iter", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    add_timeout(p, 900.0)
    add_out(p, "where horovod_api.json goes")
    args = p.parse_args(argv)
    labels = [label.strip() for label in args.backends.split(",") if label.strip()]
    unknown = [label for label in labels if label not in LAUNCHERS]
    if unknown or not args.script.is_file():
        problem = f"unknown backend {unknown[0]} (choose from {', '.join(LAUNCHERS)})" if unknown else \
            f"{args.script}: no such file; give Horovod's examples/pytorch/pytorch_synthetic_benchmark.py"
        print(f"benchmarks.horovod_api: error: {problem}", file=sys.stderr)
        return 2
    record = Record("horovod_api", argv)
    script_args = ["--model", args.model, "--batch-size", str(args.batch_size), "--no-cuda",
                   "--num-warmup-batches", str(args.warmup_batches),
                   "--num-batches-per-iter", str(args.batches_per_iter), "--num-iters", str(args.iters)]
    logs = args.out / "logs"
    runs: Dict[str, List[float]] = {label: [] for label in labels}
    failures: List[Dict] = []
    commands: Dict[str, str] = {}
    for repeat in range(args.repeats):
        for label in order(labels, repeat):
            cmd = command(label, args.np, args.script, script_args)
            commands[label] = " ".join(cmd)
            log = logs / f"horovod_api-{label}-{repeat}.log"
            try:
                seconds = run_job(cmd, log, args.timeout, env={"OMP_NUM_THREADS": "1"})
            except JobFailed as exc:
                failures.append({"backend": label, "repeat": repeat, "error": str(exc)[-2000:]})
                continue
            value = throughput(log.read_text())
            if value is None:
                failures.append({"backend": label, "repeat": repeat, "error": "printed no Total img/sec line"})
                continue
            runs[label].append(value)
            print(f"horovod_api: {label} repeat {repeat}: {value:.2f} img/s ({seconds:.0f} s)", flush=True)
    summary = summarize(runs)
    report = {**record.header(), "np": args.np, "threads_per_rank": 1, "model": args.model,
              "image_size": 224, "batch_size": args.batch_size, "script": str(args.script),
              "script_args": script_args, "commands": commands, "repeats": args.repeats, "backends": summary,
              "ratios": ratios(summary), "failures": failures, "cores": cores()}
    return publish(report, args.out / "horovod_api.json", table(report))


if __name__ == "__main__":
    sys.exit(run_cli(main, "benchmarks.horovod_api"))
