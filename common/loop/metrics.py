"""Sample-weighted meters and the per-step time split."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List

import torch


class SumMeter:
    """Sums of per-sample quantities and the sample count, kept on the device so that a step
    does not wait for the host; read (and reduced across ranks) only when reported."""

    def __init__(self, names: List[str], device: torch.device) -> None:
        self.names = list(names)
        self.sums = torch.zeros(len(names) + 1, dtype=torch.float64, device=device)

    def add(self, count: int, **totals: torch.Tensor) -> None:
        """Add `count` samples whose per-name totals (not means) are given."""
        for i, name in enumerate(self.names):
            self.sums[i] += totals[name].detach().to(torch.float64)
        self.sums[-1] += count

    def load(self, values: List[float]) -> None:
        """Continue from sums saved by values() (resuming mid-epoch)."""
        self.sums.copy_(torch.tensor(values, dtype=torch.float64))

    def values(self) -> List[float]:
        """The raw sums followed by the count, as floats (for all_reduce_sum)."""
        return [float(v) for v in self.sums.cpu()]

    def emptied(self) -> SumMeter:
        """New, empty sums of the same quantities on the same device."""
        return SumMeter(self.names, self.sums.device)

    @staticmethod
    def means(names: List[str], reduced: List[float]) -> Dict[str, float]:
        """Per-sample means from reduced sums; `count` is included."""
        count = reduced[-1]
        out = {name: (reduced[i] / count if count else float("nan")) for i, name in enumerate(names)}
        out["count"] = count
        return out


def topk_correct(logits: torch.Tensor, target: torch.Tensor, ks=(1, 5)) -> List[torch.Tensor]:
    """Number of samples whose label is among the top-k predictions, for each k (capped at classes)."""
    kmax = min(max(ks), logits.size(1))
    pred = logits.topk(kmax, dim=1).indices
    hits = pred.eq(target.unsqueeze(1))
    return [hits[:, :min(k, kmax)].any(dim=1).sum() for k in ks]


@dataclass
class TimeSplit:
    """Seconds spent per phase: waiting for data, computing, and exposed gradient communication."""

    data: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    steps: int = 0

    def add(self, data: float, compute: float, comm: float) -> None:
        """Add one step's phases."""
        self.data += data
        self.compute += compute
        self.comm += comm
        self.steps += 1

    @property
    def total(self) -> float:
        return self.data + self.compute + self.comm

    def per_step_ms(self) -> Dict[str, float]:
        """Mean milliseconds per step per phase, and each phase's fraction of the step."""
        n = max(self.steps, 1)
        total = self.total or 1.0
        return {
            "data_ms": 1000 * self.data / n,
            "compute_ms": 1000 * self.compute / n,
            "comm_ms": 1000 * self.comm / n,
            "step_ms": 1000 * self.total / n,
            "data_frac": self.data / total,
            "compute_frac": self.compute / total,
            "comm_frac": self.comm / total,
            "steps": self.steps,
        }


@dataclass
class Clock:
    """Wall clock that first waits for queued device work, so CUDA phases are timed truly."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def now(self) -> float:
        """Seconds, after the device is idle."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
