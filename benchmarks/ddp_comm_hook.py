"""A/B: DDP's step time with its built-in allreduce against the same allreduce through a Python comm hook (as
DDPBackend times communication). Both models take turns in blocks of steps in the same processes, so that load hits
both alike; each job gives the median ms per step of each (slowest rank), and the jobs' spread the run-to-run noise.

    python -m benchmarks.ddp_comm_hook --np 2 --model convnet --image-size 32 --runs 3 --out benchmarks/results
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any, Sequence, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common.inputs.models import build_model

from .jobs import Workers, add_np, add_out, add_timeout, add_worker, parser, refuse


def make(model_name: str, image_size: int, python_hook: bool) -> tuple[DDP, torch.optim.Optimizer]:
    """The model under DDP with its built-in allreduce or the same allreduce as a Python comm hook, and its SGD."""
    model = DDP(build_model(model_name, 3, image_size, 10, 0), forward_sync_buffers=False)
    if python_hook:
        default_group = cast(dist.ProcessGroup, None)  # the hook's None: the default group, as DDPBackend's
        model.register_comm_hook(None, lambda state, bucket: default_hooks.allreduce_hook(default_group, bucket))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def worker(args: Namespace) -> int:
    """One rank (under torchrun): both variants in turns; rank 0 writes the medians to --result."""
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    size = int(args.image_size)
    variants = {kind: make(args.model, size, kind == "python_hook") for kind in ("builtin", "python_hook")}
    x, y = torch.randn(args.batch_size, 3, size, size), torch.randint(10, (args.batch_size,))
    times: dict[str, list[float]] = {kind: [] for kind in variants}
    for _ in range(args.blocks):
        for kind, (model, opt) in variants.items():
            for i in range(args.steps):
                started = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if i >= 2:
                    times[kind].append(time.perf_counter() - started)
    medians = torch.tensor([statistics.median(v) for v in times.values()], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        ms = {f"{kind}_ms": float(v) * 1e3 for kind, v in zip(times, medians, strict=True)}
        Path(args.result).write_text(json.dumps(ms))
    # Free the DDP reducers (they hold the group and its gloo threads) before the group goes: left to interpreter
    # exit, those threads can abort the process ("terminate called").
    variants.clear()
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the A/B jobs (or be one rank, with --worker); exit 1 when a job failed, 2 on bad input."""
    p = parser("ddp_comm_hook", __doc__)
    add_np(p, 2, "ranks of each run")
    p.add_argument("--model", default="convnet")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=6, help="turns each variant takes")
    p.add_argument("--steps", type=int, default=15, help="steps per turn (the first 2 untimed)")
    p.add_argument("--runs", type=int, default=3, help="separate jobs, one after another")
    add_out(p)
    add_timeout(p, 600)
    add_worker(p)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if min(args.np, args.runs, args.blocks) < 1 or args.steps < 3:
        return refuse("ddp_comm_hook", "--np, --runs and --blocks must be >= 1 and --steps >= 3 (2 are untimed)")
    workers = Workers("ddp_comm_hook", argv, args.out, args.timeout)
    worker_args = ["--worker", "--model", args.model, "--image-size", str(args.image_size), "--batch-size",
                   str(args.batch_size), "--blocks", str(args.blocks), "--steps", str(args.steps)]
    rows: list[dict[str, Any]] = []
    for run in range(1, args.runs + 1):
        ms = workers.run(str(run), "torchrun", args.np, "benchmarks.ddp_comm_hook", worker_args, run=run)
        if ms is not None:
            rows.append({"run": run, **ms, "hook_cost": ms["python_hook_ms"] / ms["builtin_ms"] - 1})
    return workers.publish(rows=rows, settings={"world_size": args.np, "model": args.model, "threads": 1,
                                                "image_size": args.image_size, "batch_size": args.batch_size,
                                                "blocks": args.blocks, "steps": args.steps})


if __name__ == "__main__":
    sys.exit(main())
