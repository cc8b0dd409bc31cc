"""A/B: what the probe of `compare-backends --scripts` (common.probe) costs a user's DDP script.

The script is this file's worker: a plain DDP training loop as a user writes it (its own model, SGD with
momentum, one batch per step, no logging), timed by itself from the end of its second step to the end of its
last (slowest rank). Each case runs it as separate torchrun jobs, alternately bare (`-m benchmarks.probe_cost`)
and under the probe (`-m common.probe --run-dir DIR benchmarks/probe_cost.py`), so that load that comes and
goes hits both alike; the cost is 1 - (median probed samples/s) / (median bare samples/s).

    python -m benchmarks.probe_cost --np 2 --cases resnet18=224,convnet=32 --repeats 3 --out benchmarks/results

Writes DIR/probe_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from common.errors import print_error
from common.inputs.models import build_model

DEFINITIONS = {"bare_samples_per_s": "the script's samples/s over all ranks, bare (one value per job)",
               "probed_samples_per_s": "the same under the probe",
               "cost": "1 - median(probed) / median(bare): the share of throughput the probe takes"}


def worker(args) -> int:
    """One rank of the user's script (under torchrun); rank 0 writes samples/s to --result."""
    dist.init_process_group("gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = DDP(build_model(args.model, 3, args.image_size, 10, 0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(10, (args.batch_size,))
    started = None
    for step in range(args.steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step == 1:  # the first two steps pay for allocation and warm-up
            started = time.perf_counter()
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        samples = (args.steps - 2) * args.batch_size * dist.get_world_size()
        Path(args.result).write_text(json.dumps({"samples_per_s": samples / float(elapsed)}) + "\n")
    # Free the DDP reducer (it holds the group's gloo work) before the group goes.
    model = optimizer = None
    gc.collect()
    dist.destroy_process_group()
    return 0


def parse_cases(text: str):
    """"resnet18=224,convnet=32" -> [("resnet18", 224), ("convnet", 32)]."""
    cases = []
    for part in filter(None, text.split(",")):
        name, _, size = part.partition("=")
        if not size.isdigit() or int(size) < 8:
            raise ValueError(f"--cases {part}: give MODEL=IMAGE_SIZE with a size of at least 8")
        cases.append((name, int(size)))
    return cases


def main(argv=None) -> int:
    # Absolute imports: the worker also runs as a script by path, under the probe.
    from benchmarks.jobs import add_np, add_out, add_timeout

    p = argparse.ArgumentParser(prog="python -m benchmarks.probe_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, 2, "ranks of each job")
    p.add_argument("--cases", default="resnet18=224,convnet=32", help="MODEL=IMAGE_SIZE,... (synthetic images)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=12, help="steps per job (the first 2 untimed)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--repeats", type=int, default=3, help="jobs of each kind per case, alternating")
    add_out(p)
    p.add_argument("--work", type=Path, default=Path("runs/bench/probe_cost"), help="the probe's run directories")
    add_timeout(p, 900, "seconds before one job is stopped")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        cases = parse_cases(args.cases)
    except ValueError as exc:
        print_error("probe_cost", str(exc), ranked=False)
        return 2
    if min(args.np, args.repeats, args.batch_size, args.threads) < 1 or args.steps < 3:
        print_error("probe_cost", "--np, --repeats, --batch-size and --threads must be >= 1 and --steps >= 3 "
                    "(2 are untimed)", ranked=False)
        return 2

    from common.compare import tables

    from benchmarks.jobs import Workers
    from benchmarks.machine import Record, publish

    record = Record("probe_cost", argv)
    workers = Workers("probe_cost", args.out, args.timeout)
    rows = []
    for model, size in cases:
        script_args = ["--worker", "--model", model, "--image-size", str(size), "--batch-size", str(args.batch_size),
                       "--steps", str(args.steps), "--threads", str(args.threads)]
        measured = {"bare": [], "probed": []}
        for repeat in range(1, args.repeats + 1):
            for kind in ("bare", "probed"):
                tag = f"{model}-{size}-{kind}-{repeat}"
                if kind == "bare":
                    got = workers.run(tag, "torchrun", args.np, "benchmarks.probe_cost", script_args,
                                      model=model, image_size=size, kind=kind)
                else:
                    run_dir = (args.work / tag).resolve()
                    got = workers.run(tag, "torchrun", args.np, "common.probe",
                                      ["--run-dir", str(run_dir), "benchmarks/probe_cost.py", *script_args],
                                      model=model, image_size=size, kind=kind)
                if got is not None:
                    measured[kind].append(got["samples_per_s"])
        bare, probed = measured["bare"], measured["probed"]
        cost = 1 - statistics.median(probed) / statistics.median(bare) if bare and probed else None
        rows.append({"model": model, "image_size": size, "bare_samples_per_s": bare, "probed_samples_per_s": probed,
                     "cost": cost})
    settings = {"world_size": args.np, "batch_size": args.batch_size, "steps": args.steps, "threads": args.threads,
                "repeats": args.repeats, "launcher": "torchrun"}
    report = {**record.header(), "settings": settings, "definitions": DEFINITIONS,
              "rows": rows, "failures": workers.failures}
    return publish(report, args.out / "probe_cost.json", tables.text(
        ["model", "image", "bare samples/s", "probed samples/s", "cost"],
        [[r["model"], r["image_size"], " ".join(f"{v:.1f}" for v in r["bare_samples_per_s"]),
          " ".join(f"{v:.1f}" for v in r["probed_samples_per_s"]),
          "n/a" if r["cost"] is None else f"{100 * r['cost']:+.1f}%"] for r in rows]))


if __name__ == "__main__":
    if "--worker" in sys.argv:  # the user's script: run by path under the probe, or as a module bare
        sys.exit(main())
    from benchmarks.jobs import run_cli

    sys.exit(run_cli(main, "probe_cost"))
