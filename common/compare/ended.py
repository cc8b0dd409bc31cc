"""What the comparison says of the runs at a world size counts the runs that ended (exit code 0 and a complete run
directory), and says how many did: a sentence about "the runs at world size 2" when one of two failed would claim a
pair that never met."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.rundir.reader import Run, RunId


@dataclass(frozen=True)
class Cell:
    """The first run of a cell of the matrix as it went: its name, world size, whether it ended, and the checksum of
    its final weights (None where it did not end)."""

    name: str
    np: int
    ended: bool
    weights: Optional[str] = None


def floor_needed(np: int, cells: Sequence[Cell]) -> Tuple[bool, str]:
    """Whether the noise floor's runs at world size `np` are needed (the cells that ended there ended with different
    weights); where they are not, why, counting the cells that ended."""
    here = [cell for cell in cells if cell.np == np]
    ended = [cell for cell in here if cell.ended]
    if len(ended) < 2:
        failed = ", ".join(cell.name for cell in here if not cell.ended)
        return False, (f"only {len(ended)} of the {len(here)} runs at world size {np} ended ({failed} failed), so no "
                       "pair there needs a noise floor")
    if len({cell.weights for cell in ended}) > 1:
        return True, ""
    return False, (f"{len(ended)} of the {len(here)} runs at world size {np} ended, all with bitwise identical "
                   "weights, so no noise floor is needed")


def unpaired(runs: Sequence[Run], failures: Sequence[Dict[str, Any]]) -> List[str]:
    """A note for each world size where a run failed and fewer than two of its cells' first runs ended: nothing there
    was compared."""
    ended: Dict[int, List[str]] = defaultdict(list)
    failed: Dict[int, List[str]] = defaultdict(list)
    for run in runs:
        if not run.identity.is_variant and run.repeat == 0:
            ended[run.world_size].append(run.name)
    for failure in failures:
        try:
            identity = RunId.parse(failure["name"])
        except ValueError:
            continue
        if not identity.is_variant and identity.repeat == 0:
            failed[identity.world_size].append(failure["name"])
    notes = []
    for world in sorted(failed):
        if len(ended[world]) < 2:
            total = len(ended[world]) + len(failed[world])
            notes.append(f"At world size {world} only {len(ended[world])} of the {total} runs ended "
                         f"({', '.join(failed[world])} failed): no pair there was compared.")
    return notes
