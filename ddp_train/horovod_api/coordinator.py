"""Rank 0's coordinator: which collective every rank of a process set has asked for, in what order the ranks run
them, and what is wrong with one, as Horovod's controller decides it.

Horovod lets each rank ask for named collectives in its own order; a collective runs once every rank of its process
set has asked for it, and then on all of them in one order. Here every rank sends its requests to this thread (in rank
0's process) over a socket; once a name is complete, the coordinator checks the requests against each other (the
checks Horovod makes, `checks.mismatch`) and appends a response to one sequence that every rank runs in order, so no
two ranks can wait on each other in different collectives. Allreduces that become complete together (within one
cycle, HOROVOD_CYCLE_TIME) with the same type, device, op and factors are answered as one fused buffer of at most
HOROVOD_FUSION_THRESHOLD bytes, as Horovod fuses them.

What ends a wait that would never end: a rank whose process ended (its socket closed) or that shut the API down fails
every collective that needs it with Horovod's shutdown error; a collective that some ranks asked for and others not
for HOROVOD_STALL_CHECK_TIME_SECONDS is reported as Horovod reports it, and after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
fails on every rank that asked (Horovod's stall inspector).
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from . import checks
from .dtypes import DTYPES
from .errors import SHUT_DOWN
from .messages import (ADD_SET, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, ERROR, JOIN, REDUCESCATTER,
                       REMOVE_SET, FrameReader, Request, Response, encode, read_requests, responses_message)
from .settings import Settings

Key = Tuple[int, int, str]  # (generation, process set, name)
#: how often (seconds) the coordinator tells every rank it is alive, and looks for stalled collectives
HEARTBEAT_S = 1.0


@dataclass
class Pending:
    """A collective some ranks of its process set have asked for."""

    requests: Dict[int, Request] = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)
    warned_at: float = 0.0


@dataclass
class Ready:
    """A complete collective waiting to be answered: its requests in set-rank order, or the error to answer."""

    key: Key
    requests: List[Request]
    members: List[int]
    error: Optional[str] = None
    joined: List[int] = field(default_factory=list)


@dataclass
class Client:
    """One rank's connection."""

    sock: socket.socket
    reader: FrameReader = field(default_factory=FrameReader)
    rank: int = -1
    outbox: bytearray = field(default_factory=bytearray)


