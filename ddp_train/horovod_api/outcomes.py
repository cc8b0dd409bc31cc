"""What each rank of a `horovod.spark.run` or a `RayExecutor.run` ended with, and how the driver turns every rank's
outcome into Horovod's answer: the return values in rank order, or one exception naming the rank that failed."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class RemoteError:
    """An exception a rank raised: its type's name, its message, and the rank's traceback as text."""

    rank: int
    kind: str
    message: str
    traceback: str = ""

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> "RemoteError":
        """The error of `exc`, raised on `rank` (with its traceback)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(rank, type(exc).__name__, str(exc), text)


@dataclass(frozen=True)
class Outcome:
    """One rank's end: its return value, or its error."""

    rank: int
    value: Any = None
    error: Optional[RemoteError] = None


class WorkerError(RuntimeError):
    """A rank's function raised (or its process died): the driver's exception, naming the rank and its message; the
    rank's own traceback is a note of it. `rank`, `kind` and `remote_message` say the same as fields."""

    def __init__(self, where: str, error: RemoteError) -> None:
        super().__init__(f"{where}: rank {error.rank} raised {error.kind}: {error.message}")
        self.rank = error.rank
        self.kind = error.kind
        self.remote_message = error.message
        if error.traceback:
            self.add_note(f"rank {error.rank}'s traceback:\n{error.traceback.rstrip()}")


def first_error(outcomes: List[Outcome]) -> Optional[RemoteError]:
    """The error to report of outcomes in the order they arrived: the first rank that failed of itself, before one
    that failed only because a peer had gone (Horovod's HorovodInternalError), else the first error; None if none
    failed."""
    errors = [o.error for o in outcomes if o.error is not None]
    own = [e for e in errors if e.kind != "HorovodInternalError"]
    chosen = own or errors
    return chosen[0] if chosen else None


def in_rank_order(where: str, outcomes: Dict[int, Outcome], size: int) -> List[Any]:
    """Every rank's return value, rank 0 first; a WorkerError for the first error, a RuntimeError naming the ranks that
    never reported."""
    error = first_error(list(outcomes.values()))
    if error is not None:
        raise WorkerError(where, error)
    missing = [r for r in range(size) if r not in outcomes]
    if missing:
        raise RuntimeError(f"{where}: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {size} "
                           "ended without returning a value or an error (killed, or it exited from inside the "
                           "function); see the workers' output above")
    return [outcomes[r].value for r in range(size)]
