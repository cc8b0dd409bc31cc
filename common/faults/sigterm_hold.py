"""SIGTERM held while a rank checks its input.

A launcher that sees one rank fail stops the others at once (torchrun, horovodrun and mpirun send
SIGTERM). Each rank must still find bad input itself and say so (one line, exit code 2), so from
start-up until its checks are done a rank holds SIGTERM: a SIGTERM that arrives over good input is
delivered right after the checks; after bad input `errors.fail_usage` ignores it and exits with 2.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any, Callable, List, Optional, Union

#: what signal.signal takes and returns: a function, SIG_DFL or SIG_IGN, or None (a handler not set from Python)
Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]

_held: List[int] = []
_previous: Handler = None


def hold() -> None:
    """Hold SIGTERM from now until release()."""
    global _previous
    _held.clear()
    _previous = signal.signal(signal.SIGTERM, lambda signum, frame: _held.append(signum))


def release() -> None:
    """The checks passed: restore SIGTERM's handler and deliver a SIGTERM that arrived meanwhile."""
    global _previous
    if _previous is None:
        return
    signal.signal(signal.SIGTERM, _previous)
    _previous = None
    if _held:
        os.kill(os.getpid(), signal.SIGTERM)
