"""One rank of a `horovod.ray.RayExecutor`: the Ray actor's class (Horovod's BaseHorovodWorker, horovod/ray/worker.py).

The actor process lives as long as the executor: the API is installed in it, its environment says its rank and where
rank 0's store is (MASTER_ADDR/MASTER_PORT), and the first `hvd.init()` a function calls there joins the one
torch.distributed group the actors hold together, which later `run()` calls find again with whatever state the
functions left (module globals, the executable)."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple


class Worker:
    """The actor (made remote by ray_executor; a plain class here so that it is importable without Ray)."""

    executable: Any = None

    def __init__(self) -> None:
        from . import install

        install()

    def where(self) -> Tuple[str, str]:
        """This actor's node address (as Ray knows it) and host name."""
        import ray

        return ray.util.get_node_ip_address(), socket.gethostname()

    def free_port(self) -> int:
        """A port free on this actor's node now (rank 0's: torch.distributed's store will listen on it)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def update_env_vars(self, env: Dict[str, str]) -> None:
        """Set variables in the actor's process (its rank, the store's address, the executor's extra_env_vars), then
        the HOROVOD_* rank variables horovodrun gives its ranks."""
        from . import runtime

        os.environ.update({str(k): str(v) for k, v in env.items()})
        runtime.export_placement()

    def env_vars(self) -> Dict[str, str]:
        """The actor's environment."""
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None, executable_args: Optional[List[Any]] = None,
                         executable_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Make the executable `execute(fn)` hands to fn (None without a class)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable)."""
        return fn(self.executable)

    def call(self, fn: Callable[..., Any], args: List[Any], kwargs: Dict[str, Any]) -> Any:
        """fn(*args, **kwargs)."""
        return fn(*args, **kwargs)
