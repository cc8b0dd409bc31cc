"""One rank's side of Horovod's cache agreement (controller.cc's CoordinateCacheAndState): each cycle every rank
contributes one small vector of 64-bit words to one bitwise-AND allreduce, and all ranks read the same answer:

    word 0        flags, each cleared by a rank it applies to (AND of cleared = OR): bit 0, "a rank has joined"
    word 1        how many of rank 0's responses, after the last one run, this rank holds: 2**k - 1 (AND = the fewest)
    words 2..     the cached collectives this rank has asked for (AND = asked for on every rank)
    the rest      the cached entries this rank invalidates, inverted (AND of inverted = OR)

so a cycle costs rank 0 nothing per tensor, and every rank the same small vector, whatever the number of ranks. The
cached collectives agreed run first, in bit order, fused as rank 0 fuses; then rank 0's responses that every rank
holds, in their order; then what was invalidated, evicted, or asked for while a rank has joined goes to rank 0 as an
ordinary request. Everything a cycle decides is the same on every rank, so the caches stay the same.

A training step asks for the same collectives step after step, so each cycle also names a guess, the same on every
rank: the small floating-point sums the last cycle agreed on. The engine reduces them first, every rank with its
tensors (zeros for what it has not asked for), and one more number: 1 where this rank's vector is the one the guess
expects (those hits, nothing else to agree on), 0 otherwise. Where that number sums to the number of ranks, every
rank's vector was the expected one, so the reduced vector is known without the agreement's collective, and the sums
are the cycle's: one round of communication, as DDP's one allreduce. Otherwise the agreement runs as usual, and the
guessed sums stand only if it agreed on exactly the guess. Pure: no sockets, no threads, no torch (the engine runs
the collectives; tests and the benchmark reduce with `band`)."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .dtypes import AVERAGE, SUM
from .messages import ALLREDUCE, JOIN, Request, Response
from .negotiation import fuse_measured, fusion_bytes, fusion_key
from .response_cache import CACHED_KINDS, ResponseCache, cacheable, signature, split

WORD = 64
ALL_ONES = (1 << WORD) - 1
JOINED = 1
#: rank 0's responses one cycle can agree on (the width of word 1)
RESPONSES_PER_CYCLE = WORD
HEADER_WORDS = 2
#: the most bytes a guess reduces: small allreduces, whose time is latency (a wrong guess wastes no more than this)
GUESS_BYTES = 2 ** 20
#: what a guess reduces: sums in types that count every rank exactly
GUESS_OPS = (AVERAGE, SUM)
GUESS_TYPES = ("HOROVOD_FLOAT32", "HOROVOD_FLOAT64")


def words_for(bits: int) -> int:
    """64-bit words for `bits` bit positions."""
    return (bits + WORD - 1) // WORD


def band(vectors: Sequence[Sequence[int]]) -> List[int]:
    """The agreement's reduction (what the allreduce computes), for simulations and tests."""
    return [functools.reduce(operator.and_, column) for column in zip(*vectors, strict=True)]


def to_signed(words: Sequence[int]) -> List[int]:
    """Unsigned 64-bit words as int64 values (a tensor's)."""
    return [w - (1 << WORD) if w >= 1 << (WORD - 1) else w for w in words]


def to_unsigned(words: Sequence[int]) -> List[int]:
    """int64 values (a tensor's) as the unsigned 64-bit words they hold."""
    return [w & ALL_ONES for w in words]


def _set_bits(words: Sequence[int]) -> List[int]:
    bits = []
    for index, word in enumerate(words):
        while word:
            low = word & -word
            bits.append(index * WORD + low.bit_length() - 1)
            word ^= low
    return bits


@dataclass
class Agreement:
    """What one cycle decided, the same on every rank."""

    hits: List[int]  # cached collectives every rank asked for, in bit order
    invalid: List[int]  # cached entries some rank invalidated
    responses: int  # rank 0's responses every rank holds, to run now
    joined: bool  # some rank has joined


