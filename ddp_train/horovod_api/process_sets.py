"""Horovod's process sets (horovod/common/process_sets.py): ProcessSet, the global set, and adding and removing sets.

Adding or removing a set is a collective of every rank of the job, as in Horovod (the same ranks, in the same order,
on every rank): rank 0's coordinator numbers the set, and every rank's engine makes its process groups and records
it in the one registry of the sets that exist, runtime's State.sets, which the ProcessSet objects read."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import List, Optional, Sequence, Union

from . import runtime
from .dispatch import Entry
from .enqueue import Asker, single, submit, synchronize
from .exceptions import (DYNAMIC_PROCESS_SETS, DYNAMIC_PROCESS_SETS_REMOVE, NOT_A_MEMBER, NOT_INITIALIZED,
                         UNKNOWN_SET)
from .handles import Handle
from .messages import ADD_SET, REMOVE_SET, Request


class ProcessSet:
    """A set of ranks that run collectives together: give it to hvd.add_process_set (or hvd.init) with the same
    ranks on every rank, then as `process_set=` to collectives. Ranks are global ranks, sorted."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm = None

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks here: process sets from an MPI communicator are not "
                             "offered by the Horovod API on torch.distributed") from None
        if any(not isinstance(rank, int) for rank in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def _members(self) -> List[int]:
        if not runtime.STATE.initialized:
            raise ValueError(NOT_INITIALIZED)
        ranks = runtime.members(self.process_set_id)
        if ranks is None:
            raise ValueError(UNKNOWN_SET)
        return ranks

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None if it was not added."""
        if self.process_set_id is None:
            return None
        return len(self._members())

    def rank(self) -> Optional[int]:
        """This process's rank within the set (collectives still take global ranks as root), or None if the set was
        not added."""
        if self.process_set_id is None:
            return None
        members = self._members()
        if runtime.this_rank() not in members:
            raise ValueError(NOT_A_MEMBER)
        return members.index(runtime.this_rank())

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set, or None if the set has no ranks yet."""
        if self.ranks is None:
            return None
        return runtime.this_rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _change(kind: str, name: str, ranks: List[int], set_id: int = -1) -> int:
    """Add (ADD_SET) or remove (REMOVE_SET) a process set on every rank: the coordinator's answer (the new set's id;
    -1 when it existed already)."""
    def entries(asker: Asker, handle: Handle) -> List[Entry]:
        request = Request(asker.rank, asker.gen, asker.ps, name, kind, ranks=ranks, set_id=set_id)
        return [Entry(request, handle)]

    return int(synchronize(submit(kind, global_process_set.process_set_id, 1, single, entries)))


def _add(ranks: List[int]) -> int:
    size = runtime.size()
    bad = [rank for rank in ranks if not 0 <= rank < size]
    if bad or not ranks:
        raise ValueError(f"a process set takes ranks between 0 and {size - 1}, got {ranks}")
    return _change(ADD_SET, "process_set.add." + ",".join(map(str, ranks)), ranks)


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Add a process set on every rank (HOROVOD_DYNAMIC_PROCESS_SETS=1); returns it, ready for `process_set=`."""
    state = runtime.active()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if not state.settings.dynamic_process_sets:
        raise ValueError(DYNAMIC_PROCESS_SETS)
    assert process_set.ranks is not None
    set_id = _add(list(process_set.ranks))
    if set_id < 0:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = set_id
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a process set on every rank; whether it existed."""
    state = runtime.active()
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    if not state.settings.dynamic_process_sets:
        raise ValueError(DYNAMIC_PROCESS_SETS_REMOVE)
    ranks = runtime.members(set_id)
    process_set._invalidate()
    if ranks is None:
        return False
    _change(REMOVE_SET, f"process_set.remove.{set_id}", ranks, set_id)
    return True


def init_process_sets(process_sets: Optional[object]) -> None:
    """At hvd.init(), once a generation started: the global set's ranks, then the process sets given to init() (a
    list of ProcessSet, added in order) or "dynamic" (sets may be added later; HOROVOD_DYNAMIC_PROCESS_SETS=1 from
    then on, as Horovod sets it)."""
    state = runtime.active()
    global_process_set.ranks = list(range(runtime.size()))
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"hvd.init(process_sets={process_sets!r}): give a list of ProcessSet, or 'dynamic'")
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # later init()s read it, as Horovod's do
        state.settings = replace(state.settings, dynamic_process_sets=True)
    elif process_sets:
        for index, process_set in enumerate(list(process_sets)):  # type: ignore[call-overload]
            if not isinstance(process_set, ProcessSet) or process_set.ranks is None:
                raise ValueError(f"hvd.init(process_sets=...) entry number {index} is not a ProcessSet of ranks")
            set_id = _add(list(process_set.ranks))
            if set_id < 0:
                raise ValueError(f"Horovod could not be initialized because process_sets entry number {index} is a "
                                 f"duplicate: {process_set}")
            process_set.process_set_id = set_id
