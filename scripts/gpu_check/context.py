"""What the steps share: the settings (GPU_CHECK_*), the records, how a step ends, and its commands."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Self

ROOT = Path(__file__).resolve().parents[2]
PROG = "gpu_check"
BUDGET = {"cuda": 480, "cpu": 300}  # the whole check, seconds (GPU_CHECK_BUDGET)
FORCED_FAILURE = "--gpu-check-forced-failure"  # what GPU_CHECK_FAIL adds to a command: an option no program takes
#: an error line: Python's exceptions, `error:` of pip, CMake and compilers; and lines that only say another says why
ERROR_LINE = re.compile(r"(^|\s)([\w.]*(Error|Exception)|[Ee]rror|ERROR):\s")
NOT_THE_REASON = ("subprocess-exited-with-error", "metadata-generation-failed", "ChildFailedError",
                  "See above for", "note: This error originates")


class StepFailed(Exception):
    """A step found something wrong: its error line."""


class TimedOut(Exception):
    """A step's command was stopped at the end of its time box: the error line."""


class Skipped(Exception):
    """A step that does not apply here: the reason."""


def refuse(message: str) -> NoReturn:
    """A setting the check cannot run with: one line, exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def require(ok: object, error: str) -> None:
    """Raise StepFailed with `error` unless `ok`."""
    if not ok:
        raise StepFailed(error)


def one_line(text: str) -> str:
    """`text` on one line, its white space collapsed, cut at 400 characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= 400 else line[:399] + "…"


def error_line(output: str) -> str:
    """Why a command failed: the last `PROG: error:` line, else the last other error line, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if ": error: " in line]
    errors = [line for line in lines if ERROR_LINE.search(line) and not any(s in line for s in NOT_THE_REASON)]
    last = (ours or errors or lines)[-1:]
    return one_line(last[0]) if last else "no output"


def carry_folder(environ: Mapping[str, str]) -> Path:
    """The folder with what the offline Horovod build needs (GPU_CHECK_CARRY, default runs/gpu-carry)."""
    return Path(environ.get("GPU_CHECK_CARRY") or ROOT / "runs" / "gpu-carry").resolve()


@dataclass(frozen=True)
class Settings:
    """What the check was asked to do."""

    device: str                 # cuda, or cpu for the rehearsal
    python: str                 # the interpreter that runs everything
    work: Path                  # run directories and logs
    out: Path                   # gpu_check.json and the logs' archive
    carry: Path
    budget: float               # seconds for the whole check
    only: tuple[str, ...]       # the steps to run (GPU_CHECK_STEPS)
    force_fail: tuple[str, ...]
    build_wanted: str           # GPU_CHECK_HOROVOD_BUILD: auto, 1, 0
    nproc_wanted: str | None    # GPU_CHECK_NPROC

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], python: str, steps: Sequence[str]) -> Self:
        """The settings in `environ`, for `python` and the check's `steps`; refused (exit 2) where one is wrong."""
        device = environ.get("GPU_CHECK_DEVICE", "cuda")
        if device not in ("cuda", "cpu"):
            refuse(f"GPU_CHECK_DEVICE={device}: choose cuda or cpu")
        work = Path(environ.get("GPU_CHECK_WORK") or ROOT / "runs" / "gpu-check" / device).resolve()
        default_out = ROOT / "benchmarks" / "results" / "gpu" if device == "cuda" else work
        try:
            budget = float(environ.get("GPU_CHECK_BUDGET") or BUDGET[device])
        except ValueError:
            refuse(f"GPU_CHECK_BUDGET={environ['GPU_CHECK_BUDGET']}: give seconds")
        only, force_fail = (tuple(s for s in environ.get(key, "").split(",") if s)
                            for key in ("GPU_CHECK_STEPS", "GPU_CHECK_FAIL"))
        for name in [*only, *force_fail]:
            if name not in steps:
                refuse(f"unknown step {name!r} in GPU_CHECK_STEPS/GPU_CHECK_FAIL; the steps: {','.join(steps)}")
        return cls(device=device, python=python, work=work,
                   out=Path(environ.get("GPU_CHECK_OUT") or default_out).resolve(), carry=carry_folder(environ),
                   budget=budget, only=only or tuple(steps), force_fail=force_fail,
                   build_wanted=environ.get("GPU_CHECK_HOROVOD_BUILD", "auto"),
                   nproc_wanted=environ.get("GPU_CHECK_NPROC"))

    def forced(self, name: str) -> list[str]:
        """What step `name`'s command gets so that it fails (GPU_CHECK_FAIL)."""
        return [FORCED_FAILURE] if name in self.force_fail else []


