"""The runner: the steps of the table (spec.STEPS) in their order and time boxes, the background step beside the
others; what became of each recorded, and printed in a line as it ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from .context import Context, Skipped, Started, StepFailed, StepRecord, TimedOut, one_line
from .settings import PROG, Clock
from .spec import Background, StepSpec, check_specs

INTERRUPTED = "interrupted (SIGINT or SIGTERM)"
NOT_SELECTED = "not in GPU_CHECK_STEPS"


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
    """What the runner does: the foreground steps in order, each background step started and waited for in its place
    (at the end where it names no step to end before)."""
    background = [spec for spec in specs if spec.background]
    moves: list[Move] = []
    for spec in (spec for spec in specs if not spec.background):
        moves += [Move("join", b.name) for b in background if b.joined_before == spec.name]
        moves += [Move("run", spec.name)] + [Move("start", b.name) for b in background if b.starts_after == spec.name]
    return moves + [Move("join", b.name) for b in background if b.joined_before is None]


def time_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
             seconds_left: float) -> float:
    """A foreground step's seconds: its box, less what the selected steps after it keep back, within `seconds_left`."""
    later = specs[[s.name for s in specs].index(spec.name) + 1:]
    return min(spec.box_s.on(device), seconds_left - sum(s.reserve_s.on(device) for s in later if s.name in selected))


def background_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
                   seconds_left: float) -> float:
    """A background step's seconds: its box, less what the step that waits for it keeps back where that one was
    selected, within `seconds_left`."""
    joiner = next((s for s in specs if s.name == spec.joined_before and s.name in selected), None)
    return min(spec.box_s.on(device), seconds_left - (joiner.reserve_s.on(device) if joiner else 0))


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
    """Runs the steps of `specs` and records what became of each."""

    def __init__(self, specs: Sequence[StepSpec], ctx: Context, clock: Clock) -> None:
        check_specs(specs)
        self.specs, self.ctx, self.clock = list(specs), ctx, clock
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
            return INTERRUPTED
        finally:
            self.ctx.stop_all()
        return None

    def _skip_reason(self, spec: StepSpec) -> str | None:
        if spec.name not in self.ctx.settings.only:
            return NOT_SELECTED
        failed = [s.name for s in self.specs if s.prerequisite and s is not spec and self.records[s.name].failed]
        return f"step {failed[0]} failed" if failed else None

    def _time_left(self, spec: StepSpec, record: StepRecord, box: float) -> bool:
        """Whether the step's `box` (rounded into its record) is long enough to start in; if not, it failed."""
        settings, record.limit_s = self.ctx.settings, round(box, 1)
        if record.limit_s < spec.reserve_s.on(settings.device) or record.limit_s <= 0:
            record.outcome, record.error = "failed", f"no time left in the budget of {settings.budget:.0f} s"
        return not record.failed

    def _run(self, spec: StepSpec) -> None:
        """A foreground step within its box; its line printed where it was selected and could run."""
        record, settings, action = self.records[spec.name], self.ctx.settings, spec.action
        assert not isinstance(action, Background)
        box = time_box(spec, self.specs, settings.only, settings.device, self.clock.left())
        record.reason = self._skip_reason(spec)
        if record.reason == NOT_SELECTED and spec.left_out:  # the others still need what it finds
            record.limit_s = round(box, 1)
            try:
                spec.left_out(self.ctx, record, time.monotonic() + record.limit_s)
            except (StepFailed, TimedOut) as exc:
                record.outcome, record.error = "failed", str(exc)
        if record.reason:
            return
        record.started_s = round(self.clock.since_start(), 2)
        began = time.monotonic()
        if self._time_left(spec, record, box):
            attempt(record, lambda: action(self.ctx, record, began + round(box, 1)))
            record.seconds = time.monotonic() - began
            if record.outcome == "failed" and record.log:
                log = settings.work / record.log
                record.result["log_tail"] = log.read_text(errors="replace").splitlines()[-20:] if log.is_file() else []
        print_line(step_line(record))

    def _start(self, spec: StepSpec) -> None:
        """A background step's command started, its box counted from now; or the reason it does not run."""
        record, settings, action = self.records[spec.name], self.ctx.settings, spec.action
        assert isinstance(action, Background)
        record.reason = self._skip_reason(spec)
        if record.reason:
            return
        record.started_s = round(self.clock.since_start(), 2)  # its line is printed when it is waited for
        try:
            launch = action.prepare(self.ctx, record)
        except Skipped as exc:
            record.reason = str(exc)
            return
        box = background_box(spec, self.specs, settings.only, settings.device, self.clock.left())
        if self._time_left(spec, record, box):  # else its command never starts, and the record lists none
            self._running[spec.name] = self.ctx.start(record, launch, time.monotonic() + round(box, 1))

    def _join(self, spec: StepSpec) -> None:
        """Wait for a background step and record it; its line printed where it was selected and not blocked."""
        record, action = self.records[spec.name], spec.action
        assert isinstance(action, Background)
        started = self._running.pop(spec.name, None)
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