class Coordinator(threading.Thread):
    """The coordinator thread of rank 0: accepts every rank's connection, then answers requests until the process
    ends."""

    def __init__(self, listener: socket.socket, world_size: int, settings: Settings,
                 on_event=None) -> None:
        super().__init__(name="horovod_api-coordinator", daemon=True)
        self.listener = listener
        self.world_size = world_size
        self.settings = settings
        self.on_event = on_event  # timeline: (name, phase, start or end) of negotiations
        self.selector = selectors.DefaultSelector()
        self.clients: Dict[int, Client] = {}  # fd -> client
        self.by_rank: Dict[int, Client] = {}
        self.pending: Dict[Key, Pending] = {}
        self.ready: List[Ready] = []
        self.window_ends = 0.0
        self.groups: Dict[Tuple[int, int, str], List[Ready]] = {}
        self.sets: Dict[Tuple[int, int], List[int]] = {}
        self.next_set_id: Dict[int, int] = {}
        self.joined: Dict[int, List[int]] = {}  # generation -> ranks in the order they joined
        self.gone: Set[int] = set()
        self.closed_generations: Set[int] = set()
        self.seq = 0
        self.last_heartbeat = 0.0

    # --- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            timeout = HEARTBEAT_S if not self.ready else max(0.0, self.window_ends - now)
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
            if self.ready and (now >= self.window_ends or not self._incomplete()):
                self._answer()
            if now - self.last_heartbeat >= HEARTBEAT_S:
                self.last_heartbeat = now
                self._inspect_stalls(now)
                for client in list(self.by_rank.values()):
                    self._send(client, {"type": "alive"})

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
        for message in client.reader.feed(data):
            self._handle(client, message)

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

    def _send(self, client: Client, message: Dict) -> None:
        if client.sock.fileno() not in self.clients:
            return
        was_empty = not client.outbox
        client.outbox += encode(message)
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
            self._rank_gone(client.rank)

    # --- messages --------------------------------------------------------------------------------------------
    def _handle(self, client: Client, message: Dict) -> None:
        kind = message["type"]
        if kind == "hello":
            client.rank = int(message["rank"])
            self.by_rank[client.rank] = client
        elif kind == "requests":
            for request in read_requests(message):
                self._request(request)
        elif kind == "leave":
            self._close_generation(int(message["gen"]), SHUT_DOWN)
        elif kind == "bye":
            self._lost(client)

    def _members(self, gen: int, ps: int) -> Optional[List[int]]:
        if ps == 0:
            return list(range(self.world_size))
        return self.sets.get((gen, ps))

    def _request(self, request: Request) -> None:
        if request.gen in self.closed_generations:
            self._reply_error([request.rank], request, SHUT_DOWN)
            return
        if request.kind == JOIN:
            self._join(request)
            return
        members = self._members(request.gen, request.ps)
        if members is None:
            self._reply_error([request.rank], request, "Process set provided does not exist, or has not been "
                                                         "registered.")
            return
        key = (request.gen, request.ps, request.name)
        pending = self.pending.setdefault(key, Pending())
        if not pending.requests and self.on_event:
            self.on_event(request.name, f"NEGOTIATE_{request.kind}", True)
        pending.requests[request.rank] = request
        self._check_complete(key, pending, members)

    def _joined_members(self, gen: int, ps: int, members: List[int]) -> List[int]:
        joined = self.joined.get(gen, []) if ps == 0 else []
        return [rank for rank in members if rank in joined]

    def _check_complete(self, key: Key, pending: Pending, members: List[int]) -> None:
        gen, ps, name = key
        missing_gone = [rank for rank in members if rank in self.gone]
        if missing_gone:
            del self.pending[key]
            self._reply_error(list(pending.requests), next(iter(pending.requests.values())), SHUT_DOWN)
            return
        joined = self._joined_members(gen, ps, members)
        if any(rank not in pending.requests and rank not in joined for rank in members):
            return
        del self.pending[key]
        if self.on_event:
            self.on_event(name, "", False)
        requests = [pending.requests[rank] for rank in members if rank in pending.requests]
        first = requests[0]
        if first.kind in (ADD_SET, REMOVE_SET):
            error = checks.set_ranks_problem(requests)
        elif all(r.checked for r in requests):
            error = None  # a DistributedOptimizer's gradient, matched on every rank at its first step
        else:
            error = checks.mismatch(requests, joined=len(joined), fusion_threshold=self.settings.fusion_threshold)
        item = Ready(key, requests, members, error, joined)
        if first.group and error is None:
            # A grouped collective is answered once all of its tensors are complete, together.
            group_key = (gen, ps, first.group)
            parts = self.groups.setdefault(group_key, [])
            parts.append(item)
            if len(parts) < first.group_size:
                return
            del self.groups[group_key]
            parts.sort(key=lambda part: group_index(part.key[2]))
            self._queue(parts)
        else:
            self._queue([item])

    def _queue(self, items: List[Ready]) -> None:
        if not self.ready:
            self.window_ends = time.monotonic() + self.settings.cycle_time_s
        self.ready.extend(items)

    def _incomplete(self) -> bool:
        """Whether a collective is asked for by some ranks but not all: it may complete within the cycle and be
        fused with what is complete."""
        return bool(self.pending) or bool(self.groups)

    def _join(self, request: Request) -> None:
        order = self.joined.setdefault(request.gen, [])
        if request.rank not in order:
            order.append(request.rank)
        alive = [rank for rank in range(self.world_size) if rank not in self.gone]
        if all(rank in order for rank in alive):
            last = order[-1]
            del self.joined[request.gen]
            self._emit([Response(self._next_seq(), request.gen, 0, JOIN, [request.name], value=last)], alive)
            return
        # Collectives of the global set that were waiting only for this rank can run now, with its zeros.
        for key in [key for key in self.pending if key[0] == request.gen and key[1] == 0]:
            if key in self.pending:
                self._check_complete(key, self.pending[key], list(range(self.world_size)))

    # --- answers ---------------------------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _answer(self) -> None:
        ready, self.ready = self.ready, []
        if self.on_event:
            self.on_event("", "CYCLE_START", True)
        fusable: List[Ready] = []
        for item in ready:
            if item.error is None and item.requests[0].kind == ALLREDUCE:
                fusable.append(item)
                continue
            self._flush_fused(fusable)
            fusable = []
            self._answer_one(item)
        self._flush_fused(fusable)

    def _flush_fused(self, items: List[Ready]) -> None:
        """Allreduces answered as fused buffers: runs of compatible ones, at most the fusion threshold each."""
        buckets: Dict[Tuple, List[Ready]] = {}
        for item in items:
            r = item.requests[0]
            buckets.setdefault((r.ps, r.dtype, r.device < 0, r.op, r.prescale, r.postscale, tuple(item.joined)),
                               []).append(item)
        for bucket in buckets.values():
            itemsize = DTYPES[bucket[0].requests[0].dtype].itemsize
            fused: List[Ready] = []
            size = 0
            for item in bucket:
                nbytes = checks.fused_bytes([item.requests[0].shape], itemsize)
                if fused and size + nbytes > self.settings.fusion_threshold:
                    self._answer_allreduce(fused)
                    fused, size = [], 0
                fused.append(item)
                size += nbytes
            if fused:
                self._answer_allreduce(fused)

    def _answer_allreduce(self, items: List[Ready]) -> None:
        first, gen, ps = items[0].requests[0], items[0].key[0], items[0].key[1]
        response = Response(self._next_seq(), gen, ps, ALLREDUCE, [item.key[2] for item in items],
                            dtype=first.dtype, device=first.device, op=first.op, prescale=first.prescale,
                            postscale=first.postscale, shapes=[list(item.requests[0].shape) for item in items],
                            joined=items[0].joined)
        self._emit([response], items[0].members)

    def _answer_one(self, item: Ready) -> None:
        gen, ps, name = item.key
        first = item.requests[0]
        if item.error is not None:
            self._reply_error([r.rank for r in item.requests], first, item.error)
            return
        if first.kind == ADD_SET:
            self._add_set(item)
            return
        if first.kind == REMOVE_SET:
            self.sets.pop((gen, first.root), None)
            self._emit([Response(self._next_seq(), gen, ps, REMOVE_SET, [name], value=first.root)], item.members)
            return
        response = Response(self._next_seq(), gen, ps, first.kind, [name], dtype=first.dtype, device=first.device,
                            op=first.op, prescale=first.prescale, postscale=first.postscale, root=first.root,
                            shapes=[list(first.shape)], joined=item.joined)
        if first.kind == ALLGATHER:
            response.sizes = [[r.shape[0] for r in item.requests]]
        elif first.kind == ALLTOALL:
            response.splits = [list(r.splits) for r in item.requests]
        elif first.kind not in (BROADCAST, REDUCESCATTER, BARRIER):
            raise ValueError(f"unknown collective {first.kind}")
        self._emit([response], item.members)

    def _add_set(self, item: Ready) -> None:
        gen, ps, name = item.key
        ranks = sorted(item.requests[0].ranks)
        if any(members == ranks for (g, _), members in self.sets.items() if g == gen) or \
                ranks == list(range(self.world_size)):
            self._emit([Response(self._next_seq(), gen, ps, ADD_SET, [name], value=-1, ranks=ranks)], item.members)
            return
        set_id = self.next_set_id.get(gen, 1)
        self.next_set_id[gen] = set_id + 1
        self.sets[(gen, set_id)] = ranks
        self._emit([Response(self._next_seq(), gen, ps, ADD_SET, [name], value=set_id, ranks=ranks)], item.members)

    def _reply_error(self, ranks: List[int], request: Request, message: str) -> None:
        response = Response(self._next_seq(), request.gen, request.ps, ERROR, [request.name], error=message)
        self._emit([response], ranks)

    def _emit(self, responses: List[Response], ranks: List[int]) -> None:
        message = responses_message(responses)
        for rank in ranks:
            client = self.by_rank.get(rank)
            if client is not None:
                self._send(client, message)

    # --- ends ------------------------------------------------------------------------------------------------
    def _rank_gone(self, rank: int) -> None:
        self.gone.add(rank)
        for key in list(self.pending):
            pending = self.pending.get(key)
            if pending is None:
                continue
            members = self._members(key[0], key[1]) or []
            if rank in members:
                self._check_complete(key, pending, members)
        for gen, order in list(self.joined.items()):
            alive = [r for r in range(self.world_size) if r not in self.gone]
            if alive and all(r in order for r in alive):
                del self.joined[gen]
                self._emit([Response(self._next_seq(), gen, 0, JOIN, ["join.noname"], value=order[-1])], alive)

    def _close_generation(self, gen: int, message: str) -> None:
        """hvd.shutdown() on one rank shuts Horovod down on all: what waits in this generation fails."""
        if gen in self.closed_generations:
            return
        self.closed_generations.add(gen)
        for client in list(self.by_rank.values()):  # every rank's init() now starts the next generation
            self._send(client, {"type": "closed", "gen": gen})
        for key in [key for key in self.pending if key[0] == gen]:
            pending = self.pending.pop(key)
            self._reply_error(list(pending.requests), next(iter(pending.requests.values())), message)
        for group_key in [k for k in self.groups if k[0] == gen]:
            for item in self.groups.pop(group_key):
                self._reply_error([r.rank for r in item.requests], item.requests[0], message)
        joined = self.joined.pop(gen, [])
        if joined:
            self._emit([Response(self._next_seq(), gen, 0, ERROR, ["join.noname"], error=message)], joined)

    def _inspect_stalls(self, now: float) -> None:
        settings = self.settings
        if settings.stall_check_s <= 0:
            return
        stalled = {key: p for key, p in self.pending.items()
                   if now - p.since > settings.stall_check_s and now - p.warned_at > settings.stall_check_s}
        if not stalled:
            return
        shut = settings.stall_shutdown_s > 0 and any(now - p.since > settings.stall_shutdown_s
                                                     for p in stalled.values())
        missing: Dict[int, List[str]] = {}
        late: Set[int] = set()
        for (gen, ps, name), pending in stalled.items():
            pending.warned_at = now
            members = self._members(gen, ps) or []
            joined = self._joined_members(gen, ps, members)
            for rank in members:
                if rank not in pending.requests and rank not in joined:
                    missing.setdefault(rank, []).append(name)
                    if settings.stall_shutdown_s > 0 and now - pending.since > settings.stall_shutdown_s:
                        late.add(rank)
        report = stall_report(missing, late, settings.stall_check_s, settings.stall_shutdown_s if shut else 0)
        sys.stderr.write(f"[rank 0] horovod_api: {'ERROR' if shut else 'WARNING'}: {report}\n")
        sys.stderr.flush()
        if shut:
            for gen in sorted({key[0] for key in stalled}):
                self._close_generation(gen, f"{report}\n{SHUT_DOWN}")


def group_index(name: str) -> int:
    """The place of a grouped collective's tensor in its group, from its name (BASE_3of5 -> 3)."""
    tail = name.rsplit("_", 1)[-1]
    number = tail.split("of", 1)[0]
    return int(number) if number.isdigit() else 0


def stall_report(missing: Dict[int, List[str]], late: Set[int], check_s: float, shutdown_s: float) -> str:
    """Horovod's stall warning: which ranks have not asked for which collectives (marked `!` past the shutdown
    time)."""
    lines = [f"One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
             f"waiting for remainder of ranks for more than {check_s:g} seconds. This may indicate that different "
             "ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, "
             "which will cause deadlock. ", "Missing ranks:"]
    for rank in sorted(missing):
        names = sorted(missing[rank])
        shown = ", ".join(names[:6]) + (" ..." if len(names) > 6 else "")
        lines.append(f"{rank}{'!' if rank in late else ''}: [{shown}]")
    if shutdown_s:
        lines.append(f'One or more rank (marked by "!") is stalled for longer than {shutdown_s:g} seconds. '
                     "Will shutdown.")
    return "\n".join(lines)


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
