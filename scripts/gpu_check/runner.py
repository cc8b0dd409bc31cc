"""The runner: the order the steps run in and their time boxes, both derived from the step list (spec.py); a
background step started and waited for where the list says; what became of each step recorded, and its line
printed."""

from __future__ import annotations

import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .clock import Clock, now
from .context import Context
from .output import error_line, one_line, tail
from .record import Skipped, StepFailed, StepRecord, TimedOut
from .report import print_line, step_line
from .spec import StepSpec, check_specs
from .steps.base import BackgroundStep, Step

INTERRUPTED = "interrupted (SIGINT or SIGTERM)"


@dataclass(frozen=True)
class Move:
    """One thing the runner does: run a step, start a background step, or wait for one."""

    kind: Literal["run", "start", "join"]
    name: str


def plan(specs: Sequence[StepSpec]) -> list[Move]:
    """What the runner does, in order: the foreground steps in the list's order, each background step started
    after its `starts_after` and waited for before its `joined_before` (at the end where it names none)."""
    background = [spec for spec in specs if spec.background]
    moves: list[Move] = []
    for spec in specs:
        if spec.background:
            continue
        moves += [Move("join", b.name) for b in background if b.joined_before == spec.name]
        moves.append(Move("run", spec.name))
        moves += [Move("start", b.name) for b in background if b.starts_after == spec.name]
    return moves + [Move("join", b.name) for b in background if b.joined_before is None]


def kept_back(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str) -> int:
    """Seconds the selected steps after `spec` in the list keep back."""
    later = specs[[s.name for s in specs].index(spec.name) + 1:]
    return sum(s.reserve_s.on(device) for s in later if s.name in selected)


def time_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
             seconds_left: float) -> float:
    """The seconds a foreground step may take: its box, less what the selected steps after it keep back, within
    the `seconds_left` of the budget."""
    return min(spec.box_s.on(device), seconds_left - kept_back(spec, specs, selected, device))


def background_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
                   seconds_left: float) -> float:
    """The seconds a background step may take: its box, less what the step that waits for it keeps back where that
    one was selected, within the `seconds_left` of the budget."""
    joiner = next((s for s in specs if s.name == spec.joined_before and s.name in selected), None)
    return min(spec.box_s.on(device), seconds_left - (joiner.reserve_s.on(device) if joiner else 0))


@dataclass(frozen=True)
class Running:
    """A background step's command, started."""

    process: subprocess.Popen[bytes]
    log: Path
    until: float  # monotonic seconds: the end of its time box
    begun: float


