"""The data of a collective, moved by torch.distributed once the coordinator said to run it: Gloo for CPU tensors,
NCCL for CUDA ones, on process groups private to the API (a script's own torch.distributed calls never interleave
with them). Reductions follow Horovod's arithmetic (arithmetic.py); gathers, broadcasts and alltoalls move bytes, so
every type Horovod takes travels, int16 included, which Gloo does not reduce."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .arithmetic import postscale, reducescatter_rows, scale_
from .cycle import to_signed, to_unsigned
from .dtypes import AVERAGE, MAX, MIN, PRODUCT, SUM
from .messages import Response

_AGREE_POLL = datetime.timedelta(seconds=1)
_OPS = {AVERAGE: dist.ReduceOp.SUM, SUM: dist.ReduceOp.SUM, MIN: dist.ReduceOp.MIN, MAX: dist.ReduceOp.MAX,
        PRODUCT: dist.ReduceOp.PRODUCT}


@dataclass
class Communicator:
    """The process groups of one set of ranks: Gloo for CPU tensors, NCCL for CUDA ones (where there is CUDA)."""

    ranks: List[int]  # global ranks, in order
    set_rank: int  # this process's place among them, -1 outside
    cpu: Any = None
    cuda: Any = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def group(self, device: int) -> Any:
        return self.cuda if device >= 0 and self.cuda is not None else self.cpu


#: torch.distributed's allgather into one tensor (all_gather_single since it replaced all_gather_into_tensor)
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view)."""
    return tensor.reshape(-1).view(torch.uint8)


def row_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of one row (everything but the first dimension)."""
    return math.prod(shape[1:]) * dtype.itemsize if len(shape) else dtype.itemsize


def wait(work: Any, stop: Callable[[], bool]) -> bool:
    """Wait for a collective started with async_op; False once `stop()` says the wait is over (checked every second
    while a rank has not come)."""
    while True:
        try:
            work.wait(timeout=_AGREE_POLL)
            return True
        except RuntimeError as exc:
            if "timed out" not in str(exc).lower():
                raise
            if stop():
                return False


def agree(comm: Communicator, words: List[int], stop: Callable[[], bool]) -> Optional[List[int]]:
    """The response cache's agreement: the bitwise AND of every rank's words (unsigned 64-bit), or None once `stop()`
    says the wait is over."""
    tensor = torch.tensor(to_signed(words), dtype=torch.int64)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.BAND, group=comm.cpu, async_op=True)
    return to_unsigned(tensor.tolist()) if wait(work, stop) else None


@dataclass
class Started:
    """An allreduce started: its buffer, summed in place once `work` completes; `count` elements of data, then any
    counted flag."""

    buffer: torch.Tensor
    work: Any
    count: int

    def flag(self) -> float:
        """The sum of every rank's flag."""
        return float(self.buffer[self.count])


def start_allreduce(response: Response, inputs: List[torch.Tensor], comm: Communicator,
                    flag: Optional[float] = None, output: Optional[torch.Tensor] = None) -> Started:
    """Start an allreduce: prescale, then the sum, asynchronously. One tensor given its `output` (and no flag) is
    summed in that output, without a copy where it is the input; otherwise the inputs are copied into a buffer of
    their own (they stay as they are, should a guess's result be dropped), with `flag` one more element after the
    data, summed too."""
    count = sum(t.numel() for t in inputs)
    if output is not None and flag is None and len(inputs) == 1:
        buffer = output.view(-1)
        if output.data_ptr() != inputs[0].data_ptr():
            buffer.copy_(inputs[0].reshape(-1))
    else:
        buffer = torch.empty(count + (flag is not None), dtype=inputs[0].dtype, device=inputs[0].device)
        torch.cat([t.reshape(-1) for t in inputs], out=buffer[:count])
        if flag is not None:
            buffer[count] = flag
    scale_(buffer[:count], response.prescale)
    return Started(buffer, dist.all_reduce(buffer, op=_OPS[response.op], group=comm.group(response.device),
                                           async_op=True), count)


def finish_allreduce(response: Response, started: Started, outputs: List[torch.Tensor], comm: Communicator) -> None:
    """The rest of an allreduce whose work completed: postscale (with 1/size for Average), then the outputs (nothing
    to copy where the sum was made in the one output)."""
    data = started.buffer[:started.count]
    scale_(data, postscale(response.op, response.postscale, comm.size))
    if len(outputs) != 1 or outputs[0].data_ptr() != data.data_ptr():
        _scatter(data, outputs)


