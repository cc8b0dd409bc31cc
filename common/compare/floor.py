"""The noise floor: how far one backend drifts from itself when only rounding differs.

A run whose initial weights were moved by one unit in the last place (--perturb-ulp 1) is compared with
the same backend's undisturbed run at the same world size. Their gap is what rounding alone produces
with these settings and steps; a gap between two backends is judged against it.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from . import gaps
from .rundirs import DISTURBED, Run

SUFFIX = "+" + DISTURBED


def is_disturbed(run: Run) -> bool:
    """A run made with --perturb-ulp."""
    return run.label.endswith(SUFFIX)


def base_of(disturbed: Run, runs: List[Run]) -> Optional[Run]:
    """The undisturbed first run of the same backend and world size."""
    label = disturbed.label[:-len(SUFFIX)]
    return next((r for r in runs if r.label == label and r.world_size == disturbed.world_size and r.repeat == 0), None)


def measure(base: Run, disturbed: Run) -> Dict:
    """The floor from one pair: the headline gap, the tensors it is largest in, and the per-step loss gap."""
    found = gaps.tensor_gaps(base, disturbed)
    loss = gaps.relative_loss_gaps(base, disturbed)
    return {"base": base.name, "disturbed": disturbed.name, "world_size": base.world_size,
            "ulp": disturbed.settings.get("perturb_ulp"), "gap": gaps.headline(found), "tensor": gaps.dominant(found),
            "gaps": found, "rel_loss_diff": loss, "max_rel_loss_diff": max(loss.values(), default=None)}


def floors(runs: List[Run]) -> Dict[int, Dict]:
    """world size -> the noise floor measured there (DDP's when several backends were disturbed)."""
    out: Dict[int, Dict] = {}
    for disturbed in sorted((r for r in runs if is_disturbed(r) and r.repeat == 0),
                            key=lambda r: (r.world_size, not r.label.startswith("ddp"), r.label)):
        base = base_of(disturbed, runs)
        if base is not None and disturbed.world_size not in out:
            out[disturbed.world_size] = measure(base, disturbed)
    return out


def missing(runs: List[Run], differ: Callable[[Run, Run], bool]) -> List[int]:
    """World sizes with no floor where two runs of the backends (repeats included) `differ`."""
    measured = floors(runs)
    out = []
    for world in sorted({r.world_size for r in runs} - set(measured)):
        plain = [r for r in runs if r.world_size == world and "+" not in r.label]
        if any(differ(a, b) for i, a in enumerate(plain) for b in plain[i + 1:]
               if a.summary.get("weights_sha256") != b.summary.get("weights_sha256")):
            out.append(world)
    return out


def to_disturb(runs: List[Run], world_size: int) -> Optional[Run]:
    """The run whose recorded settings a floor at `world_size` reruns: DDP's first when there is one."""
    firsts = sorted((r for r in runs if r.world_size == world_size and r.repeat == 0 and "+" not in r.label),
                    key=lambda r: (not r.label.startswith("ddp"), r.label))
    return firsts[0] if firsts else None
