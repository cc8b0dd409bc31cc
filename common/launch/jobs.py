"""Running a launched job: its own process group, its output captured, a time limit, and a teardown
that leaves no rank behind.

torchrun and horovodrun start their workers in sessions of their own, out of reach of a signal to the
launcher's process group; they stop their workers when they get SIGTERM. So a job is stopped with
SIGTERM to its group first, and whatever of it is still alive after a grace period is killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import psutil

#: seconds a stopped job gets to end by itself before what is left of it is killed
STOP_GRACE_S = 15.0
#: Open MPI 4 keeps every mpirun of a user on a host under one session directory, /tmp/ompi.HOST.UID, which a job
#: that ends removes when it is empty: a job starting at that moment fails in orte_init ("A call to mkdir was unable
#: to create the desired directory ... File exists", open-mpi/ompi#8510). So each Job gets a base of its own
#: (under the one the caller set, if any), removed when the job has ended.
OPEN_MPI_SESSIONS = "OMPI_MCA_orte_tmpdir_base"
#: torchrun's --log-dir, which it also reads from the environment: without one, every torchrun leaves a folder
#: torchelastic_* in /tmp that nothing removes. A Job's torchrun keeps its logs in the job's own folder instead,
#: unless the caller chose a log folder.
TORCHRUN_LOGS = "PET_LOG_DIR"


def job_env(extra: Optional[Dict[str, str]] = None, python: str = sys.executable) -> Dict[str, str]:
    """The environment of a launched job: this Python's tools (torchrun, horovodrun) first on PATH,
    unbuffered output, and no inherited OMP_NUM_THREADS (the training sets its thread count itself)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra or {})
    return env


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a driver (`kill`, a scheduler ending it): it unwinds as Ctrl-C does, stopping its running job."""


@contextlib.contextmanager
def terminating_like_ctrl_c():
    """Within: SIGTERM raises Terminated in the main thread, so a driver that stops its running job on Ctrl-C
    (a Job's teardown on the way out) does the same on SIGTERM instead of leaving the job to run on."""
    def raise_terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_exit(prog: str, exc: KeyboardInterrupt) -> int:
    """Say that a driver stopped by `exc` stopped its running job; returns its exit code: 143 after SIGTERM, 130
    after Ctrl-C (128 + the signal)."""
    terminated = isinstance(exc, Terminated)
    print(f"{prog}: {'terminated' if terminated else 'interrupted'}; the running job was stopped", file=sys.stderr)
    return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


class JobTimeout(RuntimeError):
    """A job ran past its time limit and was stopped."""


class Job:
    """A command started in a session of its own, its combined output read in the background.

    Each line is kept (`lines`, `output`), written to `log` when given and passed to `on_line`.
    Used as a context manager, the job is stopped when the block is left by an exception (a failed
    assertion, Ctrl-C), so nothing it started outlives it.
    """

    def __init__(self, cmd: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
                 log: Optional[Path] = None, on_line: Optional[Callable[[str], None]] = None) -> None:
        self.cmd = [str(c) for c in cmd]
        self.lines: List[str] = []
        self.on_line = on_line
        self.started = time.monotonic()
        self._log = None
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log, "w")
            self._log.write("$ " + " ".join(self.cmd) + "\n")
            self._log.flush()
        env = dict(env if env is not None else job_env())
        # The job's own temporary folder: Open MPI's session base and torchrun's logs, removed when it has ended.
        self.scratch = Path(tempfile.mkdtemp(prefix="job-", dir=env.get(OPEN_MPI_SESSIONS) or None))
        env[OPEN_MPI_SESSIONS] = str(self.scratch)
        env.setdefault(TORCHRUN_LOGS, str(self.scratch / "torchrun"))
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, errors="replace")
        self._reader = threading.Thread(target=self._read, name=f"job-{self.proc.pid}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # started with stdout=PIPE
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            if self.on_line is not None:
                self.on_line(line)
        self.proc.stdout.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        """Everything the job printed so far."""
        return "".join(self.lines)

    @property
    def seconds(self) -> float:
        """Seconds since the job started."""
        return time.monotonic() - self.started

    def poll(self) -> Optional[int]:
        """The exit code, or None while it runs."""
        return self.proc.poll()

    @property
    def returncode(self) -> Optional[int]:
        """The launcher's exit code once it ended (None before)."""
        return self.proc.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the launcher (not its workers), as a user's Ctrl-C or `kill` would."""
        self.proc.send_signal(sig)

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code once the job ended and its output was read; JobTimeout (after stopping the
        job) when it runs longer than `timeout` seconds."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise JobTimeout(f"{' '.join(self.cmd)} did not end within {timeout:.0f} s") from None
        self._reader.join(timeout=10)
        self._release()
        return code

    def wait_until(self, condition: Callable[[], object], timeout: float) -> bool:
        """Whether `condition()` came true within `timeout` seconds while the job ran."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.proc.poll() is not None:
                self._reader.join(timeout=10)
                return bool(condition())
            time.sleep(0.05)
        return False

    def wait_for(self, pattern: str, timeout: float) -> Optional[re.Match]:
        """The first match of `pattern` in the output, waiting up to `timeout` seconds for it."""
        found: List[Optional[re.Match]] = []

        def matched() -> bool:
            found.append(re.search(pattern, self.output))
            return found[-1] is not None

        self.wait_until(matched, timeout)
        return found[-1] if found else None

    def family(self) -> List[psutil.Process]:
        """The launcher and every process it started that is still alive."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = STOP_GRACE_S) -> Optional[int]:
        """End the job: SIGTERM to its process group (launchers stop their workers on it), then, after
        `grace_s`, SIGKILL to whatever of it is left. Returns the launcher's exit code."""
        if self.proc.poll() is None:
            family = self.family()
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            for proc in family + self.family():
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)
        self._release()
        return self.proc.returncode

    def _release(self) -> None:
        """Once the job has ended: close its log and remove its temporary folder."""
        if self._log is not None and not self._reader.is_alive():
            self._log.close()
            self._log = None
        if self.proc.poll() is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.stop(grace_s=5.0)