def allreduce(response: Response, inputs: List[torch.Tensor], outputs: List[torch.Tensor],
              comm: Communicator) -> None:
    """Sum (min, max, product) the tensors over the set, in one fused buffer when there are several: prescale, the
    sum, postscale (with 1/size for Average), as Horovod does."""
    started = start_allreduce(response, inputs, comm, output=outputs[0] if len(outputs) == 1 else None)
    started.work.wait()
    finish_allreduce(response, started, outputs, comm)


def _scatter(buffer: torch.Tensor, outputs: List[torch.Tensor]) -> None:
    offset = 0
    for output in outputs:
        count = output.numel()
        output.view(-1).copy_(buffer[offset:offset + count])
        offset += count


def allgather(response: Response, tensor: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Every rank's tensor, concatenated along the first dimension (which may differ per rank)."""
    rows = response.sizes[0]
    trailing = list(tensor.shape[1:])
    row = row_bytes(list(tensor.shape), tensor.dtype)
    output = torch.empty([sum(rows), *trailing], dtype=tensor.dtype, device=tensor.device)
    group = comm.group(response.device)
    if len(set(rows)) == 1:
        _gather_into(as_bytes(output), as_bytes(tensor), group=group)
        return output
    # Uneven first dimensions: every rank's bytes padded to the longest, gathered, then cut.
    longest = max(rows) * row
    padded = torch.zeros(longest, dtype=torch.uint8, device=tensor.device)
    padded[:rows[comm.set_rank] * row].copy_(as_bytes(tensor))
    gathered = torch.empty(longest * comm.size, dtype=torch.uint8, device=tensor.device)
    _gather_into(gathered, padded, group=group)
    torch.cat([gathered[i * longest:i * longest + count * row] for i, count in enumerate(rows)],
              out=as_bytes(output))
    return output


def broadcast(response: Response, tensor: torch.Tensor, comm: Communicator) -> None:
    """Root's tensor into `tensor` on every rank of the set (root given as a global rank, as in Horovod)."""
    dist.broadcast(as_bytes(tensor), src=response.root, group=comm.group(response.device))


def alltoall(response: Response, tensor: torch.Tensor, comm: Communicator) -> Tuple[torch.Tensor, List[int]]:
    """Rows of `tensor` sent to each rank as its splits say; the rows received, and how many from each rank."""
    me = comm.set_rank
    sent = response.splits[me]
    received = [response.splits[sender][me] for sender in range(comm.size)]
    row = row_bytes(list(tensor.shape), tensor.dtype)
    output = torch.empty([sum(received), *tensor.shape[1:]], dtype=tensor.dtype, device=tensor.device)
    source = tensor.narrow(0, 0, sum(sent)) if tensor.dim() else tensor
    dist.all_to_all_single(as_bytes(output), as_bytes(source), [n * row for n in received], [n * row for n in sent],
                           group=comm.group(response.device))
    return output, received


def reducescatter(response: Response, tensor: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """The reduced tensor's rows for this rank (the first ranks one more when they do not divide evenly)."""
    buffer = tensor.reshape(-1).clone()
    scale_(buffer, response.prescale)
    dist.all_reduce(buffer, op=_OPS[response.op], group=comm.group(response.device))
    scale_(buffer, postscale(response.op, response.postscale, comm.size))
    rows = reducescatter_rows(tensor.shape[0], comm.size)
    start = sum(rows[:comm.set_rank])
    return buffer.view(tensor.shape).narrow(0, start, rows[comm.set_rank]).clone()


def barrier(comm: Communicator) -> None:
    dist.barrier(group=comm.cpu)


def placeholder(shape: Sequence[int], dtype: torch.dtype, device: int) -> torch.Tensor:
    """Zeros standing in for a tensor this rank does not have: a joined rank's part of an allreduce."""
    where = torch.device("cuda", device) if device >= 0 else torch.device("cpu")
    return torch.zeros(list(shape), dtype=dtype, device=where)


def cuda_device(tensor: Optional[torch.Tensor]) -> Optional[int]:
    return tensor.device.index if tensor is not None and tensor.device.type == "cuda" else None
