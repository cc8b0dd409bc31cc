"""Naming the ranks that stopped taking part, on any backend.

Every rank answers pings on a small TCP port of its own with its rank and the step it is on. After a
collective failed or stalled, a live rank pings all the others at once: a rank that does not answer
(stopped, stuck in the kernel, killed, cut off) is the one that stopped taking part. The answering
thread runs beside training, so a rank whose process is frozen (SIGSTOP) or gone never answers, while
a rank blocked in the same stalled collective does.

The port listens on loopback when every rank is on this host, else on the address the other hosts
reach this one by (the interface in GLOO_SOCKET_IFNAME or HOROVOD_GLOO_IFACE, or the host name's
address). It says nothing but a rank and a step number.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
from typing import Callable, List, Optional, Sequence, Tuple

Address = Tuple[str, int]

#: how long a live rank waits for the others' answers
ANSWER_TIMEOUT_S = 3.0


def advertised_host(single_host: bool) -> str:
    """The address this rank's port listens on and the other ranks reach it at."""
    if single_host:
        return "127.0.0.1"
    import psutil

    for variable in ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"):
        interface = (os.environ.get(variable) or "").split(",")[0]
        for addr in psutil.net_if_addrs().get(interface, []):
            if addr.family == socket.AF_INET:
                return addr.address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "0.0.0.0"


class Liveness:
    """This rank's answering port, and the others' addresses once exchanged."""

    def __init__(self, rank: int, step: Callable[[], int], single_host: bool) -> None:
        self.rank, self.step = rank, step
        self.peers: List[Address] = []
        self.hosts: List[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((advertised_host(single_host), 0))
        self._sock.listen(64)
        self.address: Address = self._sock.getsockname()
        threading.Thread(target=self._answer, name="liveness", daemon=True).start()

    def _answer(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed: training is over
                return
            with conn:
                try:
                    conn.settimeout(ANSWER_TIMEOUT_S)
                    conn.recv(16)
                    conn.sendall(f"{self.rank} {self.step()}\n".encode())
                except OSError:
                    pass  # the asking rank gave up or went away; nothing to answer

    def know(self, addresses: Sequence[Address], hosts: Sequence[str]) -> None:
        """Every rank's address and host name, in rank order (from a collective at start-up)."""
        self.peers = [tuple(a) for a in addresses]
        self.hosts = list(hosts)

    def silent(self) -> List[Tuple[int, str]]:
        """(rank, why) for every other rank that does not answer within ANSWER_TIMEOUT_S."""
        others = [(r, a) for r, a in enumerate(self.peers) if r != self.rank]
        if not others:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(others), 64)) as pool:
            answers = list(pool.map(lambda pair: (pair[0], _ask(pair[1])), others))
        return [(rank, why) for rank, why in answers if why is not None]

    def explain(self) -> Optional[str]:
        """Which ranks stopped taking part, in one line, or None when every rank answers."""
        if not self.peers:
            return None
        silent = self.silent()
        if not silent:
            return None
        ranks = ", ".join(str(rank) for rank, _ in silent)
        if len(set(self.hosts)) > 1:  # across hosts, the host is what a user goes to look at
            ranks += f" ({', '.join(sorted({self.hosts[rank] for rank, _ in silent}))})"
        reasons = "; ".join(sorted({why for _, why in silent}))
        return (f"rank{'s' if len(silent) > 1 else ''} {ranks} stopped taking part ({reasons}; this rank is at "
                f"step {self.step()})")

    def close(self) -> None:
        """Stop answering."""
        try:
            self._sock.close()
        except OSError:
            pass


def _ask(address: Address) -> Optional[str]:
    """None when the rank at `address` answers, else why it did not."""
    try:
        with socket.create_connection(address, timeout=ANSWER_TIMEOUT_S) as conn:
            conn.settimeout(ANSWER_TIMEOUT_S)
            conn.sendall(b"ping\n")
            reply = conn.recv(64)
    except socket.timeout:
        return "its process does not answer"
    except ConnectionRefusedError:
        return "its process is gone"
    except OSError as exc:
        return f"cannot be reached: {exc.strerror or exc}"
    return None if reply else "its process does not answer"
