"""Training branches: a pair that branches earlier than the floor's runs is judged from where it branches.

A gap that has stayed at rounding's size can leave it within a step (a ReLU, a max-pool or an Adam denominator
tips the other way) and then grows as the floor's own runs grow once they branch. When that happens is chance, so a
same-training pair can branch steps before any disturbed run does, and against the band by then (the largest gap
any disturbed run has reached by that step, common.compare.trajectory) it reads as beyond it. So a pair whose gap
first differed at rounding's size and only later leaves it (its *branch*: the first step its gap is more than the
margin times float32's last bit) is judged from there against the floor's *branches*: how far the disturbed runs'
gaps reach in as many steps after their own branch started. A real difference that acts late does not grow from
rounding's size: it jumps, by more than the margin over what the floor's branches start from. A pair large from its
first differing step has no branch to be judged from: the band is what it is judged against.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .results import Departure
from .trajectory import EPS32, QUANTITIES, band, band_at, first_differing


def onset(series: Dict[int, float], margin: float) -> Optional[int]:
    """The first step where a gap is more than `margin` times rounding's size (EPS32): where a branch starts."""
    return next((step for step in sorted(series) if series[step] > margin * EPS32), None)


def of_floor(floor_gaps: List[Dict[str, Dict[int, float]]], margin: float) -> Dict[str, Dict[int, float]]:
    """Per quantity, the floor's branches: the largest gap any disturbed run reaches within n steps after its own
    branch started (its `onset`), keyed by n. Empty for a quantity no disturbed run branches in."""
    return band([{q: _from_onset(gaps[q], margin) for q in QUANTITIES} for gaps in floor_gaps])


def _from_onset(series: Dict[int, float], margin: float) -> Dict[int, float]:
    """A run's gaps from its branch on, keyed by steps since the branch started (empty if it never branches)."""
    start = onset(series, margin)
    return {} if start is None else {step - start: gap for step, gap in series.items() if step >= start}


def judged_band(gaps: Dict[str, Dict[int, float]], floor: Dict[str, Any], margin: float) -> Dict[str, Dict[str, Any]]:
    """Per quantity, what a pair's gaps (common.compare.trajectory.step_gaps) are judged against by a floor
    (common.compare.floor.measure): {"levels": {step: level}, "branch": the step the pair's branch starts or None,
    "from_branches": the steps whose level is the floor's branches, "needed": whether the gap at one of those is
    beyond the band alone}. The level is the floor's band, except after a branch that starts later than the pair's
    first differing step, where it is the larger of the band and the floor's branches as many steps after theirs
    started. The levels are a band series: common.compare.trajectory.departure and largest_ratio take them."""
    branches = of_floor([p["steps"] for p in floor["pairs"]], margin)
    first = first_differing(gaps)
    out: Dict[str, Dict[str, Any]] = {}
    for q in QUANTITIES:
        start = onset(gaps[q], margin)
        if start is None or first is None or start <= first or not branches[q]:
            start = None
        levels, from_branches, needed = {}, set(), False
        band_of, branch_band_of = band_at(floor["band"][q]), band_at(branches[q])
        for step in sorted(gaps[q]):
            levels[step] = band_of(step)
            if start is not None and step >= start:
                level = branch_band_of(step - start)
                if level > levels[step]:
                    needed = needed or gaps[q][step] > margin * levels[step]
                    levels[step] = level
                    from_branches.add(step)
        out[q] = {"levels": levels, "branch": start, "from_branches": from_branches, "needed": needed}
    return out


def levels(judged: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[int, float]]:
    """The band series of a `judged_band`: per quantity, the level at every step."""
    return {q: j["levels"] for q, j in judged.items()}


def branch_levels(judged: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[int, float]]:
    """The part of a `judged_band` that the floor's branches set: per quantity that has any, the level at each step
    where they, not the band, are what the pair is judged against."""
    return {q: {step: j["levels"][step] for step in sorted(j["from_branches"])} for q, j in judged.items()
            if j["from_branches"]}


def branch_of(departure: Optional[Departure], judged: Dict[str, Dict[str, Any]]) -> Optional[int]:
    """The step the pair's branch started, when a departure was judged against the floor's branches (else None)."""
    if departure is None:
        return None
    j = judged[departure.quantity]
    return j["branch"] if departure.step in j["from_branches"] else None
