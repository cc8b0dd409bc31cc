"""The one way a collective is asked for, and Horovod's poll and synchronize.

`submit` is this rank's part in any collective, with tensors or without (barrier, join, process set changes): the
check that this rank belongs to the process set, a handle numbered as Horovod numbers them, the requests handed to
the engine, and the handle taken back if the engine refuses them (a name in flight, a broken engine), so that a
refused call leaves nothing behind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from . import runtime
from .dispatch import Entry
from .handles import Handle
from .messages import ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, REDUCESCATTER

#: how Horovod's messages name each kind of collective
_KIND_TEXT = {ALLREDUCE: "Allreduce", ALLGATHER: "Allgather", BROADCAST: "Broadcast", ALLTOALL: "Alltoall",
              REDUCESCATTER: "Reducescatter", BARRIER: "Barrier"}

#: a handle's result from its parts' results, in order
Combine = Callable[[List[Any]], Any]


def single(results: List[Any]) -> Any:
    """The result of a call with one part."""
    return results[0]


@dataclass(frozen=True)
class Asker:
    """Who asks for a collective: this rank, in this generation, of this process set, under this handle number (an
    unnamed collective is named after it)."""

    rank: int
    gen: int
    ps: int
    number: int


def submit(kind: str, set_id: Optional[int], parts: int, combine: Combine,
           entries: Callable[[Asker, Handle], List[Entry]]) -> int:
    """Ask for a collective of process set `set_id` with `parts` parts (one per tensor), whose entries `entries`
    builds: the handle's number. ValueError (Horovod's) when this rank is not in the set or a name is in flight."""
    state = runtime.active()
    world = state.world
    assert world is not None
    rank = world.topology.rank
    ranks = runtime.members(set_id)
    text = _KIND_TEXT.get(kind, kind)
    if ranks is None:
        raise ValueError(f"{text}: Process set provided does not exist, or has not been registered.")
    if rank not in ranks:
        raise ValueError(f"{text}: Rank {rank} is not a member of the provided process set.")
    number = state.handles.next_number()
    handle = Handle(number, parts, combine)
    built = entries(Asker(rank, state.gen, int(set_id or 0), number), handle)
    state.handles.add(handle)
    try:
        world.engine.submit(built)
    except BaseException:
        state.handles.pop(number)
        raise
    return number


def poll(handle: int) -> bool:
    """Whether the collective of `handle` completed (synchronize() would return at once)."""
    found = runtime.active().handles.get(handle)
    return True if found is None else found.done()


def synchronize(handle: int) -> Any:
    """Wait for the collective of `handle` and return its result (None for an unknown handle, as Horovod)."""
    state = runtime.active()
    found = state.handles.get(handle)
    if found is None:
        return None
    world = state.world
    assert world is not None
    waits = not found.done()
    if waits:
        world.engine.awaited(1)  # nothing more comes from this thread until it has its result: agree now
    try:
        return found.wait(world.engine.trouble)
    finally:
        if waits:
            world.engine.awaited(-1)
        state.handles.pop(handle)
