"""Checkpointing during a run: which checkpoint to resume from, and writing one while every rank waits.

The file format (atomic write, digest, verified load, pruning) is common.checkpoints.format; this part knows
the run: --resume, the settings a checkpoint must share with the run, rank 0 writing while the others
wait, and the callbacks that keep each written state (Horovod elastic commits it on every rank).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from common.config import Config
from common.loop.backend import Backend
from . import format as ckpt_io


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
    """Finds the checkpoint to resume from and writes checkpoints into RUN_DIR/checkpoints."""

    def __init__(self, run_dir: str, keep: int, backend: Backend, say: Callable[[str], None]) -> None:
        self.run_dir, self.keep, self.backend, self.say = run_dir, keep, backend, say
        #: called on every rank with each state written; with any, every rank builds the full state
        self.on_save: List[Callable[[Dict], None]] = []

    @property
    def every_rank_keeps(self) -> bool:
        """Whether every rank needs the full state of a checkpoint (not only rank 0, which writes it)."""
        return bool(self.on_save)

    def find(self, resume: Optional[str], settings: Dict) -> Optional[Dict]:
        """The checkpoint to resume from (every rank reads the same file), with its path under "path";
        None to start fresh. CheckpointError when --resume names a file that cannot be used."""
        if resume is None:
            return None
        if resume == "auto":
            loaded, path, problems = ckpt_io.find_newest_valid(self.run_dir)
            for problem in problems:
                self.say(f"skipping checkpoint: {problem}")
            if loaded is None:
                self.say(f"--resume auto: no valid checkpoint in {self.run_dir}; starting fresh")
                return None
        else:
            path = resume
            loaded = ckpt_io.check_format(ckpt_io.verified_load(path), path)
        ckpt_io.check_matches(loaded, settings, path)
        loaded["path"] = path
        return loaded

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
