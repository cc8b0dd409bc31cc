"""The noise floor: how far rounding alone carries a run, as a spread over several disturbed runs.

A disturbed run is the same settings with the initial weights moved by one unit in the last place
(--perturb-ulp 1), each with its own pattern of directions (--perturb-pattern 1, 2, ...). Compared with the
undisturbed run of the same backend and world size, each gives the gaps rounding alone produces at every
step and at the end; training branches (runs that differ only by rounding can end far apart), so one
disturbed run is one sample of those outcomes and several describe their spread. The floor keeps, per step,
the band of the largest gap any of them has reached (common.compare.trajectory), the largest final gap, and
the range of the final loss and accuracy over the base and its disturbed runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from common.rundir.reader import DISTURBED, Run, learned_settings
from . import gaps, trajectory
#: disturbed runs per floor by default: chosen by measurement (docs/comparing.md, benchmarks/results/verdicts.json)
DEFAULT_FLOOR_RUNS = 3
#: the final metrics set beside the range of the floor's runs
OUTCOME = ("val_top1", "val_loss")
#: those an outcome is judged on: accuracy, whose steps of one validation sample say how far is far (a loss has no
#: such unit, and a few disturbed runs can agree on it to many digits)
JUDGED = ("val_top1",)


def is_disturbed(run: Run) -> bool:
    """A run made with --perturb-ulp."""
    return run.identity.is_disturbed


def base_label(run: Run) -> str:
    """The label of the undisturbed run a disturbed run is measured against: ddp for ddp+perturbed2."""
    identity = run.identity
    return replace(identity, variants=tuple(v for v in identity.variants if not v.startswith(DISTURBED))).label


def signature(run: Run) -> str:
    """The run's settings, leaving out those that change nothing learned and those its label carries."""
    return json.dumps(learned_settings(run), sort_keys=True)


def base_of(disturbed: Run, runs: List[Run]) -> Optional[Run]:
    """The undisturbed first run of the same backend, world size and settings."""
    return next((r for r in runs if not is_disturbed(r) and r.label == base_label(disturbed)
                 and r.world_size == disturbed.world_size and r.repeat == 0 and signature(r) == signature(disturbed)),
                None)


def _pair(base: Run, disturbed: Run) -> Dict[str, Any]:
    found = gaps.tensor_gaps(base, disturbed)
    steps = trajectory.step_gaps(base.step_states(), disturbed.step_states())
    return {"disturbed": disturbed.name, "ulp": disturbed.settings.get("perturb_ulp"),
            "pattern": disturbed.settings.get("perturb_pattern", 1), "gap": gaps.headline(found),
            "tensor": gaps.dominant(found), "gaps": found, "steps": steps,
            "max_rel_loss_diff": max(steps["loss"].values(), default=None),
            "first_differing_step": trajectory.first_differing(steps)}


def outcome_range(members: List[Run]) -> Dict[str, Optional[List[float]]]:
    """[min, max] of each final metric (OUTCOME) over `members` (None where a run lacks it)."""
    out: Dict[str, Optional[List[float]]] = {}
    for metric in OUTCOME:
        values = [r.summary.get(metric) for r in members]
        known = [float(v) for v in values if v is not None]
        out[metric] = None if len(known) < len(values) else [min(known), max(known)]
    return out


def measure(base: Run, disturbed: List[Run]) -> Dict[str, Any]:
    """The floor from a base and its disturbed runs: each pair's gaps, the band per step, the largest final
    parameter gap and the range of the outcomes."""
    pairs = [_pair(base, d) for d in disturbed]
    widest = max(pairs, key=lambda p: p["gap"])
    return {"base": base.name, "disturbed": [d.name for d in disturbed], "world_size": base.world_size,
            "runs": len(disturbed), "pairs": pairs, "band": trajectory.band([p["steps"] for p in pairs]),
            "gap": widest["gap"], "tensor": widest["tensor"], "gaps": widest["gaps"],
            "max_rel_loss_diff": max((p["max_rel_loss_diff"] or 0.0 for p in pairs), default=None),
            "outcome": outcome_range([base, *disturbed])}


def floors(runs: List[Run]) -> Dict[int, Dict[str, Any]]:
    """world size -> the noise floor measured there (DDP's when several backends were disturbed)."""
    groups: Dict[Tuple[int, str], List[Run]] = {}
    for run in runs:
        if is_disturbed(run):
            base = base_of(run, runs)
            if base is not None:
                groups.setdefault((run.world_size, base.name), []).append(run)
    out: Dict[int, Dict[str, Any]] = {}
    for (world, name), disturbed in sorted(groups.items(), key=lambda item: (item[0][0], not item[0][1].startswith(
            "ddp"), item[0][1])):
        if world not in out:
            base = next(r for r in runs if r.name == name)
            out[world] = measure(base, sorted(disturbed, key=lambda r: r.name))
    return out


def missing(runs: List[Run], differ: Callable[[Run, Run], bool]) -> List[int]:
    """World sizes with no floor where two runs (repeats included) `differ`."""
    measured = floors(runs)
    out = []
    for world in sorted({r.world_size for r in runs} - set(measured)):
        plain = [r for r in runs if r.world_size == world and not r.identity.is_variant]
        if any(differ(a, b) for i, a in enumerate(plain) for b in plain[i + 1:]
               if a.summary.get("weights_sha256") != b.summary.get("weights_sha256")):
            out.append(world)
    return out


def to_disturb(runs: List[Run], world_size: int) -> Optional[Run]:
    """The run whose recorded settings a floor at `world_size` reruns: DDP's first when there is one."""
    firsts = sorted((r for r in runs if r.world_size == world_size and r.repeat == 0 and not r.identity.is_variant),
                    key=lambda r: (not r.label.startswith("ddp"), r.label))
    return firsts[0] if firsts else None
