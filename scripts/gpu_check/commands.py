"""The check's commands: each in a process group of its own, its output appended to a log, stopped at the end of
its time box, and every one still running stopped when the check ends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from .clock import now
from .settings import ROOT


class Commands:
    """The commands the check started and has not waited for yet."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start `cmd` from the repository root, its output (after a `$ cmd` line) appended to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            # A session of its own: stop() reaches every process it starts (torchrun's workers, make's jobs).
            process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=ROOT, env=env, start_new_session=True)
        self.running.append(process)
        return process

    def wait(self, process: subprocess.Popen[bytes], until: float) -> int | None:
        """Wait for `process` until `until` (monotonic seconds): its exit code, or None where it was stopped then."""
        try:
            code: int | None = process.wait(max(0.0, until - now()))
        except subprocess.TimeoutExpired:
            self.stop(process)
            code = None
        # Not on an interrupt (SIGINT, SIGTERM): then it is still running, and stop_all() stops it.
        self.running.remove(process)
        return code

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the command's process group (torchrun passes it to its workers), SIGKILL 10 s later."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        """Stop every command still running."""
        for process in list(self.running):
            self.stop(process)
