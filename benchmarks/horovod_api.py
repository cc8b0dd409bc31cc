"""Horovod's own pytorch_synthetic_benchmark.py, unchanged, on the project's Horovod API (python -m
ddp_train.horovod_api under torchrun) against real Horovod with its Gloo and its MPI controller.

    python -m benchmarks.horovod_api --script HOROVOD/examples/pytorch/pytorch_synthetic_benchmark.py --repeats 3

Every run is the script at 2 ranks with one thread per rank (OMP_NUM_THREADS=1 for every launcher: torchrun sets it,
horovodrun does not), on synthetic images (resnet18 at 224 by default), as a user launches it:

- api:           torchrun --rdzv-backend loopback --nproc-per-node=2 -m ddp_train.horovod_api SCRIPT ARGS
- horovod-gloo:  horovodrun -np 2 -H localhost:2 --gloo python SCRIPT ARGS
- horovod-mpi:   horovodrun -np 2 -H localhost:2 --mpi python SCRIPT ARGS (Open MPI as it comes)
- api-cache-off: the API with HOROVOD_CACHE_CAPACITY=0 (every request to rank 0), when --backends names it
- port:          torchrun --rdzv-backend loopback --nproc-per-node=2 PORT ARGS, PORT the script's plain DDP port
                 (python -m ddp_train.port SCRIPT), when --backends names it

`--script small-tensors` runs a Horovod script of this module's own instead: 80 Linear(16, 16) layers (160 gradient
tensors) and little compute, so that a step is mostly its exchange.

Each repeat runs the three once, every other repeat in the opposite order, so that the machine's drift falls on all
alike. A run's throughput is what the script prints: its total img/sec (ranks x the mean of its iterations). Reported
per backend: every repeat, the median, and the API's median over each Horovod's. Writes DIR/horovod_api.json.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Sequence

from common import launch
from common.compare.arguments import csv_list

from .jobs import JobFailed, add_out, add_timeout, parser, refuse, run_cli, run_job, schedule
from .machine import Record, cores, publish

#: run label -> the registered launcher that starts it
LAUNCHERS = {"api": "torchrun", "horovod-gloo": "horovodrun-gloo", "horovod-mpi": "horovodrun-mpi",
             "api-cache-off": "torchrun", "port": "torchrun"}
DEFAULT_BACKENDS = ("api", "horovod-gloo", "horovod-mpi")
#: a run label's own variables
ENV = {"api-cache-off": {"HOROVOD_CACHE_CAPACITY": "0"}}
SMALL_TENSORS = "small-tensors"
#: a Horovod script whose step is mostly its exchange: 160 small gradient tensors, little compute; it takes the
#: synthetic benchmark's options and prints its Total img/sec line
SMALL_TENSORS_SCRIPT = '''"""Many small gradient tensors, little compute (benchmarks/horovod_api.py --script
small-tensors)."""
import argparse
import timeit

import torch
import torch.nn.functional as F
import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument('--model', default='small-tensors')
parser.add_argument('--batch-size', type=int, default=8)
parser.add_argument('--no-cuda', action='store_true')
parser.add_argument('--num-warmup-batches', type=int, default=5)
parser.add_argument('--num-batches-per-iter', type=int, default=10)
parser.add_argument('--num-iters', type=int, default=5)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(80)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
data, target = torch.randn(args.batch_size, 16), torch.randn(args.batch_size, 16)


def benchmark_step():
    optimizer.zero_grad()
    F.mse_loss(model(data), target).backward()
    optimizer.step()


timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for _ in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
mean = sum(img_secs) / len(img_secs)
spread = 1.96 * (sum((x - mean) ** 2 for x in img_secs) / len(img_secs)) ** 0.5
if hvd.rank() == 0:
    print('Total img/sec on %d CPU(s): %.1f +-%.1f' % (hvd.size(), hvd.size() * mean, hvd.size() * spread))
'''
API_MODULE = "ddp_train.horovod_api"
TOTAL = re.compile(r"Total img/sec on (\d+) \S+: ([0-9.]+) \+-([0-9.]+)")


def command(label: str, np: int, program: Sequence[str], args: Sequence[str]) -> list[str]:
    """`python PROGRAM ARGS` (PROGRAM: a script, or -m and a module) on `np` ranks as a user starts it: under the
    API's module through torchrun, or itself under horovodrun (the launcher's command, its `-m hvd_train` replaced)."""
    launcher = launch.get(LAUNCHERS[label])
    if label in ("api", "api-cache-off"):
        return launcher.command(np, [*program, *args], module=API_MODULE, python=sys.executable)
    cmd = launcher.command(np, args, python=sys.executable)
    at = cmd.index("-m")
    return [*cmd[:at], *program, *cmd[at + 2:]]


def summarize(runs: dict[str, list[float]]) -> dict[str, dict]:
    """Per backend: its repeats and their median and spread (max/min - 1)."""
    return {label: {"img_s": values, "median": statistics.median(values),
                    "spread": (max(values) / min(values) - 1) if min(values) > 0 else None}
            for label, values in runs.items() if values}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every backend in every repeat; exit 1 when a run failed (the rest is written), 2 on bad input."""
    p = parser("horovod_api", __doc__)
    p.add_argument("--script", type=Path, required=True,
                   help="Horovod's examples/pytorch/pytorch_synthetic_benchmark.py (from a Horovod checkout), or "
                        f"{SMALL_TENSORS}")
    p.add_argument("--np", type=int, default=2, help="ranks of every run")
    p.add_argument("--repeats", type=int, default=3, help="runs of every backend, interleaved")
    p.add_argument("--backends", type=csv_list(str, tuple(LAUNCHERS)), default=",".join(DEFAULT_BACKENDS),
                   help=f"which of {', '.join(LAUNCHERS)}")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup-batches", type=int, default=2)
    p.add_argument("--batches-per-iter", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    add_timeout(p, 900.0)
    add_out(p, "where horovod_api.json goes")
    args = p.parse_args(argv)
    small = str(args.script) == SMALL_TENSORS
    if small:
        args.model = SMALL_TENSORS
        (args.out / "logs").mkdir(parents=True, exist_ok=True)  # beside the logs: made here, not kept
        args.script = (args.out / "logs" / "small_tensors_horovod.py").resolve()
        args.script.write_text(SMALL_TENSORS_SCRIPT)
    if not args.script.is_file():
        return refuse("horovod_api", f"{args.script}: no such file; give Horovod's "
                                     f"examples/pytorch/pytorch_synthetic_benchmark.py, or {SMALL_TENSORS}")
    programs = {label: [str(args.script)] for label in args.backends}
    if "port" in args.backends:
        ported = args.out / "logs" / f"{args.script.stem}_ported.py"
        ported.parent.mkdir(parents=True, exist_ok=True)
        try:
            run_job([sys.executable, "-m", "ddp_train.port", str(args.script), "-o", str(ported)],
                    args.out / "logs" / "horovod_api-port.log", 120)
        except JobFailed as exc:
            return refuse("horovod_api", f"python -m ddp_train.port {args.script} failed: {str(exc).splitlines()[0]}")
        programs["port"] = [str(ported.resolve())]
    record = Record("horovod_api", argv)
    script_args = ["--model", args.model, "--batch-size", str(args.batch_size), "--no-cuda",
                   "--num-warmup-batches", str(args.warmup_batches),
                   "--num-batches-per-iter", str(args.batches_per_iter), "--num-iters", str(args.iters)]
    runs: dict[str, list[float]] = {label: [] for label in args.backends}
    failures: list[dict] = []
    commands: dict[str, str] = {}
    for repeat, label in schedule(args.backends, args.repeats):
        cmd = command(label, args.np, programs[label], script_args)
        commands[label], log = " ".join(cmd), args.out / "logs" / f"horovod_api-{label}-{repeat}.log"
        try:
            seconds = run_job(cmd, log, args.timeout, env={"OMP_NUM_THREADS": "1", **ENV.get(label, {})})
            printed = TOTAL.findall(log.read_text())
            if not printed:
                raise JobFailed("printed no Total img/sec line")
        except JobFailed as exc:
            failures.append({"backend": label, "repeat": repeat, "error": str(exc)[-2000:]})
            continue
        runs[label].append(float(printed[-1][1]))
        print(f"horovod_api: {label} repeat {repeat}: {runs[label][-1]:.2f} img/s ({seconds:.0f} s)", flush=True)
    summary = summarize(runs)
    ratios = {f"api/{label}": summary["api"]["median"] / entry["median"] for label, entry in summary.items()
              if "api" in summary and label != "api" and entry["median"]}
    return publish({**record.header(), "np": args.np, "threads_per_rank": 1, "model": args.model,
                    "image_size": None if small else 224,
                    "batch_size": args.batch_size, "script": str(args.script), "script_args": script_args,
                    "commands": commands, "repeats": args.repeats, "backends": summary, "ratios": ratios,
                    "failures": failures, "cores": cores()}, args.out / "horovod_api.json")


if __name__ == "__main__":
    sys.exit(run_cli(main, "benchmarks.horovod_api"))
