"""Starting benchmark jobs through the launch layer (common.launch), and the options every benchmark shares."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, cast

from common import launch
from common.compare.arguments import world_sizes
from common.errors import OneLineParser, print_error
from common.launch.hosts import DEFAULT_PORT, parse_hosts, place, spell
from common.launch.remote import commands_for, run_commands, shown

from .machine import REPO, Record

Env = Dict[str, Optional[str]]  # a job's variables; None: removed from its environment


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser, its module docstring as the description."""
    return OneLineParser(prog=f"python -m benchmarks.{prog}", description=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)


def refuse(prog: str, message: str) -> int:
    """Say in one line what is wrong with the options; the exit code of bad input."""
    print_error(prog, message, ranked=False)
    return 2


def add_out(p: argparse.ArgumentParser, help: str = "where the results go") -> None:
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help=help)


def add_np(p: argparse.ArgumentParser, default: Any, help: str | None = None, **kwargs: Any) -> None:
    """--np: the ranks of each job (an int), or the world sizes to measure (when `default` is a list: 1,2,4)."""
    p.add_argument("--np", type=world_sizes if isinstance(default, list) else int, default=default, help=help,
                   **kwargs)


def add_timeout(p: argparse.ArgumentParser, default: float, help: str = "seconds before one run is stopped") -> None:
    p.add_argument("--timeout", type=float, default=default, help=help)


def add_places(p: argparse.ArgumentParser, work: str, help: str = "run directories (not kept in git)") -> None:
    """--out (where the result goes, kept in git) and --work (the run directories, not kept)."""
    add_out(p)
    p.add_argument("--work", type=Path, default=Path(work), help=help)


def add_worker(p: argparse.ArgumentParser, *hidden: str) -> None:
    """The options of a benchmark's own ranks (--worker, --result and `hidden`), left out of --help."""
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for option in ("--result", *hidden):
        p.add_argument(option, help=argparse.SUPPRESS)


def job_env(extra: Env | None = None) -> dict[str, str]:
    """A job's environment (common.launch.job_env) with the repository importable (the workers run as
    `python -m benchmarks...`), `extra` set, and a variable given as None removed, so that the program under test
    makes its own choice even when this shell set it."""
    env = launch.job_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class JobFailed(RuntimeError):
    """A launched job exited non-zero or ran out of time; the message ends with its output."""


def checked(result: launch.Result, timeout_s: float) -> launch.Result:
    """`result`, or JobFailed where it ran out of time or exited non-zero."""
    if result.timed_out or result.returncode != 0:
        how = f"did not finish in {timeout_s:.0f} s" if result.timed_out else f"exited {result.returncode}"
        raise JobFailed(f"{how}: {' '.join(result.cmd)}\n" + result.output[-3000:])
    return result


def run_job(cmd: Sequence[str], log: Path, timeout_s: float, env: Env | None = None) -> float:
    """Run `cmd` from the repository root, output to `log`; the seconds it took. JobFailed when it fails or times
    out; on Ctrl-C the job and every rank it started are stopped."""
    return checked(launch.run(cmd, timeout=timeout_s, env=job_env(env), cwd=REPO, log=log), timeout_s).seconds


def run_jobs_together(cmds: list[list[str]], logs: list[Path], timeout_s: float, env: Env | None = None) -> None:
    """Start independent jobs at the same moment and wait for all; JobFailed when one fails or they run out of time
    (then all are stopped)."""
    jobs: list[launch.Job] = []
    try:
        jobs = [launch.Job(cmd, env=job_env(env), cwd=REPO, log=log) for cmd, log in zip(cmds, logs, strict=True)]
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


def schedule(cells: Sequence[Any], repeats: int) -> list[tuple[int, Any]]:
    """(repeat, cell) in the order to run them: every cell once per repeat, every other repeat backwards, so that a
    steady drift in the machine's speed falls on every cell alike (A B, B A)."""
    return [(repeat, cell) for repeat in range(repeats) for cell in (cells if repeat % 2 == 0 else cells[::-1])]


class Workers:
    """A benchmark's worker jobs, one after another, each writing its measurement as JSON to the --result path it is
    given; keeps the failures, and starts the benchmark's Record. With `hosts` ("node0:2,node1:2") each job's ranks
    are placed on them in order, torchrun is started on every host over ssh, and job i's rendezvous is at `port` + i."""

    def __init__(self, benchmark: str, argv: Sequence[str] | None, out: Path, timeout_s: float,
                 hosts: str | None = None, port: int = DEFAULT_PORT) -> None:
        self.record = Record(benchmark, argv)
        self.benchmark, self.out, self.timeout_s, self.hosts, self.port = benchmark, out, timeout_s, hosts, port
        self.failures: list[dict[str, Any]] = []
        self.last_command, self.jobs = "", 0  # the latest job's command and placement, for the record
        self.last_placement: str | None = None

    def run(self, tag: str, launcher: str, np: int, module: str, args: Sequence[str], env: Env | None = None,
            **identity: Any) -> dict[str, Any] | None:
        """`python -m module args --result FILE` on `np` ranks under `launcher`: the JSON it wrote, or None when it
        failed (the failure is kept, with `identity` naming what was measured, and printed)."""
        result = (self.out / f"{self.benchmark}-{tag}.part.json").resolve()
        self.last_placement = spell(place(parse_hosts(self.hosts), np)) if self.hosts else None
        commands = commands_for(launch.get(launcher), np, [*args, "--result", str(result)], python=sys.executable,
                                module=module, hosts=self.last_placement, port=self.port + self.jobs)
        self.jobs, self.last_command = self.jobs + 1, shown(commands)
        try:
            checked(run_commands(cast(Dict[str, Sequence[str]], commands), self.timeout_s, env=job_env(env), cwd=REPO,
                                log=self.out / "logs" / f"{self.benchmark}-{tag}.log"), self.timeout_s)
            data = json.loads(result.read_text())
            result.unlink()
            return data
        except (JobFailed, OSError, ValueError) as exc:
            print(f"{self.benchmark}: FAILED {tag}: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            self.failures.append({**identity, "launcher": launcher, "command": self.last_command,
                                  "error": str(exc)[-2000:]})
            return None

    def publish(self, **fields: Any) -> int:
        """Publish the result of `fields` and the failures (machine.publish)."""
        return self.record.publish(self.out, **fields, failures=self.failures)


def run_cli(main: Callable[[], int], name: str) -> int:
    """A benchmark's main() for the command line: Ctrl-C or SIGTERM stops the running job (and its ranks) and exits
    130 or 143."""
    try:
        with launch.terminating_like_ctrl_c():
            return main()
    except KeyboardInterrupt as stopped:
        return launch.stopped_exit(name, stopped)
