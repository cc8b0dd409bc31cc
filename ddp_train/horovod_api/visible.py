"""The API's modules, visible again in sys.modules while the driver hands functions to Spark or Ray.

`python -m ddp_train.horovod_api driver.py` sets the project's modules aside while the driver runs
(common.launch.userscript: the user's `import common` must find the user's own). Spark's and Ray's cloudpickle
pickle a function by reference only if its module is in sys.modules; otherwise by value, with everything it refers
to, which fails on the API's sockets and locks. So install() remembers the API's modules, and `shown()` puts them
back for the moment of pickling (the workers, fresh processes, import them by name)."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Dict, Iterator

_REMEMBERED: Dict[str, types.ModuleType] = {}


def remember() -> None:
    """Keep the API's modules now in sys.modules (at install(), before any user code runs)."""
    for name, module in list(sys.modules.items()):
        if name == "ddp_train" or name.startswith("ddp_train.horovod_api"):
            _REMEMBERED.setdefault(name, module)


@contextlib.contextmanager
def shown() -> Iterator[None]:
    """Within: the remembered modules are in sys.modules (those that were not leave again after)."""
    added = [name for name in _REMEMBERED if name not in sys.modules]
    for name in added:
        sys.modules[name] = _REMEMBERED[name]
    try:
        yield
    finally:
        for name in added:
            if sys.modules.get(name) is _REMEMBERED[name]:
                del sys.modules[name]
