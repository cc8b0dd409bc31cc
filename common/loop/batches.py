"""The batches of this rank at the current world size: loaders, steps per epoch, the last step, the batches
on this rank's device.

With --reduction allreduce a step is one optimizer step over --accumulate micro-batches (loader
batches) of the per-rank batch (--batch-size, or --global-batch / world size); an epoch's incomplete
tail of micro-batches is dropped. With --reduction exact a step takes one loader batch per rank: this
rank's contiguous block of micro-batches of the step's global batch, the same global batches at every
world size. Positions inside an epoch are counted in loader batches.
"""

from __future__ import annotations

import itertools
from typing import Iterator, List, Tuple

import torch

from common.config import Config, exact_global_batch
from common.errors import UsageError
from common.inputs.data import make_loaders
from .backend import Backend


def per_rank_batch(config: Config, world: int) -> int:
    """--reduction allreduce: the samples of one loader batch of a rank at `world` ranks."""
    return config.global_batch // world if config.global_batch else config.batch_size


def global_batch_at(config: Config, world: int) -> int:
    """The samples of one optimizer step over all ranks at `world` ranks: exact mode's global batch, else the
    per-rank batch times the world size times --accumulate."""
    if config.exact:
        return exact_global_batch(config)
    return per_rank_batch(config, world) * world * config.accumulate


class Batches:
    """This rank's training and validation batches, and how many steps the run takes."""

    def __init__(self, config: Config, train_set, val_set, backend: Backend, device: torch.device) -> None:
        self.config = config
        self.train_set, self.val_set, self.device = train_set, val_set, device
        self.rank, self.world_size = backend.rank, backend.world_size
        self.exact = config.exact
        world = self.world_size
        self.global_batch = global_batch_at(config, world)
        if self.exact:
            self.micro_batches = self.global_batch // config.micro_batch
            if self.micro_batches % world:
                raise UsageError(f"--global-batch {self.global_batch} makes {self.micro_batches} micro-batches of "
                                 f"{config.micro_batch}, which {world} ranks cannot share equally; use a world size "
                                 f"that divides {self.micro_batches}, or change --global-batch or --micro-batch")
            self.per_rank_batch, self.accumulate = self.global_batch // world, 1
        else:
            if config.global_batch is not None and config.global_batch % world:
                raise UsageError(f"--global-batch {config.global_batch} does not divide among {world} ranks; give a "
                                 f"multiple of {world}")
            self.per_rank_batch, self.accumulate = per_rank_batch(config, world), config.accumulate
        self.train_loader, self.val_loader, self.sampler = make_loaders(
            config, train_set, val_set, self.rank, world, pin_memory=device.type == "cuda",
            batch_size=self.per_rank_batch, global_batch=self.global_batch if self.exact else None)
        self.steps_per_epoch = len(self.train_loader) // self.accumulate
        if self.steps_per_epoch == 0:
            if self.exact:
                raise UsageError(f"the {len(train_set)} training samples make no global batch of {self.global_batch}; "
                                 "lower --global-batch")
            raise UsageError(f"--accumulate {config.accumulate} is more than the {len(self.train_loader)} batches "
                             "per rank in an epoch; lower --accumulate or --batch-size")
        self.batches_per_epoch = self.steps_per_epoch * self.accumulate
        self.total_steps = self.last_step(from_epoch=0, from_step=0)

    def placed_for(self, backend: Backend) -> Batches:
        """These batches while `backend`'s rank and world size are theirs; else (an elastic job changed its
        members) this rank's batches at its new rank and world size."""
        if (self.rank, self.world_size) == (backend.rank, backend.world_size):
            return self
        return Batches(self.config, self.train_set, self.val_set, backend, backend.device)

    def last_step(self, from_epoch: int, from_step: int) -> int:
        """The run's last step when it continues at this world size from (epoch, step): the rest of the
        epochs at this world size's steps per epoch, capped by --max-steps."""
        total = from_step + (self.config.epochs - from_epoch) * self.steps_per_epoch
        return total if self.config.max_steps is None else min(total, self.config.max_steps)

    def continue_from(self, epoch: int, step: int) -> None:
        """A run resumed at this world size from (epoch, step) ends at its own last step."""
        self.total_steps = self.last_step(from_epoch=epoch, from_step=step)

    def epoch(self, epoch: int, skip: int) -> Iterator[List]:
        """The groups of loader batches (one per step) of `epoch` on this rank's device, leaving out its first
        `skip` loader batches."""
        self.sampler.set_epoch(epoch)
        self.sampler.skip = skip if self.exact else skip * self.per_rank_batch
        return ([self.on_device(images, labels) for images, labels in group]
                for group in grouped(self.train_loader, self.accumulate))

    def on_device(self, images: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A batch on this rank's device, inputs in channels-last memory format when asked (4-D only)."""
        images = images.to(self.device, non_blocking=True)
        if self.config.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=True)

    def finished(self, batch: int) -> bool:
        """Whether `batch` loader batches complete an epoch."""
        return batch >= self.batches_per_epoch


def grouped(iterable, k: int) -> Iterator[List]:
    """Consecutive lists of `k` items; an incomplete last list is dropped."""
    it = iter(iterable)
    while True:
        group = list(itertools.islice(it, k))
        if len(group) < k:
            return
        yield group
