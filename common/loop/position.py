"""Where training stands: the epoch, its loader batches done, global steps done, the epoch's metrics so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .metrics import SumMeter

#: the training metrics each step adds to the epoch's meter, as sums over samples
TRAIN_METRICS = ["loss", "correct"]


@dataclass
class Position:
    """Where training stands: the epoch being trained, its micro-batches done, global steps done, and
    this rank's partial sums of the epoch's metrics."""

    epoch: int
    batch: int
    step: int
    meter: SumMeter
    resumed_from: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    @classmethod
    def start(cls, device: torch.device, epoch: int = 0, batch: int = 0, step: int = 0,
              resumed_from: Optional[str] = None) -> Position:
        """A position whose epoch has no metrics yet (the beginning, unless told otherwise)."""
        return cls(epoch, batch, step, SumMeter(TRAIN_METRICS, device), resumed_from)

    def advance(self, batches: int) -> None:
        """One more optimizer step done, over `batches` loader batches."""
        self.step += 1
        self.batch += batches

    def next_epoch(self) -> Position:
        """The start of the next epoch: no batches done, no metrics, no notes left to write."""
        return Position(self.epoch + 1, 0, self.step, self.meter.emptied(), self.resumed_from)

    def note(self, message: str) -> None:
        """A note for metrics.jsonl, written when the run directory is (re)opened."""
        self.notes.append(message)


def epoch_means(sums: List[float]) -> Dict[str, float]:
    """The epoch's training loss, top-1 accuracy and samples, from its meter's sums over all ranks."""
    means = SumMeter.means(TRAIN_METRICS, sums)
    return {"loss": means["loss"], "top1": means["correct"], "samples": means["count"]}
