"""Jobs started in the background, and the processes they leave: for fault and elastic tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import psutil

from launch import REPO, job_env


class Job:
    """A launched job whose output is collected in the background."""

    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        """Until the output matches `pattern`; the job is killed and the test fails if it never does."""
        self.wait_until(lambda: re.search(pattern, self.output), f"never printed {pattern!r}", timeout)

    def wait_until(self, condition, failure: str, timeout: float = 120) -> None:
        """Until `condition()` holds while the job runs; else the job is killed and the test fails."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"{failure}:\n{self.output[-3000:]}")

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job still running after {timeout}s:\n{self.output[-3000:]}")
        self._reader.join(timeout=10)
        return code

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def job_processes(marker: str):
    """Live processes whose command line mentions `marker` (the job's unique run directory)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def assert_nothing_left(marker: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = job_processes(marker)
    for proc in left:
        proc.kill()
    assert not left, f"processes left behind: {[p.pid for p in left]}"


def rank_of(proc: psutil.Process):
    env = proc.environ()
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in env:
            return int(env[var])
    return None


def worker(marker: str, rank: int) -> psutil.Process:
    for proc in job_processes(marker):
        cmd = proc.cmdline()
        # The training interpreter itself: python -m ddp_train|hvd_train (not a launcher or shell).
        head = cmd[1:4]  # torchrun adds -u before -m
        if "-m" in head and cmd[cmd.index("-m") + 1] in ("ddp_train", "hvd_train") and rank_of(proc) == rank:
            return proc
    raise AssertionError(f"no worker of rank {rank} found")