@dataclass
class StepRecord:
    """What became of one step (gpu_check.json's `steps`, in this order)."""

    name: str
    outcome: str = "skipped"             # ok, failed, timeout, skipped
    started_s: float | None = None       # from the start of the check
    seconds: float = 0.0
    limit_s: float | None = None
    commands: list[str] = field(default_factory=list)
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)  # what it measured, as the JSON has it
    log: str | None = None               # relative to the work folder
    reason: str | None = None            # why it was skipped

    @property
    def failed(self) -> bool:
        """Whether it failed or ran out of time."""
        return self.outcome in ("failed", "timeout")


@dataclass(frozen=True)
class Launch:
    """A command to start: what the record keeps of it, and its environment (None: the check's)."""

    command: list[str]
    shown: str | None = None
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class Started:
    """A step's command, started: where its output begins in the step's log; when it began and its box ends."""

    process: subprocess.Popen[bytes]
    log: Path
    offset: int
    began: float  # monotonic seconds
    until: float


@dataclass
class Context:
    """One check's state: its settings, its commands' environment and those running, what the install step found."""

    settings: Settings
    env: dict[str, str] = field(default_factory=lambda: {"PYTHONUNBUFFERED": "1", **os.environ})
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)  # the probe's, as the JSON has them
    compat: dict[str, Any] = field(default_factory=dict)
    install_method: str | None = None
    nproc: int = 1  # processes per run: the world size

    def __post_init__(self) -> None:
        if self.settings.device == "cuda":
            self.env["NCCL_DEBUG"] = "VERSION"  # NCCL says its version when a communicator starts: proof it ran

    def run(self, record: StepRecord, cmd: list[str], until: float, shown: str | None = None) -> str:
        """Run `cmd` to its end or `until` (monotonic seconds): its output, as finish() gives it."""
        return self.finish(record, self.start(record, Launch(cmd, shown), until))

    def start(self, record: StepRecord, launch: Launch, until: float) -> Started:
        """Start a command from the repository root, its output (after a `$ cmd` line) appended to the step's log."""
        record.commands.append(launch.shown or " ".join(launch.command))
        log = self.settings.work / "logs" / f"{record.name}.log"
        record.log = str(log.relative_to(self.settings.work))
        log.parent.mkdir(parents=True, exist_ok=True)
        offset = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(launch.command)}\n".encode())
            f.flush()
            # A session of its own: stop() reaches every process it starts (torchrun's workers, make's jobs).
            process = subprocess.Popen(launch.command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=ROOT, env=launch.env or self.env, start_new_session=True)
        self.running.append(process)
        return Started(process, log, offset, time.monotonic(), until)

    def finish(self, record: StepRecord, started: Started) -> str:
        """Wait for a started command: its output; StepFailed where it failed, TimedOut at the end of its box."""
        try:
            code: int | None = started.process.wait(max(0.0, started.until - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop(started.process)
            code = None
        self.running.remove(started.process)  # not on an interrupt: stop_all() stops it then
        output = started.log.read_bytes()[started.offset:].decode(errors="replace")
        if code is None:
            raise TimedOut(f"stopped after its time box ({record.limit_s:.0f} s): {error_line(output)}")
        require(code == 0, f"exit code {code}: {error_line(output)}")
        return output

    @staticmethod
    def stop(process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the command's process group (torchrun passes it to its workers), SIGKILL 10 s later."""
        with contextlib.suppress(ProcessLookupError):
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(wait)
                    return

    def stop_all(self) -> None:
        """Stop every command still running."""
        for process in list(self.running):
            self.stop(process)
