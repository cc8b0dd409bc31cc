"""Rank 0's coordinator: the socket and thread shell around the negotiation (negotiation.py). It accepts every rank's
connection, feeds the negotiation what the ranks send (requests, leaves, goodbyes, closed connections), answers when
a cycle is due, and sends each rank one message with all of its responses.

What ends a wait that would never end: a rank whose process ended (its socket closed) or that shut the API down fails
every collective that needs it with Horovod's shutdown error, and with the response cache on every rank hears that it
is gone (what waits for the cache's agreement can no longer complete); a collective that some ranks asked for and
others not for HOROVOD_STALL_CHECK_TIME_SECONDS is reported as Horovod reports it, and after
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS fails on every rank that asked (Horovod's stall inspector).
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .messages import FrameReader, encode, fields_of, read_requests
from .negotiation import Closed, Negotiator, Outgoing
from .settings import Settings

#: how often (seconds) the coordinator tells every rank it is alive, and looks for stalled collectives
HEARTBEAT_S = 1.0


@dataclass
class Client:
    """One rank's connection."""

    sock: socket.socket
    reader: FrameReader = field(default_factory=FrameReader)
    rank: int = -1
    outbox: bytearray = field(default_factory=bytearray)


class Coordinator(threading.Thread):
    """The coordinator thread of rank 0: accepts every rank's connection, then answers requests until the process
    ends. `broadcast`: the response cache is on (every numbered response goes to every rank)."""

    def __init__(self, listener: socket.socket, world_size: int, settings: Settings, broadcast: bool = False,
                 on_event: Optional[Callable[[str, str, bool], None]] = None) -> None:
        super().__init__(name="horovod_api-coordinator", daemon=True)
        self.listener = listener
        self.broadcast = broadcast
        self.core = Negotiator(world_size, settings, broadcast=broadcast, on_event=on_event)
        self.selector = selectors.DefaultSelector()
        self.clients: Dict[int, Client] = {}  # fd -> client
        self.by_rank: Dict[int, Client] = {}
        self.last_heartbeat = 0.0

    # --- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        core = self.core
        while True:
            now = time.monotonic()
            timeout = HEARTBEAT_S if not core.ready else max(0.0, core.window_ends - now)
            for key, events in self.selector.select(timeout):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    client = self.clients.get(key.fd)
                    if client is None:
                        continue
                    if events & selectors.EVENT_READ:
                        self._read(client)
                    if events & selectors.EVENT_WRITE and key.fd in self.clients:
                        self._write(client)
            now = time.monotonic()
            if core.due(now):
                core.answer()
            if now - self.last_heartbeat >= HEARTBEAT_S:
                self.last_heartbeat = now
                stalls = core.stalls(now)
                if stalls is not None:
                    report, shut = stalls
                    sys.stderr.write(f"[rank 0] horovod_api: {'ERROR' if shut else 'WARNING'}: {report}\n")
                    sys.stderr.flush()
                for client in list(self.by_rank.values()):
                    self._send(client, encode({"type": "alive"}))
            self._flush()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = Client(sock)
        self.clients[sock.fileno()] = client
        self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, client: Client) -> None:
        try:
            data = client.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(client)
            return
        now = time.monotonic()
        for message in client.reader.feed(data):
            self._handle(client, message, now)

    def _write(self, client: Client) -> None:
        try:
            sent = client.sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost(client)
            return
        del client.outbox[:sent]
        if not client.outbox:
            self.selector.modify(client.sock, selectors.EVENT_READ)

    def _send(self, client: Client, frame: bytes) -> None:
        if client.sock.fileno() not in self.clients:
            return
        was_empty = not client.outbox
        client.outbox += frame
        if was_empty:
            self._write(client)
            if client.outbox and client.sock.fileno() in self.clients:
                self.selector.modify(client.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def _lost(self, client: Client) -> None:
        """A rank's process ended (or said goodbye): what needs it can never run."""
        fd = client.sock.fileno()
        if fd in self.clients:
            self.selector.unregister(client.sock)
            del self.clients[fd]
        client.sock.close()
        if client.rank >= 0 and self.by_rank.get(client.rank) is client:
            del self.by_rank[client.rank]
            self.core.rank_gone(client.rank, time.monotonic())
            if self.broadcast:
                gone = encode({"type": "gone", "rank": client.rank})
                for other in list(self.by_rank.values()):
                    self._send(other, gone)

    def _handle(self, client: Client, message: Dict, now: float) -> None:
        kind = message["type"]
        if kind == "hello":
            client.rank = int(message["rank"])
            self.by_rank[client.rank] = client
        elif kind == "requests":
            for request in read_requests(message):
                self.core.request(request, now)
        elif kind == "leave":
            self.core.leave(int(message["gen"]))
        elif kind == "bye":
            self._lost(client)

    # --- what goes out -----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        for rank, frame in frames(self.core.take(), list(self.by_rank)):
            client = self.by_rank.get(rank)
            if client is not None:
                self._send(client, frame)


def frames(outbox: List[object], ranks: List[int]) -> List[Tuple[int, bytes]]:
    """What the negotiation decided as frames to send, (rank, frame) in order: each rank one message of its
    responses, a generation closed after the responses before it. A message every rank gets is encoded once."""
    out: List[Tuple[int, bytes]] = []
    if not outbox:
        return out
    shared: List[Dict[str, Any]] = []
    own: Dict[int, List[Dict[str, Any]]] = {}

    def responses() -> None:
        frame = encode({"type": "responses", "responses": shared}) if shared else b""
        for rank in ranks:
            if rank in own:
                out.append((rank, encode({"type": "responses", "responses": own[rank]})))
            elif frame:
                out.append((rank, frame))

    for item in outbox:
        if isinstance(item, Closed):
            responses()
            shared, own = [], {}
            closed = encode({"type": "closed", "gen": item.gen})
            out.extend((rank, closed) for rank in ranks)
            continue
        assert isinstance(item, Outgoing)
        encoded = [fields_of(r) for r in item.responses]
        if item.ranks is None:
            shared.extend(encoded)
            for extra in own.values():
                extra.extend(encoded)
        else:
            for rank in item.ranks:
                own.setdefault(rank, list(shared)).extend(encoded)
    responses()
    return out


def listen_address(single_host: bool) -> str:
    """Where the coordinator listens: loopback when every rank is on this host; else the address of the interface
    GLOO_SOCKET_IFNAME names, or the address this host's name resolves to (as gloo's own connections do)."""
    if single_host:
        return "127.0.0.1"
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if interface:
        import psutil

        for address in psutil.net_if_addrs().get(interface, []):
            if address.family == socket.AF_INET:
                return address.address
    return socket.gethostbyname(socket.gethostname())


def listen(single_host: bool) -> socket.socket:
    """The coordinator's listening socket, at a port the system picks."""
    host = listen_address(single_host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(max(128, os.cpu_count() or 1))
    return sock
