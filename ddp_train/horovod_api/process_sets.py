"""Horovod's process sets: ProcessSet, the global set, and which sets exist in this init() of the API (the
registry the runtime keeps; adding and removing sets is a collective, in sets.py)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .exceptions import NOT_A_MEMBER, NOT_INITIALIZED, UNKNOWN_SET

#: set id -> its ranks, for the sets that exist now (None before init and after shutdown)
_registry: Optional[Dict[int, List[int]]] = None
_rank = -1


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
        if _registry is None:
            raise ValueError(NOT_INITIALIZED)
        if self.process_set_id is None or self.process_set_id not in _registry:
            raise ValueError(UNKNOWN_SET)
        return _registry[self.process_set_id]

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
        if _rank not in members:
            raise ValueError(NOT_A_MEMBER)
        return members.index(_rank)

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set, or None if the set has no ranks yet."""
        if self.ranks is None:
            return None
        return _rank in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def on_init(size: int, rank: int) -> None:
    """A new init(): only the global set exists."""
    global _registry, _rank
    _rank = rank
    _registry = {0: list(range(size))}
    global_process_set.ranks = list(range(size))


def on_shutdown() -> None:
    global _registry
    _registry = None


def register(set_id: int, ranks: List[int]) -> None:
    if _registry is not None:
        _registry[set_id] = list(ranks)


def unregister(set_id: int) -> None:
    if _registry is not None:
        _registry.pop(set_id, None)


def members(set_id: Optional[int]) -> Optional[List[int]]:
    """The ranks of an existing set, else None."""
    if _registry is None or set_id is None:
        return None
    return _registry.get(set_id)
