"""A/B: what the probe of `compare-backends --scripts` costs a user's DDP script. The script is this file's worker,
a plain DDP loop (SGD with momentum, one batch per step) that times itself after two steps; each case runs it as
torchrun jobs taking turns bare and under the probe (`-m common.probe ... benchmarks/probe_cost.py`); the cost is
1 - median probed samples/s / median bare samples/s.

    python -m benchmarks.probe_cost --np 2 --cases resnet18=224,convnet=32 --repeats 3 --out benchmarks/results
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Absolute imports: the worker also runs as a script by path, under the probe.
from benchmarks.jobs import Workers, add_np, add_places, add_timeout, add_worker, parser, refuse, run_cli
from common.inputs.models import build_model


def worker(args: Namespace) -> int:
    """One rank of the user's script (under torchrun); rank 0 writes samples/s to --result."""
    dist.init_process_group("gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    size = int(args.image_size)
    model = DDP(build_model(args.model, 3, size, 10, 0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(args.batch_size, 3, size, size), torch.randint(10, (args.batch_size,))
    started = 0.0
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
    del model, optimizer  # the DDP reducer holds the group's gloo work: free it before the group goes
    gc.collect()
    dist.destroy_process_group()
    return 0


def parse_cases(text: str) -> list[tuple[str, int]]:
    """"resnet18=224,convnet=32" -> [("resnet18", 224), ("convnet", 32)]; ValueError naming the part."""
    cases = [(part.partition("=")[0], part.partition("=")[2]) for part in text.split(",") if part]
    bad = [f"{model}={size}" for model, size in cases if not size.isdigit() or int(size) < 8]
    if bad:
        raise ValueError(f"--cases {bad[0]}: give MODEL=IMAGE_SIZE with a size of at least 8")
    return [(model, int(size)) for model, size in cases]


def cost(bare: Sequence[float], probed: Sequence[float]) -> float | None:
    """The share of throughput the probe takes, from the medians; None without both."""
    return 1 - statistics.median(probed) / statistics.median(bare) if bare and probed else None


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every case (or be one rank of the script, with --worker); exit 1 when a job failed, 2 on bad input."""
    p = parser("probe_cost", __doc__)
    add_np(p, 2, "ranks of each job")
    p.add_argument("--cases", default="resnet18=224,convnet=32", help="MODEL=IMAGE_SIZE,... (synthetic images)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=12, help="steps per job (the first 2 untimed)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--repeats", type=int, default=3, help="jobs of each kind per case, alternating")
    add_places(p, "runs/bench/probe_cost", "the probe's run directories")
    add_timeout(p, 900, "seconds before one job is stopped")
    add_worker(p, "--model", "--image-size")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        cases = parse_cases(args.cases)
    except ValueError as exc:
        return refuse("probe_cost", str(exc))
    if min(args.np, args.repeats, args.batch_size, args.threads) < 1 or args.steps < 3:
        return refuse("probe_cost", "--np, --repeats, --batch-size and --threads must be >= 1 and --steps >= 3 "
                                    "(2 are untimed)")
    workers = Workers("probe_cost", argv, args.out, args.timeout)
    rows: list[dict[str, Any]] = []
    for model, size in cases:
        script = ["--worker", "--model", model, "--image-size", str(size), "--batch-size", str(args.batch_size),
                  "--steps", str(args.steps), "--threads", str(args.threads)]
        measured: dict[str, list[float]] = {"bare": [], "probed": []}
        for repeat in range(1, args.repeats + 1):
            for kind in measured:
                tag = f"{model}-{size}-{kind}-{repeat}"
                probed = ["--run-dir", str((args.work / tag).resolve()), "benchmarks/probe_cost.py", *script]
                module, script_args = ("benchmarks.probe_cost", script) if kind == "bare" else ("common.probe", probed)
                got = workers.run(tag, "torchrun", args.np, module, script_args, model=model, image_size=size,
                                  kind=kind)
                if got is not None:
                    measured[kind].append(got["samples_per_s"])
        rows.append({"model": model, "image_size": size, "bare_samples_per_s": measured["bare"],
                     "probed_samples_per_s": measured["probed"], "cost": cost(measured["bare"], measured["probed"])})
    return workers.publish(rows=rows, settings={"world_size": args.np, "batch_size": args.batch_size,
                                                "steps": args.steps, "threads": args.threads,
                                                "repeats": args.repeats, "launcher": "torchrun"})


if __name__ == "__main__":
    sys.exit(main() if "--worker" in sys.argv else run_cli(main, "probe_cost"))
