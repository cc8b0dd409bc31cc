"""What the comparison finds about a pair of runs, as typed records: every part of the comparison (the report, the
figures, the explanations, the benchmarks' verdict corpus) reads these by attribute, and summary.json holds them as
JSON (`as_json`), under the same names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: per quantity ("loss", "weights"), a value per step
Series = Dict[str, Dict[int, float]]


@dataclass(frozen=True)
class Departure:
    """Where a pair leaves what it is judged against: the step, the quantity, its gap, the level it was judged
    against there (`band`), how many times that level the gap is, and the step the pair's branch started when the
    level was the floor's branches (common.compare.branches)."""

    step: int
    quantity: str
    gap: float
    band: float
    ratio: float
    branch: Optional[int] = None


@dataclass(frozen=True)
class BandRatio:
    """The step and quantity where a pair's gap is largest against its level, and how many times it is."""

    step: int
    quantity: str
    ratio: float


@dataclass(frozen=True)
class LrDifference:
    """The first step whose learning rate differs, and the two rates."""

    step: int
    a: float
    b: float


@dataclass(frozen=True)
class SettingDifference:
    """The first step whose optimizer settings (but the learning rate) differ: which param group and setting, the
    two values, and the first step whose forward pass sees its effect (`acts`)."""

    step: int
    group: int
    setting: str
    a: Any
    b: Any
    acts: int


@dataclass(frozen=True)
class Cause:
    """Why two scripts part (common.compare.causes): the step it acts on (None: before training), the quantity
    that differs first, the sentence, its numbers, and the section of the migration guide on that mistake."""

    step: Optional[int]
    quantity: str
    text: str
    guide: str
    numbers: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ParityResult:
    """How closely two runs learned the same thing (common.compare.analysis.parity): `kind` ("backends": two
    backends, "settings": one backend with other settings, "repeat": a run against its first), the runs' names and
    world size, the per-step gaps (`rel_loss_diff`, `rel_weight_diff`), where they first differ and where they
    train differently, against which noise floor, the final weights' gaps, and the `verdict` in words."""

    a: str
    b: str
    world_size: Optional[int]
    kind: str = "backends"
    steps_compared: int = 0
    loss_diff: Dict[int, float] = field(default_factory=dict)
    rel_loss_diff: Dict[int, float] = field(default_factory=dict)
    rel_weight_diff: Dict[int, float] = field(default_factory=dict)
    max_loss_diff: Optional[float] = None
    max_rel_loss_diff: Optional[float] = None
    first_differing_step: Optional[int] = None
    lr_difference: Optional[LrDifference] = None
    setting_difference: Optional[SettingDifference] = None
    max_abs_weight_diff: float = 0.0
    bitwise_identical: bool = False
    #: the parameters' headline ‖Δ‖/‖w‖ and the per-tensor gaps (common.compare.gaps)
    gap: float = 0.0
    gaps: Optional[Dict[str, Any]] = None
    val_top1: List[Optional[float]] = field(default_factory=list)
    #: the floor's largest final gap, its ratio to the pair's, how many disturbed runs made it
    noise_floor: Optional[float] = None
    floor_ratio: Optional[float] = None
    floor_runs: Optional[int] = None
    departure: Optional[Departure] = None
    largest_band_ratio: Optional[BandRatio] = None
    #: per quantity, the step of a branch judged against the floor's branches, and the levels from there
    branches: Dict[str, int] = field(default_factory=dict)
    branch_levels: Dict[str, Dict[int, float]] = field(default_factory=dict)
    trains_differently_from: Optional[int] = None
    within_noise_floor: Optional[bool] = None
    #: the final metrics beside the floor's range (common.compare.analysis.outcome)
    outcome: Dict[str, Any] = field(default_factory=dict)
    #: how far apart the two start (0: alike, None: not recorded)
    start_gap: Optional[float] = None
    #: why no verdict could be given (a program that does not reproduce itself), else None
    cannot_judge: Optional[str] = None
    verdict: str = ""
    cause: Optional[Cause] = None
    #: what explains the cause, where something does (the port's rewrite at a line, with `compare-backends --port`)
    explained_by: Optional[str] = None

    @property
    def judged(self) -> bool:
        """Judged against a noise floor (within or beyond it)."""
        return self.within_noise_floor is not None


def as_json(record: Any) -> Any:
    """A record (or a list or dict of them) as plain data for summary.json."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    if isinstance(record, list):
        return [as_json(item) for item in record]
    if isinstance(record, dict):
        return {key: as_json(value) for key, value in record.items()}
    return record
