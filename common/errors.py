"""Errors and the exit policy: how bad input is reported and how a process with bad input exits.

`UsageError` is bad input. `print_error` writes the one `PROG: error: message` line every program of the
project prints; `fail_usage` prints it and exits with code 2, lingering under a launcher so that the
other ranks print their own line too; `OneLineParser` is the command-line parser every program builds on.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, NoReturn, Optional

from .launch import placement
from .launch.together import leave_together


class UsageError(Exception):
    """Bad input: reported as one line and exit code 2 on every rank, before any collective."""


#: a rank started by a launcher that finds bad input lingers until it has lived this long before exiting:
#: on a loaded machine a sibling's Python start-up can lag by more than a second, and a sibling must reach
#: its own checks (holding SIGTERM, see common.faults.sigterm_hold) before the launcher stops it
SIBLING_GRACE_S = 5.0
STARTED = time.monotonic()


def print_error(prog: str, message: str, rank: Optional[int] = None, *, ranked: bool = True) -> None:
    """Print `PROG: error: MESSAGE` on stderr, prefixed with `rank`, else with the rank a launcher gave this
    process (unless `ranked` is False: a tool that is never one of a job's ranks). One write with its
    newline: the ranks share the launcher's stderr, and a line written in two parts can have another
    rank's line between them."""
    if ranked:
        rank = placement.rank_hint() if rank is None else rank
    prefix = f"[rank {rank}] " if ranked and rank is not None else ""
    sys.stderr.write(f"{prefix}{prog}: error: {message}\n")
    sys.stderr.flush()


def fail_usage(prog: str, message: str) -> NoReturn:
    """Print one error line naming the problem and the fix, then exit with code 2.

    Under a launcher every rank finds the same bad input at about the same moment; the launcher stops
    the others as soon as one exits (horovodrun, mpirun), so a rank lingers a moment for the others to
    print their own line too, and the ranks on a host leave together (common.launch.together).
    """
    print_error(prog, message)
    here = placement.detect()
    if here.family is not None:
        # A launcher that stops this rank while it lingers (after a sibling exited) still sees exit code 2.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: os._exit(2))
        leave_together(here, time.time() + SIBLING_GRACE_S - (time.monotonic() - STARTED))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nor while the interpreter shuts down
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (prog: error: ...) and exits 2, and takes no abbreviation of
    an option (argparse would read --batch as --batch-size, and a check of what was given could not tell)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail_usage(self.prog, f"{message} (see --help)")
