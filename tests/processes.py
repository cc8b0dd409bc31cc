"""Jobs started in the background (common.launch.Job), and the processes they leave: for fault and
elastic tests."""

from __future__ import annotations

import time
from typing import Optional

import psutil

from common.launch import Job as LaunchedJob, runs_module, still_running
from common.rundir.reader import events_so_far
from launched import REPO, job_env


class Job(LaunchedJob):
    """A launched job whose output is collected in the background; waits that fail kill it and fail
    the test with its output."""

    def __init__(self, cmd, env=None, cwd=REPO):
        super().__init__(cmd, env=job_env(env), cwd=cwd)

    def wait_for(self, pattern: str, timeout: float = 120):
        """Until the output matches `pattern`; the job is killed and the test fails if it never does."""
        found = super().wait_for(pattern, timeout)
        if not found:
            self.kill()
            raise AssertionError(f"never printed {pattern!r}:\n{self.output[-3000:]}")
        return found

    def wait_until(self, condition, failure: str = "condition never held", timeout: float = 120) -> bool:
        """Until `condition()` holds while the job runs; else the job is killed and the test fails."""
        if not super().wait_until(condition, timeout):
            self.kill()
            raise AssertionError(f"{failure}:\n{self.output[-3000:]}")
        return True

    def wait(self, timeout: float) -> int:
        try:
            return super().wait(timeout)
        except Exception as exc:  # JobTimeout: stopped already
            raise AssertionError(f"job still running after {timeout}s:\n{self.output[-3000:]}") from exc

    def kill(self):
        self.stop(grace_s=0)

    def ended_within(self, timeout: float) -> Optional[int]:
        """The exit code, or None when the job ran past `timeout` seconds (it is stopped then): for a test
        that judges several jobs, each on its own."""
        try:
            return self.wait(timeout)
        except AssertionError:
            return None


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
        if runs_module(proc, ("ddp_train", "hvd_train")) and rank_of(proc) == rank:
            return proc
    raise AssertionError(f"no worker of rank {rank} found")


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listening(job: Job):
    """{process: [address it listens on]} for the launcher and every process it started."""
    found = {}
    for proc in job.family():
        try:
            addresses = [c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
        if addresses:
            found[proc] = addresses
    return found


def steps_logged(run_dir) -> list:
    """The step events rank 0 has written to metrics.jsonl so far."""
    return [e for e in events_so_far(run_dir) if e.get("event") == "step"]


def wait_ended(procs, timeout: float) -> list:
    """Wait until every process has exited (gone, or a zombie its launcher has not reaped yet); the
    ones still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        running = still_running(procs)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)
