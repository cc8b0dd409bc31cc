"""A/B: DDP's step time with its built-in allreduce against the same allreduce through a Python
comm hook (DDPBackend registers one to time the communication that backward did not hide).

Both models live in the same processes and take turns in blocks of steps, so load that comes
and goes hits both alike; each run reports the median ms per step of each (slowest rank). The
runs are separate torchrun jobs, one after another, so their spread shows the run-to-run noise.

    python -m benchmarks.ddp_comm_hook --np 2 --model convnet --image-size 32 --runs 3 --out benchmarks/results

Writes DIR/ddp_comm_hook.json and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common.compare import tables
from common.errors import print_error
from common.inputs.models import build_model


DEFINITIONS = {"builtin_ms": "median ms per step, DDP's built-in allreduce (slowest rank)",
               "python_hook_ms": "median ms per step, the same allreduce through a Python comm hook",
               "hook_cost": "python_hook_ms / builtin_ms - 1"}


def make(model_name: str, image_size: int, python_hook: bool):
    model = DDP(build_model(model_name, 3, image_size, 10, 0), forward_sync_buffers=False)
    if python_hook:
        def hook(state, bucket):  # DDP checks the parameter names
            return default_hooks.allreduce_hook(None, bucket)

        model.register_comm_hook(None, hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def worker(args) -> int:
    """One rank (under torchrun): both variants in turns; rank 0 writes the medians to --result."""
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    variants = {"builtin": make(args.model, args.image_size, False),
                "python_hook": make(args.model, args.image_size, True)}
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(10, (args.batch_size,))
    times = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, (model, opt) in variants.items():
            for i in range(args.steps):
                started = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if i >= 2:
                    times[name].append(time.perf_counter() - started)
    medians = torch.tensor([statistics.median(v) for v in times.values()], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        ms = {f"{name}_ms": float(v) * 1e3 for name, v in zip(times, medians)}
        Path(args.result).write_text(json.dumps(ms) + "\n")
    # Free the DDP reducers (they hold the group and its gloo threads) before the group goes:
    # left to interpreter exit, those threads can abort the process ("terminate called").
    variants.clear()
    model = opt = None
    gc.collect()
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    from .jobs import add_np, add_out, add_timeout
    p = argparse.ArgumentParser(prog="python -m benchmarks.ddp_comm_hook", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, 2, "ranks of each run")
    p.add_argument("--model", default="convnet")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=6, help="turns each variant takes")
    p.add_argument("--steps", type=int, default=15, help="steps per turn (the first 2 untimed)")
    p.add_argument("--runs", type=int, default=3, help="separate jobs, one after another")
    add_out(p)
    add_timeout(p, 600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if min(args.np, args.runs, args.blocks) < 1 or args.steps < 3:
        print_error("ddp_comm_hook", "--np, --runs and --blocks must be >= 1 and --steps >= 3 (2 are untimed)",
                    ranked=False)
        return 2

    from .jobs import Workers
    from .machine import Record, publish

    record = Record("ddp_comm_hook", argv)
    rows = []
    workers = Workers("ddp_comm_hook", args.out, args.timeout)
    worker_args = ["--worker", "--model", args.model, "--image-size", str(args.image_size),
                   "--batch-size", str(args.batch_size), "--blocks", str(args.blocks), "--steps", str(args.steps)]
    for run in range(1, args.runs + 1):
        ms = workers.run(str(run), "torchrun", args.np, "benchmarks.ddp_comm_hook", worker_args, run=run)
        if ms is not None:
            rows.append({"run": run, **ms, "hook_cost": ms["python_hook_ms"] / ms["builtin_ms"] - 1})
    settings = {"world_size": args.np, "model": args.model, "image_size": args.image_size,
                "batch_size": args.batch_size, "blocks": args.blocks, "steps": args.steps, "threads": 1}
    report = {**record.header(), "settings": settings, "definitions": DEFINITIONS, "rows": rows,
              "failures": workers.failures}
    return publish(report, args.out / "ddp_comm_hook.json", tables.text(
        ["run", "built-in ms", "hook ms", "hook cost"],
        [[r["run"], f"{r['builtin_ms']:.2f}", f"{r['python_hook_ms']:.2f}", f"{100 * r['hook_cost']:+.1f}%"]
         for r in rows]))


if __name__ == "__main__":
    raise SystemExit(main())
