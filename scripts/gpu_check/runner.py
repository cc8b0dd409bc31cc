"""The steps as one table (STEPS), a row each: its time box, reserve and what it runs; and the runner, which derives
from it their order, time boxes and the background step, records each step and prints a line as it ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from .context import PROG, Context, Launch, Skipped, Started, StepFailed, StepRecord, TimedOut, one_line
from .horovod import build_finished, compare, horovod_api, prepare_build
from .install import install, probe
from .training import Training, exact

#: a step run in its turn, until the end of its time box (monotonic seconds): it fills its record's result, and
#: raises StepFailed, TimedOut (from Context.run), or Skipped where it does not apply
Action = Callable[[Context, StepRecord, float], None]
NOT_SELECTED = "not in GPU_CHECK_STEPS"


@dataclass(frozen=True)
class PerDevice:
    """A number of seconds on a GPU machine (`cuda`) and in the CPU rehearsal (`cpu`)."""

    cuda: int
    cpu: int

    def on(self, device: str) -> int:
        """The number for `device`."""
        return self.cuda if device == "cuda" else self.cpu


@dataclass(frozen=True)
class Background:
    """A step whose command runs beside the steps after it: `prepare` gives the command (raising Skipped where there
    is none to run here); `finished` records what a command that ended well did, from its whole log."""

    prepare: Callable[[Context, StepRecord], Launch]
    finished: Callable[[Context, StepRecord, str], None]


@dataclass(frozen=True)
class StepSpec:
    """One step. The table's order is the record's (gpu_check.json, docs/gpu-check.md) and the foreground steps'; a
    background step starts after `starts_after` and is waited for before `joined_before` (or at the end)."""

    name: str
    issue_step: int  # the issue's numbering of the steps (docs/gpu-check.md)
    box_s: PerDevice  # seconds it may take at most
    reserve_s: PerDevice  # seconds kept back for it while the steps before it run
    action: Action | Background
    required: bool = True  # a failure or timeout fails the check
    #: a prerequisite's: what it finds when GPU_CHECK_STEPS leaves it out (the others need it, skipped if it fails)
    left_out: Action | None = None
    starts_after: str | None = None
    joined_before: str | None = None

    @property
    def background(self) -> bool:
        """Whether its command runs beside the steps after `starts_after`."""
        return isinstance(self.action, Background)


STEPS: tuple[StepSpec, ...] = (
    StepSpec("install", 0, PerDevice(90, 120), PerDevice(20, 10), install, left_out=probe),
    # NCCL, a rank per GPU, a finite loss; samples/s with the GPU to itself
    StepSpec("ddp", 1, PerDevice(90, 120), PerDevice(25, 15), Training()),
    StepSpec("amp_fp16", 2, PerDevice(60, 90), PerDevice(20, 0), Training(
        {"amp": "fp16"}, lambda run: bool((run["precision"] or {}).get("grad_scaler")),
        "--amp fp16 ran without a GradScaler",
        cuda_only="float16 autocast with a GradScaler runs on CUDA only (refused on CPU: tests/test_knobs.py)")),
    StepSpec("amp_bf16", 2, PerDevice(60, 90), PerDevice(20, 15), Training(
        {"amp": "bf16"}, lambda run: (run["precision"] or {}).get("amp") == "bf16",
        "--amp bf16 recorded precision {run[precision]}")),
    StepSpec("channels_last", 2, PerDevice(60, 90), PerDevice(20, 15), Training(
        {"channels_last": ""}, lambda run: run["channels_last"] is True,
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
    """Raise ValueError where a table cannot be run: a name twice, or a background step that is a prerequisite or
    does not start after a foreground step and end before a later one (or at the end)."""
    if len(set(names(steps))) != len(steps):
        raise ValueError(f"a step named twice: {names(steps)}")
    ends = [step.name for step in steps if not step.background] + [None]  # None: the end of the check
    for step in steps:
        if not step.background and (step.starts_after or step.joined_before):
            raise ValueError(f"{step.name}: no background step to run (only a background step starts after or ends "
                             "before another)")
        if step.background and (step.left_out or step.starts_after not in ends[:-1] or step.joined_before
                                not in ends or ends.index(step.joined_before) <= ends.index(step.starts_after)):
            raise ValueError(f"{step.name}: starts after {step.starts_after!r} and ends before "
                             f"{step.joined_before!r}: a background step, not a prerequisite, starts after a "
                             "foreground step and ends before a later one")


def print_line(text: str) -> None:
    """One line of the check's progress, as it happens."""
    print(f"[{PROG}] {text}", flush=True)


def step_line(record: StepRecord) -> str:
    """What became of a step: its outcome and time, then its error, why it was skipped, or the main of its result."""
    text, r = f"{record.name}: {record.outcome} in {record.seconds:.1f} s", record.result
    if record.error or record.reason:
        return f"{text}: {record.error}" if record.error else f"{text} ({record.reason})"
    if record.name == "install":
        text += f": {r.get('method')}" + (f" ({r['pip_error']})" if r.get("pip_error") else "")
    if r.get("samples_per_s"):
        text += f": {r['process_group']}, {r['devices']}, {r['samples_per_s']:.0f} samples/s"
    if "repeat_identical" in r:
        text += f": repeat identical {r['repeat_identical']}, across world sizes {r['world_sizes_identical']}"
    if "img_sec_total" in r:
        text += f": {r['size']} worker(s), {r['img_sec_total']:.0f} img/s"
    return text + (f": {r['verdicts']}" if "verdicts" in r else "")


@dataclass(frozen=True)
class Move:
    """One thing the runner does: run a step, start a background step, or wait for one."""

    kind: Literal["run", "start", "join"]
    name: str