class Runner:
    """Runs the steps of `specs` with their `actions` (one per step, by name) and records what became of each."""

    def __init__(self, specs: Sequence[StepSpec], actions: Mapping[str, Step | BackgroundStep], ctx: Context,
                 clock: Clock) -> None:
        check_specs(specs)
        for spec in specs:
            action = actions.get(spec.name)
            if not isinstance(action, BackgroundStep if spec.background else Step):
                raise ValueError(f"{spec.name}: no {'background ' if spec.background else ''}step to run")
        self.specs, self.actions, self.ctx, self.clock = list(specs), actions, ctx, clock
        self.records = {spec.name: StepRecord(spec) for spec in specs}
        self._running: dict[str, Running] = {}
        #: background steps whose line is printed when they are waited for: those selected and not blocked
        self._to_print: set[str] = set()

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
            self.ctx.commands.stop_all()
        return None

    def _blocked(self, spec: StepSpec) -> str | None:
        """Why `spec` cannot run: a prerequisite failed."""
        for other in self.specs:
            if other.prerequisite and other is not spec and self.records[other.name].failed:
                return f"step {other.name} failed"
        return None

    def _box(self, spec: StepSpec) -> float:
        settings = self.ctx.settings
        return time_box(spec, self.specs, settings.only, settings.device, self.clock.left())

    def _no_time_left(self, spec: StepSpec, record: StepRecord) -> bool:
        """Whether `record`'s box is too short for the step to start; if so it failed, saying so."""
        settings = self.ctx.settings
        limit = record.limit_s or 0.0
        if limit < spec.reserve_s.on(settings.device) or limit <= 0:
            record.outcome, record.error = "failed", f"no time left in the budget of {settings.budget:.0f} s"
            return True
        return False

    def _run(self, spec: StepSpec) -> None:
        """A foreground step within its box; its line printed where it was selected and could run."""
        record, action, settings = self.records[spec.name], self.actions[spec.name], self.ctx.settings
        assert isinstance(action, Step)
        if not settings.selected(spec.name):
            record.reason = "not in GPU_CHECK_STEPS"
            if spec.prerequisite:  # the others still need what it finds
                record.limit_s = round(self._box(spec), 1)
                try:
                    action.left_out(self.ctx, record, now() + record.limit_s)
                except (StepFailed, TimedOut) as exc:
                    record.outcome, record.error = "failed", str(exc)
            return
        record.reason = self._blocked(spec)
        if record.reason:
            return
        record.limit_s = round(self._box(spec), 1)
        record.started_s = round(self.clock.since_start(), 2)
        began = now()
        if self._no_time_left(spec, record):
            print_line(step_line(record))
            return
        try:
            action.run(self.ctx, record, now() + record.limit_s)
            record.outcome = "ok"
        except Skipped as exc:
            record.reason = str(exc)
        except TimedOut as exc:
            record.outcome, record.error = "timeout", str(exc)
        except StepFailed as exc:
            record.outcome, record.error = "failed", str(exc)
        except Exception as exc:  # a bug of the check itself: recorded like a failure
            record.outcome, record.error = "failed", one_line(f"{type(exc).__name__}: {exc}")
        record.seconds = now() - began
        if record.outcome == "failed" and record.log:
            record.result["log_tail"] = tail(settings.work / record.log, 20)
        print_line(step_line(record))

    def _start(self, spec: StepSpec) -> None:
        """A background step's command started, its box counted from now; or the reason it does not run."""
        record, action, settings = self.records[spec.name], self.actions[spec.name], self.ctx.settings
        assert isinstance(action, BackgroundStep)
        if not settings.selected(spec.name):
            record.reason = "not in GPU_CHECK_STEPS"
            return
        record.reason = self._blocked(spec)
        if record.reason:
            return
        self._to_print.add(spec.name)
        record.started_s = round(self.clock.since_start(), 2)
        try:
            launch = action.prepare(self.ctx, record)
        except Skipped as exc:
            record.reason = str(exc)
            return
        record.limit_s = round(background_box(spec, self.specs, settings.only, settings.device, self.clock.left()),
                               1)
        if self._no_time_left(spec, record):  # its command never starts, so the record lists none
            return
        record.commands.append(launch.shown)
        log = settings.work / "logs" / f"{spec.name}.log"
        record.log = str(log.relative_to(settings.work))
        process = self.ctx.commands.start(launch.command, log, launch.env)
        self._running[spec.name] = Running(process, log, until=now() + record.limit_s, begun=now())

    def _join(self, spec: StepSpec) -> None:
        """Wait for a background step (within its box) and record it; its line printed once, as a foreground step's
        is: where it was selected and not blocked, whatever became of it then."""
        record = self.records[spec.name]
        running = self._running.pop(spec.name, None)
        try:
            if running is not None:
                self._wait(spec, record, running)
        finally:
            if spec.name in self._to_print:
                self._to_print.discard(spec.name)
                print_line(step_line(record))

    def _wait(self, spec: StepSpec, record: StepRecord, running: Running) -> None:
        action = self.actions[spec.name]
        assert isinstance(action, BackgroundStep)
        code = self.ctx.commands.wait(running.process, running.until)
        record.seconds = now() - running.begun
        output = running.log.read_text(errors="replace")
        if code is None:
            record.outcome, record.error = "timeout", (f"stopped after its time box ({record.limit_s:.0f} s): "
                                                       f"{error_line(output) or 'no output'}")
            return
        if code != 0:
            record.outcome, record.error = "failed", f"exit code {code}: {error_line(output) or 'no output'}"
            return
        record.outcome = "ok"
        action.finished(self.ctx, record, output)
