"""Commands on several hosts at once: a launcher that runs on every host (torchrun's agent per node) is
started on the others over ssh, in the same folder, as a user of a cluster starts it, and the commands
together are one job.

Over ssh the remote command gets a terminal (ssh -tt): when the job is stopped and its ssh client ends,
the remote launcher gets SIGHUP and stops its workers, so nothing is left running on the other hosts.
"""

from __future__ import annotations

import functools
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from .hosts import is_local, parse_hosts
from .jobs import Job, JobTimeout, Result, finish
from .registry import Launcher

#: the key of a command that is started once, from this host, whatever hosts its ranks run on
HERE = ""

#: seconds ssh waits for a host to answer before it gives up
SSH_CONNECT_TIMEOUT_S = 5
#: ssh options: never ask for a password, give up on a host that does not answer within seconds, and
#: notice a host that drops off the network while a command runs
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
               "-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3")
#: variables a remote command gets from this host: the tools' PATH and the settings of the libraries
#: that choose interfaces and threads
FORWARDED = re.compile(r"^(PATH|PYTHONPATH|PYTHONUNBUFFERED|PYTHONSAFEPATH"
                       r"|(GLOO|NCCL|TORCH|HOROVOD|OMP|MKL|HVD_DDP_COMPARE)_\w+)$")
#: seconds the other hosts' commands get to end by themselves once one host's command failed (they
#: usually fail at once, with messages of their own) before they are stopped
PEERS_GRACE_S = 5.0


def over_ssh(host: str, cmd: Sequence[str], cwd: Path, env: Dict[str, str]) -> List[str]:
    """`cmd` as started on `host` from here: ssh to it, cd to the same folder (one line and exit code 2 where the
    host has no such folder: it must be on a filesystem every host sees), the forwarded variables."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if FORWARDED.match(k))
    missing = shlex.quote(f"{host}: error: no folder {cwd} on {host}; the folder a run starts in (a run's working "
                          "directory is under the comparison's --out) must be at the same path on every host: put it "
                          "on a filesystem every host sees")
    remote = (f"cd {shlex.quote(str(cwd))} 2>/dev/null || {{ echo {missing} >&2; exit 2; }}; "
              f"exec env {exports} {shlex.join([str(c) for c in cmd])}")
    # LogLevel=ERROR: no "Connection to HOST closed." after every command that had a terminal
    return ["ssh", "-tt", *SSH_OPTIONS, "-o", "LogLevel=ERROR", host, remote]


def on_hosts(commands: Dict[str, Sequence[str]], cwd: Path, env: Dict[str, str]) -> Dict[str, List[str]]:
    """host -> the command line that starts that host's command from here (itself on this host)."""
    return {host: list(cmd) if is_local(host) else over_ssh(host, cmd, cwd, env) for host, cmd in commands.items()}


class HostsJob:
    """One command per host, started together and ended together; their output is one stream with each
    line prefixed by its host. The job fails when any command fails; the others then get PEERS_GRACE_S to
    end before they are stopped. Used as a context manager, every command is stopped when the block is
    left by an exception (Ctrl-C)."""

    def __init__(self, commands: Dict[str, Sequence[str]], *, env: Dict[str, str], cwd: Path,
                 log: Optional[Path] = None, on_line: Optional[Callable[[str], None]] = None) -> None:
        self.lines: List[str] = []
        self.on_line = on_line
        self._lock = threading.Lock()
        self._log = None
        self.cmd = [f"{host}$ {' '.join(map(str, cmd))}" for host, cmd in commands.items()]
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log, "w")
            self._log.write("".join(f"$ {line}\n" for line in self.cmd))
        self.started = time.monotonic()
        self.jobs: Dict[str, Job] = {}
        try:
            for host, cmd in on_hosts(commands, cwd, env).items():
                self.jobs[host] = Job(cmd, env=env, cwd=cwd, on_line=functools.partial(self._line, host))
        except BaseException:
            self.stop()
            raise

    def _line(self, host: str, line: str) -> None:
        with self._lock:
            self.lines.append(f"[{host}] {line}")
            if self._log is not None:
                self._log.write(f"[{host}] {line}")
                self._log.flush()
        if self.on_line is not None:
            self.on_line(line)

    @property
    def output(self) -> str:
        """Everything the commands printed so far, each line prefixed by its host."""
        with self._lock:
            return "".join(self.lines)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def returncode(self) -> Optional[int]:
        """The first failed command's exit code, 0 when all succeeded, None while one runs."""
        codes = [job.returncode for job in self.jobs.values()]
        return next((c for c in codes if c), None if None in codes else 0)

    def wait(self, timeout: Optional[float] = None) -> int:
        """0 when every command succeeded, else the first failure's exit code; JobTimeout (after stopping
        every command) past `timeout` seconds."""
        deadline = None if timeout is None else self.started + timeout
        failed_at = None
        while True:
            codes = {host: job.poll() for host, job in self.jobs.items()}
            failures = [code for code in codes.values() if code not in (None, 0)]
            if all(code is not None for code in codes.values()):
                break
            if failures and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > PEERS_GRACE_S:
                self.stop()
                break
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                raise JobTimeout(f"{'; '.join(self.cmd)} did not end within {timeout:.0f} s")
            time.sleep(0.1)
        ended = {host: job.wait() for host, job in self.jobs.items()}
        self._close_log()
        return next((code for code in ended.values() if code != 0), 0)

    def stop(self) -> None:
        """Stop every command that still runs (see Job.stop)."""
        threads = [threading.Thread(target=job.stop) for job in self.jobs.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._close_log()

    def _close_log(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> "HostsJob":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.stop()


def commands_for(launcher: Launcher, np: int, args: Sequence[str], *, python: str, module: Optional[str] = None,
                 hosts: Optional[str] = None, port: Optional[int] = None) -> Dict[str, List[str]]:
    """What to start for `np` processes of `module` (default: the launcher's training module) on `hosts`
    ("node0:2,node1:2", None: this host): {HERE: command} for a launcher started once from here, else
    {host: command} for one started on every host (torchrun)."""
    cmd = launcher.command(np, args, module=module, python=python, hosts=hosts, port=port)
    if hosts and launcher.per_host:
        return {host: list(cmd) for host, _ in parse_hosts(hosts)}  # a list each: a caller may edit one
    return {HERE: cmd}


def shown(commands: Dict[str, List[str]]) -> str:
    """The commands as one line: the command, or each host's as `host$ command`, separated by `; `."""
    return "; ".join(" ".join(cmd) if host == HERE else f"{host}$ {' '.join(cmd)}" for host, cmd in commands.items())


def run_commands(commands: Mapping[str, Sequence[str]], timeout: float, *, env: Dict[str, str], cwd: Path,
                 log: Optional[Path] = None, on_line: Optional[Callable[[str], None]] = None) -> Result:
    """Run what commands_for gave to its end (a Job for a command started from here, else a HostsJob); past
    `timeout` seconds every command is stopped and `timed_out` is set."""
    job: Union[Job, HostsJob]
    if HERE in commands:
        job = Job(commands[HERE], env=env, cwd=cwd, log=log, on_line=on_line)
    else:
        job = HostsJob(dict(commands), env=env, cwd=cwd, log=log, on_line=on_line)
    return finish(job, timeout)
