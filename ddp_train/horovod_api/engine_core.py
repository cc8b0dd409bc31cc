"""Each rank's engine as a state machine: what the script asked for, what rank 0 answered, and what this rank runs
next, with no threads, sockets, clock or torch of its own (the shell, engine.py, runs it under one lock and says what
time it is). Horovod's background loop (operations.cc's RunLoopOnce) decides the same things; here they are plain
methods, so that every ordering of events can be replayed from a made-up stream.

Inputs: the parts the script submits (`submit`), rank 0's responses (`receive`), a script thread that starts or stops
waiting (`awaited`), a generation shut down (`close`), a lost rank or a broken engine (`lose`), and per cycle the
agreed words (`settle`) or the guess's count (`after_guess`). Outputs: the requests to send rank 0, the cycle to
start (`CycleStart`: this rank's words, the guess and what this rank puts into it), the collectives to run in order
(`Run`, each with this rank's parts), and the parts that failed (`Failure`).

One machine for both modes. With the response cache on (capacity > 0) the ranks agree once a cycle (cycle.py); with
it off every request goes to rank 0, which sends each rank its own responses in its order, and a cycle runs the ones
received, with this rank's own words as the agreement (`CycleStart.agree` False: nothing to agree on).

A cycle under way: from the moment the guess's sums start (`start`) until the cycle settles, the guessed parts stay
in the table but are `running`: a shutdown that comes meanwhile does not fail them, because the other ranks may have
completed that very collective and left (the race of a rank that leaves while a slower one hands out results). At
`settle` the parts of what runs leave the table: what arrives later cannot fail them. What the cycle did not run
fails once it ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, Generic, List, Optional, Protocol, Sequence, Set, Tuple, TypeVar

from .cycle import Guess, RankCycle
from .exceptions import DUPLICATE_NAME, SHUT_DOWN, HorovodInternalError
from .messages import JOIN, Request, Response

Key = Tuple[int, int, str]  # (generation, process set, name)
#: with the cache on, the longest a cycle waits for a burst of requests to pause, in cycle times
LONGEST_BURST = 20


class Part(Protocol):
    """This rank's part in one collective, as the machine sees it: its request (the rest is the shell's)."""

    @property
    def request(self) -> Request: ...


P = TypeVar("P", bound=Part)


def key_of(request: Request) -> Key:
    """Where a request's part is kept."""
    return request.gen, request.ps, request.name


@dataclass(frozen=True)
class Failure(Generic[P]):
    """A part that can no longer complete, and Horovod's error for it."""

    part: P
    message: str


@dataclass(frozen=True)
class Submitted:
    """What a submission asks of the shell: requests for rank 0 now, and whether to wake an idle cycle thread."""

    to_rank0: List[Request]
    wake: bool


@dataclass(frozen=True)
class CycleStart(Generic[P]):
    """A cycle begins: this rank's words, the requests rank 0 gets now, whether the ranks agree (cache on), and the
    guess this rank reduces first with, per fused response, its parts (None where it puts in zeros) and whether its
    words are the ones the guess expects (`matched`)."""

    words: List[int]
    to_rank0: List[Request]
    agree: bool
    guess: Optional[Guess] = None
    guess_parts: List[List[Optional[P]]] = field(default_factory=list)
    matched: bool = False


@dataclass(frozen=True)
class Run(Generic[P]):
    """One collective the cycle runs, in order: the response, this rank's parts (None for a name it holds nothing
    of), the index of the guess's sum it finishes (None: run it whole), and whether it is one of rank 0's
    responses (counted as run, and cached, once it ran)."""

    response: Response
    parts: List[Optional[P]]
    ahead: Optional[int]
    from_rank0: bool


@dataclass
class Counts:
    """What this rank's cycles did so far: cycles run, cycles whose words the agreement's collective reduced, and
    cycles the guess answered without it (one round: the guess's sums)."""

    cycles: int = 0
    agreed: int = 0
    guessed: int = 0


@dataclass(frozen=True)
class CycleEnd(Generic[P]):
    """A cycle ended: the requests rank 0 gets now, and what failed meanwhile that no cycle will run."""

    to_rank0: List[Request]
    failures: List[Failure[P]]


