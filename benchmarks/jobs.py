"""Starting benchmark jobs through the launch layer (common.launch): the command of a worker module
under a registered launcher, and running one job, or several at once, with its output in a log."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from common import launch
from common.compare.arguments import world_sizes
from common.launch.hosts import DEFAULT_PORT, parse_hosts, place, spell
from common.launch.remote import commands_for, run_commands, shown

from .machine import REPO


#: where the benchmarks' results go (kept in git)
RESULTS = Path("benchmarks/results")


def add_out(parser: argparse.ArgumentParser, help: Optional[str] = None) -> None:
    """--out: the folder of the result files."""
    parser.add_argument("--out", type=Path, default=RESULTS, help=help)


def add_np(parser: argparse.ArgumentParser, default: Any, help: Optional[str] = None, **kwargs: Any) -> None:
    """--np: the ranks of each job (an int), or the world sizes to measure (when `default` is a list: 1,2,4)."""
    parse = world_sizes if isinstance(default, list) else int
    parser.add_argument("--np", type=parse, default=default, help=help, **kwargs)


def add_timeout(parser: argparse.ArgumentParser, default: float, help: str = "seconds before one run is stopped") -> None:
    """--timeout: seconds before one run (or job, or phase) is stopped."""
    parser.add_argument("--timeout", type=float, default=default, help=help)


def add_places(parser: argparse.ArgumentParser, work: str) -> None:
    """--out (where the result goes, kept in git) and --work (the run directories, not kept)."""
    add_out(parser, "where the JSON (and PNG) go")
    parser.add_argument("--work", type=Path, default=Path(work), help="run directories (not kept in git)")


def launcher_by_label() -> Dict[str, str]:
    """A run label (ddp, horovod-gloo, horovod-mpi) -> the first host launcher the registry has for it."""
    found: Dict[str, str] = {}
    for launcher in launch.host_launchers():
        found.setdefault(launcher.label, launcher.name)
    return found


def worker_command(launcher: str, np: int, module: str, args: Sequence[str]) -> List[str]:
    """`python -m module args` on `np` local processes through the registered launcher `launcher`."""
    return launch.get(launcher).command(np, args, module=module)


def job_env(extra: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, str]:
    """A launched job's environment (common.launch.job_env) with the repository importable: workers run
    as `python -m benchmarks...`, which the installed project does not include. A variable given as None
    in `extra` is removed, so that the program under test makes its own choice even when this shell set it."""
    env = launch.job_env()
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class JobFailed(RuntimeError):
    """A launched job exited non-zero or ran out of time; the message ends with its output."""


def children_cpu_s() -> float:
    """CPU seconds (user + system) used so far by every finished process this one started, their
    children included: run jobs one at a time and the difference is one job's CPU time, which
    other load on the machine disturbs far less than its wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _failure(result: launch.Result, timeout_s: float) -> Optional[str]:
    if result.timed_out:
        return f"did not finish in {timeout_s:.0f} s: {' '.join(result.cmd)}\n" + result.output[-3000:]
    if result.returncode != 0:
        return f"exited {result.returncode}: {' '.join(result.cmd)}\n" + result.output[-3000:]
    return None


def run_job(cmd: Sequence[str], log: Path, timeout_s: float,
            env: Optional[Dict[str, Optional[str]]] = None) -> float:
    """Run `cmd` from the repository root, output to `log`; return the seconds it took. JobFailed when it
    fails or times out; on Ctrl-C the job and every rank it started are stopped."""
    result = launch.run(cmd, timeout=timeout_s, env=job_env(env), cwd=REPO, log=log)
    problem = _failure(result, timeout_s)
    if problem:
        raise JobFailed(problem)
    return result.seconds


class Workers:
    """Worker jobs of one benchmark, run one after another, each writing its measurement as JSON (to the
    --result path it is given): what they measured, and the failures, each with its command and error.
    With `hosts` ("node0:2,node1:2") each job's ranks are placed on those hosts in order, a launcher that
    runs on every host (torchrun) is started there over ssh, and job i's rendezvous is at `port` + i."""

    def __init__(self, benchmark: str, out: Path, timeout_s: float, hosts: Optional[str] = None,
                 port: int = DEFAULT_PORT) -> None:
        self.benchmark, self.out, self.timeout_s = benchmark, out, timeout_s
        self.hosts, self.port = hosts, port
        self.failures: List[Dict] = []
        self.last_command = ""  # the command of the latest job, for the record
        self.last_placement: Optional[str] = None  # and the hosts its ranks were placed on
        self.jobs = 0

    def run(self, tag: str, launcher: str, np: int, module: str, args: Sequence[str],
            env: Optional[Dict[str, Optional[str]]] = None, **identity) -> Optional[Dict]:
        """`python -m module args --result FILE` on `np` ranks under `launcher`: the JSON it wrote, or None
        when it failed (then the failure is kept, with `identity` naming what was measured, and printed)."""
        result = self.out / f"{self.benchmark}-{tag}.part.json"
        placed = spell(place(parse_hosts(self.hosts), np)) if self.hosts else None
        commands = commands_for(launch.get(launcher), np, [*args, "--result", str(result.resolve())],
                                python=sys.executable, module=module, hosts=placed, port=self.port + self.jobs)
        self.jobs += 1
        self.last_command, self.last_placement = shown(commands), placed
        try:
            outcome = run_commands(commands, self.timeout_s, env=job_env(env), cwd=REPO,
                                   log=self.out / "logs" / f"{self.benchmark}-{tag}.log")
            problem = _failure(outcome, self.timeout_s)
            if problem:
                raise JobFailed(problem)
            data = json.loads(result.read_text())
            result.unlink()
            return data
        except (JobFailed, OSError, ValueError) as exc:
            print(f"{self.benchmark}: FAILED {tag}: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            self.failures.append({**identity, "launcher": launcher, "command": self.last_command,
                                  "error": str(exc)[-2000:]})
            return None


def run_jobs_together(cmds: List[Sequence[str]], logs: List[Path], timeout_s: float,
                      env: Optional[Dict[str, Optional[str]]] = None) -> None:
    """Start several independent jobs at the same moment and wait for all of them; JobFailed when one
    fails or they run out of time (then all are stopped)."""
    jobs: List[launch.Job] = []
    try:
        for cmd, log in zip(cmds, logs):
            jobs.append(launch.Job(cmd, env=job_env(env), cwd=REPO, log=log))
        for job in jobs:
            try:
                code = job.wait(timeout=max(1.0, timeout_s - job.seconds))
            except launch.JobTimeout:
                raise JobFailed(f"independent jobs did not finish in {timeout_s:.0f} s") from None
            if code != 0:
                raise JobFailed(f"exited {code}: {' '.join(job.cmd)}\n" + job.output[-3000:])
    finally:
        for job in jobs:
            job.stop()


def run_cli(main, name: str) -> int:
    """A benchmark's main() for the command line: Ctrl-C or SIGTERM stops the running job (and its ranks) and exits
    130 or 143."""
    try:
        with launch.terminating_like_ctrl_c():
            return main()
    except KeyboardInterrupt as stopped:
        return launch.stopped_exit(name, stopped)
