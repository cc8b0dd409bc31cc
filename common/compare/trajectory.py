"""Where two runs part: their gap at every logged step, judged against the noise floor's band at that step.

Each step has two measured quantities, both describing the weights the step's forward pass sees: rank 0's
loss, and a fingerprint of the weights (every parameter tensor's norm, common.loop.fingerprint). The gap of a
quantity at a step is its relative difference between the two runs (for the fingerprint, the largest over
the tensors). Rounding starts at the last bit of float32 and grows; a real difference (a learning rate, a
weight decay, a compression, another sample order) moves the trajectory from the first step it acts on by
orders of magnitude more. So a pair is judged where its divergence starts: at each step its gap is compared
with the band of the noise floor (the largest gap any of its disturbed runs has reached by that step), and
the pair *leaves the band* at the first step where its gap is more than `margin` times the band.

The learning rate of each step is recorded too: the first step where it differs is a difference in training
by itself, whatever the trajectory shows.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Dict, List, Optional

from .results import BandRatio, Departure, LrDifference, SettingDifference

#: the unit roundoff of float32: two float32 numbers a relative 1.2e-7 apart differ in their last bit. No band
#: is narrower (a logged float32 loss cannot tell smaller gaps from none)
EPS32 = 2.0 ** -23

#: the quantities measured at each step, in the order a departure names them
QUANTITIES = ("weights", "loss")
#: what each quantity is, in a verdict
WORDS = {"weights": "the weights' fingerprint", "loss": "the loss"}


def relative(x: float, y: float) -> float:
    """|x - y| relative to the larger of |x|, |y| (0 for two zeros)."""
    size = max(abs(x), abs(y))
    return abs(x - y) / size if size > 0 else 0.0


def step_gaps(a: Dict[int, Dict[str, Any]], b: Dict[int, Dict[str, Any]]) -> Dict[str, Dict[int, float]]:
    """Per quantity, the relative gap at every step both runs logged it (inputs: Run.step_states())."""
    out: Dict[str, Dict[int, float]] = {q: {} for q in QUANTITIES}
    for step in sorted(set(a) & set(b)):
        x, y = a[step], b[step]
        if x.get("loss") is not None and y.get("loss") is not None:
            out["loss"][step] = relative(x["loss"], y["loss"])
        wa, wb = x.get("wnorm"), y.get("wnorm")
        if wa is not None and wb is not None and len(wa) == len(wb):
            out["weights"][step] = max((relative(p, q) for p, q in zip(wa, wb, strict=True)), default=0.0)
    return out


def lr_difference(a: Dict[int, Dict[str, Any]], b: Dict[int, Dict[str, Any]]) -> Optional[LrDifference]:
    """The first step whose learning rate differs, or None."""
    for step in sorted(set(a) & set(b)):
        x, y = a[step].get("lr"), b[step].get("lr")
        if x is not None and y is not None and relative(x, y) > 1e-9:
            return LrDifference(step, x, y)
    return None


#: optimizer settings that first act in the second update: the first one's momentum buffer is its gradient alone
SECOND_UPDATE = ("momentum", "dampening")


def setting_difference(a: Dict[int, Dict[str, Any]], b: Dict[int, Dict[str, Any]]) -> Optional[SettingDifference]:
    """The first step whose optimizer settings other than the learning rate differ (a weight decay, a momentum,
    Adam's betas, another optimizer), with `acts`, the first step whose forward pass sees its effect (the next
    step's, or for a momentum the one after), or None."""
    for step in sorted(set(a) & set(b)):
        x, y = a[step].get("optimizer") or [], b[step].get("optimizer") or []
        for group, (u, v) in enumerate(zip(x, y, strict=False)):  # param groups the two have both
            for key in sorted(set(u) | set(v)):
                if key in u and key in v and not _same(u[key], v[key]):
                    acts = step + (2 if key in SECOND_UPDATE else 1)
                    return SettingDifference(step, group, key, u[key], v[key], acts)
    return None


def _same(x: Any, y: Any) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    return relative(x, y) <= 1e-9 if numbers else x == y


def first_differing(gaps: Dict[str, Dict[int, float]]) -> Optional[int]:
    """The first step at which any quantity differs at all."""
    steps = [s for q in QUANTITIES for s, g in gaps[q].items() if g > 0]
    return min(steps) if steps else None


def band(floor_gaps: List[Dict[str, Dict[int, float]]]) -> Dict[str, Dict[int, float]]:
    """The noise floor's band per quantity and step: the largest gap any disturbed run has reached by that step
    (a running maximum: rounding does not take back how far it has carried a run), never below EPS32."""
    out: Dict[str, Dict[int, float]] = {}
    for q in QUANTITIES:
        steps = sorted({s for g in floor_gaps for s in g[q]})
        level, series = EPS32, {}
        for step in steps:
            level = max([level] + [g[q][step] for g in floor_gaps if step in g[q]])
            series[step] = level
        out[q] = series
    return out


def band_at(series: Dict[int, float]) -> Callable[[int], float]:
    """The band of `series` at any step: its value at the last step at or before it that the floor logged (EPS32
    before the first). The steps are sorted once and each lookup bisects them, so a whole run's steps cost
    O(n log n), not O(n**2)."""
    steps = sorted(series)

    def at(step: int) -> float:
        known = bisect.bisect_right(steps, step)
        return series[steps[known - 1]] if known else EPS32

    return at


def departure(gaps: Dict[str, Dict[int, float]], floor_band: Dict[str, Dict[int, float]],
              margin: float) -> Optional[Departure]:
    """The first step where a quantity's gap is more than `margin` times the band (the largest ratio among the
    quantities that leave at that step), or None."""
    found = []
    for q in QUANTITIES:
        band_of = band_at(floor_band[q])
        for step in sorted(gaps[q]):
            level = band_of(step)
            if gaps[q][step] > margin * level:
                found.append(Departure(step, q, gaps[q][step], level, gaps[q][step] / level))
                break
    if not found:
        return None
    first = min(d.step for d in found)
    return max((d for d in found if d.step == first), key=lambda d: d.ratio)


def largest_ratio(gaps: Dict[str, Dict[int, float]], floor_band: Dict[str, Dict[int, float]]) -> Optional[BandRatio]:
    """The step and quantity where the pair's gap is largest against the band."""
    best: Optional[BandRatio] = None
    for q in QUANTITIES:
        band_of = band_at(floor_band[q])
        for step, gap in gaps[q].items():
            ratio = gap / band_of(step)
            if best is None or ratio > best.ratio:
                best = BandRatio(step, q, ratio)
    return best
