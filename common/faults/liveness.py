"""Where every rank is, on any backend: what this rank does, and what the others answer when asked.

Every rank keeps an Activity (its step, what it is doing, and whether it waits on the other ranks in a
collective) and answers pings on a small TCP port of its own with it. When a collective failed or waited
too long, a rank asks all the others at once and can tell apart:
- a rank that does not answer (its process is stopped, stuck in the kernel, or cut off): it stopped
  taking part;
- a rank whose port refuses (its process has ended): it is gone;
- a rank that answers: it is alive, and says where it is (its step, computing or waiting in a
  collective), so a slow rank is named as slow, never as gone.
The answering thread runs beside training, so a rank blocked in the same stalled collective answers.

The port listens on loopback when every rank is on this host, else on the address the other hosts
reach this one by (the interface in GLOO_SOCKET_IFNAME or HOROVOD_GLOO_IFACE, or the host name's
address). It says nothing but a rank, a step and what the rank does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from common.loop.activity import Activity

Address = Tuple[str, int]

#: how long a live rank waits for the others' answers
ANSWER_TIMEOUT_S = 3.0

#: why a rank did not answer, when its port refused the connection: its process has ended
GONE = "its process is gone"
#: why a rank on this host did not answer, when its process is stopped (SIGSTOP, a job-control stop)
STOPPED = "its process is stopped"


@dataclass
class PeerState:
    """What one other rank answered: where it is, or why it did not answer."""

    rank: int
    host: str
    step: Optional[int] = None
    waits: bool = False
    doing: str = ""
    silent: Optional[str] = None  # why it did not answer (GONE, STOPPED, ...), None when it answered

    def where(self) -> str:
        """'computing (forward and backward) at step 7' or 'waiting in the gradient allreduce at step 7'."""
        what = f"waiting in {self.doing}" if self.waits else f"computing ({self.doing})"
        return f"{what} at step {self.step}"


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
    """This rank's answering port, and the others' addresses, hosts and process ids once exchanged."""

    def __init__(self, rank: int, activity: Activity, host: str, single_host: bool) -> None:
        self.rank, self.activity, self.host = rank, activity, host
        self.peers: List[Address] = []
        self.hosts: List[str] = []
        self.pids: List[int] = []
        self.stopped: List[int] = []  # the ranks on this host whose process the last survey found stopped
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((advertised_host(single_host), 0))
        self._sock.listen(64)
        self.address: Address = self._sock.getsockname()
        threading.Thread(target=self._answer, name="liveness", daemon=True).start()

    def card(self) -> Tuple[Address, str, int]:
        """What the other ranks need to know of this one: (address, host, process id)."""
        return self.address, self.host, os.getpid()

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
                    a = self.activity
                    conn.sendall(f"{self.rank} {a.step} {int(a.waits)} {a.doing}\n".encode())
                except OSError:
                    pass  # the asking rank gave up or went away; nothing to answer

    def know(self, cards: Sequence[Tuple[Address, str, int]]) -> None:
        """Every rank's card, in rank order (from a collective at start-up)."""
        self.peers = [(str(address[0]), int(address[1])) for address, _, _ in cards]
        self.hosts = [host for _, host, _ in cards]
        self.pids = [int(pid) for _, _, pid in cards]

    def survey(self) -> List[PeerState]:
        """What every other rank answers, asked all at once (each within ANSWER_TIMEOUT_S)."""
        others = [r for r in range(len(self.peers)) if r != self.rank]
        if not others:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(others), 64)) as pool:
            states = list(pool.map(self._ask, others))
        self.stopped = [peer.rank for peer in states if peer.silent == STOPPED]
        return states

    def gone(self) -> List[PeerState]:
        """The other ranks whose process has ended (their port refuses): a collective with them cannot end."""
        return [peer for peer in self.survey() if peer.silent == GONE]

    def explain(self, states: Optional[List[PeerState]] = None) -> Optional[str]:
        """Where the other ranks are, in one line (None when there are none): the ones that stopped taking
        part, or, when every rank answers, that they are alive and where each one is."""
        states = self.survey() if states is None else states
        if not states:
            return None
        a = self.activity
        here = f"this rank is {'waiting in ' + a.doing + ' ' if a.waits else ''}at step {a.step}"
        silent = [p for p in states if p.silent]
        if silent:
            ranks = ", ".join(str(p.rank) for p in silent)
            if len(set(self.hosts)) > 1:  # across hosts, the host is what a user goes to look at
                ranks += f" ({', '.join(sorted({p.host for p in silent}))})"
            reasons = "; ".join(sorted({p.silent for p in silent if p.silent}))
            return f"rank{'s' if len(silent) > 1 else ''} {ranks} stopped taking part ({reasons}; {here})"
        where = ", ".join(f"rank {p.rank} is alive and {p.where()}" for p in states)
        return f"every rank answers: {where}; {here}"

    def end_stopped(self) -> None:
        """End the stopped processes found by the last survey (ranks on this host), on this rank's way out
        of a failed job. A stopped process keeps the launcher's SIGTERM pending, and launchers wait out a
        grace period before they kill it (torchrun and horovodrun 30 s; mpirun twice its
        odls_base_sigkill_timeout once any rank has failed while another still runs), so it goes with the
        rank that found it, at the same moment."""
        for rank in self.stopped:
            with contextlib.suppress(OSError):
                os.kill(self.pids[rank], signal.SIGKILL)

    def close(self) -> None:
        """Stop answering."""
        try:
            self._sock.close()
        except OSError:
            pass

    def _ask(self, rank: int) -> PeerState:
        state = PeerState(rank, self.hosts[rank])
        state.silent = self._stopped(rank)  # a stopped process's port accepts and never answers: no need to wait
        if state.silent:
            return state
        try:
            with socket.create_connection(self.peers[rank], timeout=ANSWER_TIMEOUT_S) as conn:
                conn.settimeout(ANSWER_TIMEOUT_S)
                conn.sendall(b"ping\n")
                reply = conn.recv(256).decode(errors="replace")
        except socket.timeout:
            reply, state.silent = "", "its process does not answer"
        except ConnectionRefusedError:
            state.silent = GONE
            return state
        except OSError as exc:
            state.silent = f"cannot be reached: {exc.strerror or exc}"
            return state
        fields = reply.strip().split(" ", 3)
        if len(fields) < 3:
            state.silent = "its process does not answer"
            return state
        state.step, state.waits = int(fields[1]), fields[2] == "1"
        state.doing = fields[3] if len(fields) > 3 else ""
        return state

    def _stopped(self, rank: int) -> Optional[str]:
        """STOPPED when rank `rank` runs on this host and its process is stopped."""
        if self.hosts[rank] != self.host:
            return None
        import psutil

        try:
            return STOPPED if psutil.Process(self.pids[rank]).status() == psutil.STATUS_STOPPED else None
        except psutil.Error:
            return None

