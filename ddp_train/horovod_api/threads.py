"""horovod.runner.util.threads as the API offers it: `in_thread`, which Horovod's test utilities import."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence


def in_thread(target: Callable[..., Any], args: Sequence[Any] = (), name: Optional[str] = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Run `target(*args)` in a new thread, started; with `silent`, its exception is not printed."""
    def run() -> None:
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread
