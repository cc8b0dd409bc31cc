"""The reference loop: the simplest correct DDP training loop, with the training's model, data, sampler, batch,
optimizer and threads, and no logging, meters, checkpoints, stop checks or evaluation; samples/s from the end of the
first step to the end of the last, in rank 0's RUN_DIR/summary.json. --data-path seed fetches one sample per call
and collates, as a user writes it; batched uses the training's loader, so that the ratio is bookkeeping alone.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.bare_ddp --data-path batched --model resnet18 \\
        --dataset synthetic --image-size 224 --batch-size 16 --max-steps 12 --run-dir runs/bare
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from common.config import parse_config
from common.inputs.data import make_loaders, open_datasets
from common.inputs.models import build_model
from common.launch.placement import default_threads, detect
from common.loop.optim import make_optimizer
from common.rundir.names import SUMMARY_FILE


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Train `--max-steps` steps (or the epochs) and write rank 0's summary."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--data-path", choices=("seed", "batched"), default="seed")
    known, rest = own.parse_known_args(sys.argv[1:] if argv is None else argv)
    config = parse_config(rest, "bare_ddp", __doc__)
    cuda = torch.cuda.is_available() and config.device != "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(config.threads or default_threads(detect().local_world_size))  # as the training loop
    train_set, val_set, info = open_datasets(config)
    if known.data_path == "batched":
        loader, _, sampler = make_loaders(config, train_set, val_set, rank, world, pin_memory=cuda)
    else:  # as a user writes it: one sample per call, collated
        sampler = DistributedSampler(  # type: ignore[assignment]  # the loop's samplers are DistributedSamplers too
            train_set, num_replicas=world, rank=rank, shuffle=True, seed=config.seed)
        loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, num_workers=config.workers,
                            pin_memory=cuda)
    model = build_model(config.model, info.channels, info.image_size, info.num_classes, config.seed).to(device)
    # forward_sync_buffers=False: the loop under comparison does not sync BatchNorm buffers every forward either.
    ddp = DDP(model, device_ids=[local_rank] if cuda else None, forward_sync_buffers=False)
    optimizer = make_optimizer(config, ddp.parameters())
    total = min(config.epochs * len(loader), config.max_steps or config.epochs * len(loader))
    step, epoch, first_end, last_end = 0, 0, 0.0, 0.0
    while step < total:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(images.to(device, non_blocking=True)), labels.to(device, non_blocking=True))
            loss.backward()
            optimizer.step()
            step += 1
            if step in (1, total):
                if cuda:
                    torch.cuda.synchronize(device)
                last_end = time.perf_counter()
                first_end = last_end if step == 1 else first_end
            if step >= total:
                break
        epoch += 1
    seconds = last_end - first_end
    if rank == 0:
        os.makedirs(config.run_dir, exist_ok=True)
        summary = {"backend": "bare_ddp", "data_path": known.data_path, "world_size": world, "model": config.model,
                   "dataset": config.dataset, "batch_size": config.batch_size, "steps": step, "train_s": seconds,
                   "samples_per_s": (step - 1) * config.batch_size * world / seconds if seconds > 0 else None,
                   "threads": torch.get_num_threads(), "final_loss": float(loss.item())}
        with open(os.path.join(config.run_dir, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"bare_ddp: {step} steps, {summary['samples_per_s'] or 0:.1f} samples/s, "
              f"run dir {os.path.abspath(config.run_dir)}", flush=True)
    # Free the DDP reducer (it holds the group and its gloo threads) before the group goes: left to interpreter
    # exit, those threads can abort the process ("terminate called").
    del ddp, optimizer
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
