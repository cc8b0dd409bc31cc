"""The program behind `python -m ddp_train` and `python -m hvd_train`: parse the shared options, then
(only then importing torch, so bad options fail in a fraction of a second) build the backend and train."""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING, Callable, NoReturn, Optional, Sequence, Tuple

from .config import parse_config
from .faults import sigterm_hold
from .launch.startup import pause_collector, resume_collector

if TYPE_CHECKING:  # torch comes in after the options are parsed
    from .loop.backend import Backend
    from .trainer import Trainer

#: how a backend's program starts: its backend, and how to fit (None: Trainer.fit)
Start = Callable[[], Tuple["Backend", Optional[Callable[["Trainer"], int]]]]


def main(argv: Optional[Sequence[str]], prog: str, description: str,
         start: Start) -> NoReturn:
    """Parse `argv`; `start()` imports and builds the backend and says how to fit (None: Trainer.fit).
    Ends the process with its exit code. SIGTERM is held until the input is checked (the options here, the
    data and the model in Trainer.prepare), so every rank names bad input itself."""
    sigterm_hold.hold()
    config = parse_config(argv, prog=prog, description=description)  # bad options: fail_usage exits 2
    pause_collector()  # while torch, the loop and the backend are imported; not while the user's data loads
    from common.trainer import run

    backend, fit = start()
    resume_collector()
    try:
        code = run(config, backend, prog=prog, fit=fit)
    except SystemExit as refused:  # input refused once the backend was up (fail_usage): leave the same way
        code = refused.code if isinstance(refused.code, int) else 0 if refused.code is None else 1
    leave(code)


def leave(code: int) -> NoReturn:
    """End a rank whose run directory is written and whose backend has left the job. Not through the
    interpreter's teardown: there torch's C++ threads (gloo work of a destroyed process group) can abort a
    rank that finished ("terminate called without an active exception", SIGABRT), and the launcher then
    reports a complete run as a failed job."""
    gc.collect()  # data loader workers are shut down with their loader
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
