"""Why two scripts part: at the first step where they do, the first quantity that differs, in causal order.

A script the probe followed (common.probe) records, per step and rank, the input batch's fingerprint, every
param group's settings, the optimizer's state before the step, the gradients' norms, the weights' norms after
it and the loss; and the weights each rank starts from, and any optimizer step taken without a backward. Two
runs of a Horovod script and its DDP port are read in the order one causes the next: the initial weights
(the same on every rank? the same in both scripts?), optimizer steps before training, then step by step up to
the step where the trajectories part: the inputs of each rank, the optimizer's settings, its state, the
gradients, and last the weights and the loss. The first that differs is the cause, with its numbers, the
likely mistake and the section of the migration guide that covers it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.rundir.reader import Run

from .results import Cause
from .trajectory import relative

GUIDE = "docs/migrating-from-horovod.md"
#: sections of the migration guide, by the mistake they cover
SECTIONS = {
    "weights": "#the-initial-weights",
    "zero-step": "#the-trap-in-broadcast_optimizer_state",
    "inputs": "#the-sample-order",
    "set-epoch": "#the-sample-order",
    "lr": "#the-learning-rate",
    "state": "#the-trap-in-broadcast_optimizer_state",
    "gradients": "#averaging-the-gradients",
    "compression": "#averaging-the-gradients",
    "step": "#the-map",
}
#: gradients whose norms are further apart than this are not rounding apart (rounding: about 1e-7)
GRADIENT_TOLERANCE = 1e-4
#: a ratio within this of the world size (or its inverse) is the world size
RATIO_TOLERANCE = 0.01


def is_script_run(run: Run) -> bool:
    """A run directory the probe wrote of a user's script."""
    return bool((run.config.get("backend") or {}).get("script"))


def _events(run: Run, kind: str) -> List[Dict[str, Any]]:
    return [e for e in run.events if e["event"] == kind]


def _steps(run: Run) -> Dict[int, Dict[str, Any]]:
    return {e["step"]: e for e in _events(run, "step")}


def _largest_gap(x: Optional[Sequence[Optional[float]]], y: Optional[Sequence[Optional[float]]]) -> float:
    """The largest relative gap of two fingerprints, tensor by tensor (inf when they have other lengths)."""
    x, y = x or [], y or []
    if len(x) != len(y):
        return float("inf")
    return max((relative(a, b) for a, b in zip(x, y, strict=True) if a is not None and b is not None), default=0.0)


def _cause(step: Optional[int], quantity: str, text: str, section: str, **numbers: Any) -> Cause:
    return Cause(step, quantity, text, f"{GUIDE}{SECTIONS[section]}", numbers)


def _ranks_apart(a: Run, b: Run) -> Optional[Cause]:
    """The ranks of one run starting from different weights."""
    for run in (a, b):
        start = (_events(run, "start") or [{}])[0]
        ranks = start.get("ranks") or []
        for rank, norms in enumerate(ranks[1:], start=1):
            gap = _largest_gap(ranks[0], norms)
            if gap > 0:
                return _cause(None, "initial weights",
                              f"the ranks of {run.name} start from different weights (rank {rank}'s fingerprint is "
                              f"{gap:.1e} from rank 0's): its weights are not broadcast from rank 0 before training",
                              "weights", run=run.name, rank=rank, gap=gap)
    return None


def _built_apart(a: Run, b: Run) -> Optional[Cause]:
    """The two runs starting from different weights (rank 0's)."""
    start_a, start_b = ((_events(r, "start") or [{}])[0].get("wnorm") for r in (a, b))
    gap = _largest_gap(start_a, start_b)
    if gap > 0:
        return _cause(None, "initial weights", f"the two scripts start from different weights (rank 0's fingerprints "
                      f"{gap:.1e} apart): another seed or initialisation", "weights", gap=gap)
    return None


def _effective_state(summary: Dict[str, Any]) -> Dict[str, Any]:
    """What of an optimizer's state can change a step: its step counts (Adam's bias correction) and its momentum
    buffers, a missing buffer counting as zeros (SGD's first step makes the same buffer from either)."""
    momentum = [n or 0.0 for n in summary.get("momentum_norms") or []]
    return {"steps": summary.get("steps") or [], "momentum": momentum if any(momentum) else []}


