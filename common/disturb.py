"""The smallest disturbance of a run: its initial weights moved by units in the last place.

Two runs that differ only by this drift apart as far as rounding alone carries them; that drift is the
noise floor against which compare-backends judges the gap between two backends.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def perturb_ulp(model: torch.nn.Module, ulps: int) -> None:
    """Move every nonzero floating-point parameter element `ulps` units in the last place away from zero
    (zeros stay: one ulp of zero is a denormal, slow on CPUs and no smaller a disturbance)."""
    for param in model.parameters():
        if not param.is_floating_point():
            continue
        for _ in range(ulps):
            away = torch.where(param > 0, torch.full_like(param, float("inf")), torch.full_like(param, float("-inf")))
            param.copy_(torch.where(param != 0, torch.nextafter(param, away), param))
