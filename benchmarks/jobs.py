"""Starting benchmark jobs: launcher command lines, and running jobs in their own process group
so that a timeout or Ctrl-C leaves no rank behind."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common.compare.launchers import mpi_flags

from .machine import REPO

#: the launchers a benchmark can start a worker module with
LAUNCHERS = ("torchrun", "horovodrun-gloo", "horovodrun-mpi", "mpirun")


def tool(name: str) -> str:
    """A launcher script installed beside this Python (the venv's), else the name for PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def worker_command(launcher: str, np: int, module: str, args: Sequence[str]) -> List[str]:
    """`python -m module args` on `np` local processes through a real launcher."""
    if launcher == "torchrun":
        return [tool("torchrun"), "--standalone", f"--nproc-per-node={np}", "-m", module, *args]
    if launcher in ("horovodrun-gloo", "horovodrun-mpi"):
        controller = launcher.split("-")[1]
        cmd = [tool("horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}"]
        if controller == "mpi":
            cmd.append("--mpi-args=" + " ".join(mpi_flags()))
        return cmd + [sys.executable, "-m", module, *args]
    if launcher == "mpirun":
        return [tool("mpirun"), *mpi_flags(), "-np", str(np), sys.executable, "-m", module, *args]
    raise ValueError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for a launched job: the venv's tools first on PATH, the repository importable
    (workers run as `python -m benchmarks...`), unbuffered output, no inherited thread count."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra or {})
    return env


class JobFailed(RuntimeError):
    """A launched job exited non-zero or ran out of time; the message ends with its output."""


def children_cpu_s() -> float:
    """CPU seconds (user + system) used so far by every finished process this one started, their
    children included: run jobs one at a time and the difference is one job's CPU time, which
    other load on the machine disturbs far less than its wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(cmd: Sequence[str], log: Path, timeout_s: float, env: Optional[Dict[str, str]] = None) -> float:
    """Run `cmd` from the repository root in its own process group, output to `log`; return the
    seconds it took. On timeout or Ctrl-C the whole group is killed, so no rank is left behind."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(map(str, cmd)) + "\n")
        out.flush()
        proc = subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=job_env(env), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except BaseException as exc:  # timeout, Ctrl-C
            _kill_group(proc)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise JobFailed(f"did not finish in {timeout_s:.0f} s: {' '.join(map(str, cmd))}\n"
                                + _tail(log)) from None
            raise
    if code != 0:
        raise JobFailed(f"exited {code}: {' '.join(map(str, cmd))}\n" + _tail(log))
    return time.monotonic() - started


def run_jobs_together(cmds: List[Sequence[str]], logs: List[Path], timeout_s: float,
                      env: Optional[Dict[str, str]] = None) -> None:
    """Start several independent jobs at the same moment and wait for all of them."""
    procs, files = [], []
    try:
        for cmd, log in zip(cmds, logs):
            log.parent.mkdir(parents=True, exist_ok=True)
            f = open(log, "w")
            f.write("$ " + " ".join(map(str, cmd)) + "\n")
            f.flush()
            files.append(f)
            procs.append(subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=job_env(env), stdout=f,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        for proc, cmd, log in zip(procs, cmds, logs):
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise JobFailed(f"exited {code}: {' '.join(map(str, cmd))}\n" + _tail(log))
    except BaseException as exc:
        for proc in procs:
            _kill_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise JobFailed(f"independent jobs did not finish in {timeout_s:.0f} s") from None
        raise
    finally:
        for f in files:
            f.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop a launcher and every rank it started. SIGTERM first: torchrun and horovodrun start their
    workers in sessions of their own (out of reach of a kill of the launcher's group) and stop them
    when they get SIGTERM. Whatever is still alive after a grace period is killed."""
    if proc.poll() is not None:
        return
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run_cli(main, name: str) -> int:
    """A benchmark's main() for the command line: Ctrl-C stops the running job (and its ranks) and exits 130."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted; the running job was stopped", file=sys.stderr)
        return 130