def runs_module(proc: psutil.Process, modules: Sequence[str]) -> bool:
    """Whether `proc` is a Python interpreter running `python [-u] -m MODULE` for one of `modules` (a rank,
    not its launcher or a shell around it); False for a process that is gone."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    head = cmd[1:4]  # torchrun adds -u before -m
    return "-m" in head and cmd.index("-m") + 1 < len(cmd) and cmd[cmd.index("-m") + 1] in modules


def still_running(procs: Sequence[psutil.Process]) -> List[psutil.Process]:
    """Those of `procs` still running: an exited rank its launcher has not reaped yet (a zombie) has ended."""
    running = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc)
        except psutil.NoSuchProcess:
            pass
    return running


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Result:
    """How a job that ran to its end (or to its time limit) ended."""

    cmd: List[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False


def finish(job, timeout: float) -> Result:
    """Wait for a started job (a Job, or common.launch.remote.HostsJob) to end; past `timeout` seconds it is
    stopped and `timed_out` is set. Ctrl-C while waiting stops it too."""
    with job:
        try:
            code, timed_out = job.wait(timeout=timeout), False
        except JobTimeout:
            code, timed_out = job.returncode, True
    return Result(job.cmd, code, job.output, job.seconds, timed_out)


def run(cmd: Sequence[str], timeout: float, *, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
        log: Optional[Path] = None, on_line: Optional[Callable[[str], None]] = None) -> Result:
    """Run `cmd` to its end as a Job; past `timeout` seconds it is stopped and `timed_out` is set."""
    return finish(Job(cmd, env=env, cwd=cwd, log=log, on_line=on_line), timeout)
