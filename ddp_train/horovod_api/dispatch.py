"""One collective run on this rank with its parts: the data moved by execute.py, the results handed to the handles.

A rank takes part in every response sent to it, even one whose tensor it no longer holds (a joined rank adds zeros,
a rank that shut down sends a stand-in), so that no other rank waits on it. What the engine's state machine decided
(engine_core.py) arrives here as a `Run`; this module only does it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from . import execute
from .dtypes import DTYPES
from .engine_core import CycleStart, Failure, Run
from .handles import Handle
from .messages import ADD_SET, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, REDUCESCATTER, REMOVE_SET, \
    Request, Response

#: a timeline's mark: (name, phase, start)
OnEvent = Callable[[str, str, bool], None]


@dataclass
class Entry:
    """This rank's part in one collective: its request, the handle (and place in it) its result completes, and its
    tensors (`output` is the tensor written in place, where the call has one)."""

    request: Request
    handle: Handle
    index: int = 0
    tensor: Optional[torch.Tensor] = None
    output: Optional[torch.Tensor] = None
    splits_device: Optional[torch.device] = None  # alltoall: where the received splits go
    ready: Optional[Tuple[int, torch.cuda.Event]] = None  # CUDA: (device, event) once the tensor's producer finished


def fail(failures: List[Failure[Entry]]) -> None:
    """Hand each failed part its error."""
    for failure in failures:
        failure.part.handle.fail(failure.message)


class Dispatcher:
    """Runs the collectives: `communicator(ps)` gives a process set's Communicator; `on_set(response)` registers a
    process set the coordinator added or removed; `join_device()` is where this rank's zeros go while it has joined;
    `on_event` marks the timeline."""

    def __init__(self, communicator: Callable[[int], execute.Communicator], on_set: Callable[[Response], None],
                 join_device: Callable[[], int], on_event: Optional[OnEvent] = None) -> None:
        self.communicator = communicator
        self.on_set = on_set
        self.join_device = join_device
        self.on_event = on_event

    def start_guess(self, start: CycleStart[Entry]) -> List[execute.Started]:
        """Start the guess's allreduces (every rank starts the same ones): this rank's tensors of the collectives
        it waits for as hits, zeros for the others; the first carries whether this rank's words are the expected
        ones."""
        assert start.guess is not None
        comm = self.communicator(0)
        flag = 1.0 if start.matched else 0.0
        started = []
        for i, (response, parts) in enumerate(zip(start.guess.fused, start.guess_parts, strict=True)):
            inputs = [p.tensor if p is not None and p.tensor is not None else self._stand_in(response, j)
                      for j, p in enumerate(parts)]
            started.append(execute.start_allreduce(response, inputs, comm, flag if i == 0 else None))
        return started

    def run(self, run: Run[Entry], ahead: Optional[execute.Started] = None) -> None:
        """Run one collective (an allreduce whose sum was started `ahead` is finished) and hand out its results."""
        response, entries = run.response, run.parts
        if response.kind == JOIN:
            self._hand_out(entries, [response.joining] * len(entries))
            return
        if response.kind in (ADD_SET, REMOVE_SET):
            self.on_set(response)
            self._hand_out(entries, [response.set_id] * len(entries))
            return
        comm = self._member(response)
        if comm is None:
            return
        for entry in entries:
            if entry is not None and entry.ready is not None:
                torch.cuda.current_stream(entry.ready[0]).wait_event(entry.ready[1])
        self._mark(response, True)
        results = self._dispatch(response, entries, comm, ahead)
        self._mark(response, False)
        self._hand_out(entries, results, events=True)

    def mark_cycle(self, phase: str, names: Sequence[str] = ()) -> None:
        """A cycle's agreement, marked on the timeline (rank 0's, with mark_cycles): CYCLE_AGREED where the
        agreement's collective ran, CYCLE_GUESSED (naming the guessed collectives) where the guess answered."""
        if self.on_event:
            self.on_event(",".join(names), phase, True)

    def _mark(self, response: Response, start: bool) -> None:
        if self.on_event:
            for name in response.names:
                self.on_event(name, response.kind if start else "", start)

    @staticmethod
    def _hand_out(entries: List[Optional[Entry]], results: List, events: bool = False) -> None:
        for entry, result in zip(entries, results, strict=True):
            if entry is None:
                continue
            event = None
            device = execute.cuda_device(result if isinstance(result, torch.Tensor) else entry.output) \
                if events else None
            if device is not None:
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(device))
                event = (device, done)
            entry.handle.set_result(entry.index, result, event)

    def _member(self, response: Response) -> Optional[execute.Communicator]:
        """The groups of the response's process set, or None where this rank is not in it (with the cache on,
        every rank hears every response)."""
        try:
            comm = self.communicator(response.ps)
        except KeyError:
            return None
        return comm if comm.set_rank >= 0 else None

    def _stand_in(self, response: Response, index: int) -> torch.Tensor:
        """Zeros of the shape the response names, for a part this rank does not hold."""
        device = response.device
        if device >= 0:  # zeros on this rank's own device (the one it joined with, else its current one)
            device = self.join_device() if self.join_device() >= 0 else torch.cuda.current_device()
        shape = response.shapes[index] if index < len(response.shapes) else []
        return execute.placeholder(shape, DTYPES[response.dtype], device)

    def _dispatch(self, response: Response, entries: List[Optional[Entry]], comm: execute.Communicator,
                  ahead: Optional[execute.Started] = None) -> List:
        kind = response.kind
        if kind == BARRIER:
            execute.barrier(comm)
            return [None] * len(entries)
        if kind == ALLREDUCE:
            return self._allreduce(response, entries, comm, ahead)
        entry = entries[0]
        tensor = entry.tensor if entry is not None and entry.tensor is not None else self._participation(response,
                                                                                                          comm)
        if kind == BROADCAST:
            output = entry.output if entry is not None and entry.output is not None else tensor
            if output.data_ptr() != tensor.data_ptr():
                output.copy_(tensor)
            execute.broadcast(response, output, comm)
            return [output]
        if kind == ALLGATHER:
            return [execute.allgather(response, tensor, comm)]
        if kind == REDUCESCATTER:
            return [execute.reducescatter(response, tensor, comm)]
        if kind == ALLTOALL:
            output, received = execute.alltoall(response, tensor, comm)
            where = entry.splits_device if entry is not None and entry.splits_device is not None else None
            splits = torch.tensor(received, dtype=torch.int32, device=where)
            return [(output, splits)]
        raise ValueError(f"unknown response {kind}")

    def _allreduce(self, response: Response, entries: List[Optional[Entry]], comm: execute.Communicator,
                   ahead: Optional[execute.Started]) -> List:
        inputs, outputs = [], []
        for i, entry in enumerate(entries):
            if entry is None or entry.tensor is None or entry.output is None:
                zeros = self._stand_in(response, i)
                inputs.append(zeros)
                outputs.append(zeros)
            else:
                inputs.append(entry.tensor)
                outputs.append(entry.output)
        if ahead is not None:
            execute.finish_allreduce(response, ahead, outputs, comm)
        else:
            execute.allreduce(response, inputs, outputs, comm)
        return outputs

    def _participation(self, response: Response, comm: execute.Communicator) -> torch.Tensor:
        """A tensor of the right size for a collective this rank must take part in without holding its tensor (it
        shut down meanwhile): what it sends is never read by a caller."""
        shape = list(response.shapes[0]) if response.shapes else []
        if response.kind == ALLGATHER and shape:
            shape[0] = response.sizes[0][comm.set_rank]
        if response.kind == ALLTOALL and shape:
            shape[0] = sum(response.splits[comm.set_rank])
        return execute.placeholder(shape, DTYPES[response.dtype], response.device)
