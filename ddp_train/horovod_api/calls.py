"""What a script's call of one collective asks for, one dataclass per kind: its tensors, where their results go,
its name and process set (what every kind has), and what only its kind has (an allreduce's op and scale factors, a
broadcast's root, an alltoall's splits). mpi_ops turns one into this rank's requests, one per tensor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Sequence

import torch

from .dtypes import SUM
from .messages import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER
from .process_sets import ProcessSet


@dataclass(frozen=True)
class Call:
    """One call of a collective on `tensors` (a grouped call's tensors are answered together); `outputs[i]` is
    where the i-th result is written (None: a new tensor)."""

    kind: ClassVar[str]
    prefix: ClassVar[str]  # how Horovod names an unnamed call of this kind (`allreduce.noname.7`)

    tensors: Sequence[torch.Tensor]
    outputs: Sequence[Optional[torch.Tensor]]
    name: Optional[str]
    process_set: ProcessSet
    grouped: bool = False

    def fields(self) -> Dict[str, Any]:
        """The fields of each request that only this kind has."""
        return {}

    def splits_device(self) -> Optional[torch.device]:
        """Where the received splits go (alltoall only)."""
        return None


@dataclass(frozen=True)
class Allreduce(Call):
    """An allreduce: its op, Horovod's factors around the sum, and whether every rank's tensor was matched before
    (a DistributedOptimizer's gradient after its first step)."""

    kind: ClassVar[str] = ALLREDUCE
    prefix: ClassVar[str] = "allreduce"

    op: int = SUM
    prescale: float = 1.0
    postscale: float = 1.0
    checked: bool = False

    def fields(self) -> Dict[str, Any]:
        return {"op": self.op, "prescale": float(self.prescale), "postscale": float(self.postscale),
                "checked": self.checked}


@dataclass(frozen=True)
class Allgather(Call):
    """An allgather (first dimensions may differ)."""

    kind: ClassVar[str] = ALLGATHER
    prefix: ClassVar[str] = "allgather"


@dataclass(frozen=True)
class Broadcast(Call):
    """A broadcast from `root` (a global rank)."""

    kind: ClassVar[str] = BROADCAST
    prefix: ClassVar[str] = "broadcast"

    root: int = 0

    def fields(self) -> Dict[str, Any]:
        return {"root": int(self.root)}


@dataclass(frozen=True)
class Alltoall(Call):
    """An alltoall: the rows this rank sends to each rank of the set, and where the received splits go."""

    kind: ClassVar[str] = ALLTOALL
    prefix: ClassVar[str] = "alltoall"

    splits: Sequence[int] = ()
    received_on: Optional[torch.device] = None

    def fields(self) -> Dict[str, Any]:
        return {"splits": list(self.splits)}

    def splits_device(self) -> Optional[torch.device]:
        return self.received_on


@dataclass(frozen=True)
class Reducescatter(Call):
    """A reducescatter: its op (Average or Sum) and Horovod's factors around the sum."""

    kind: ClassVar[str] = REDUCESCATTER
    prefix: ClassVar[str] = "reducescatter"

    op: int = SUM
    prescale: float = 1.0
    postscale: float = 1.0

    def fields(self) -> Dict[str, Any]:
        return {"op": self.op, "prescale": float(self.prescale), "postscale": float(self.postscale)}