def plan(specs: Sequence[StepSpec]) -> list[Move]:
    """The foreground steps in order, each background step started and waited for in its place (or at the end)."""
    background = [spec for spec in specs if spec.background]
    moves: list[Move] = []
    for spec in (spec for spec in specs if not spec.background):
        moves += [Move("join", b.name) for b in background if b.joined_before == spec.name]
        moves += [Move("run", spec.name)] + [Move("start", b.name) for b in background if b.starts_after == spec.name]
    return moves + [Move("join", b.name) for b in background if b.joined_before is None]


def time_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
             seconds_left: float) -> float:
    """A step's seconds: its box, less what the selected steps after it keep back (a background step: the one that
    waits for it), within `seconds_left`."""
    later = ([s for s in specs if s.name == spec.joined_before] if spec.background
             else specs[names(specs).index(spec.name) + 1:])
    return min(spec.box_s.on(device), seconds_left - sum(s.reserve_s.on(device) for s in later if s.name in selected))


def attempt(record: StepRecord, work: Callable[[], None]) -> None:
    """Do a step's `work`, and record what became of it."""
    try:
        work()
        record.outcome = "ok"
    except Skipped as exc:
        record.reason = str(exc)
    except TimedOut as exc:
        record.outcome, record.error = "timeout", str(exc)
    except StepFailed as exc:
        record.outcome, record.error = "failed", str(exc)
    except Exception as exc:  # a bug of the check itself: recorded like a failure
        record.outcome, record.error = "failed", one_line(f"{type(exc).__name__}: {exc}")


class Runner:
    """Runs the steps of `specs` in `budget` seconds from now, and records what became of each."""

    def __init__(self, specs: Sequence[StepSpec], ctx: Context, budget: float) -> None:
        check_specs(specs)
        self.specs, self.ctx, self.start = list(specs), ctx, time.monotonic()  # monotonic, as every time box
        self.deadline = self.start + budget
        self.records = {spec.name: StepRecord(spec) for spec in specs}
        self._running: dict[str, Started] = {}

    def run(self) -> str | None:
        """Run every step; None, or why the check stopped early (a signal). No command is left running."""
        doing = {"run": self._run, "start": self._start, "join": self._join}
        by_name = {spec.name: spec for spec in self.specs}
        try:
            for move in plan(self.specs):
                doing[move.kind](by_name[move.name])
        except KeyboardInterrupt:
            return "interrupted (SIGINT or SIGTERM)"
        finally:
            self.ctx.stop_all()
        return None

    def _skip_reason(self, spec: StepSpec) -> str | None:
        if spec.name not in self.ctx.settings.only:
            return NOT_SELECTED
        failed = [s.name for s in self.specs if s.left_out and s is not spec and self.records[s.name].failed]
        return f"step {failed[0]} failed" if failed else None

    def _box(self, spec: StepSpec, record: StepRecord) -> float:
        settings = self.ctx.settings
        record.limit_s = round(time_box(spec, self.specs, settings.only, settings.device,
                                        self.deadline - time.monotonic()), 1)
        return record.limit_s

    def _time_left(self, spec: StepSpec, record: StepRecord) -> float | None:
        """The step's box, rounded into its record; None where it is too short to start in (then the step failed)."""
        if (box := self._box(spec, record)) >= spec.reserve_s.on(self.ctx.settings.device) and box > 0:
            return box
        record.outcome, record.error = "failed", f"no time left in the budget of {self.ctx.settings.budget:.0f} s"
        return None

    def _run(self, spec: StepSpec) -> None:
        """A foreground step within its box; its line printed where it was selected and could run."""
        record, action = self.records[spec.name], spec.action
        assert not isinstance(action, Background)
        record.reason = self._skip_reason(spec)
        if record.reason == NOT_SELECTED and spec.left_out:  # the others still need what it finds
            try:
                spec.left_out(self.ctx, record, time.monotonic() + self._box(spec, record))
            except (StepFailed, TimedOut) as exc:
                record.outcome, record.error = "failed", str(exc)
        if record.reason:
            return
        record.started_s, began = round(time.monotonic() - self.start, 2), time.monotonic()
        if (box := self._time_left(spec, record)) is not None:
            attempt(record, lambda: action(self.ctx, record, began + box))
            record.seconds = time.monotonic() - began
            if record.outcome == "failed" and record.log:
                log = self.ctx.settings.work / record.log
                record.result["log_tail"] = log.read_text(errors="replace").splitlines()[-20:] if log.is_file() else []
        print_line(step_line(record))

    def _start(self, spec: StepSpec) -> None:
        """A background step's command started, its box counted from now; or the reason it does not run."""
        record, action = self.records[spec.name], spec.action
        assert isinstance(action, Background)
        record.reason = self._skip_reason(spec)
        if record.reason:
            return
        record.started_s = round(time.monotonic() - self.start, 2)  # its line is printed when it is waited for
        try:
            launch = action.prepare(self.ctx, record)
        except Skipped as exc:
            record.reason = str(exc)
            return
        if (box := self._time_left(spec, record)) is not None:  # else its command never starts: no command listed
            self._running[spec.name] = self.ctx.start(record, launch, time.monotonic() + box)

    def _join(self, spec: StepSpec) -> None:
        """Wait for a background step and record it; its line printed where it was selected and not blocked."""
        record, action, started = self.records[spec.name], spec.action, self._running.pop(spec.name, None)
        assert isinstance(action, Background)
        try:
            if started is not None:
                attempt(record, lambda: action.finished(self.ctx, record, self._wait(record, started)))
        finally:
            if record.started_s is not None:
                print_line(step_line(record))

    def _wait(self, record: StepRecord, started: Started) -> str:
        try:
            return self.ctx.finish(record, started)
        finally:
            record.seconds = time.monotonic() - started.began