def pack(joined: bool, held: int, hits: Sequence[int], invalid: Sequence[int], bits: int) -> List[int]:
    """One rank's vector (unsigned words)."""
    n = words_for(bits)
    hit_words, invalid_words = [0] * n, [0] * n
    for bit in hits:
        hit_words[bit // WORD] |= 1 << (bit % WORD)
    for bit in invalid:
        invalid_words[bit // WORD] |= 1 << (bit % WORD)
    flags = ALL_ONES & ~JOINED if joined else ALL_ONES
    held = min(held, RESPONSES_PER_CYCLE)
    return [flags, (1 << held) - 1, *hit_words, *[ALL_ONES ^ w for w in invalid_words]]


def unpack(words: Sequence[int], bits: int) -> Agreement:
    """The reduced vector read back."""
    n = words_for(bits)
    hit_words = words[HEADER_WORDS:HEADER_WORDS + n]
    invalid_words = [ALL_ONES ^ w for w in words[HEADER_WORDS + n:HEADER_WORDS + 2 * n]]
    invalid = _set_bits(invalid_words)
    dropped = set(invalid)
    return Agreement([b for b in _set_bits(hit_words) if b not in dropped], invalid, words[1].bit_length(),
                     not words[0] & JOINED)


@dataclass
class Plan:
    """What a rank runs after a cycle: the cached responses agreed (`hits`: allreduces fused as rank 0 fuses them,
    then the others, in bit order), then rank 0's responses, in order."""

    cached: List[Response] = field(default_factory=list)
    responses: List[Response] = field(default_factory=list)
    hits: Tuple[int, ...] = ()

    def tensors(self) -> int:
        """How many tensors the plan runs."""
        return sum(len(r.names) for r in self.cached) + sum(len(r.names) for r in self.responses)


@dataclass(frozen=True)
class Guess:
    """The cached allreduces a cycle reduces before its agreement (`fused`, on CPU, as the cycle that agreed on
    `hits` fused them), valid while the cache is at `version`; `expected`: the reduced vector when every rank's
    vector is the one the guess expects. The same object cycle after cycle while the step repeats."""

    hits: Tuple[int, ...]
    fused: Tuple[Response, ...]
    version: int
    expected: Tuple[int, ...]
    bits: Tuple[int, ...] = ()  # the bit of each name of `fused`, in order


class RankCycle:
    """One rank's requests between cycles: asked and not yet looked up, waiting for agreement as cache hits, and rank
    0's responses received and not yet run. `stall_s` (> 0): a hit waiting longer is invalidated, so that it goes
    to rank 0, whose stall inspector names the ranks that have not asked (Horovod's InvalidateStalledCachedTensors).
    """

    def __init__(self, capacity: int, stall_s: float = 0.0, fusion_threshold: int = 128 * 2 ** 20) -> None:
        self.cache = ResponseCache(capacity)
        self.stall_s = stall_s
        self.fusion_threshold = fusion_threshold
        self.incoming: List[Request] = []
        self.waiting: Dict[int, Tuple[Request, float]] = {}  # bit -> this rank's request answered from the cache, when
        self.fused: Dict[Tuple, List[Response]] = {}  # the cached allreduces of a set of hits, fused (per version)
        self.fused_version = -1
        self.invalidating: List[Request] = []  # asked with another signature: to rank 0 once every rank erased it
        self.outgoing: List[Request] = []  # to rank 0 after this cycle
        self.received: Dict[int, Response] = {}  # rank 0's responses by the order they arrived in, from 1
        self.arrived = 0
        self.last_run = 0  # the last of rank 0's responses run (they are numbered from 1)
        self.joined = False  # this rank has joined and its join has not completed
        self.others_joined = False  # a rank had joined at the last cycle
        self.last: Optional[Guess] = None  # what the last cycle agreed on, where it can be guessed again

    # --- between cycles ----------------------------------------------------------------------------------------
    def ask(self, request: Request) -> bool:
        """A request of this rank: True if the cycle decides where it goes, False if it goes to rank 0 now."""
        if self.cache.capacity <= 0 or not cacheable(request):
            return False
        self.incoming.append(request)
        return True

    def hold(self, response: Response) -> None:
        """A response of rank 0, received. Counted in the order received, which is rank 0's order: with the cache on
        every numbered response reaches every rank; with it off, each rank gets its own (their numbers skip the
        others')."""
        self.arrived += 1
        self.received[self.arrived] = response

    def held(self) -> int:
        """How many of rank 0's responses, from the next to run, are here."""
        count = 0
        while self.last_run + count + 1 in self.received:
            count += 1
        return count

    def has_work(self) -> bool:
        """Whether this rank needs a cycle: requests to look up or waiting, responses to run, or a join."""
        return bool(self.incoming or self.waiting or self.joined or self.last_run + 1 in self.received)

    def forget(self, keys: Sequence[tuple]) -> None:
        """Requests that failed here (their generation ended): no longer asked for."""
        dropped = set(keys)
        for bit, (request, _) in list(self.waiting.items()):
            if (request.gen, request.ps, request.name) in dropped:
                del self.waiting[bit]

    # --- a cycle -----------------------------------------------------------------------------------------------
    def vector(self, now: float) -> List[int]:
        """Look up what was asked since the last cycle, and this rank's vector for the agreement."""
        invalid: List[int] = []
        joined = self.joined or self.others_joined
        for request in self.incoming:
            if joined:
                self.outgoing.append(request)  # while a rank has joined, rank 0 adds its zeros: no cache
                continue
            state, bit = self.cache.lookup(request)
            if state == "hit":
                self.waiting[bit] = (request, now)
            elif state == "invalid":
                invalid.append(bit)
                self.invalidating.append(request)
            else:
                self.outgoing.append(request)
        self.incoming = []
        if self.stall_s > 0:
            invalid.extend(bit for bit, (_, started) in self.waiting.items() if now - started > self.stall_s)
        hits = [] if self.joined else list(self.waiting)
        return pack(self.joined, self.held(), hits, invalid, self.cache.bits)

    def settle(self, words: Sequence[int]) -> Plan:
        """Read the reduced vector: erase what some rank invalidated, take the agreed responses from the cache and
        rank 0's responses every rank holds."""
        agreement = unpack(words, self.cache.bits)
        self.others_joined = agreement.joined
        for bit in agreement.invalid:
            self.cache.erase(bit)
            self._resend(bit)
        hits = tuple(agreement.hits)
        plan = Plan(hits=hits)
        if self.fused_version != self.cache.version:
            self.fused, self.fused_version = {}, self.cache.version
        fused = self.fused.get(hits)
        fusable = []
        nbytes = 0
        for bit in hits:
            entry = self.cache.use(bit)
            nbytes += entry.nbytes
            if entry.response.kind != ALLREDUCE:
                plan.cached.append(entry.response)
            elif fused is None:
                fusable.append((entry.response, entry.fusion, entry.nbytes))
            self.waiting.pop(bit, None)
        if fused is None:  # a training step agrees on the same hits step after step: fuse them once
            fused = self.fused[hits] = fuse_measured(fusable, self.fusion_threshold)
        last, self.last = self.last, None
        if hits and not plan.cached and not agreement.joined and 0 < nbytes <= GUESS_BYTES and all(
                r.device < 0 and r.op in GUESS_OPS and r.dtype in GUESS_TYPES for r in fused):
            same = last is not None and last.hits == hits and last.version == self.cache.version
            self.last = last if same else self._guess(hits, fused)
        plan.cached[:0] = fused
        if agreement.joined:
            for bit in list(self.waiting):
                self._resend(bit)
        for _ in range(agreement.responses):
            self.last_run += 1
            plan.responses.append(self.received.pop(self.last_run))
        self.outgoing.extend(self.invalidating)
        self.invalidating = []
        return plan

    def _guess(self, hits: Tuple[int, ...], fused: List[Response]) -> Guess:
        bit_of = {self.cache.by_bit[bit].response.names[0]: bit for bit in hits}
        bits = tuple(bit_of[name] for response in fused for name in response.names)
        expected = tuple(pack(False, 0, hits, [], self.cache.bits))
        return Guess(hits, tuple(fused), self.cache.version, expected, bits)

    def guess(self) -> Optional[Guess]:
        """What this cycle reduces beside its agreement: the last cycle's hits, if the cache has not changed since
        (the same on every rank: it follows from what every rank agreed and ran)."""
        last = self.last
        return last if last is not None and last.version == self.cache.version else None

    def ran(self, response: Response, mine: Dict[str, Optional[Request]]) -> None:
        """A response of rank 0 ran here: cache it (one entry per tensor) where Horovod would; `mine` is this rank's
        request of each name (None where it had none)."""
        if response.kind == JOIN:
            self.joined = False
        if self.cache.capacity <= 0 or response.ps != 0 or response.joined or not response.names:
            return
        if response.kind not in CACHED_KINDS:
            return
        for one in split(response):
            request = mine.get(one.names[0])
            if request is not None and request.group:
                continue
            fusion, nbytes = (fusion_key(one), fusion_bytes(one)) if one.kind == ALLREDUCE else ((), 0)
            evicted = self.cache.put(one, signature(request) if request is not None else None, fusion, nbytes)
            if evicted is not None:
                for bit, (waiting, _) in list(self.waiting.items()):
                    if (waiting.gen, waiting.name) == evicted:
                        del self.waiting[bit]
                        self.outgoing.append(waiting)

    def take_outgoing(self) -> List[Request]:
        """The requests that go to rank 0 now."""
        out, self.outgoing = self.outgoing, []
        return out

    def _resend(self, bit: int) -> None:
        waiting = self.waiting.pop(bit, None)
        if waiting is not None:
            self.outgoing.append(waiting[0])
