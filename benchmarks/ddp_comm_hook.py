"""A/B: DDP's step time with its built-in allreduce against the same allreduce through a Python
comm hook (DDPBackend registers one to time the communication that backward did not hide).

Both models live in the same processes and take turns in blocks of steps, so load that comes
and goes hits both alike. Rank 0 prints one JSON line: median ms per step of each (slowest rank).

    torchrun --standalone --nproc-per-node 2 -m benchmarks.ddp_comm_hook --model convnet --image-size 32
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common.models import build_model


def make(model_name: str, image_size: int, python_hook: bool):
    model = DDP(build_model(model_name, 3, image_size, 10, 0), forward_sync_buffers=False)
    if python_hook:
        def hook(state, bucket):  # DDP checks the parameter names
            return default_hooks.allreduce_hook(None, bucket)

        model.register_comm_hook(None, hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ddp_comm_hook", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="convnet")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=6, help="turns each variant takes")
    p.add_argument("--steps", type=int, default=15, help="steps per turn (the first 2 untimed)")
    args = p.parse_args(argv)
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
        ms = {name: round(float(v) * 1e3, 2) for name, v in zip(times, medians)}
        ms["hook_cost"] = round(ms["python_hook"] / ms["builtin"] - 1, 4)
        print(json.dumps(ms), flush=True)
    # Free the DDP reducers (they hold the group and its gloo threads) before the group goes:
    # left to interpreter exit, those threads can abort the process ("terminate called").
    variants.clear()
    model = opt = None
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
