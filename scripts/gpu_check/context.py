"""What the steps share: their records, how a step says it failed, ran out of time or does not apply, their commands
(each in a process group of its own, its output appended to the step's log), and what the install step found."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import ROOT, Settings

if TYPE_CHECKING:
    from .spec import StepSpec

#: an error line: Python's exceptions, `error:` of pip, CMake and compilers; and the lines that only say that
#: another line said why
ERROR_LINE = re.compile(r"(^|\s)([\w.]*(Error|Exception)|[Ee]rror|ERROR):\s")
NOT_THE_REASON = ("subprocess-exited-with-error", "metadata-generation-failed", "ChildFailedError",
                  "See above for", "note: This error originates")


class StepFailed(Exception):
    """A step found something wrong: its error line."""


class TimedOut(Exception):
    """A step's command was stopped at the end of its time box: the error line."""


class Skipped(Exception):
    """A step that does not apply here: the reason."""


def require(ok: object, error: str) -> None:
    """Raise StepFailed with `error` unless `ok`."""
    if not ok:
        raise StepFailed(error)


def one_line(text: str, limit: int = 400) -> str:
    """`text` on one line, its white space collapsed, cut at `limit` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def error_line(output: str) -> str | None:
    """Why a command failed: the last `PROG: error:` line, else the last other error line, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if ": error: " in line]
    errors = [line for line in lines if ERROR_LINE.search(line) and not any(s in line for s in NOT_THE_REASON)]
    last = (ours or errors or lines)[-1:]
    return one_line(last[0]) if last else None


@dataclass
class StepRecord:
    """What became of one step (gpu_check.json's `steps`, in this order)."""

    spec: StepSpec
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
    def name(self) -> str:
        """The step's name."""
        return self.spec.name

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
    """One check's shared state: the settings, the commands' environment (the install step may put the project on
    PYTHONPATH) and those running, and what the install step found for the others and the record."""

    settings: Settings
    env: dict[str, str]
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)  # the probe's, as the JSON has them
    compat: dict[str, Any] = field(default_factory=dict)
    install_method: str | None = None
    nproc: int = 1  # processes per run: the world size

    @classmethod
    def create(cls, settings: Settings) -> Context:
        """The context of a check with `settings`, its commands' environment this process's."""
        env = {"PYTHONUNBUFFERED": "1", **os.environ}
        if settings.device == "cuda":
            env["NCCL_DEBUG"] = "VERSION"  # NCCL says its version when a communicator starts: proof it ran
        return cls(settings, env)

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
        with open(started.log, "rb") as f:
            f.seek(started.offset)
            output = f.read().decode(errors="replace")
        why = error_line(output) or "no output"
        if code is None:
            raise TimedOut(f"stopped after its time box ({record.limit_s:.0f} s): {why}")
        require(code == 0, f"exit code {code}: {why}")
        return output

    @staticmethod
    def stop(process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the command's process group (torchrun passes it to its workers), SIGKILL 10 s later."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
                process.wait(wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        """Stop every command still running."""
        for process in list(self.running):
            self.stop(process)
