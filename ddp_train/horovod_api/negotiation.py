"""The negotiation of rank 0, as Horovod's controller decides it: which collective every rank of a process set has
asked for, in what order the ranks run them, how allreduces fuse, and what is wrong with one. Requests in, responses
out: no sockets, no threads, no clock of its own (the caller says what time it is), so that every rule is tested on
made-up request streams; coordinator.py is the socket and thread shell around it.

A collective runs once every rank of its process set asked for it (or joined), and then on all of them in one order:
once a name is complete its requests are checked against each other (`checks.mismatch`) and a response is queued.
Responses queued within one cycle (HOROVOD_CYCLE_TIME) are answered together, compatible allreduces fused into
buffers of at most HOROVOD_FUSION_THRESHOLD bytes. The work per request does not depend on the number of ranks: a
collective is complete when its count of requests (and joined ranks) reaches its size; only a complete collective
reads its requests, once.

With `broadcast` (the response cache is on), every numbered response goes to every rank, so that every rank can count
them; a rank outside the response's process set skips it. Errors are not numbered: they go to the ranks that asked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Set, Tuple

from . import checks
from .dtypes import DTYPES
from .exceptions import SHUT_DOWN
from .messages import ADD_SET, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, ERROR, JOIN, REDUCESCATTER, \
    REMOVE_SET, Request, Response
from .settings import Settings

Key = Tuple[int, int, str]  # (generation, process set, name)
UNKNOWN_SET = "Process set provided does not exist, or has not been registered."


@dataclass
class Pending:
    """A collective some ranks of its process set have asked for."""

    since: float
    requests: Dict[int, Request] = field(default_factory=dict)
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
class Outgoing:
    """Responses for some ranks (None: every rank still connected)."""

    ranks: Optional[List[int]]
    responses: List[Response]


@dataclass
class Closed:
    """A generation shut down: every rank is told."""

    gen: int


def fusion_key(response: Response) -> Tuple:
    """What allreduces must share to share a buffer: set, type, device kind, op, factors, joined ranks."""
    return (response.ps, response.dtype, response.device < 0, response.op, response.prescale, response.postscale,
            tuple(response.joined))


def fusion_bytes(response: Response) -> int:
    """The bytes of a one-tensor allreduce in a fused buffer."""
    return checks.fused_bytes([response.shapes[0]], DTYPES[response.dtype].itemsize)


def fuse_allreduces(responses: List[Response], threshold: int) -> List[Response]:
    """Allreduce responses of one tensor each, in order, as fused responses: runs of compatible ones of at most
    `threshold` bytes each, as Horovod's FuseResponses."""
    return fuse_measured([(r, fusion_key(r), fusion_bytes(r)) for r in responses], threshold)


def fuse_measured(items: List[Tuple[Response, Tuple, int]], threshold: int) -> List[Response]:
    """fuse_allreduces for responses whose fusion key and bytes are known (the response cache keeps them)."""
    buckets: Dict[Tuple, List[Tuple[Response, int]]] = {}
    for response, key, nbytes in items:
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = []
        bucket.append((response, nbytes))
    fused: List[Response] = []
    for bucket in buckets.values():
        run: List[Response] = []
        size = 0
        for response, nbytes in bucket:
            if run and size + nbytes > threshold:
                fused.append(_merge(run))
                run, size = [], 0
            run.append(response)
            size += nbytes
        if run:
            fused.append(_merge(run))
    return fused


def _merge(run: List[Response]) -> Response:
    if len(run) == 1:
        return run[0]
    return replace(run[0], names=[r.names[0] for r in run], shapes=[r.shapes[0] for r in run])


def group_index(name: str) -> int:
    """The place of a grouped collective's tensor in its group, from its name (BASE_3of5 -> 3)."""
    tail = name.rsplit("_", 1)[-1]
    number = tail.split("of", 1)[0]
    return int(number) if number.isdigit() else 0


