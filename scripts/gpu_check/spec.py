"""The check's steps, one specification each, in one list: everything else (the order they run in, their time
boxes, which one runs in the background, the record's order) is derived from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PerDevice:
    """A number of seconds on a GPU machine (`cuda`) and in the CPU rehearsal (`cpu`)."""

    cuda: int
    cpu: int

    def on(self, device: str) -> int:
        """The number for `device` (cuda or cpu)."""
        return self.cuda if device == "cuda" else self.cpu


@dataclass(frozen=True)
class StepSpec:
    """One step of the check.

    The list's order is the order of the record (gpu_check.json, docs/gpu-check.md's table) and the order the
    steps in the foreground run in. A background step starts once `starts_after` has run and is waited for before
    `joined_before` starts; the steps in between run beside it.
    """

    name: str
    #: the issue's numbering of the steps (docs/gpu-check.md)
    issue_step: int
    #: seconds it may take at most
    box_s: PerDevice
    #: seconds kept back for it while the steps before it run, so that an early step cannot take its time
    reserve_s: PerDevice
    #: a failure or timeout fails the check
    required: bool = True
    #: the other steps need what it finds: they are skipped when it fails, and it finds that much even when
    #: GPU_CHECK_STEPS leaves it out
    prerequisite: bool = False
    background: bool = False
    starts_after: str | None = None
    joined_before: str | None = None


STEPS: tuple[StepSpec, ...] = (
    StepSpec("install", 0, box_s=PerDevice(90, 120), reserve_s=PerDevice(20, 10), prerequisite=True),
    StepSpec("ddp", 1, box_s=PerDevice(90, 120), reserve_s=PerDevice(25, 15)),
    StepSpec("amp_fp16", 2, box_s=PerDevice(60, 90), reserve_s=PerDevice(20, 0)),
    StepSpec("amp_bf16", 2, box_s=PerDevice(60, 90), reserve_s=PerDevice(20, 15)),
    StepSpec("channels_last", 2, box_s=PerDevice(60, 90), reserve_s=PerDevice(20, 15)),
    StepSpec("exact", 3, box_s=PerDevice(150, 240), reserve_s=PerDevice(45, 40)),
    StepSpec("horovod_api", 4, box_s=PerDevice(75, 120), reserve_s=PerDevice(25, 15)),
    # After ddp, so that ddp's speed is the GPU's alone; before compare, which uses the Horovod it built.
    StepSpec("horovod_build", 5, box_s=PerDevice(240, 900), reserve_s=PerDevice(0, 0), required=False,
             background=True, starts_after="ddp", joined_before="compare"),
    StepSpec("compare", 6, box_s=PerDevice(150, 300), reserve_s=PerDevice(45, 30)),
)


def names(steps: Sequence[StepSpec] = STEPS) -> list[str]:
    """The steps' names in the list's order."""
    return [step.name for step in steps]


def check_specs(steps: Sequence[StepSpec]) -> None:
    """Raise ValueError where the list cannot be run: a name twice, a background step that does not start after
    and end before foreground steps in that order, or a background prerequisite."""
    seen = names(steps)
    if len(set(seen)) != len(seen):
        raise ValueError(f"a step named twice: {seen}")
    foreground = [step.name for step in steps if not step.background]
    for step in steps:
        if not step.background:
            if step.starts_after or step.joined_before:
                raise ValueError(f"{step.name}: only a background step starts after or ends before another")
            continue
        if step.prerequisite:
            raise ValueError(f"{step.name}: a prerequisite runs in the foreground")
        if step.starts_after not in foreground:
            raise ValueError(f"{step.name}: starts after {step.starts_after!r}, not a foreground step")
        if step.joined_before is not None and (
                step.joined_before not in foreground
                or foreground.index(step.joined_before) <= foreground.index(step.starts_after)):
            raise ValueError(f"{step.name}: ends before {step.joined_before!r}, not a foreground step after "
                             f"{step.starts_after}")