def _stepless(a: Run, b: Run, before: int) -> Optional[Cause]:
    """An optimizer step without a backward before training in one script and not the other, when it mattered:
    it moved the weights, or its state changes the first real step."""
    counts = {run.name: [e for e in _events(run, "stepless") if e.get("before_step", 1) <= before] for run in (a, b)}
    if len(counts[a.name]) == len(counts[b.name]):
        return None
    run, other = (a, b) if len(counts[a.name]) > len(counts[b.name]) else (b, a)
    event = counts[run.name][0]
    moved = _largest_gap(event.get("wnorm_before"), event.get("wnorm"))
    first = _steps(run).get(event.get("before_step", 1)) or {}
    state = _effective_state(first.get("state") or {})
    if moved == 0 and not state["steps"] and not state["momentum"]:
        return None  # SGD without weight decay: zero momentum buffers, the first step the same bits
    decay = max((g.get("weight_decay") or 0.0) for g in event.get("groups") or [{}])
    effect = (f"with weight decay {decay:g} it moved the weights ({moved:.1e} of a tensor's norm) and left "
              "momentum buffers" if moved > 0 else "it moved no weight but left optimizer state (Adam's step "
              f"count {state['steps']}) that changes the first real step")
    return _cause(event.get("before_step"), "optimizer steps before training",
                  f"{run.name} ran an optimizer step with no backward before step {event.get('before_step')} "
                  f"(horovod.torch.broadcast_optimizer_state on a fresh optimizer) and {other.name} did not: {effect}",
                  "zero-step", run=run.name, weights_moved=moved, weight_decay=decay)


def _inputs(a: Run, b: Run, step: int, sa: Dict[str, Any], sb: Dict[str, Any]) -> Optional[Cause]:
    ranks_a, ranks_b = sa.get("ranks") or [], sb.get("ranks") or []
    for rank, (x, y) in enumerate(zip(ranks_a, ranks_b, strict=False)):  # scripts may run on other numbers
        if x.get("inputs") == y.get("inputs"):
            continue
        shapes = [[i[0] if i else None for i in r.get("inputs") or []] for r in (x, y)]
        if shapes[0] != shapes[1]:
            return _cause(step, "inputs", f"rank {rank}'s batch at step {step} has another shape ({shapes[0]} vs "
                          f"{shapes[1]}): another batch size or batch split", "inputs", rank=rank)
        repeated = _repeats_first_epoch(a, b, step, rank)
        if repeated:
            return _cause(step, "inputs", f"rank {rank}'s batch at step {step} differs, and {repeated} draws the "
                          f"same batches from step {step} as from step 1: its sampler does not change the order "
                          "with the epoch (DistributedSampler.set_epoch(epoch) is not called)", "set-epoch",
                          rank=rank, run=repeated)
        return _cause(step, "inputs", f"rank {rank}'s batch at step {step} differs: another sample order or "
                      "another sharding of the data", "inputs", rank=rank)
    return None


def _repeats_first_epoch(a: Run, b: Run, step: int, rank: int) -> Optional[str]:
    """The run whose batch at `step` is its batch at step 1 while the other's is not (an epoch repeated)."""
    def batch(at: int, steps: Dict[int, Dict[str, Any]]) -> Any:
        return ((steps.get(at) or {}).get("ranks") or [{}] * (rank + 1))[rank].get("inputs")

    for run, other in ((a, b), (b, a)):
        steps, theirs = _steps(run), _steps(other)
        if step > 1 and batch(step, steps) == batch(1, steps) and batch(step, theirs) != batch(1, theirs):
            return run.name
    return None


def _settings(a: Run, b: Run, step: int, sa: Dict[str, Any], sb: Dict[str, Any]) -> Optional[Cause]:
    world = a.world_size
    for index, (x, y) in enumerate(zip(sa.get("groups") or [], sb.get("groups") or [], strict=False)):
        for key in sorted(set(x) & set(y)):
            u, v = x[key], y[key]
            numbers = all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in (u, v))
            if u == v or (numbers and relative(u, v) < 1e-12):
                continue
            section = "lr" if key == "lr" else "step"
            if not numbers:
                return _cause(step, "optimizer settings", f"param group {index}'s {key} is {u} in {a.name} and {v} in "
                              f"{b.name} from step {step}", section, key=key, a=u, b=v)
            ratio = u / v if v else float("inf")
            why = f" (ratio {ratio:.3g})" if key == "lr" else ""
            if ratio and (abs(ratio - world) <= RATIO_TOLERANCE * world or
                          abs(1 / ratio - world) <= RATIO_TOLERANCE * world):
                why = (f" (ratio {ratio:.3g}: the world size, {world}: one script scales its {key} by the number of "
                       "ranks, the other does not)")
            return _cause(step, "optimizer settings", f"param group {index}'s {key} is {u:g} in {a.name} and {v:g} in "
                          f"{b.name} from step {step}{why}", section, key=key, a=u, b=v, ratio=ratio)
    return None


