"""The smallest disturbances of a run: its initial weights moved by units in the last place, and where its gradients
are rounded below float32, each reduced gradient moved by one unit of that precision at every step.

Two runs that differ only by such a disturbance drift apart as far as rounding alone carries them. Several
distinct disturbances of the same size (patterns: which way each tensor moves) sample the outcomes rounding
leads to; their spread is the noise floor against which compare-backends judges the gap between two runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional

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
    for param, away in zip(params, directions(pattern, len(params)), strict=True):
        target = torch.where(param > 0, float("inf"), float("-inf")) if away else torch.zeros_like(param)
        for _ in range(ulps):
            param.copy_(torch.where(param != 0, torch.nextafter(param, target.to(param.dtype)), param))


#: per precision a run's gradients can be rounded at: its fraction bits and its smallest subnormal's exponent
PRECISIONS = {"float32": (23, -149), "bfloat16": (7, -133), "float16": (10, -24)}


@dataclass(frozen=True)
class GradientDisturbance:
    """The noise floor's disturbance of a run whose gradients are rounded below float32 (fp16 compression): at
    every optimizer step each nonzero reduced gradient element moves one unit in the last place of that precision,
    up or down as a draw from the pattern and the step says, the same on every rank. Two correct implementations
    that group their float16 roundings differently (per backward pass or per accumulated step, dividing before the
    sum or after it) differ by up to that much in every element at every step; a one-ulp move of the float32
    initial weights alone rarely flips a float16 rounding in the first steps, and a floor made only of it would
    call every such pair beyond."""

    precision: str
    pattern: int

    @torch.no_grad()
    def __call__(self, params: Iterable[torch.Tensor], step: int) -> None:
        bits, smallest = PRECISIONS[self.precision]
        draw = torch.Generator().manual_seed(self.pattern * 1_000_003 + step)
        for param in params:
            grad = param.grad
            if grad is None or grad.is_sparse or not grad.is_floating_point():
                continue
            # grad = m * 2**exponent, 0.5 <= |m| < 1: one ulp is 2**(exponent - bits - 1)
            _, exponent = torch.frexp(grad)
            ulp = torch.ldexp(torch.ones_like(grad), torch.clamp(exponent - (bits + 1), min=smallest))
            up = torch.randint(0, 2, grad.shape, generator=draw).to(grad.device, torch.bool)
            grad.add_(torch.where(grad == 0, 0.0, torch.where(up, ulp, -ulp)))


def gradient_disturbance(ulps: int, pattern: int, precision: Optional[str]) -> Optional[GradientDisturbance]:
    """The gradient disturbance of a disturbed run (`ulps` > 0) whose gradients are rounded at `precision` (None or
    float32: none, the initial weights' disturbance is at float32 already)."""
    if not ulps or precision is None or precision == "float32":
        return None
    return GradientDisturbance(precision, pattern)
