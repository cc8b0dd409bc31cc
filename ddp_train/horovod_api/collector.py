"""The driver's end of `horovod.spark.run`: a socket that every rank reports its outcome to, on whatever host Spark
started it, as Horovod's driver service hears from its Spark tasks.

TorchDistributor gives back one process's return value only; each rank instead sends its own (or its error) here
before it exits. A report is accepted only with the job's secret token, checked before anything of it is unpickled,
and acknowledged, so that a rank that has exited has been heard. `report` is the rank's side."""

from __future__ import annotations

import hmac
import pickle
import secrets
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import cloudpickle

from .outcomes import Outcome, RemoteError

_TOKEN_BYTES = 32
_LENGTH = struct.Struct("!Q")
_ACK = b"ok"


@dataclass(frozen=True)
class Address:
    """Where the ranks report to, and the secret that lets them."""

    host: str
    port: int
    token: bytes


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    parts: List[bytes] = []
    while count:
        part = sock.recv(count)
        if not part:
            raise ConnectionError("the connection closed early")
        parts.append(part)
        count -= len(part)
    return b"".join(parts)


class Collector:
    """Listens on `host` (the driver's address as the ranks reach it) and keeps every authenticated report, in the
    order they came; `on_error` is called once, on the first report of an error (from the receiving thread). Use as a
    context manager; `outcomes()` reads what came so far."""

    def __init__(self, host: str, on_error: Optional[Callable[[], None]] = None) -> None:
        self._on_error = on_error
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)
        self.address = Address(host, self._listener.getsockname()[1], self.token)
        self._arrived: List[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="horovod.spark.run results", daemon=True)

    def __enter__(self) -> "Collector":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._receive, args=(conn,), daemon=True).start()

    def _receive(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(60)
                if not hmac.compare_digest(_read_exactly(conn, _TOKEN_BYTES), self.token):
                    return  # not one of this job's ranks: nothing of it is read further
                (length,) = _LENGTH.unpack(_read_exactly(conn, _LENGTH.size))
                outcome = pickle.loads(_read_exactly(conn, length))
                first_error = False
                if isinstance(outcome, Outcome):
                    with self._lock:
                        first_error = outcome.error is not None and all(o.error is None for o in self._arrived)
                        self._arrived.append(outcome)
                if first_error and self._on_error is not None:
                    self._on_error()
                conn.sendall(_ACK)
            except (OSError, ConnectionError, pickle.UnpicklingError, EOFError):
                return

    def outcomes(self) -> List[Outcome]:
        """The reports so far, in the order they came."""
        with self._lock:
            return list(self._arrived)

    def by_rank(self) -> Dict[int, Outcome]:
        """The reports so far by rank (a rank's first report wins)."""
        found: Dict[int, Outcome] = {}
        for outcome in self.outcomes():
            found.setdefault(outcome.rank, outcome)
        return found


def _payload(outcome: Outcome) -> bytes:
    try:
        return cloudpickle.dumps(outcome)
    except Exception as exc:  # the value cannot be pickled: the driver hears why instead
        error = RemoteError(outcome.rank, type(exc).__name__, f"its return value cannot be pickled: {exc}")
        return cloudpickle.dumps(Outcome(outcome.rank, error=error))


def report(address: Address, outcome: Outcome, timeout_s: Optional[float] = 60.0) -> None:
    """Send one rank's outcome to the driver and wait for its acknowledgement."""
    payload = _payload(outcome)
    with socket.create_connection((address.host, address.port), timeout=timeout_s) as conn:
        conn.sendall(address.token + _LENGTH.pack(len(payload)) + payload)
        if _read_exactly(conn, len(_ACK)) != _ACK:
            raise ConnectionError("the driver did not acknowledge the result")
