"""The smallest disturbances of a run: its initial weights moved by units in the last place.

Two runs that differ only by such a disturbance drift apart as far as rounding alone carries them. Several
distinct disturbances of the same size (patterns: which way each tensor moves) sample the outcomes rounding
leads to; their spread is the noise floor against which compare-backends judges the gap between two runs.
"""

from __future__ import annotations

from typing import List

import torch

#: pattern 1 moves every tensor away from zero, pattern 2 toward zero; higher patterns draw each tensor's way
AWAY, TOWARD = 1, 2


def directions(pattern: int, tensors: int) -> List[bool]:
    """For each of `tensors` parameter tensors, whether `pattern` moves it away from zero (else toward)."""
    if pattern == AWAY:
        return [True] * tensors
    if pattern == TOWARD:
        return [False] * tensors
    coins = torch.randint(2, (tensors,), generator=torch.Generator().manual_seed(pattern))
    return [bool(c) for c in coins]


@torch.no_grad()
def perturb_ulp(model: torch.nn.Module, ulps: int, pattern: int = AWAY) -> None:
    """Move every nonzero floating-point parameter element `ulps` units in the last place, each tensor away from
    zero or toward it as `pattern` says (zeros stay: one ulp of zero is a denormal, slow on CPUs and no smaller
    a disturbance). Every element of a tensor moves the same way, so each tensor's norm moves by about `ulps`
    ulps: the per-step weight fingerprint (common.loop.fingerprint) sees the disturbance from the first step."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    for param, away in zip(params, directions(pattern, len(params))):
        target = torch.where(param > 0, float("inf"), float("-inf")) if away else torch.zeros_like(param)
        for _ in range(ulps):
            param.copy_(torch.where(param != 0, torch.nextafter(param, target.to(param.dtype)), param))
