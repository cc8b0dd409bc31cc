"""Checkpointing during a run: which checkpoint to resume from, what a checkpoint holds of the run's training
and where each piece goes back, when one is due, and writing one while every rank waits.

The file format (atomic write, digest, verified load, pruning) is common.checkpoints.format; this part knows
the run: --resume, --checkpoint-every, the settings a checkpoint must share with the run, the parts whose state
it keeps (weights, optimizer, loss scale, the step's own state, where training stands, every rank's random
numbers), rank 0 writing while the others wait, and the callbacks that keep each written state (Horovod
elastic commits it on every rank).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from common.config import Config
from common.loop.backend import Backend
from common.loop.batches import Batches
from common.loop.finite import nonfinite_tensors, refuse_nonfinite
from common.loop.position import Position
from common.loop.precision import Precision
from common.loop.stepping import Step
from . import format as ckpt_io
from .resume import carry_over


def run_settings(config: Config, image_size: int, global_batch: int) -> Dict:
    """The settings a checkpoint records and a run that resumes it must share (checked against
    format.MUST_MATCH); `global_batch` is the run's at this world size."""
    fixed_global = config.fixed_global_batch
    return {"model": config.model, "dataset": config.dataset, "image_size": image_size,
            # a per-rank batch that follows the world size is no reason to refuse a checkpoint
            "batch_size": None if fixed_global else config.batch_size,
            "global_batch": global_batch if fixed_global else None,
            "seed": config.seed, "lr": config.lr, "lr_scaling": config.lr_scaling,
            "accumulate": config.accumulate, "reduction": config.reduction,
            "micro_batch": config.micro_batch if config.exact else None}


class Checkpointer:
    """Finds the checkpoint to resume from, says when one is due, builds the state of the run's training that a
    checkpoint holds (with the run's `settings`), writes it into RUN_DIR/checkpoints and restores it into the
    parts: the unwrapped `model`, the `optimizer`, the loss scale of `precision` and the `step`'s own state."""

    def __init__(self, config: Config, backend: Backend, say: Callable[[str], None], settings: Dict, *,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, step: Step) -> None:
        self.config, self.backend, self.say, self.settings = config, backend, say, settings
        self.run_dir, self.keep, self.every = config.run_dir, config.keep_checkpoints, config.checkpoint_every
        self.model, self.optimizer, self.precision, self.step = model, optimizer, precision, step
        #: called on every rank with each state written; with any, every rank builds the full state
        self.on_save: List[Callable[[Dict], None]] = []

    @property
    def every_rank_keeps(self) -> bool:
        """Whether every rank needs the full state of a checkpoint (not only rank 0, which writes it)."""
        return bool(self.on_save)

    def find(self, resume: Optional[str]) -> Optional[Dict]:
        """The checkpoint to resume from (every rank reads the same file), with its path under "path";
        None to start fresh. CheckpointError when --resume names a file that cannot be used."""
        if resume is None:
            return None
        if resume == "auto":
            loaded, path, problems = ckpt_io.find_newest_valid(self.run_dir)
            for problem in problems:
                self.say(f"skipping checkpoint: {problem}")
            if loaded is None or path is None:  # both or neither
                self.say(f"--resume auto: no valid checkpoint in {self.run_dir}; starting fresh")
                return None
        else:
            path = resume
            loaded = ckpt_io.check_format(ckpt_io.verified_load(path), path)
        ckpt_io.check_matches(loaded, self.settings, path)
        loaded["path"] = path
        return loaded

    def due(self, step: int, at_end: bool) -> bool:
        """Whether --checkpoint-every asks for a checkpoint after `step`; never `at_end` of an epoch or of the
        run, where one is written anyway."""
        return bool(self.every) and step % self.every == 0 and not at_end

    def state(self, position: Position, finished: bool) -> Dict:
        """Where training stands at `position` (its epoch `finished` or not), as a checkpoint holds it. A
        collective: every rank's random numbers and partial sums are gathered, and NonFinite is raised on every
        rank when any rank's weights or buffers are not finite. Built on rank 0 only, unless every rank keeps
        checkpoints (Horovod elastic)."""
        backend = self.backend
        gathered = backend.all_gather_object((torch.get_rng_state(), position.meter.values(),
                                              nonfinite_tensors(self.model)))
        rng, meters, bad = zip(*gathered, strict=True)
        refuse_nonfinite(list(bad), position.step, "checkpoint")
        if not (backend.is_main or self.every_rank_keeps):
            return {"step": position.step}
        epoch, batch, kept_meters = position.epoch, position.batch, list(meters)
        if finished:  # a finished epoch continues at the start of the next one
            epoch, batch, kept_meters = epoch + 1, 0, [position.meter.emptied().values()] * len(meters)
        return {
            "format": ckpt_io.FORMAT,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "epoch": epoch, "batch": batch, "step": position.step,
            "world_size": backend.world_size, "backend": backend.name,
            "settings": self.settings, "rng": list(rng), "meter": kept_meters,
            "scaler": self.precision.state_dict(), "step_state": self.step.state_dict(),
        }

    def restore(self, state: Dict, origin: str, batches: Batches) -> Position:
        """Load checkpoint `state` (read from `origin`) into the parts and return the position it continues
        from, with `batches` (this rank's at the current world size): the rest of the run is counted at this
        world size (see common.checkpoints.resume)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state.get("scaler"))
        self.step.load_state_dict(state.get("step_state"))
        position = Position.start(self.backend.device, int(state["epoch"]), int(state["batch"]), int(state["step"]),
                                  resumed_from=origin)
        carry_over(state, position, origin, self.config, self.backend, batches, self.settings, self.say)
        self.say(f"resuming from {origin}: epoch {position.epoch + 1}, batch {position.batch}, step {position.step}")
        return position

    def save(self, state: Dict) -> Optional[str]:
        """Rank 0 writes `state` (atomically) and keeps the newest --keep-checkpoints; every rank waits for
        it, then hands the state to the on_save callbacks. Returns the file written (rank 0), else None."""
        path = None
        if self.backend.is_main:
            path = ckpt_io.checkpoint_path(self.run_dir, state["step"])
            ckpt_io.atomic_save(state, path)
            ckpt_io.prune(self.run_dir, self.keep)
        self.backend.barrier()
        for callback in self.on_save:
            callback(state)
        return path
