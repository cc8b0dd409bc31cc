"""The tqdm progress bar of an epoch, shown on rank 0 only."""

from __future__ import annotations

import sys

from tqdm import tqdm


def epoch_bar(mode: str, is_main: bool, epoch: int, total: int, initial: int) -> tqdm:
    """A bar over the optimizer steps of one epoch. `mode` is --progress: on, off, or auto (only
    when stderr is a terminal, so logs and launcher-collected output stay free of bar redraws)."""
    shown = is_main and (mode == "on" or (mode == "auto" and sys.stderr.isatty()))
    return tqdm(total=total, initial=initial, desc=f"epoch {epoch + 1}", unit="step", disable=not shown,
                leave=False, dynamic_ncols=True, file=sys.stderr)
