"""The program behind `python -m ddp_train` and `python -m hvd_train`: parse the shared options, then
(only then importing torch, so bad options fail in a fraction of a second) build the backend and train."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from . import sigterm_hold
from .config import parse_config


def main(argv: Optional[Sequence[str]], prog: str, description: str,
         start: Callable[[], Tuple[object, Optional[Callable]]]) -> int:
    """Parse `argv`; `start()` imports and builds the backend and says how to fit (None: Trainer.fit).
    Returns the process exit code. SIGTERM is held until the input is checked (the options here, the data
    and the model in Trainer.prepare), so every rank names bad input itself."""
    sigterm_hold.hold()
    config = parse_config(argv, prog=prog, description=description)  # bad options: fail_usage exits 2
    from .train import run

    backend, fit = start()
    return run(config, backend, prog=prog, fit=fit)
