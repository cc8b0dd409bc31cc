"""Handles of asynchronous collectives: Horovod's integer handles, what `poll` and `synchronize` (enqueue.py) look at.

A handle's parts (one per tensor of a grouped call) complete on the API's engine thread; `synchronize` waits on the
caller's thread, in short waits so that Ctrl-C and a lost job still reach it, and on CUDA makes the caller's stream
wait for the collective's work (as Horovod's synchronize does)."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .exceptions import HorovodInternalError

#: how long one wait of synchronize() lasts before it checks the engine again (seconds)
WAIT_SLICE_S = 0.25


class Handle:
    """The outcome of one asynchronous call: its parts' results, or the error that ended it."""

    def __init__(self, number: int, parts: int, combine: Callable[[List[Any]], Any]) -> None:
        self.number = number
        self.results: List[Any] = [None] * parts
        self.remaining = parts
        self.combine = combine
        self.error: Optional[str] = None
        self.events: List[Tuple[int, Any]] = []  # (CUDA device, event) the caller's stream waits for
        self._done = threading.Event()
        self._lock = threading.Lock()

    def set_result(self, index: int, value: Any, event: Optional[Tuple[int, Any]] = None) -> None:
        with self._lock:
            self.results[index] = value
            if event is not None:
                self.events.append(event)
            self.remaining -= 1
            if self.remaining <= 0:
                self._done.set()

    def fail(self, message: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = message
            self._done.set()

    def done(self) -> bool:
        """Whether synchronize() would return at once."""
        if not self._done.is_set():
            return False
        return all(event.query() for _, event in self.events)

    def wait(self, trouble: Callable[[], Optional[str]]) -> Any:
        """The call's result once it completed; HorovodInternalError with its error, or with `trouble()` (the
        engine's reason it can no longer complete) while it waits."""
        while not self._done.wait(WAIT_SLICE_S):
            problem = trouble()
            if problem is not None and not self._done.is_set():
                self.fail(problem)
        if self.error is not None:
            raise HorovodInternalError(self.error)
        for device, event in self.events:
            torch.cuda.current_stream(device).wait_event(event)
        return self.combine(self.results)


class HandleTable:
    """Horovod's handle map: numbers from 1 in the order of the calls of one init() (unnamed collectives are named
    after them, so every rank must make the same calls in the same order, as in Horovod)."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._handles: Dict[int, Handle] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self._numbers = itertools.count(1)
            self._handles = {}

    def next_number(self) -> int:
        with self._lock:
            return next(self._numbers)

    def add(self, handle: Handle) -> int:
        with self._lock:
            self._handles[handle.number] = handle
        return handle.number

    def get(self, number: int) -> Optional[Handle]:
        with self._lock:
            return self._handles.get(number)

    def pop(self, number: int) -> Optional[Handle]:
        with self._lock:
            return self._handles.pop(number, None)
