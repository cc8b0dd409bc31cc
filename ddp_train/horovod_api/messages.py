"""What the ranks and the coordinator tell each other: a rank's request to take part in a named collective, the
coordinator's response once every rank of the process set asked (what to run, or the error), and the framing of
both on a socket (length-prefixed JSON of these dataclasses' fields: plain data, nothing of the API pickled)."""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# The kinds of collectives (Horovod's Request::RequestType names), and the API's own control kinds.
ALLREDUCE, ALLGATHER, BROADCAST, JOIN = "ALLREDUCE", "ALLGATHER", "BROADCAST", "JOIN"
ALLTOALL, BARRIER, REDUCESCATTER = "ALLTOALL", "BARRIER", "REDUCESCATTER"
ADD_SET, REMOVE_SET, ERROR = "ADD_PROCESS_SET", "REMOVE_PROCESS_SET", "ERROR"
#: the kinds that reduce, and so check scale factors
REDUCING = (ALLREDUCE, REDUCESCATTER)


@dataclass
class Request:
    """One rank's part in one named collective of a process set, within one init() of the API (`gen`)."""

    rank: int
    gen: int
    ps: int
    name: str
    kind: str
    dtype: str = ""
    shape: List[int] = field(default_factory=list)
    device: int = -1
    op: int = 1
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    splits: List[int] = field(default_factory=list)  # alltoall: rows to each rank of the set
    group: str = ""  # a grouped collective's base name: its tensors are answered together
    group_size: int = 0
    checked: bool = False  # a DistributedOptimizer's gradient whose shape and type every rank matched before
    ranks: List[int] = field(default_factory=list)  # a process set added or removed: its ranks
    set_id: int = -1  # a process set removed: its id


@dataclass
class Response:
    """What the ranks of a process set run next, in the same order on every rank (`seq`), or the error of it."""

    seq: int
    gen: int
    ps: int
    kind: str
    names: List[str]
    error: str = ""
    dtype: str = ""
    device: int = -1
    op: int = 1
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    shapes: List[List[int]] = field(default_factory=list)  # per name
    sizes: List[List[int]] = field(default_factory=list)  # per name: first dimension of each rank's tensor
    splits: List[List[int]] = field(default_factory=list)  # alltoall: rows sent by rank i to rank j
    joined: List[int] = field(default_factory=list)  # ranks that joined: they add zeros
    joining: int = -1  # join: the rank that joined last
    set_id: int = -1  # a process set added (-1: it existed) or removed: its id
    ranks: List[int] = field(default_factory=list)  # a new process set: its ranks


def encode(message: Dict[str, Any]) -> bytes:
    """One frame: 4 bytes of length, then the JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack("!I", len(body)) + body


def fields_of(message: Any) -> Dict[str, Any]:
    """A request's or response's fields as a dict for JSON (shallow: dataclasses.asdict deep-copies every list, and
    costs rank 0 more than the negotiation itself)."""
    return dict(vars(message))


def requests_message(requests: List[Request]) -> Dict[str, Any]:
    """A rank's requests as one message to the coordinator."""
    return {"type": "requests", "requests": [fields_of(r) for r in requests]}


def read_requests(message: Dict[str, Any]) -> List[Request]:
    """The requests of a message requests_message() made."""
    return [Request(**r) for r in message["requests"]]


def read_responses(message: Dict[str, Any]) -> List[Response]:
    """The responses of a coordinator's "responses" message."""
    return [Response(**r) for r in message["responses"]]


class FrameReader:
    """The one decoder of frames: feed() what a socket gave, take the whole messages it completed (the coordinator's
    non-blocking loop and each rank's Channel both read through it)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        """The messages whose frames `data` completes, in order (a partial frame waits for the next data)."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            (length,) = struct.unpack("!I", self._buffer[:4])
            if len(self._buffer) < 4 + length:
                break
            messages.append(json.loads(bytes(self._buffer[4:4 + length])))
            del self._buffer[:4 + length]
        return messages


class Channel:
    """A socket carrying frames both ways: sends from any thread (one at a time), receives from one."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._send_lock = threading.Lock()
        self._reader = FrameReader()
        self._ready: "collections.deque[Dict[str, Any]]" = collections.deque()  # decoded, not yet taken, in order

    def send(self, message: Dict[str, Any]) -> None:
        """Send one message as one frame (OSError once the other end is gone)."""
        frame = encode(message)
        with self._send_lock:
            self.sock.sendall(frame)

    def recv(self) -> Optional[Dict[str, Any]]:
        """The next message, or None once the other end closed."""
        while not self._ready:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            self._ready.extend(self._reader.feed(chunk))
        return self._ready.popleft()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
