"""`bash scripts/gpu_check.sh [--prepare]`: the arguments, the settings, the run and its exit code (0 when every
step that should work did, 1 otherwise, 2 on a bad setting)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from types import FrameType

from .clock import Clock
from .context import Context
from .prepare import prepare
from .report import print_line, start_line, write
from .runner import Runner
from .settings import Settings, carry_folder, refuse
from .spec import STEPS, names
from .steps import ACTIONS


def main(argv: list[str] | None = None) -> int:
    """The check, or with --prepare what its Horovod build needs offline; the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--prepare"]:
        return prepare(carry_folder(os.environ))
    if args:
        refuse(f"unknown arguments {' '.join(args)}; the check takes none but --prepare (its settings are "
               "GPU_CHECK_* variables: docs/gpu-check.md)")
    settings = Settings.from_environ(os.environ, sys.executable, names(STEPS))
    clock = Clock.started(settings.budget)
    ctx = Context.create(settings)
    signal.signal(signal.SIGTERM, _interrupt)
    shutil.rmtree(settings.work, ignore_errors=True)
    settings.work.mkdir(parents=True)
    settings.out.mkdir(parents=True, exist_ok=True)
    print_line(start_line(settings))
    runner = Runner(STEPS, ACTIONS, ctx, clock)
    interrupted = runner.run()
    return write(settings, ctx.found, list(runner.records.values()), interrupted, clock)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM as SIGINT: the runner stops every command and the record is still written.
    raise KeyboardInterrupt
