"""The program behind `python -m ddp_train` and `python -m hvd_train`: parse the shared options, then
(only then importing torch, so bad options fail in a fraction of a second) build the backend and train."""

from __future__ import annotations

import os
import signal
from typing import Callable, Optional, Sequence, Tuple

from .config import parse_config


def main(argv: Optional[Sequence[str]], prog: str, description: str,
         start: Callable[[], Tuple[object, Optional[Callable]]]) -> int:
    """Parse `argv`; `start()` imports and builds the backend and says how to fit (None: Trainer.fit).
    Returns the process exit code."""
    config = _parse_holding_sigterm(argv, prog, description)
    from .train import run

    backend, fit = start()
    return run(config, backend, prog=prog, fit=fit)


def _parse_holding_sigterm(argv: Optional[Sequence[str]], prog: str, description: str):
    """parse_config, with SIGTERM held until it is done: a launcher that sees one rank fail stops the
    others at once (horovodrun sends SIGTERM), and each rank must still name bad input itself (exit 2).
    A SIGTERM held over good options is delivered right after; after bad ones the rank exits with 2."""
    held = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        config = parse_config(argv, prog=prog, description=description)
    except SystemExit:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the error is printed: exit with its code, not 143
        raise
    signal.signal(signal.SIGTERM, previous)
    if held:
        os.kill(os.getpid(), signal.SIGTERM)
    return config
