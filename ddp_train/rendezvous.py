"""torchrun's `--rdzv-backend loopback`: the rendezvous of a one-host job, with its store listening on
127.0.0.1 only.

`torchrun --standalone` hosts its rendezvous store on every interface of the machine (torch's TCPStore
binds the wildcard address, and torchrun has no option to change that): on a shared network anyone who
reaches the port can join or disturb the job. A one-host job needs nothing beyond loopback, so this
handler hands the store a socket already bound to 127.0.0.1. torchrun finds it through the entry point
`torchrun.handlers` (pyproject.toml):

    torchrun --rdzv-backend loopback --nproc-per-node 4 -m ddp_train
"""

from __future__ import annotations

import datetime
import socket
from typing import Optional

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (RendezvousHandler, RendezvousInfo, RendezvousParameters,
                                                  RendezvousStoreInfo)

NAME = "loopback"
LOOPBACK = "127.0.0.1"


class LoopbackRendezvous(RendezvousHandler):
    """One node, rank 0: a store on 127.0.0.1 that the agent shares with its workers."""

    def __init__(self, run_id: str, timeout: datetime.timedelta) -> None:
        self.run_id, self.timeout = run_id, timeout
        self._store: Optional[TCPStore] = None
        self._port = 0  # the store's, once it listens

    def get_backend(self) -> str:
        return NAME

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((LOOPBACK, 0))
            listener.listen(128)
            self._port = listener.getsockname()[1]
            # The store takes the listening socket over (and closes it with itself).
            self._store = TCPStore(LOOPBACK, self._port, None, True, self.timeout, wait_for_workers=False,
                                   multi_tenant=True, master_listen_fd=listener.detach())
        return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1,
                              RendezvousStoreInfo(LOOPBACK, self._port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler for torchrun's parameters; ValueError (torchrun prints it) across nodes."""
    if params.max_nodes != 1:
        raise ValueError(f"--rdzv-backend {NAME} runs one node; across nodes use --rdzv-backend c10d "
                         "--rdzv-endpoint HOST:PORT")
    return LoopbackRendezvous(params.run_id, datetime.timedelta(seconds=int(params.config.get("timeout", 600))))


def torchrun_handler():
    """What the `torchrun.handlers` entry point names: torchrun calls it for the handler's creator."""
    return create_handler
