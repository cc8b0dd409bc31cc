"""Whether a program reproduces itself, checked before anything is judged.

A noise floor is only as good as its disturbance: each disturbed run must start where its undisturbed run starts,
moved by the disturbance alone, and see the same batches. A script that seeds nothing starts every run from other
random weights and draws other random batches; its "floor" then measures its own randomness, wide enough to hold
any pair, and two runs that share nothing would be called the same. So every pair of runs of one program with the
same arguments (an undisturbed run and its disturbed runs, a run and its repeats) is checked: the weights each
starts from (the fingerprint the probe records before its disturbance; a run of the project's loop records it
after, within the disturbance's reach of its base), and where the probe recorded them, every rank's first batch.
Where one differs, no pair at that world size is judged: the verdict says the program does not reproduce itself,
with the evidence and the fix.

Two runs of different programs that start from different weights part at step 0, whatever the floor says
(`start_gap`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.rundir.reader import Run
from .floor import base_of, is_disturbed
from .trajectory import EPS32, relative

#: how far a one-ulp disturbance of the float32 initial weights can move a tensor's norm, relative to it (one ulp
#: is at most 2**-23 of an element; a few to spare)
DISTURBANCE_REACH = 4 * EPS32

#: what makes a script reproduce itself
FIX = ("seed torch, numpy and random (torch.manual_seed, np.random.seed, random.seed) before the model and the data "
       "loader are built, and give a shuffling DataLoader a seeded generator")


@dataclass(frozen=True)
class Irreproducible:
    """A program that did not reproduce itself at a world size: which, between which two runs, and how."""

    program: str
    world_size: int
    runs: Tuple[str, str]
    evidence: str

    @property
    def verdict(self) -> str:
        """The verdict of every pair at its world size."""
        return (f"cannot judge: {self.program} does not reproduce itself: {self.evidence}; fix: {FIX}")


def program_of(run: Run) -> str:
    """The program a run ran: the script's file name for a run of the probe, else the backend's entry point."""
    script = run.config.get("script") or {}
    if script.get("path"):
        return os.path.basename(str(script["path"]))
    return f"{(run.config.get('backend') or {}).get('name', run.label)}'s training"


def _start(run: Run) -> Tuple[Optional[List[float]], bool]:
    """The fingerprint of the weights a run starts from, and whether it is from before any disturbance."""
    start = next((e for e in run.events if e["event"] == "start"), {})
    if start.get("built") is not None:
        return start["built"], True
    return start.get("wnorm"), False


def _largest(x: Sequence[Optional[float]], y: Sequence[Optional[float]]) -> float:
    if len(x) != len(y):
        return float("inf")
    return max((relative(a, b) for a, b in zip(x, y, strict=True) if a is not None and b is not None), default=0.0)


def start_gap(a: Run, b: Run) -> Optional[float]:
    """How far apart two runs' starting weights are (the largest relative gap of a tensor's norm), None when one
    did not record them; 0 when they start from the same weights (within a disturbance's reach)."""
    (wa, exact_a), (wb, exact_b) = _start(a), _start(b)
    if wa is None or wb is None:
        return None
    gap = _largest(wa, wb)
    return gap if gap > (0.0 if exact_a and exact_b else DISTURBANCE_REACH) else 0.0


def _first_batches(run: Run) -> Optional[List[Any]]:
    """Every rank's input fingerprints at step 1 (runs of the probe), None where not recorded."""
    first = next((e for e in run.events if e["event"] == "step" and e.get("step") == 1), None)
    if first is None or not first.get("ranks"):
        return None
    return [rank.get("inputs") for rank in first["ranks"]]


def compare_starts(a: Run, b: Run) -> Optional[str]:
    """The evidence that `b`, a run of the same program with the same arguments as `a`, did not start where `a`
    did (None when it did, or when neither recorded what tells)."""
    gap = start_gap(a, b)
    if gap:
        return (f"two runs of it with the same arguments ({a.name} and {b.name}) start from initial weights "
                f"{gap:.1e} apart (the largest relative gap of a tensor's norm)")
    batches_a, batches_b = _first_batches(a), _first_batches(b)
    if batches_a is not None and batches_b is not None:
        for rank, (x, y) in enumerate(zip(batches_a, batches_b, strict=False)):
            if x != y:
                return (f"rank {rank}'s first batch differs between two runs of it with the same arguments "
                        f"({a.name} and {b.name})")
    return None


def same_program_pairs(runs: List[Run]) -> List[Tuple[Run, Run]]:
    """Runs that must start alike: each disturbed run with its undisturbed base, each repeat with its first run."""
    pairs = []
    for run in runs:
        if is_disturbed(run):
            base = base_of(run, runs)
            if base is not None:
                pairs.append((base, run))
        elif run.repeat > 0:
            first = next((r for r in runs if r.key == run.key and r.repeat == 0), None)
            if first is not None:
                pairs.append((first, run))
    return pairs


def check(runs: List[Run]) -> Dict[int, Irreproducible]:
    """World size -> the first program found not to reproduce itself there."""
    found: Dict[int, Irreproducible] = {}
    for a, b in same_program_pairs(runs):
        if a.world_size in found:
            continue
        evidence = compare_starts(a, b)
        if evidence:
            found[a.world_size] = Irreproducible(program_of(a), a.world_size, (a.name, b.name), evidence)
    return found
