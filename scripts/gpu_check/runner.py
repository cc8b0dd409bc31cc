"""The steps as one table (STEPS), a row each, and the runner that runs them in its order within their time boxes."""

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from .context import PROG, Context, Launch, Skipped, Started, StepFailed, StepRecord, TimedOut, one_line
from .horovod import build_finished, compare, horovod_api, prepare_build
from .install import install, probe
from .training import Training, exact

#: a step run until the end of its box (monotonic seconds): it fills its record's result, or raises (Skipped too)
Action = Callable[[Context, StepRecord, float], None]
#: the background step's: its command (or Skipped), and what it records from the log of a command that ended well
Background = tuple[Callable[[Context, StepRecord], Launch], Callable[[Context, StepRecord, str], None]]
NOT_SELECTED = "not in GPU_CHECK_STEPS"


@dataclass(frozen=True)
class StepSpec:
    """One step, its seconds (on a GPU, in the rehearsal); the background one runs between its two neighbours."""

    name: str
    issue_step: int  # the issue's numbering of the steps (docs/gpu-check.md)
    box_s: tuple[int, int]  # seconds it may take at most
    reserve_s: tuple[int, int]  # seconds kept back for it while the steps before it run
    action: Action | Background
    required: bool = True  # a failure or timeout fails the check
    #: a prerequisite's: what it finds when GPU_CHECK_STEPS leaves it out (the others need it, skipped if it fails)
    left_out: Action | None = None
    starts_after: str | None = None
    joined_before: str | None = None


STEPS: tuple[StepSpec, ...] = (
    StepSpec("install", 0, (90, 120), (20, 10), install, left_out=probe),
    # NCCL, a rank per GPU, a finite loss; samples/s with the GPU to itself
    StepSpec("ddp", 1, (90, 120), (25, 15), Training()),
    StepSpec("amp_fp16", 2, (60, 90), (20, 0), Training(
        {"amp": "fp16"}, lambda run: bool((run["precision"] or {}).get("grad_scaler")),
        "--amp fp16 ran without a GradScaler",
        cuda_only="float16 autocast with a GradScaler runs on CUDA only (refused on CPU: tests/test_knobs.py)")),
    StepSpec("amp_bf16", 2, (60, 90), (20, 15), Training(
        {"amp": "bf16"}, lambda run: (run["precision"] or {}).get("amp") == "bf16",
        "--amp bf16 recorded precision {run[precision]}")),
    StepSpec("channels_last", 2, (60, 90), (20, 15), Training(
        {"channels_last": ""}, lambda run: run["channels_last"] is True,
        "--channels-last is not recorded in config.json")),
    StepSpec("exact", 3, (150, 240), (45, 40), exact),
    StepSpec("horovod_api", 4, (75, 120), (25, 15), horovod_api),
    # after ddp, so that ddp's speed is the GPU's alone; before compare, which uses the Horovod it built
    StepSpec("horovod_build", 5, (240, 900), (0, 0), (prepare_build, build_finished), required=False,
             starts_after="ddp", joined_before="compare"),
    StepSpec("compare", 6, (150, 300), (45, 30), compare),
)


NAMES = tuple(step.name for step in STEPS)


def on(seconds: tuple[int, int], device: str) -> int:
    """A row's seconds for `device`."""
    return seconds[0] if device == "cuda" else seconds[1]


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


def time_box(spec: StepSpec, specs: Sequence[StepSpec], selected: Collection[str], device: str,
             seconds_left: float) -> float:
    """A step's box, less what the selected steps after it (or that wait for it) keep back, within `seconds_left`."""
    later = ([s for s in specs if s.name == spec.joined_before] if spec.starts_after
             else specs[list(specs).index(spec) + 1:])
    return min(on(spec.box_s, device), seconds_left - sum(on(s.reserve_s, device) for s in later if s.name in selected))


def attempt(record: StepRecord, work: Callable[[], None]) -> None:
    """Do a step's `work`, and record what became of it."""
    try:
        work()
        record.outcome = "ok"
    except Skipped as exc:
        record.reason = str(exc)
    except (TimedOut, StepFailed) as exc:
        record.outcome, record.error = "timeout" if isinstance(exc, TimedOut) else "failed", str(exc)
    except Exception as exc:  # a bug of the check itself: recorded like a failure
        record.outcome, record.error = "failed", one_line(f"{type(exc).__name__}: {exc}")


class Runner:
    """Runs the steps of `specs` in `budget` seconds from now, and records what became of each."""

    def __init__(self, specs: Sequence[StepSpec], ctx: Context, budget: float) -> None:
        self.specs, self.ctx, self.start = list(specs), ctx, time.monotonic()  # monotonic, as every time box
        self.deadline = self.start + budget
        self.records = {spec.name: StepRecord(spec.name) for spec in specs}
        self._started: Started | None = None  # the background step's command

    def run(self) -> str | None:
        """Run every step; None, or why the check stopped early (a signal). No command is left running."""
        build = next(spec for spec in self.specs if spec.starts_after)
        try:
            for spec in self.specs:
                if spec.name == build.joined_before:
                    self._join(build)
                if spec is not build:
                    self._run(spec)
                if spec.name == build.starts_after:
                    self._start(build)
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
        if (box := self._box(spec, record)) >= on(spec.reserve_s, self.ctx.settings.device) and box > 0:
            return box
        record.outcome, record.error = "failed", f"no time left in the budget of {self.ctx.settings.budget:.0f} s"
        return None

    def _run(self, spec: StepSpec) -> None:
        """A foreground step within its box; its line printed where it was selected and could run."""
        record, action = self.records[spec.name], spec.action
        assert not isinstance(action, tuple)
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
        """The background step's command started, its box counted from now; or the reason it does not run."""
        record, action = self.records[spec.name], spec.action
        assert isinstance(action, tuple)
        record.reason = self._skip_reason(spec)
        if record.reason:
            return
        record.started_s = round(time.monotonic() - self.start, 2)  # its line is printed when it is waited for
        try:
            launch = action[0](self.ctx, record)
        except Skipped as exc:
            record.reason = str(exc)
            return
        if (box := self._time_left(spec, record)) is not None:  # else its command never starts: no command listed
            self._started = self.ctx.start(record, launch, time.monotonic() + box)

    def _join(self, spec: StepSpec) -> None:
        """Wait for the background step and record it; its line printed where it was selected and not blocked."""
        record, action, started, self._started = self.records[spec.name], spec.action, self._started, None
        assert isinstance(action, tuple)
        try:
            if started is not None:
                attempt(record, lambda: action[1](self.ctx, record, self._wait(record, started)))
        finally:
            if record.started_s is not None:
                print_line(step_line(record))

    def _wait(self, record: StepRecord, started: Started) -> str:
        try:
            return self.ctx.finish(record, started)
        finally:
            record.seconds = time.monotonic() - started.began