class Negotiator:
    """Rank 0's negotiation. Feed it requests, joins, leaves and lost ranks; `answer()` when the cycle is due
    (`due(now)`); take what to send with `take()`. `on_event(name, phase, start)` marks negotiations for the
    timeline."""

    def __init__(self, world_size: int, settings: Settings, broadcast: bool = False,
                 on_event: Optional[Callable[[str, str, bool], None]] = None) -> None:
        self.world_size = world_size
        self.settings = settings
        self.broadcast = broadcast
        self.on_event = on_event
        self.everyone = list(range(world_size))
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
        self.outbox: List[object] = []  # Outgoing and Closed, in order

    # --- what comes in ---------------------------------------------------------------------------------------
    def request(self, request: Request, now: float) -> None:
        """One rank asks for one collective."""
        if request.gen in self.closed_generations:
            self._reply_error([request.rank], request, SHUT_DOWN)
            return
        if request.kind == JOIN:
            self._join(request, now)
            return
        members = self._members(request.gen, request.ps)
        if members is None:
            self._reply_error([request.rank], request, UNKNOWN_SET)
            return
        key = (request.gen, request.ps, request.name)
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = Pending(now)
            if self.on_event:
                self.on_event(request.name, f"NEGOTIATE_{request.kind}", True)
        pending.requests[request.rank] = request
        self._check_complete(key, pending, members, now)

    def leave(self, gen: int) -> None:
        """hvd.shutdown() on one rank shuts Horovod down on all: what waits in this generation fails."""
        self._close_generation(gen, SHUT_DOWN)

    def rank_gone(self, rank: int, now: float) -> None:
        """A rank's process ended: what needs it can never run."""
        if rank in self.gone:
            return
        self.gone.add(rank)
        for key in list(self.pending):
            pending = self.pending.get(key)
            members = self._members(key[0], key[1]) or []
            if pending is not None and rank in members:
                self._check_complete(key, pending, members, now)
        alive = self._alive()
        for gen, order in list(self.joined.items()):
            if alive and all(r in order for r in alive):
                del self.joined[gen]
                self._emit([self._response(gen, 0, JOIN, ["join.noname"], joining=order[-1])], alive)

    # --- cycles ----------------------------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        """Whether complete collectives should be answered now: their cycle ended, or nothing else is asked for
        that could still fuse with them."""
        return bool(self.ready) and (now >= self.window_ends or not (self.pending or self.groups))

    def answer(self) -> None:
        """Answer the complete collectives, allreduces fused."""
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

    def take(self) -> List[object]:
        """What to send, in order (Outgoing responses, Closed generations)."""
        out, self.outbox = self.outbox, []
        return out

    # --- completion ------------------------------------------------------------------------------------------
    def _alive(self) -> List[int]:
        return [rank for rank in self.everyone if rank not in self.gone]

    def _members(self, gen: int, ps: int) -> Optional[List[int]]:
        return self.everyone if ps == 0 else self.sets.get((gen, ps))

    def _needs_gone(self, ps: int, members: List[int]) -> bool:
        if not self.gone:
            return False
        return ps == 0 or any(rank in self.gone for rank in members)

    def _check_complete(self, key: Key, pending: Pending, members: List[int], now: float) -> None:
        gen, ps, name = key
        if self._needs_gone(ps, members):
            del self.pending[key]
            self._reply_error(list(pending.requests), next(iter(pending.requests.values())), self._gone_text())
            return
        joined = self.joined.get(gen, []) if ps == 0 else []
        count = len(pending.requests) + sum(1 for rank in joined if rank not in pending.requests)
        if count < len(members):
            return
        del self.pending[key]
        if self.on_event:
            self.on_event(name, "", False)
        requests = [pending.requests[rank] for rank in sorted(pending.requests)]
        first = requests[0]
        if first.kind in (ADD_SET, REMOVE_SET):
            error = checks.set_ranks_problem(requests)
        elif all(r.checked for r in requests):
            error = None  # a DistributedOptimizer's gradient, matched on every rank at its first step
        else:
            error = checks.mismatch(requests, joined=len(joined), fusion_threshold=self.settings.fusion_threshold)
        item = Ready(key, requests, members, error, sorted(joined))
        if first.group and error is None:
            # A grouped collective is answered once all of its tensors are complete, together.
            group_key = (gen, ps, first.group)
            parts = self.groups.setdefault(group_key, [])
            parts.append(item)
            if len(parts) < first.group_size:
                return
            del self.groups[group_key]
            parts.sort(key=lambda part: group_index(part.key[2]))
            self._queue(parts, now)
        else:
            self._queue([item], now)

    def _queue(self, items: List[Ready], now: float) -> None:
        if not self.ready:
            self.window_ends = now + self.settings.cycle_time_s
        self.ready.extend(items)

    def _join(self, request: Request, now: float) -> None:
        order = self.joined.setdefault(request.gen, [])
        if request.rank not in order:
            order.append(request.rank)
        alive = self._alive()
        if len(order) >= len(alive) and all(rank in order for rank in alive):
            del self.joined[request.gen]
            self._emit([self._response(request.gen, 0, JOIN, [request.name], joining=order[-1])], alive)
            return
        # Collectives of the global set that were waiting only for this rank can run now, with its zeros.
        for key in [key for key in self.pending if key[0] == request.gen and key[1] == 0]:
            if key in self.pending:
                self._check_complete(key, self.pending[key], self.everyone, now)

    # --- answers ---------------------------------------------------------------------------------------------
    def _response(self, gen: int, ps: int, kind: str, names: List[str], **fields) -> Response:
        self.seq += 1
        return Response(self.seq, gen, ps, kind, names, **fields)

    def _flush_fused(self, items: List[Ready]) -> None:
        if not items:
            return
        singles = []
        for item in items:
            r = item.requests[0]
            singles.append(Response(0, item.key[0], item.key[1], ALLREDUCE, [item.key[2]], dtype=r.dtype,
                                    device=r.device, op=r.op, prescale=r.prescale, postscale=r.postscale,
                                    shapes=[list(r.shape)], joined=item.joined))
        members = {item.key[2]: item.members for item in items}
        for fused in fuse_allreduces(singles, self.settings.fusion_threshold):
            self.seq += 1
            fused.seq = self.seq
            self._emit([fused], members[fused.names[0]])

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
            self.sets.pop((gen, first.set_id), None)
            self._emit([self._response(gen, ps, REMOVE_SET, [name], set_id=first.set_id)], item.members)
            return
        if first.kind not in (BROADCAST, REDUCESCATTER, BARRIER, ALLGATHER, ALLTOALL):
            raise ValueError(f"unknown collective {first.kind}")
        response = self._response(gen, ps, first.kind, [name], dtype=first.dtype, device=first.device, op=first.op,
                                  prescale=first.prescale, postscale=first.postscale, root=first.root,
                                  shapes=[list(first.shape)], joined=item.joined)
        if first.kind == ALLGATHER:
            response.sizes = [[r.shape[0] for r in item.requests]]
        elif first.kind == ALLTOALL:
            response.splits = [list(r.splits) for r in item.requests]
        self._emit([response], item.members)

    def _add_set(self, item: Ready) -> None:
        gen, ps, name = item.key
        ranks = sorted(item.requests[0].ranks)
        exists = any(members == ranks for (g, _), members in self.sets.items() if g == gen)
        if exists or ranks == self.everyone:
            self._emit([self._response(gen, ps, ADD_SET, [name], set_id=-1, ranks=ranks)], item.members)
            return
        set_id = self.next_set_id.get(gen, 1)
        self.next_set_id[gen] = set_id + 1
        self.sets[(gen, set_id)] = ranks
        self._emit([self._response(gen, ps, ADD_SET, [name], set_id=set_id, ranks=ranks)], item.members)

    def _reply_error(self, ranks: List[int], request: Request, message: str) -> None:
        """An error is not numbered: it runs nothing, and only the ranks that asked hear of it."""
        response = Response(0, request.gen, request.ps, ERROR, [request.name], error=message)
        self.outbox.append(Outgoing(ranks, [response]))

    def _emit(self, responses: List[Response], ranks: List[int]) -> None:
        self.outbox.append(Outgoing(None if self.broadcast else list(ranks), responses))

    def _gone_text(self) -> str:
        lost = ", ".join(str(rank) for rank in sorted(self.gone))
        return f"{SHUT_DOWN} (rank {lost} exited or lost its connection to rank 0)"

    # --- ends ------------------------------------------------------------------------------------------------
    def _close_generation(self, gen: int, message: str) -> None:
        if gen in self.closed_generations:
            return
        self.closed_generations.add(gen)
        self.outbox.append(Closed(gen))  # every rank's init() now starts the next generation
        for key in [key for key in self.pending if key[0] == gen]:
            pending = self.pending.pop(key)
            self._reply_error(list(pending.requests), next(iter(pending.requests.values())), message)
        for group_key in [k for k in self.groups if k[0] == gen]:
            for item in self.groups.pop(group_key):
                self._reply_error([r.rank for r in item.requests], item.requests[0], message)
        joined = self.joined.pop(gen, [])
        if joined:
            self.outbox.append(Outgoing(joined, [Response(0, gen, 0, ERROR, ["join.noname"], error=message)]))

    def stalls(self, now: float) -> Optional[Tuple[str, bool]]:
        """Horovod's stall inspector: the report of collectives some ranks wait in for longer than the stall check
        time, and whether it shuts the job down (past the shutdown time: their generations are closed)."""
        settings = self.settings
        if settings.stall_check_s <= 0:
            return None
        stalled = {key: p for key, p in self.pending.items()
                   if now - p.since > settings.stall_check_s and now - p.warned_at > settings.stall_check_s}
        if not stalled:
            return None
        shut = settings.stall_shutdown_s > 0 and any(now - p.since > settings.stall_shutdown_s
                                                     for p in stalled.values())
        missing: Dict[int, List[str]] = {}
        late: Set[int] = set()
        for (gen, ps, name), pending in stalled.items():
            pending.warned_at = now
            members = self._members(gen, ps) or []
            joined = self.joined.get(gen, []) if ps == 0 else []
            for rank in members:
                if rank not in pending.requests and rank not in joined:
                    missing.setdefault(rank, []).append(name)
                    if settings.stall_shutdown_s > 0 and now - pending.since > settings.stall_shutdown_s:
                        late.add(rank)
        report = stall_report(missing, late, settings.stall_check_s, settings.stall_shutdown_s if shut else 0)
        if shut:
            for gen in sorted({key[0] for key in stalled}):
                self._close_generation(gen, f"{report}\n{SHUT_DOWN}")
        return report, shut


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