class EngineCore(Generic[P]):
    """One rank's engine state. `cycle`: its side of the cache (capacity 0: cache off); `size`: the number of ranks;
    `cycle_time_s`: HOROVOD_CYCLE_TIME."""

    def __init__(self, cycle: RankCycle, size: int, cycle_time_s: float) -> None:
        self.cycle = cycle
        self.size = size
        self.cycle_time_s = cycle_time_s
        self.agrees = cycle.cache.capacity > 0
        self.table: Dict[Key, P] = {}
        self.broken: Optional[str] = None
        self.closed: Set[int] = set()  # generations shut down (by any rank's hvd.shutdown())
        self.unrun = 0  # rank 0's responses received and not yet run
        self.waiting_threads = 0  # the script's threads waiting for a result (synchronize)
        self.last_ask = 0.0  # when the script last asked for a collective a cycle looks up
        self.idle = False  # the cycle thread waits for an input (only then does a submission wake it)
        self.gathering_since: Optional[float] = None  # when the cycle thread saw work and began to gather a burst
        self.rest_until: Optional[float] = None  # after a cycle that ran nothing: the next one waits a cycle time
        self.guess: Optional[Guess] = None  # the guess of the cycle under way
        self.running: AbstractSet[Key] = frozenset()  # its parts: a shutdown meanwhile does not fail them
        self._guessed: Tuple[Optional[Guess], Tuple[Key, ...], AbstractSet[Key]] = (None, (), frozenset())
        self.answered = False  # the guess answered the cycle under way
        self.ran_any = False
        self.counts = Counts()

    # --- the script's side -----------------------------------------------------------------------------------
    def submit(self, parts: Sequence[P], now: float) -> Submitted:
        """Keep this rank's parts; the requests that go to rank 0 now. HorovodInternalError once the engine broke,
        ValueError (Horovod's) for a name still in flight; nothing is kept then."""
        if self.broken is not None:
            raise HorovodInternalError(self.broken)
        keys = [key_of(p.request) for p in parts]
        if len(set(keys)) < len(keys) or not self.table.keys().isdisjoint(keys):
            raise ValueError(DUPLICATE_NAME)
        self.table.update(zip(keys, parts, strict=True))
        ask = self.cycle.ask
        to_rank0 = [p.request for p in parts if not ask(p.request)]
        looked_up = len(to_rank0) < len(parts)
        joins = self.agrees and any(p.request.kind == JOIN for p in parts)
        if joins:
            self.cycle.joined = True  # the other ranks' cached collectives go to rank 0, which adds its zeros
        if looked_up:
            self.last_ask = now
        return Submitted(to_rank0, self.idle and (looked_up or joins))

    def awaited(self, change: int) -> None:
        """A script thread starts (+1) or stops (-1) waiting for a result: the cycle gathering a burst runs now."""
        self.waiting_threads += change
        self.rest_until = None

    def finished(self, gen: int) -> bool:
        """Generation `gen` is shut down here and nothing of rank 0's remains to run."""
        return gen in self.closed and self.unrun == 0

    # --- what rank 0 says ------------------------------------------------------------------------------------
    def receive(self, response: Response) -> List[Failure[P]]:
        """A response of rank 0: an error (unnumbered) fails what it names at once; a numbered one waits for the
        cycle that runs it."""
        if response.seq == 0:
            return [Failure(p, response.error or SHUT_DOWN) for p in self._take(response) if p is not None]
        self.unrun += 1
        self.cycle.hold(response)
        self.rest_until = None
        return []

    def close(self, gen: int) -> List[Failure[P]]:
        """A generation was shut down (by any rank): what this rank waits for in it fails, but for what the cycle
        under way reduces. Its responses already received still run (the other ranks take part in them)."""
        self.closed.add(gen)
        return self.stranded()

    def lose(self, message: str) -> List[Failure[P]]:
        """Nothing more can run (a rank was lost, rank 0 is gone, a collective failed): everything that waits fails,
        but for what the cycle under way reduces, and everything asked from now on."""
        if self.broken is None:
            self.broken = message
        return self.stranded()

    def stranded(self) -> List[Failure[P]]:
        """Take out what can no longer run: everything once the engine broke, else what waits in a generation that
        was shut down; never what the cycle under way reduces."""
        keys = [key for key in self.table if (self.broken is not None or key[0] in self.closed)
                and key not in self.running]
        failed = [self.table.pop(key) for key in keys]
        self.cycle.forget(keys)
        return [Failure(part, self.broken or SHUT_DOWN) for part in failed]

    # --- cycles --------------------------------------------------------------------------------------------------
    def due(self, now: float) -> Optional[float]:
        """When the next cycle starts: None while there is nothing to do (wait for an input), else a time (at or
        before `now`: at once). What the script asks for in one burst (a backward pass) is agreed on together: the
        cycle runs once a script thread waits for a result, once the script has asked for nothing for a cycle time
        (the allreduces overlap the compute that follows), or at the latest LONGEST_BURST cycle times after the
        burst began; rank 0's responses run at once; a broken engine ends at once."""
        if self.broken is not None:
            return now
        if self.rest_until is not None:
            if now < self.rest_until:
                return self.rest_until
            self.rest_until = None
        self.idle = not self.cycle.has_work()
        if self.idle:
            return None
        if self.waiting_threads or self.cycle.held():
            return now
        if self.gathering_since is None:
            self.gathering_since = now
        return min(self.last_ask + self.cycle_time_s, self.gathering_since + LONGEST_BURST * self.cycle_time_s)

    def start(self, now: float) -> Optional[CycleStart[P]]:
        """Begin a cycle: look up what was asked, this rank's words and the guess (None once the engine broke)."""
        if self.broken is not None:
            return None
        self.idle, self.gathering_since, self.rest_until = False, None, None
        words = self.cycle.vector(now)
        to_rank0 = self.cycle.take_outgoing()
        self.guess = self.cycle.guess() if self.agrees else None
        if self.guess is None:
            return CycleStart(words, to_rank0, self.agrees)
        guess = self.guess
        if guess is not self._guessed[0]:  # a step repeats the same guess: its keys are worked out once
            keys = tuple((r.gen, r.ps, name) for r in guess.fused for name in r.names)
            self._guessed = (guess, keys, frozenset(keys))
        _, keys, self.running = self._guessed
        waiting, table = self.cycle.waiting, self.table
        mine = [table.get(key) if bit in waiting else None for key, bit in zip(keys, guess.bits, strict=True)]
        parts, at = [], 0
        for response in guess.fused:
            parts.append(mine[at:at + len(response.names)])
            at += len(response.names)
        return CycleStart(words, to_rank0, True, guess, parts, tuple(words) == guess.expected)

    def after_guess(self, count: float) -> Optional[List[int]]:
        """The guess's sums are complete, `count` ranks' words the expected ones: where that is every rank, the
        agreed words without the agreement's collective; else None (the agreement runs)."""
        assert self.guess is not None
        self.answered = count == self.size
        return list(self.guess.expected) if self.answered else None

    def settle(self, agreed: Sequence[int]) -> List[Run[P]]:
        """The agreed words read: what this cycle runs, in order, each with this rank's parts (taken out of the
        table: from now on only the cycle hands them their results). The guess's sums stand where the cycle agreed
        on exactly what was guessed."""
        plan = self.cycle.settle(agreed)
        stands = self.guess is not None and plan.hits == self.guess.hits
        self.counts.cycles += 1
        self.counts.guessed += int(self.answered)
        self.counts.agreed += int(self.agrees and not self.answered)
        self.answered = False
        runs = [Run(r, self._take(r), i if stands else None, False) for i, r in enumerate(plan.cached)]
        runs += [Run(r, self._take(r), None, True) for r in plan.responses]
        self.running = frozenset()
        self.ran_any = bool(runs)
        return runs

    def refusal(self, run: Run[P]) -> Optional[str]:
        """Why `run` is not to run here: the engine broke (a sum started ahead is complete on every rank, and
        finishes)."""
        return self.broken if run.ahead is None else None

    def ran(self, run: Run[P]) -> None:
        """A collective of the cycle ran here: rank 0's are counted and cached where Horovod caches them."""
        if not run.from_rank0:
            return
        self.unrun -= 1
        self.cycle.ran(run.response, {name: (p.request if p is not None else None)
                                      for name, p in zip(run.response.names, run.parts, strict=True)})

    def end(self, now: float) -> CycleEnd[P]:
        """The cycle ended (or gave up): what goes to rank 0 now, and what failed meanwhile. A cycle that ran
        nothing (not every rank asked yet) makes the next one wait a cycle time, or an input."""
        self.guess, self.running, self.answered = None, frozenset(), False
        if not self.ran_any:
            self.rest_until = now + self.cycle_time_s
        self.ran_any = False
        failures = self.stranded() if self.closed or self.broken is not None else []
        return CycleEnd(self.cycle.take_outgoing(), failures)

    def _take(self, response: Response) -> List[Optional[P]]:
        return [self.table.pop((response.gen, response.ps, name), None) for name in response.names]
