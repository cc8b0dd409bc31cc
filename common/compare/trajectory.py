"""Where two runs part: their gap at every logged step, judged against the noise floor where the divergence starts.

Each step has two measured quantities, both describing the weights the step's forward pass sees: rank 0's
loss, and a fingerprint of the weights (every parameter tensor's norm, common.loop.fingerprint). The gap of a
quantity at a step is its relative difference between the two runs (for the fingerprint, the largest over
the tensors). Rounding starts at the last bit of float32 and grows; a real difference (a learning rate, a
weight decay, a compression, another sample order) moves the trajectory from the first step it acts on by
orders of magnitude more. So a pair is judged where its divergence starts: at each step its gap is compared
with the band of the noise floor (the largest gap any of its disturbed runs has reached by that step), and
the pair *leaves the band* at the first step where its gap is more than `margin` times the band.

Training branches: a gap that has stayed at rounding's size can leave it within a step (a ReLU, a max-pool or an
Adam denominator tips the other way) and then grows as the floor's own runs grow once they branch. When that
happens is chance, so a same-training pair can branch steps before any disturbed run does. A pair whose gap first
differed at rounding's size and only later leaves it (its *branch*) is judged from there against the floor's
*branches*: how far the disturbed runs' gaps reach in as many steps after their own branch started. A real
difference that acts late does not grow from rounding's size: it jumps, by more than the margin over what the
floor's branches start from.

The learning rate of each step is recorded too: the first step where it differs is a difference in training
by itself, whatever the trajectory shows.
"""

from __future__ import annotations

from typing import Dict, List, Optional

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


def step_gaps(a: Dict[int, Dict], b: Dict[int, Dict]) -> Dict[str, Dict[int, float]]:
    """Per quantity, the relative gap at every step both runs logged it (inputs: Run.step_states())."""
    out: Dict[str, Dict[int, float]] = {q: {} for q in QUANTITIES}
    for step in sorted(set(a) & set(b)):
        x, y = a[step], b[step]
        if x.get("loss") is not None and y.get("loss") is not None:
            out["loss"][step] = relative(x["loss"], y["loss"])
        wa, wb = x.get("wnorm"), y.get("wnorm")
        if wa is not None and wb is not None and len(wa) == len(wb):
            out["weights"][step] = max((relative(p, q) for p, q in zip(wa, wb)), default=0.0)
    return out


def lr_difference(a: Dict[int, Dict], b: Dict[int, Dict]) -> Optional[Dict]:
    """The first step whose learning rate differs, {"step", "a", "b"}, or None."""
    for step in sorted(set(a) & set(b)):
        x, y = a[step].get("lr"), b[step].get("lr")
        if x is not None and y is not None and relative(x, y) > 1e-9:
            return {"step": step, "a": x, "b": y}
    return None


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


def band_at(series: Dict[int, float], steps: List[int]) -> Dict[int, float]:
    """A band (or the floor's branches) at each of `steps`, ascending: its value at the last step at or before each
    that the floor logged, EPS32 before the first."""
    known, out, i, level = sorted(series), {}, 0, EPS32
    for step in steps:
        while i < len(known) and known[i] <= step:
            level = series[known[i]]
            i += 1
        out[step] = level
    return out


def onset(series: Dict[int, float], margin: float) -> Optional[int]:
    """The first step where a gap is more than `margin` times rounding's size (EPS32): where a branch starts."""
    return next((step for step in sorted(series) if series[step] > margin * EPS32), None)


def branches(floor_gaps: List[Dict[str, Dict[int, float]]], margin: float) -> Dict[str, Dict[int, float]]:
    """Per quantity, the floor's branches: the largest gap any disturbed run reaches within n steps after its own
    branch started (its `onset`), keyed by n. Empty for a quantity no disturbed run branches in."""
    out: Dict[str, Dict[int, float]] = {}
    for q in QUANTITIES:
        aligned = []
        for g in floor_gaps:
            start = onset(g[q], margin)
            if start is not None:
                aligned.append({step - start: gap for step, gap in g[q].items() if step >= start})
        level, series = 0.0, {}
        for n in sorted({n for a in aligned for n in a}):
            level = max([level] + [a[n] for a in aligned if n in a])
            series[n] = level
        out[q] = series
    return out


def judged_band(gaps: Dict[str, Dict[int, float]], floor_band: Dict[str, Dict[int, float]],
                floor_branches: Dict[str, Dict[int, float]], margin: float) -> Dict[str, Dict]:
    """Per quantity, what the pair's gap at each step is judged against: {"levels": {step: level}, "branch": the
    step the pair's branch starts or None, "from_branches": the steps whose level is the floor's branches, "needed":
    whether the gap at one of those is beyond the band alone}. The level
    is the band, except after a branch that starts later than the pair's first differing step (the gap was at
    rounding's size first), where it is the larger of the band and the floor's branches as many steps after theirs
    started."""
    first = first_differing(gaps)
    out: Dict[str, Dict] = {}
    for q in QUANTITIES:
        start = onset(gaps[q], margin)
        if start is None or first is None or start <= first or not floor_branches.get(q):
            start = None
        steps = sorted(gaps[q])
        levels, from_branches, needed = band_at(floor_band[q], steps), set(), False
        if start is not None:
            after = [step for step in steps if step >= start]
            for step, level in zip(after, band_at(floor_branches[q], [step - start for step in after]).values()):
                if level > levels[step]:
                    needed = needed or gaps[q][step] > margin * levels[step]
                    levels[step] = level
                    from_branches.add(step)
        out[q] = {"levels": levels, "branch": start, "from_branches": from_branches, "needed": needed}
    return out


def departure(gaps: Dict[str, Dict[int, float]], judged: Dict[str, Dict], margin: float) -> Optional[Dict]:
    """The first step where a quantity's gap is more than `margin` times what it is judged against (`judged_band`):
    {"step", "quantity", "gap", "band", "ratio", "branch"} (the largest ratio among the quantities that leave at
    that step; "branch" is the step the pair's branch started when the level there is the floor's branches, else
    None), or None."""
    found = []
    for q in QUANTITIES:
        for step in sorted(gaps[q]):
            level = judged[q]["levels"][step]
            if gaps[q][step] > margin * level:
                found.append({"step": step, "quantity": q, "gap": gaps[q][step], "band": level,
                              "ratio": gaps[q][step] / level,
                              "branch": judged[q]["branch"] if step in judged[q]["from_branches"] else None})
                break
    if not found:
        return None
    first = min(d["step"] for d in found)
    return max((d for d in found if d["step"] == first), key=lambda d: d["ratio"])


def largest_ratio(gaps: Dict[str, Dict[int, float]], judged: Dict[str, Dict]) -> Optional[Dict]:
    """The step and quantity where the pair's gap is largest against what it is judged against:
    {"step", "quantity", "ratio"}."""
    best = None
    for q in QUANTITIES:
        for step, gap in gaps[q].items():
            ratio = gap / judged[q]["levels"][step]
            if best is None or ratio > best["ratio"]:
                best = {"step": step, "quantity": q, "ratio": ratio}
    return best
