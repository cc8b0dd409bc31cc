"""Resuming at another world size: what of a checkpoint's position, metrics and random numbers carries
over, and how the rest of the run is counted, when the job now has a different number of ranks."""

from __future__ import annotations

from typing import Callable, Dict

import torch

from common.config import Config
from common.loop.backend import Backend
from common.loop.batches import Batches, global_batch_at
from common.loop.optim import lr_at
from common.loop.position import Position
from . import format as ckpt_io


def carry_over(state: Dict, position: Position, origin: str, config: Config, backend: Backend, batches: Batches,
               settings: Dict, say: Callable[[str], None]) -> None:
    """Restore `position`'s metrics and this rank's random numbers from checkpoint `state` (read from
    `origin`), noting a world-size change. Exact mode carries everything over at any world size; otherwise
    at another world size only an epoch-end checkpoint can be continued (an epoch's sample order depends on
    the world size): the random numbers are reseeded and the rest of the run is counted at this world's
    steps per epoch (CheckpointError from a mid-epoch one)."""
    old_world = int(state["world_size"])
    if config.exact:
        # Nothing of an exact run depends on the world size: the position, the metrics so far (the same
        # on every rank) and the random numbers (keyed by step and micro-batch) carry over as they are.
        position.meter.load([float(v) for v in state["meter"][0]])
        if old_world != backend.world_size:
            note = (f"world size changed {old_world} -> {backend.world_size} at step {position.step} "
                    "(--reduction exact: the same global batches)")
            position.note(note)
            say(note)
    elif old_world == backend.world_size:
        torch.set_rng_state(state["rng"][backend.rank])
        position.meter.load([float(v) for v in state["meter"][backend.rank]])
    elif position.batch != 0:
        raise ckpt_io.CheckpointError(
            f"{origin} was written mid-epoch (epoch {position.epoch + 1}, batch {position.batch}) at world size "
            f"{old_world}; a different world size ({backend.world_size}) can only resume from an epoch-end "
            "checkpoint, since the sample order of an epoch depends on the world size")
    else:
        torch.manual_seed(config.seed + backend.rank + 1_000 * position.epoch)
        old_lr = lr_at(config, position.step, batches.steps_per_epoch, batches.total_steps, old_world)
        batches.continue_from(position.epoch, position.step)
        new_lr = lr_at(config, position.step, batches.steps_per_epoch, batches.total_steps, backend.world_size)
        note = (f"world size changed {old_world} -> {backend.world_size} at the start of epoch "
                f"{position.epoch + 1}: global batch "
                f"{settings['global_batch'] or global_batch_at(config, old_world)} -> "
                f"{batches.global_batch}, lr {old_lr:g} -> {new_lr:g}"
                + (" (--lr-scaling linear)" if config.lr_scaling == "linear" else ""))
        position.note(note)
        say(note)
