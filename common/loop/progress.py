"""The tqdm progress bar of an epoch, shown on rank 0 only, and rank 0's lines at the end of an epoch and of
the run."""

from __future__ import annotations

import os
import sys
from typing import Dict

from tqdm import tqdm


def epoch_bar(mode: str, is_main: bool, epoch: int, total: int, initial: int) -> tqdm:
    """A bar over the optimizer steps of one epoch. `mode` is --progress: on, off, or auto (only
    when stderr is a terminal, so logs and launcher-collected output stay free of bar redraws)."""
    shown = is_main and (mode == "on" or (mode == "auto" and sys.stderr.isatty()))
    return tqdm(total=total, initial=initial, desc=f"epoch {epoch + 1}", unit="step", disable=not shown,
                leave=False, dynamic_ncols=True, file=sys.stderr)


def epoch_line(r: Dict, total_steps: int) -> str:
    """Rank 0's line at the end of an epoch, from the epoch's record (of `total_steps` in the run)."""
    line = (f"epoch {r['epoch'] + 1} step {r['step']}/{total_steps} train_loss {r['train_loss']:.4f} "
            f"train_top1 {r['train_top1']:.4f}")
    if "val_top1" in r:
        line += f" val_loss {r['val_loss']:.4f} val_top1 {r['val_top1']:.4f} val_top5 {r['val_top5']:.4f}"
    if r.get("samples_per_s"):
        line += f" {r['samples_per_s']:.0f} samples/s"
    return line


def done_line(summary: Dict, run_dir: str) -> str:
    """Rank 0's last line, from the run's summary.json: steps, validation accuracy, throughput, where the run
    directory is."""
    return (f"done: {summary['steps']} steps, val_top1 {summary['val_top1']:.4f}, "
            f"{summary['samples_per_s'] or 0:.0f} samples/s, run dir {os.path.abspath(run_dir)}")
