"""Each rank's engine: sends its requests to the coordinator as the script makes them, and runs the coordinator's
responses, in their order, on a thread of its own, so that the script's thread only waits when it asks for a result
(synchronize) and a DistributedOptimizer's allreduces run while backward computes.

With the response cache on (HOROVOD_CACHE_CAPACITY > 0, Horovod's default) that thread runs Horovod's cycles
(cycle.py): a collective negotiated before is not sent to rank 0; each cycle the ranks agree, with one bitwise-AND
allreduce of a few words, on the cached collectives every rank has asked for and on the responses of rank 0 every
rank holds, and run them, in the same order on every rank. A rank takes part in cycles only while it has something
to look up, to agree on or to run (Horovod's ranks cycle without end, every HOROVOD_CYCLE_TIME).

A rank takes part in every response sent to it, even one whose tensor it no longer holds (a joined rank adds zeros),
so that no other rank waits on it; a response it cannot run, or a coordinator that went away, fails what waits."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

from . import execute
from .cycle import Guess, RankCycle
from .dtypes import DTYPES
from .exceptions import DUPLICATE_NAME, SHUT_DOWN, HorovodInternalError
from .handles import Handle
from .messages import (ADD_SET, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, ERROR, JOIN, REDUCESCATTER,
                       REMOVE_SET, Channel, Request, Response, read_responses, requests_message)

Key = Tuple[int, int, str]
#: with the cache on, the longest a cycle waits for a burst of requests to pause, in cycle times
LONGEST_BURST = 20
#: a collective that failed on a lost peer waits this long for rank 0's word naming the rank that was lost
NOTICE_WAIT_S = 2.0
#: the agreement of one cycle: this rank's words in, every rank's AND out (None once `stop()` says to give up)
Agree = Callable[[List[int], Callable[[], bool]], Optional[List[int]]]


@dataclass
class Cycling:
    """The response cache's side of the engine: this rank's cycle state, the agreement collective, Horovod's cycle
    time."""

    cycle: RankCycle
    agree: Agree
    cycle_time_s: float


@dataclass
class Entry:
    """This rank's part in one collective: its request, the handle (and place in it) its result completes, and its
    tensors (`output` is the tensor written in place, where the call has one)."""

    request: Request
    handle: Handle
    index: int = 0
    tensor: Optional[torch.Tensor] = None
    output: Optional[torch.Tensor] = None
    splits_device: Optional[torch.device] = None  # alltoall: where the received splits go
    ready: Optional[Tuple[int, torch.cuda.Event]] = None  # CUDA: (device, event) once the tensor's producer finished


class Engine:
    """Requests out, responses in and run. `communicator(ps)` gives a process set's Communicator;
    `on_set(response)` registers a process set the coordinator added or removed; `join_device()` is where this
    rank's zeros go while it has joined."""

    def __init__(self, channel: Channel, rank: int, communicator: Callable[[int], execute.Communicator],
                 on_set: Callable[[Response], None], join_device: Callable[[], int], silence_s: float,
                 on_event: Optional[Callable[[str, str, bool], None]] = None,
                 on_closed: Optional[Callable[[int], None]] = None, cycling: Optional[Cycling] = None) -> None:
        self.channel = channel
        self.rank = rank
        self.communicator = communicator
        self.on_set = on_set
        self.join_device = join_device
        self.silence_s = silence_s
        self.on_event = on_event
        self.on_closed = on_closed
        self.table: Dict[Key, Entry] = {}
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)  # cycles: something to look up, agree on or run
        self.waiting_threads = 0  # the script's threads waiting for a result (synchronize)
        self.last_ask = 0.0  # when the script last asked for a collective the cycle looks up
        self.idle = False  # the cycle thread waits for work (only then does a request wake it: no wake-up per tensor)
        self.cycling = cycling
        self.responses: "queue.Queue[Optional[Response]]" = queue.Queue()
        self.broken: Optional[str] = None
        self.closed: Set[int] = set()  # generations shut down (by any rank's hvd.shutdown())
        # what the cycle under way reduces (its guess, then its plan): a shutdown that comes meanwhile (the other
        # ranks may have finished this very collective and left) lets them complete
        self.running: Set[Key] = set()
        self.heard = time.monotonic()
        self.unrun = 0  # responses received and not yet run
        self._reader = threading.Thread(target=self._read, name="horovod_api-reader", daemon=True)
        self._runner = threading.Thread(target=self._run if cycling is None else self._cycles,
                                        name="horovod_api-engine", daemon=True)

    def start(self) -> None:
        self.channel.send({"type": "hello", "rank": self.rank})
        self._reader.start()
        self._runner.start()

    # --- the script's side -----------------------------------------------------------------------------------
    def submit(self, entries: List[Entry]) -> None:
        """Register this rank's parts and ask the coordinator for them; ValueError (Horovod's) for a name still in
        flight."""
        if self.broken is not None:
            raise HorovodInternalError(self.broken)
        with self.lock:
            keys = [(e.request.gen, e.request.ps, e.request.name) for e in entries]
            if any(key in self.table for key in keys) or len(set(keys)) < len(keys):
                raise ValueError(DUPLICATE_NAME)
            for key, entry in zip(keys, entries, strict=True):
                self.table[key] = entry
            if self.cycling is None:
                now = [e.request for e in entries]
            else:
                cycle = self.cycling.cycle
                now = [e.request for e in entries if not cycle.ask(e.request)]
                self.last_ask = time.monotonic()
                if any(e.request.kind == JOIN for e in entries):
                    cycle.joined = True  # the other ranks' cached collectives go to rank 0, which adds its zeros
                if self.idle:
                    self.work.notify()
        if now:
            self._to_coordinator(now)

    def _to_coordinator(self, requests: List[Request]) -> None:
        try:
            self.channel.send(requests_message(requests))
        except OSError:
            self._break(f"{SHUT_DOWN} (rank 0, which coordinates the collectives, is gone)")

    def awaited(self, change: int) -> None:
        """A script thread starts (+1) or stops (-1) waiting for a result: with the cache on, the cycle that would
        wait out HOROVOD_CYCLE_TIME for more requests runs at once."""
        if self.cycling is None:
            return
        with self.lock:
            self.waiting_threads += change
            self.work.notify()

    def trouble(self) -> Optional[str]:
        """Why what waits can no longer complete: the engine broke, or the coordinator went silent."""
        if self.broken is not None:
            return self.broken
        if self.silence_s > 0 and time.monotonic() - self.heard > self.silence_s:
            self._break(f"{SHUT_DOWN} (no word from rank 0, which coordinates the collectives, for "
                        f"{self.silence_s:g} s: it stopped or its host is unreachable)")
            return self.broken
        return None

    def finished(self, gen: int) -> bool:
        """Generation `gen` is shut down here and nothing of it remains to run."""
        with self.lock:
            return gen in self.closed and self.unrun == 0

    def send(self, message: Dict) -> None:
        """A control message to the coordinator (leave, bye); nothing if it is gone."""
        try:
            self.channel.send(message)
        except OSError:
            pass

    # --- the engine's side -----------------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            message = self.channel.recv()
            if message is None:
                self._break(f"{SHUT_DOWN} (rank 0, which coordinates the collectives, is gone)")
                self.responses.put(None)
                return
            self.heard = time.monotonic()
            if message["type"] == "closed":
                self._close(int(message["gen"]))
            elif message["type"] == "gone":
                self._break(f"{SHUT_DOWN} (rank {message['rank']} exited or lost its connection to rank 0)")
            elif message["type"] == "responses":
                for response in read_responses(message):
                    if self.cycling is not None:
                        self._hold(response)
                        continue
                    with self.lock:
                        self.unrun += 1
                    self.responses.put(response)

    def _hold(self, response: Response) -> None:
        """Cycles: an error fails what it names at once (it runs nothing); a numbered response waits for the cycle
        in which every rank holds it."""
        if response.seq == 0:
            self._fail(self._take(response), response.error)
            return
        with self.lock:
            self.unrun += 1
            assert self.cycling is not None
            self.cycling.cycle.hold(response)
            self.work.notify()

    def _close(self, gen: int) -> None:
        """A generation was shut down (by any rank): what this rank still waits for in it fails. The responses of it
        already received still run (the other ranks take part in them), with stand-ins for what failed here."""
        with self.lock:
            self.closed.add(gen)
        self._fail_stranded()
        if self.on_closed is not None:
            self.on_closed(gen)

    def _fail_stranded(self) -> None:
        """Fail what can no longer run (everything once the engine broke, else what waits in a generation that was
        shut down), but for what the cycle under way reduces: its collective may have completed on every rank."""
        with self.lock:
            keys = [key for key in self.table if (self.broken is not None or key[0] in self.closed)
                    and key not in self.running]
            entries = [self.table.pop(key) for key in keys]
            if self.cycling is not None:
                self.cycling.cycle.forget(keys)
        for entry in entries:
            entry.handle.fail(self.broken or SHUT_DOWN)

    def _break(self, message: str) -> None:
        """Nothing more can run: fail everything that waits, and everything asked from now on."""
        with self.lock:
            if self.broken is None:
                self.broken = message
            self.work.notify_all()
        self._fail_stranded()

    def _run(self) -> None:
        while True:
            response = self.responses.get()
            if response is None:
                return
            try:
                self._execute(response)
            except Exception as exc:  # a collective of torch.distributed failed: its groups are unusable now
                self._break(f"{SHUT_DOWN} ({type(exc).__name__}: {exc})")
            finally:
                with self.lock:
                    self.unrun -= 1

    # --- cycles (the response cache) ---------------------------------------------------------------------------
    def _cycles(self) -> None:
        try:
            self._cycle_loop()
        finally:  # the engine broke, or gave up waiting: nothing is under way any more
            with self.lock:
                self.running = set()
            self._fail_stranded()

    def _cycle_loop(self) -> None:
        assert self.cycling is not None
        cycling, cycle = self.cycling, self.cycling.cycle
        started = 0.0
        while True:
            with self.lock:
                while self.broken is None and not cycle.has_work():
                    self.idle = True
                    self.work.wait()
                self.idle = False
                if self.broken is not None:
                    return
            # What the script asks for in one burst (a backward pass) is agreed on together: the cycle runs once the
            # script waits for a result (nothing more comes before it has it), once it has asked for nothing for
            # HOROVOD_CYCLE_TIME (a pause in the burst: the allreduces overlap the compute that follows), or at
            # the latest after LONGEST_BURST cycle times; rank 0's responses run at once.
            with self.lock:
                latest = time.monotonic() + LONGEST_BURST * cycling.cycle_time_s
                while self.broken is None and not self.waiting_threads and not cycle.held():
                    left = min(self.last_ask + cycling.cycle_time_s, latest) - time.monotonic()
                    if left <= 0:
                        break
                    self.work.wait(left)
            started = time.monotonic()
            stop = lambda: self.broken is not None  # noqa: E731
            with self.lock:
                words = cycle.vector(started)
                first = cycle.take_outgoing()
                guess = cycle.guess()
                guessed = self._guess_inputs(guess) if guess is not None else []
                if guess is not None:
                    self.running = {(r.gen, r.ps, name) for r in guess.fused for name in r.names}
            if first:
                self._to_coordinator(first)
            try:
                agreed: Optional[List[int]] = None
                ahead: List[execute.Started] = []
                if guess is not None:
                    comm = self.communicator(0)
                    matched = 1.0 if tuple(words) == guess.expected else 0.0
                    ahead = [execute.start_allreduce(response, inputs, comm, matched if i == 0 else None)
                             for i, (response, inputs) in enumerate(zip(guess.fused, guessed, strict=True))]
                    if not all(execute.wait(one.work, stop) for one in ahead):
                        return
                    if ahead[0].flag() == comm.size:  # every rank's vector was the expected one
                        agreed = list(guess.expected)
                if agreed is None:
                    agreed = cycling.agree(words, stop)
                    if agreed is None:
                        return
            except Exception as exc:  # a rank's process ended in the agreement: its connections closed
                self._lost_in_collective(exc)
                return
            with self.lock:
                plan = cycle.settle(agreed)
                self.running = {(r.gen, r.ps, name) for r in [*plan.cached, *plan.responses] for name in r.names}
            ran = bool(plan.cached or plan.responses)
            # The guess's sums stand where the cycle agreed on exactly what was guessed; otherwise they are dropped.
            reused = guess is not None and plan.hits == guess.hits and [r.names for r in plan.cached] == [
                r.names for r in guess.fused]
            try:
                for i, response in enumerate(plan.cached):
                    self._execute(response, ahead[i] if reused else None)
                for response in plan.responses:
                    entries = self._execute(response)
                    with self.lock:
                        self.unrun -= 1
                        cycle.ran(response, {name: (e.request if e is not None else None)
                                             for name, e in zip(response.names, entries, strict=True)})
            except Exception as exc:  # a collective of torch.distributed failed: its groups are unusable now
                self._lost_in_collective(exc)
                return
            with self.lock:
                later = cycle.take_outgoing()
                self.running = set()
            if self.closed or self.broken is not None:
                self._fail_stranded()
            if later:
                self._to_coordinator(later)
            if not ran:  # nothing every rank asked for yet: wait a cycle, or for this rank's next request
                with self.lock:
                    self.work.wait(cycling.cycle_time_s)

    def _guess_inputs(self, guess: Guess) -> List[List[torch.Tensor]]:
        """What this rank puts into each of the guess's allreduces (every rank starts the same ones): its tensors of
        the collectives it waits for as hits, zeros for the others."""
        assert self.cycling is not None
        waiting = self.cycling.cycle.waiting
        ready = {waiting[bit][0].name for bit in guess.hits if bit in waiting}
        every = []
        for response in guess.fused:
            inputs = []
            for i, name in enumerate(response.names):
                entry = self.table.get((response.gen, response.ps, name)) if name in ready else None
                inputs.append(entry.tensor if entry is not None and entry.tensor is not None
                              else self._stand_in(response, i))
            every.append(inputs)
        return every

    def _lost_in_collective(self, exc: Exception) -> None:
        """A collective failed, most often on a peer whose process ended (Gloo: "Connection reset by peer"): rank 0's
        word that a rank is gone names it, and usually comes within moments; wait for it before failing with the
        collective's own error."""
        deadline = time.monotonic() + NOTICE_WAIT_S
        with self.lock:
            while self.broken is None and time.monotonic() < deadline:
                self.work.wait(deadline - time.monotonic())
        self._break(f"{SHUT_DOWN} ({type(exc).__name__}: {exc})")

    # --- running a response ----------------------------------------------------------------------------------
    def _take(self, response: Response) -> List[Optional[Entry]]:
        with self.lock:
            return [self.table.pop((response.gen, response.ps, name), None) for name in response.names]

    @staticmethod
    def _fail(entries: List[Optional[Entry]], message: Optional[str]) -> None:
        for entry in entries:
            if entry is not None:
                entry.handle.fail(message or SHUT_DOWN)

    def _member(self, response: Response) -> Optional[execute.Communicator]:
        """The groups of the response's process set, or None where this rank is not in it (with the cache on,
        every rank hears every response)."""
        try:
            comm = self.communicator(response.ps)
        except KeyError:
            return None
        return comm if comm.set_rank >= 0 else None

    def _execute(self, response: Response, ahead: Optional[execute.Started] = None) -> List[Optional[Entry]]:
        """Run one response (an allreduce whose sum was started `ahead` is finished); this rank's entries of it (None
        for a name it had none of)."""
        entries = self._take(response)
        if response.kind == ERROR:
            self._fail(entries, response.error)
            return entries
        if self.broken is not None and ahead is None:  # (a sum started ahead is complete on every rank)
            self._fail(entries, self.broken)
            return entries
        if response.kind == JOIN:
            for entry in entries:
                if entry is not None:
                    entry.handle.set_result(entry.index, response.joining)
            return entries
        if response.kind in (ADD_SET, REMOVE_SET):
            self.on_set(response)
            for entry in entries:
                if entry is not None:
                    entry.handle.set_result(entry.index, response.set_id)
            return entries
        comm = self._member(response)
        if comm is None:
            return entries
        for entry in entries:
            if entry is not None and entry.ready is not None:
                torch.cuda.current_stream(entry.ready[0]).wait_event(entry.ready[1])
        if self.on_event:
            for name in response.names:
                self.on_event(name, response.kind, True)
        results = self._dispatch(response, entries, comm, ahead)
        if self.on_event:
            for name in response.names:
                self.on_event(name, "", False)
        for entry, result in zip(entries, results, strict=True):
            if entry is not None:
                event = None
                device = execute.cuda_device(result if isinstance(result, torch.Tensor) else entry.output)
                if device is not None:
                    done = torch.cuda.Event()
                    done.record(torch.cuda.current_stream(device))
                    event = (device, done)
                entry.handle.set_result(entry.index, result, event)
        return entries

    def _stand_in(self, response: Response, index: int) -> torch.Tensor:
        """Zeros of the shape the response names, for a part this rank does not hold."""
        device = response.device
        if device >= 0:  # zeros on this rank's own device (the one it joined with, else its current one)
            device = self.join_device() if self.join_device() >= 0 else torch.cuda.current_device()
        shape = response.shapes[index] if index < len(response.shapes) else []
        return execute.placeholder(shape, DTYPES[response.dtype], device)

    def _dispatch(self, response: Response, entries: List[Optional[Entry]], comm: execute.Communicator,
                  ahead: Optional[execute.Started] = None) -> List:
        kind = response.kind
        if kind == BARRIER:
            execute.barrier(comm)
            return [None] * len(entries)
        if kind == ALLREDUCE:
            inputs, outputs = [], []
            for i, entry in enumerate(entries):
                if entry is None or entry.tensor is None or entry.output is None:
                    zeros = self._stand_in(response, i)
                    inputs.append(zeros)
                    outputs.append(zeros)
                else:
                    inputs.append(entry.tensor)
                    outputs.append(entry.output)
            if ahead is not None:
                execute.finish_allreduce(response, ahead, outputs, comm)
            else:
                execute.allreduce(response, inputs, outputs, comm)
            return outputs
        entry = entries[0]
        tensor = entry.tensor if entry is not None and entry.tensor is not None else self._participation(response,
                                                                                                          comm)
        if kind == BROADCAST:
            output = entry.output if entry is not None and entry.output is not None else tensor
            if output.data_ptr() != tensor.data_ptr():
                output.copy_(tensor)
            execute.broadcast(response, output, comm)
            return [output]
        if kind == ALLGATHER:
            return [execute.allgather(response, tensor, comm)]
        if kind == REDUCESCATTER:
            return [execute.reducescatter(response, tensor, comm)]
        if kind == ALLTOALL:
            output, received = execute.alltoall(response, tensor, comm)
            where = entry.splits_device if entry is not None and entry.splits_device is not None else None
            splits = torch.tensor(received, dtype=torch.int32, device=where)
            return [(output, splits)]
        raise ValueError(f"unknown response {kind}")

    def _participation(self, response: Response, comm: execute.Communicator) -> torch.Tensor:
        """A tensor of the right size for a collective this rank must take part in without holding its tensor (it
        shut down meanwhile): what it sends is never read by a caller."""
        shape = list(response.shapes[0]) if response.shapes else []
        if response.kind == ALLGATHER and shape:
            shape[0] = response.sizes[0][comm.set_rank]
        if response.kind == ALLTOALL and shape:
            shape[0] = sum(response.splits[comm.set_rank])
        return execute.placeholder(shape, DTYPES[response.dtype], response.device)

