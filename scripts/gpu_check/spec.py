"""The check's steps as one table (STEPS), a row each: its time box, its reserve and what it runs; the order they
run in, their time boxes, the background step and the record's order are derived from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .context import Context, Launch, StepRecord
from .horovod import build_finished, compare, horovod_api, prepare_build
from .install import install, probe
from .training import Training, exact

#: a step run in its turn, until the end of its time box (monotonic seconds): it fills its record's result, and
#: raises StepFailed, TimedOut (from Context.run), or Skipped where it does not apply
Action = Callable[[Context, StepRecord, float], None]


@dataclass(frozen=True)
class PerDevice:
    """A number of seconds on a GPU machine (`cuda`) and in the CPU rehearsal (`cpu`)."""

    cuda: int
    cpu: int

    def on(self, device: str) -> int:
        """The number for `device` (cuda or cpu)."""
        return self.cuda if device == "cuda" else self.cpu


@dataclass(frozen=True)
class Background:
    """A step whose command runs beside the steps after it: `prepare` gives the command (raising Skipped where there
    is none to run here); `finished` records what a command that ended well did, from its whole log."""

    prepare: Callable[[Context, StepRecord], Launch]
    finished: Callable[[Context, StepRecord, str], None]


@dataclass(frozen=True)
class StepSpec:
    """One step. The table's order is the record's (gpu_check.json, docs/gpu-check.md's table) and the order the
    foreground steps run in; a background step starts once `starts_after` has run and is waited for before
    `joined_before` starts (at the end where it names none)."""

    name: str
    issue_step: int  # the issue's numbering of the steps (docs/gpu-check.md)
    box_s: PerDevice  # seconds it may take at most
    #: seconds kept back for it while the steps before it run, so that an early step cannot take its time
    reserve_s: PerDevice
    action: Action | Background
    required: bool = True  # a failure or timeout fails the check
    #: a prerequisite's: what it finds when GPU_CHECK_STEPS leaves it out, since the others need it (and are
    #: skipped when it fails)
    left_out: Action | None = None
    starts_after: str | None = None
    joined_before: str | None = None

    @property
    def background(self) -> bool:
        """Whether its command runs beside the steps after `starts_after`."""
        return isinstance(self.action, Background)

    @property
    def prerequisite(self) -> bool:
        """Whether the other steps need what it finds."""
        return self.left_out is not None


STEPS: tuple[StepSpec, ...] = (
    StepSpec("install", 0, PerDevice(90, 120), PerDevice(20, 10), install, left_out=probe),
    # NCCL, a rank per GPU, a finite loss; samples/s with the GPU to itself
    StepSpec("ddp", 1, PerDevice(90, 120), PerDevice(25, 15), Training()),
    StepSpec("amp_fp16", 2, PerDevice(60, 90), PerDevice(20, 0), Training(
        {"amp": "fp16"}, lambda run: bool((run.precision or {}).get("grad_scaler")),
        "--amp fp16 ran without a GradScaler",
        cuda_only="float16 autocast with a GradScaler runs on CUDA only (refused on CPU: tests/test_knobs.py)")),
    StepSpec("amp_bf16", 2, PerDevice(60, 90), PerDevice(20, 15), Training(
        {"amp": "bf16"}, lambda run: (run.precision or {}).get("amp") == "bf16",
        "--amp bf16 recorded precision {run.precision}")),
    StepSpec("channels_last", 2, PerDevice(60, 90), PerDevice(20, 15), Training(
        {"channels_last": ""}, lambda run: run.channels_last is True,
        "--channels-last is not recorded in config.json")),
    StepSpec("exact", 3, PerDevice(150, 240), PerDevice(45, 40), exact),
    StepSpec("horovod_api", 4, PerDevice(75, 120), PerDevice(25, 15), horovod_api),
    # after ddp, so that ddp's speed is the GPU's alone; before compare, which uses the Horovod it built
    StepSpec("horovod_build", 5, PerDevice(240, 900), PerDevice(0, 0), Background(prepare_build, build_finished),
             required=False, starts_after="ddp", joined_before="compare"),
    StepSpec("compare", 6, PerDevice(150, 300), PerDevice(45, 30), compare),
)


def names(steps: Sequence[StepSpec] = STEPS) -> list[str]:
    """The steps' names in the table's order."""
    return [step.name for step in steps]


def check_specs(steps: Sequence[StepSpec]) -> None:
    """Raise ValueError where a table cannot be run: a name twice, or a background step that does not start after
    a foreground step and end before a later one (or at the end), or is a prerequisite."""
    if len(set(names(steps))) != len(steps):
        raise ValueError(f"a step named twice: {names(steps)}")
    ends = [step.name for step in steps if not step.background] + [None]  # None: the end of the check
    for step in steps:
        if not step.background and (step.starts_after or step.joined_before):
            raise ValueError(f"{step.name}: no background step to run (only a background step starts after or ends "
                             "before another)")
        if step.background and (step.prerequisite or step.starts_after not in ends[:-1] or step.joined_before
                                not in ends or ends.index(step.joined_before) <= ends.index(step.starts_after)):
            raise ValueError(f"{step.name}: starts after {step.starts_after!r} and ends before "
                             f"{step.joined_before!r}: a background step, not a prerequisite, starts after a "
                             "foreground step and ends before a later one")
