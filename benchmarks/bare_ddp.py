"""The reference loop: the simplest correct DistributedDataParallel training loop, nothing else.

Same model (common.inputs.models.build_model), data (common.inputs.data), sampler (DistributedSampler), per-rank
batch, optimizer and thread count as `python -m ddp_train`, and no logging, meters, checkpoints,
stop checks or evaluation. Throughput is measured the way the training loop measures it: from the
end of the first step to the end of the last, so the first step (allocation, warm-up) is left out.
Rank 0 writes RUN_DIR/summary.json with `samples_per_s`.

--data-path says how batches are fetched:
- seed (default): a plain DataLoader with batch_size, one sample per call and a collate, as a user
  writes it (and as the seed project did);
- batched: the loader the training loop uses (common.inputs.data.make_loaders: a whole batch per call
  for in-memory and synthetic data), so that the loop / bare ratio measures the loop's bookkeeping alone.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.bare_ddp --data-path batched --model resnet18 \\
        --dataset synthetic --image-size 224 --batch-size 16 --max-steps 12 --run-dir runs/bare

Takes the training options (python -m ddp_train --help); only the data, model, batch, optimizer,
step, thread and run-dir options are used.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

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


DATA_PATHS = ("seed", "batched")


def split_data_path(argv):
    """(--data-path, the training options): this loop's one option of its own, and the rest."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--data-path", choices=DATA_PATHS, default="seed")
    known, rest = own.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.data_path, rest


def seed_loader(config, train_set, rank: int, world: int, pin_memory: bool):
    """(loader, sampler) as a user writes them: DistributedSampler and a DataLoader that fetches one
    sample per call and collates the batch."""
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=config.seed)
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, num_workers=config.workers,
                        pin_memory=pin_memory)
    return loader, sampler


def main(argv=None) -> int:
    data_path, argv = split_data_path(argv)
    config = parse_config(argv, "bare_ddp", __doc__)
    cuda = torch.cuda.is_available() and config.device != "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    # The same intra-op threads as the training loop: cores / processes on this host.
    torch.set_num_threads(config.threads or default_threads(detect().local_world_size))

    train_set, val_set, info = open_datasets(config)
    if data_path == "batched":
        loader, _, sampler = make_loaders(config, train_set, val_set, rank, world, pin_memory=cuda)
    else:
        loader, sampler = seed_loader(config, train_set, rank, world, pin_memory=cuda)
    model = build_model(config.model, info.channels, info.image_size, info.num_classes, config.seed).to(device)
    # forward_sync_buffers=False: the loop under comparison does not sync BatchNorm buffers every
    # forward either, so both send exactly the gradients and the ratio measures the loop.
    model = DDP(model, device_ids=[local_rank] if cuda else None, forward_sync_buffers=False)
    optimizer = make_optimizer(config, model.parameters())

    total = config.epochs * len(loader)
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    step, first_end, last_end = 0, None, None
    epoch = 0
    while step < total:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 1 or step == total:
                if cuda:
                    torch.cuda.synchronize(device)
                now = time.perf_counter()
                first_end = now if step == 1 else first_end
                last_end = now
            if step >= total:
                break
        epoch += 1

    seconds = last_end - first_end
    samples = (step - 1) * config.batch_size * world
    if rank == 0:
        os.makedirs(config.run_dir, exist_ok=True)
        summary = {"backend": "bare_ddp", "data_path": data_path, "world_size": world, "model": config.model,
                   "dataset": config.dataset, "batch_size": config.batch_size, "steps": step, "train_s": seconds,
                   "samples_per_s": samples / seconds if seconds > 0 else None,
                   "threads": torch.get_num_threads(), "final_loss": float(loss.item())}
        with open(os.path.join(config.run_dir, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"bare_ddp: {step} steps, {summary['samples_per_s'] or 0:.1f} samples/s, "
              f"run dir {os.path.abspath(config.run_dir)}", flush=True)
    # Free the DDP reducer (it holds the group and its gloo threads) before the group goes:
    # left to interpreter exit, those threads can abort the process ("terminate called").
    model = optimizer = None
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
