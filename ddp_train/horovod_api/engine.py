"""Each rank's engine: the thread shell around its state machine (engine_core.py). The script's threads submit
parts and wait for results; a reader thread feeds the machine what rank 0 sends; a cycle thread starts the cycles
the machine says are due, runs the agreement (or the guess) and the collectives the machine hands it (dispatch.py),
so that the script's thread only waits when it asks for a result (synchronize) and a DistributedOptimizer's
allreduces run while backward computes.

The state is the machine's, and only one lock guards it: every call into the machine is made under that lock; the
sockets, the collectives and the handles' results are used outside it. With the response cache on, the ranks agree
once a cycle with one bitwise-AND allreduce of a few words (cycle.py), or skip it where the guess was every rank's;
with it off, a cycle runs the responses rank 0 sent this rank, in their order."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import execute
from .dispatch import Dispatcher, Entry, fail
from .engine_core import Counts, CycleStart, EngineCore, Failure, Run
from .exceptions import SHUT_DOWN
from .messages import Channel, Request, Response, read_responses, requests_message

#: a collective that failed on a lost peer waits this long for rank 0's word naming the rank that was lost
NOTICE_WAIT_S = 2.0
#: the agreement of one cycle: this rank's words in, every rank's AND out (None once `stop()` says to give up)
Agree = Callable[[List[int], Callable[[], bool]], Optional[List[int]]]
GONE = f"{SHUT_DOWN} (rank 0, which coordinates the collectives, is gone)"


class Engine:
    """Requests out, responses in and run. `core`: this rank's state machine; `dispatcher` runs what it decides;
    `agree`: the agreement collective; `silence_s` (> 0): how long rank 0 may say nothing before what waits fails;
    `on_closed(gen)`: a generation was shut down."""

    def __init__(self, channel: Channel, rank: int, core: EngineCore[Entry], dispatcher: Dispatcher, agree: Agree,
                 silence_s: float, on_closed: Optional[Callable[[int], None]] = None) -> None:
        self.channel = channel
        self.rank = rank
        self.core = core
        self.dispatcher = dispatcher
        self.agree = agree
        self.silence_s = silence_s
        self.on_closed = on_closed
        self.lock = threading.Condition()  # guards `core`; the cycle thread waits on it
        self.heard = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="horovod_api-reader", daemon=True)
        self._runner = threading.Thread(target=self._cycles, name="horovod_api-engine", daemon=True)

    def start(self) -> None:
        """Say hello to the coordinator and start the reader and cycle threads."""
        self.channel.send({"type": "hello", "rank": self.rank})
        self._reader.start()
        self._runner.start()

    # --- the script's side -----------------------------------------------------------------------------------
    @property
    def broken(self) -> Optional[str]:
        """Why nothing more can run, or None."""
        return self.core.broken

    def submit(self, entries: List[Entry]) -> None:
        """Register this rank's parts and ask the coordinator for those the cycle does not look up; ValueError
        (Horovod's) for a name still in flight, HorovodInternalError once the engine broke."""
        with self.lock:
            submitted = self.core.submit(entries, time.monotonic())
            if submitted.wake:
                self.lock.notify()
        if submitted.to_rank0:
            self._to_coordinator(submitted.to_rank0)

    def awaited(self, change: int) -> None:
        """A script thread starts (+1) or stops (-1) waiting for a result: the cycle that would wait out
        HOROVOD_CYCLE_TIME for more requests runs at once."""
        with self.lock:
            self.core.awaited(change)
            if not self.core.idle:
                self.lock.notify()

    def trouble(self) -> Optional[str]:
        """Why what waits can no longer complete: the engine broke, or the coordinator went silent."""
        if self.core.broken is not None:
            return self.core.broken
        if self.silence_s > 0 and time.monotonic() - self.heard > self.silence_s:
            self._lose(f"{SHUT_DOWN} (no word from rank 0, which coordinates the collectives, for "
                       f"{self.silence_s:g} s: it stopped or its host is unreachable)")
            return self.core.broken
        return None

    def counts(self) -> Counts:
        """What this rank's cycles did so far (a copy)."""
        with self.lock:
            return replace(self.core.counts)

    def finished(self, gen: int) -> bool:
        """Generation `gen` is shut down here and nothing of it remains to run."""
        with self.lock:
            return self.core.finished(gen)

    def send(self, message: Dict) -> None:
        """A control message to the coordinator (leave, bye); nothing if it is gone."""
        try:
            self.channel.send(message)
        except OSError:
            pass

    def _to_coordinator(self, requests: List[Request]) -> None:
        try:
            self.channel.send(requests_message(requests))
        except OSError:
            self._lose(GONE)

    # --- inputs from rank 0 ------------------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            message = self.channel.recv()
            if message is None:
                self._lose(GONE)
                return
            self.heard = time.monotonic()
            if message["type"] == "closed":
                self._close(int(message["gen"]))
            elif message["type"] == "gone":
                self._lose(f"{SHUT_DOWN} (rank {message['rank']} exited or lost its connection to rank 0)")
            elif message["type"] == "responses":
                self._receive(read_responses(message))

    def _receive(self, responses: List[Response]) -> None:
        failures: List[Failure[Entry]] = []
        with self.lock:
            for response in responses:
                failures += self.core.receive(response)
            self.lock.notify()
        fail(failures)

    def _close(self, gen: int) -> None:
        with self.lock:
            failures = self.core.close(gen)
        fail(failures)
        if self.on_closed is not None:
            self.on_closed(gen)

    def _lose(self, message: str) -> None:
        with self.lock:
            failures = self.core.lose(message)
            self.lock.notify_all()
        fail(failures)

    # --- the cycle thread --------------------------------------------------------------------------------------
    def _cycles(self) -> None:
        # The collectives run outside autograd, as Horovod's C++ operations do (grad mode is per thread): a fused
        # buffer filled from tensors that require grad (a grouped allreduce under autograd) is data, not a graph.
        torch.set_grad_enabled(False)
        try:
            while self._cycle():
                pass
        finally:  # the engine broke, or gave up waiting: nothing is under way any more
            with self.lock:
                end = self.core.end(time.monotonic())
            fail(end.failures)

    def _cycle(self) -> bool:
        """One cycle: False once the engine broke."""
        start = self._next_start()
        if start is None:
            return False
        if start.to_rank0:
            self._to_coordinator(start.to_rank0)
        try:
            settled = self._agreement(start)
            if settled is None:
                return False
            agreed, ahead = settled
            with self.lock:
                runs = self.core.settle(agreed)
            for run in runs:
                self._run(run, ahead)
        except Exception as exc:  # a collective of torch.distributed failed: its groups are unusable now
            self._lost_in_collective(exc)
            return False
        with self.lock:
            end = self.core.end(time.monotonic())
        fail(end.failures)
        if end.to_rank0:
            self._to_coordinator(end.to_rank0)
        return True

    def _next_start(self) -> Optional[CycleStart[Entry]]:
        """Wait until the machine says a cycle is due, and start it (None once the engine broke)."""
        with self.lock:
            while True:
                now = time.monotonic()
                at = self.core.due(now)
                if at is not None and at <= now:
                    return self.core.start(now)
                self.lock.wait(None if at is None else at - now)

    def _agreement(self, start: CycleStart[Entry]) -> Optional[Tuple[List[int], List[execute.Started]]]:
        """The agreed words (this rank's own with the cache off) and the guess's sums started ahead; None once the
        engine broke while it waited."""
        if not start.agree:
            return start.words, []
        ahead: List[execute.Started] = []
        if start.guess is not None:
            ahead = self.dispatcher.start_guess(start)
            if not all(execute.wait(one.work, self._stopped) for one in ahead):
                return None
            with self.lock:
                agreed = self.core.after_guess(ahead[0].flag())
            if agreed is not None:
                self.dispatcher.mark_cycle("CYCLE_GUESSED", [n for r in start.guess.fused for n in r.names])
                return agreed, ahead
        words = self.agree(start.words, self._stopped)
        if words is None:
            return None
        self.dispatcher.mark_cycle("CYCLE_AGREED")
        return words, ahead

    def _run(self, run: Run[Entry], ahead: List[execute.Started]) -> None:
        with self.lock:
            refusal = self.core.refusal(run)
        if refusal is not None:
            fail([Failure(part, refusal) for part in run.parts if part is not None])
        else:
            self.dispatcher.run(run, ahead[run.ahead] if run.ahead is not None else None)
        with self.lock:
            self.core.ran(run)

    def _stopped(self) -> bool:
        return self.core.broken is not None

    def _lost_in_collective(self, exc: Exception) -> None:
        """A collective failed, most often on a peer whose process ended (Gloo: "Connection reset by peer"): with
        the cache on, rank 0's word that a rank is gone names it, and usually comes within moments; wait for it
        before failing with the collective's own error."""
        deadline = time.monotonic() + (NOTICE_WAIT_S if self.core.agrees else 0.0)
        with self.lock:
            while self.core.broken is None and time.monotonic() < deadline:
                self.lock.wait(deadline - time.monotonic())
        self._lose(f"{SHUT_DOWN} ({type(exc).__name__}: {exc})")

