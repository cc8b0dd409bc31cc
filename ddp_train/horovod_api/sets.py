"""Adding and removing process sets: a collective of every rank of the job, as in Horovod (the same ranks, in the
same order, on every rank), which makes the set's process groups on every rank."""

from __future__ import annotations

import os
from typing import List, Sequence, Union

from . import runtime
from .exceptions import DYNAMIC_PROCESS_SETS, DYNAMIC_PROCESS_SETS_REMOVE
from .messages import ADD_SET, REMOVE_SET
from .mpi_ops import _control, synchronize
from .process_sets import ProcessSet, global_process_set, members


def _dynamic() -> bool:
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "").strip().lower() in ("1", "true", "yes", "on")


def _add(ranks: List[int]) -> int:
    size = runtime.size()
    bad = [rank for rank in ranks if not 0 <= rank < size]
    if bad or not ranks:
        raise ValueError(f"a process set takes ranks between 0 and {size - 1}, got {ranks}")
    name = "process_set.add." + ",".join(map(str, ranks))
    return int(synchronize(_control(ADD_SET, name, global_process_set, extra={"ranks": ranks})))


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Add a process set on every rank (HOROVOD_DYNAMIC_PROCESS_SETS=1); returns it, ready for `process_set=`."""
    runtime.active()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if not _dynamic():
        raise ValueError(DYNAMIC_PROCESS_SETS)
    assert process_set.ranks is not None
    set_id = _add(list(process_set.ranks))
    if set_id < 0:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = set_id
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a process set on every rank; whether it existed."""
    runtime.active()
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    if not _dynamic():
        raise ValueError(DYNAMIC_PROCESS_SETS_REMOVE)
    ranks = members(set_id)
    process_set._invalidate()
    if ranks is None:
        return False
    name = f"process_set.remove.{set_id}"
    synchronize(_control(REMOVE_SET, name, global_process_set, extra={"ranks": ranks, "set_id": set_id}))
    return True


def add_initial(process_sets: List[ProcessSet]) -> None:
    """The process sets given to hvd.init()."""
    for index, process_set in enumerate(process_sets):
        if not isinstance(process_set, ProcessSet) or process_set.ranks is None:
            raise ValueError(f"hvd.init(process_sets=...) entry number {index} is not a ProcessSet of ranks")
        set_id = _add(list(process_set.ranks))
        if set_id < 0:
            raise ValueError(f"Horovod could not be initialized because process_sets entry number {index} is a "
                             f"duplicate: {process_set}")
        process_set.process_set_id = set_id


runtime.INITIAL_SETS.append(add_initial)
