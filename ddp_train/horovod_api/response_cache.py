"""Horovod's response cache (horovod/common/response_cache.cc): the responses of collectives negotiated before,
kept on every rank in the same order, each at a numbered bit, so that a collective asked for again is agreed on by
one bitwise AND of the ranks' bit vectors instead of a request to rank 0.

Every rank changes its cache only when it runs a response, and every rank runs the same responses in the same order,
so the caches (names, bits, least-recently-used order) are the same on every rank at every cycle. What a rank keeps
for itself is the signature of its own request (shape, type, device, op, factors, splits): a request whose name is
cached with another signature invalidates the entry on every rank, and goes through rank 0 again. Pure: no sockets,
no threads, no torch."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

from .messages import ALLGATHER, ALLREDUCE, ALLTOALL, Request, Response

#: Horovod 0.28.1's default HOROVOD_CACHE_CAPACITY
CAPACITY = 1024
#: the kinds Horovod caches (controller.cc: allreduce, allgather, adasum, alltoall), of the global process set
CACHED_KINDS = (ALLREDUCE, ALLGATHER, ALLTOALL)

Signature = Tuple
Key = Tuple[int, str]  # (generation, name)


def cacheable(request: Request) -> bool:
    """Whether a request may be answered from the cache: a single tensor of a cached kind in the global set."""
    return request.ps == 0 and request.kind in CACHED_KINDS and not request.group


def signature(request: Request) -> Signature:
    """What of one rank's request its cached response depends on (compared, never hashed)."""
    return (request.kind, request.dtype, request.shape, request.device, request.op, request.prescale,
            request.postscale, request.splits)


@dataclass
class CacheEntry:
    """One cached collective: its response for this one tensor, and this rank's signature when it was negotiated
    (None where this rank ran it without a tensor of its own)."""

    key: Key
    bit: int
    response: Response
    mine: Optional[Signature]
    fusion: Tuple = ()  # an allreduce's fusion key and bytes, kept so that a cycle fuses without measuring again
    nbytes: int = 0


def split(response: Response) -> List[Response]:
    """A response of several tensors (a fused allreduce) as one response per tensor, as Horovod caches them."""
    if len(response.names) == 1:
        return [response]
    return [replace(response, names=[name], shapes=[response.shapes[i]],
                    sizes=[response.sizes[i]] if response.sizes else [],
                    splits=list(response.splits)) for i, name in enumerate(response.names)]


class ResponseCache:
    """Least-recently-used responses at stable bit positions; a freed bit is reused lowest first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.entries: "OrderedDict[Key, CacheEntry]" = OrderedDict()  # least recently used first
        self.by_bit: Dict[int, CacheEntry] = {}
        self.free_bits: List[int] = []
        self.bits = 0  # bit positions handed out so far: the length of the agreement's vectors
        self.version = 0  # changes whenever an entry is added, replaced or erased

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, request: Request) -> Tuple[str, int]:
        """("hit", bit), ("invalid", bit) for a cached name asked with another signature, or ("miss", -1)."""
        entry = self.entries.get((request.gen, request.name))
        if entry is None:
            return "miss", -1
        return ("hit" if entry.mine == signature(request) else "invalid"), entry.bit

    def use(self, bit: int) -> CacheEntry:
        """The entry at `bit`, now the most recently used (every rank runs it: the order stays common)."""
        entry = self.by_bit[bit]
        self.entries.move_to_end(entry.key)
        return entry

    def erase(self, bit: int) -> Optional[Key]:
        """Forget the entry at `bit` (invalidated by some rank); its key."""
        entry = self.by_bit.pop(bit, None)
        if entry is None:
            return None
        del self.entries[entry.key]
        self.version += 1
        self.free_bits.append(bit)
        self.free_bits.sort()
        return entry.key

    def put(self, response: Response, mine: Optional[Signature], fusion: Tuple = (), nbytes: int = 0
            ) -> Optional[Key]:
        """Cache a one-tensor response this rank just ran; the key of the entry evicted for it, if the cache was
        full."""
        if self.capacity <= 0:
            return None
        self.version += 1
        key = (response.gen, response.names[0])
        entry = self.entries.get(key)
        if entry is not None:  # asked again with the same name: the newest response, at the same bit
            entry.response, entry.mine, entry.fusion, entry.nbytes = response, mine, fusion, nbytes
            self.entries.move_to_end(key)
            return None
        evicted = None
        if len(self.entries) >= self.capacity:
            oldest = next(iter(self.entries.values()))
            evicted = self.erase(oldest.bit)
        if self.free_bits:
            bit = self.free_bits.pop(0)
        else:
            bit, self.bits = self.bits, self.bits + 1
        entry = CacheEntry(key, bit, response, mine, fusion, nbytes)
        self.entries[key] = entry
        self.by_bit[bit] = entry
        return evicted
