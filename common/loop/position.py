"""Where training stands: the epoch, its loader batches done, global steps done, the epoch's metrics so far."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .metrics import SumMeter


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
