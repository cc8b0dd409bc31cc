"""Launch a matrix of training runs through the real launchers, one at a time, with progress."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .launchers import LaunchSpec
from .rundirs import run_name

EPOCH_LINE = re.compile(r"^epoch (\d+) step (\d+)/(\d+)")


@dataclass
class PlannedRun:
    """One cell of the matrix: a launch spec and which timing repeat it is."""

    spec: LaunchSpec
    repeat: int

    @property
    def name(self) -> str:
        return run_name(self.spec.label, self.spec.np, self.repeat)

    @property
    def dirname(self) -> str:
        return f"{self.spec.label}-np{self.spec.np}-r{self.repeat + 1}"


def plan(backends: Sequence[str], world_sizes: Sequence[int], controllers: Optional[Sequence[str]],
         repeats: int) -> List[PlannedRun]:
    """The runs to make. Repeats are interleaved (all cells once, then again) so that drift in
    the machine's speed spreads over every cell. With controllers=None Horovod runs the Gloo
    controller at every size and the MPI controller at the largest."""
    largest = max(world_sizes)
    cells: List[LaunchSpec] = []
    for np in world_sizes:
        for backend in backends:
            if backend == "ddp":
                cells.append(LaunchSpec("ddp", np))
            elif controllers is None:
                cells.append(LaunchSpec("horovod", np, "gloo"))
                if np == largest:
                    cells.append(LaunchSpec("horovod", np, "mpi"))
            else:
                cells += [LaunchSpec("horovod", np, c) for c in controllers]
    return [PlannedRun(spec, r) for r in range(repeats) for spec in cells]


@dataclass
class Outcome:
    """How one launched run ended."""

    planned: PlannedRun
    run_dir: Path
    returncode: int
    seconds: float
    command: str
    error: Optional[str]


def _error_of(lines: List[str]) -> str:
    """The most telling line of a failed run's output: our one-line error, else the last line."""
    for line in reversed(lines):
        if ": error: " in line or "Error:" in line or "error:" in line.lower():
            return line.strip()
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1] if tail else "no output"


def _fmt_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class MatrixRunner:
    """Runs a plan sequentially (runs on one host must not compete for its cores)."""

    def __init__(self, train_args: Sequence[str], out: Path, python: str = sys.executable,
                 timeout_s: float = 1800, echo: Callable[[str], None] = print) -> None:
        self.train_args = list(train_args)
        self.out = out
        self.python = python
        self.timeout_s = timeout_s
        self.echo = echo
        self._current: Optional[subprocess.Popen] = None

    def run_all(self, runs: List[PlannedRun]) -> List[Outcome]:
        """Launch every planned run; a failure is recorded and the rest still run."""
        outcomes: List[Outcome] = []
        started = time.monotonic()
        for index, planned in enumerate(runs):
            outcome = self._run_one(planned, index, len(runs), started, outcomes)
            outcomes.append(outcome)
            status = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode}): {outcome.error}"
            self.echo(f"[{index + 1}/{len(runs)}] finished {planned.name} in {outcome.seconds:.1f}s: {status}")
        return outcomes

    @staticmethod
    def _eta(index: int, total: int, fraction: float, current_s: float, done: List[Outcome]) -> float:
        """Seconds left: the current run's rest (from its progress), plus the runs still to
        start at the mean duration of the finished ones (or of this one, before any finished)."""
        current_total = current_s / fraction if fraction > 0 else current_s
        per_run = sum(o.seconds for o in done) / len(done) if done else current_total
        return max(current_total - current_s, 0.0) + per_run * (total - index - 1)

    def _run_one(self, planned: PlannedRun, index: int, total: int, started: float,
                 done: List[Outcome]) -> Outcome:
        run_dir = self.out / "runs" / planned.dirname
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = planned.spec.command(self.train_args + ["--run-dir", str(run_dir)], python=self.python)
        shown = " ".join(cmd)
        self.echo(f"[{index + 1}/{total}] starting {planned.name}: {shown}")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PATH"] = f"{Path(self.python).parent}{os.pathsep}{env.get('PATH', '')}"
        t0 = time.monotonic()
        lines: List[str] = []
        with open(run_dir / "launch.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    start_new_session=True)
            self._current = proc
            try:
                for line in proc.stdout:
                    log.write(line)
                    lines.append(line)
                    match = EPOCH_LINE.match(line)
                    if match:
                        step, steps = int(match.group(2)), int(match.group(3))
                        now = time.monotonic() - t0
                        eta = self._eta(index, total, step / steps, now, done)
                        self.echo(f"    {planned.name} epoch {match.group(1)} step {step}/{steps} "
                                  f"· elapsed {_fmt_seconds(time.monotonic() - started)} · ETA {_fmt_seconds(eta)}")
                    if time.monotonic() - t0 > self.timeout_s:
                        self.stop()
                        lines.append(f"compare: error: run exceeded --run-timeout {self.timeout_s:.0f}s\n")
                        break
                returncode = proc.wait()
            finally:
                if proc.poll() is None:
                    self.stop()
                self._current = None
        seconds = time.monotonic() - t0
        error = None if returncode == 0 else _error_of(lines)
        (run_dir / "launch.json").write_text(json.dumps(
            {"command": shown, "returncode": returncode, "seconds": seconds, "name": planned.name,
             "backend": planned.spec.label, "np": planned.spec.np, "repeat": planned.repeat + 1}, indent=2) + "\n")
        return Outcome(planned, run_dir, returncode, seconds, shown, error)

    def stop(self) -> None:
        """End the running job's whole process group: SIGTERM, then SIGKILL after 10 s."""
        proc = self._current
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


def failure_record(outcome: Outcome) -> Dict:
    """A failed run as the report shows it."""
    return {"name": outcome.planned.name, "returncode": outcome.returncode, "error": outcome.error,
            "command": outcome.command, "log": str(outcome.run_dir / "launch.log")}