def _state(a: Run, b: Run, step: int, sa: Dict[str, Any], sb: Dict[str, Any]) -> Optional[Cause]:
    x, y = (_effective_state(s.get("state") or {}) for s in (sa, sb))
    if x["steps"] == y["steps"] and _largest_gap(x["momentum"], y["momentum"]) <= GRADIENT_TOLERANCE:
        return None
    return _cause(step, "optimizer state", f"before step {step} the optimizer of {a.name} holds step counts "
                  f"{x['steps'] or 'none'} and momentum of norms up to {max(x['momentum'], default=0):.3g}, that of "
                  f"{b.name} step counts {y['steps'] or 'none'} and momentum up to {max(y['momentum'], default=0):.3g}",
                  "state")


def gradient_precision(run: Run) -> str:
    """The precision a run's gradients were exchanged at: what the probe saw, or the loop's --compression."""
    recorded = run.config.get("gradient_precision")
    if recorded:
        return str(recorded)
    return "float16" if (run.settings or {}).get("compression") == "fp16" else "float32"


#: fraction bits of the precisions gradients are rounded at below float32
ROUNDING_BITS = {"float16": 10, "bfloat16": 7}


def _rounding_reach(a: Run, b: Run) -> Optional[Tuple[str, float, List[str]]]:
    """(the lower precision, the largest relative gap of a gradient's norm its rounding explains, the runs whose
    gradients are rounded at it) when either run's gradients are rounded below float32, else None: roundings
    grouped differently move each element by up to one unit, a tensor's norm by less."""
    for precision, bits in ROUNDING_BITS.items():
        runs = [run.name for run in (a, b) if gradient_precision(run) == precision]
        if runs:
            return precision, 2.0 ** -bits, runs
    return None


def _gradients(a: Run, b: Run, step: int, sa: Dict[str, Any], sb: Dict[str, Any]) -> Optional[Cause]:
    ga, gb = sa.get("gnorm") or [], sb.get("gnorm") or []
    gap = _largest_gap(ga, gb)
    if gap <= GRADIENT_TOLERANCE:
        return None
    ratios = [x / y for x, y in zip(ga, gb, strict=False) if x and y]  # models of other sizes: their common tensors
    ratio = sorted(ratios)[len(ratios) // 2] if ratios else float("nan")
    world = a.world_size
    scaled = abs(ratio - 1) > RATIO_TOLERANCE  # a common factor of 1 is no scale
    if scaled and ratios and all(abs(r - ratio) <= RATIO_TOLERANCE * ratio for r in ratios):
        if abs(ratio - world) <= RATIO_TOLERANCE * world or abs(1 / ratio - world) <= RATIO_TOLERANCE * world:
            summed = a.name if ratio > 1 else b.name
            return _cause(step, "gradients", f"at step {step} every gradient of {summed} is {world}x the other's "
                          f"(ratio {ratio:.3g} = the world size): its gradients are summed over the ranks, not "
                          "averaged", "gradients", ratio=ratio)
        return _cause(step, "gradients", f"at step {step} every gradient differs by the same factor, {ratio:.3g}: a "
                      "scaled loss or a scaled reduction", "gradients", ratio=ratio)
    reach = _rounding_reach(a, b)
    if reach is not None and gap <= reach[1]:
        precision, _, rounded = reach
        how = ("the compression is applied at another grouping (per backward pass or per accumulated step, before "
               "or after the division by the world size)" if len(rounded) == 2 else
               f"{rounded[0]} sends its gradients as {precision} and the other does not")
        return _cause(step, "gradients", f"the gradients differ at {precision}'s rounding from step {step} (up to "
                      f"{gap:.1e} of their norm): {how}", "compression", gap=gap, precision=precision)
    return _cause(step, "gradients", f"the gradients differ at step {step} (up to {gap:.1e} of "
                  "their norm) though the inputs, the weights and the optimizer agree: another loss, model or "
                  "reduction", "gradients")


def explain(a: Run, b: Run, parts_at: Optional[int]) -> Optional[Cause]:
    """The cause of two script runs parting at step `parts_at` (None: they do not), or None."""
    if parts_at is None or not (is_script_run(a) and is_script_run(b)):
        return None
    # An optimizer step before training moves the weights the first forward pass sees: it comes before them.
    # Runs that start apart part at step 0: a step before the first (the zero step) can be why.
    found = _ranks_apart(a, b) or _stepless(a, b, max(parts_at, 1)) or _built_apart(a, b)
    if found:
        return found
    steps_a, steps_b = _steps(a), _steps(b)
    for step in sorted(set(steps_a) & set(steps_b)):
        if step > parts_at:
            break
        sa, sb = steps_a[step], steps_b[step]
        found = (_inputs(a, b, step, sa, sb) or _settings(a, b, step, sa, sb) or _state(a, b, step, sa, sb)
                 or _gradients(a, b, step, sa, sb))
        if found:
            return found
    return _cause(parts_at, "weights and loss", f"the weights and the loss part at step {parts_at} while the inputs, "
                  "the optimizer's settings and state and the gradients agreed before it", "step")
