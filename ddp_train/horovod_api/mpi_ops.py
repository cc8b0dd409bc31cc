"""Horovod's collectives with its signatures and semantics: allreduce (average, sum, min, max, product, with pre-
and postscale factors and compression), allgather (first dimensions may differ), broadcast, alltoall (with splits),
reducescatter, their grouped, asynchronous and in-place forms, sparse allreduce, join and barrier, and hvd.init(),
as horovod/torch/mpi_ops.py has them. The differentiable forms backpropagate as Horovod's do. Every call is asked
for through enqueue.submit; its handle is waited for with enqueue.poll and enqueue.synchronize.

Every call is named (its `name`, or a number in the order of the calls, as in Horovod) and runs once every rank of its
process set made it: the ranks may make their calls in different orders."""

from __future__ import annotations

import warnings
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import runtime
from .arithmetic import alltoall_splits
from .calls import Allgather, Allreduce, Alltoall, Broadcast, Call, Reducescatter
from .compression import Compression
from .dtypes import ADASUM, AVERAGE, CPU_DEVICE, MAX, MIN, PRODUCT, SUM, TYPE_NAMES, check_supported, device_id
from .dispatch import Entry
from .enqueue import Asker, single, submit, synchronize
from .exceptions import ADASUM_REFUSED, HorovodInternalError
from .handles import Handle
from .messages import BARRIER, JOIN, Request
from .process_sets import ProcessSet, global_process_set, init_process_sets
from .runtime import members

Average, Sum, Adasum, Min, Max, Product = AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT


def handle_average_backwards_compatibility(op: Optional[int], average: Optional[bool]) -> int:
    """Horovod's rule for the deprecated `average`: op wins, both is an error, neither is Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return AVERAGE if average else SUM
    return AVERAGE


def _ready_event(tensor: torch.Tensor):
    """CUDA: an event after the work that produces `tensor`, which the engine waits for before it reads it."""
    if tensor.device.type != "cuda":
        return None
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return device, event


def _enqueue(call: Call) -> int:
    """This rank's part in a collective of tensors (one request per tensor, named as Horovod names them): the
    handle's number."""
    count = len(call.tensors)
    prefix = f"grouped_{call.prefix}" if call.grouped else call.prefix
    fields = call.fields()

    def entries(asker: Asker, handle: Handle) -> List[Entry]:
        base = f"{prefix}.{call.name}" if call.name else f"{prefix}.noname.{asker.number}"
        names = [f"{base}_{i + 1}of{count}" for i in range(count)] if call.grouped else [base]
        built = []
        for i, (tensor, output) in enumerate(zip(call.tensors, call.outputs, strict=True)):
            request = Request(asker.rank, asker.gen, asker.ps, names[i], call.kind, dtype=TYPE_NAMES[tensor.dtype],
                              shape=list(tensor.shape), device=device_id(tensor), group=base if call.grouped else "",
                              group_size=count if call.grouped else 0, **fields)
            built.append(Entry(request, handle, i, tensor, output, call.splits_device(), _ready_event(tensor)))
        return built

    return submit(call.kind, call.process_set.process_set_id, count, list if call.grouped else single, entries)


def _control(kind: str, name: str, process_set: ProcessSet, device: int = CPU_DEVICE) -> int:
    """A collective without a tensor (barrier, join): the handle's number."""
    def entries(asker: Asker, handle: Handle) -> List[Entry]:
        return [Entry(Request(asker.rank, asker.gen, asker.ps, name, kind, device=device), handle)]

    return submit(kind, process_set.process_set_id, 1, single, entries)


def init(comm: Optional[object] = None, process_sets: Optional[object] = None) -> None:
    """hvd.init(): join the job (the first time) and start a generation of collectives (runtime.init), add the process
    sets given (`process_sets`: ProcessSet objects every rank gives alike, or "dynamic"), then start the timeline
    HOROVOD_TIMELINE names, in that order, as Horovod's init does. `comm` may be omitted or list every rank."""
    if not runtime.init(comm):
        return
    init_process_sets(process_sets)
    runtime.start_configured_timeline()


# --- allreduce ----------------------------------------------------------------------------------------------------
def _check_reduction(op: int) -> None:
    if op == ADASUM:
        raise NotImplementedError(ADASUM_REFUSED)
    if op not in (AVERAGE, SUM, MIN, MAX, PRODUCT):
        raise ValueError(f"op={op!r} is not one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product")


def _allreduce_async(tensor: torch.Tensor, output: torch.Tensor, name: Optional[str], op: int, prescale_factor: float,
                     postscale_factor: float, process_set: ProcessSet, checked: bool = False) -> int:
    _check_reduction(op)
    check_supported(tensor, reducing=True)
    return _enqueue(Allreduce([tensor], [output], name, process_set, op=op, prescale=prescale_factor,
                              postscale=postscale_factor, checked=checked))


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start averaging (summing, ...) `tensor` over the process set into a new tensor: a handle."""
    op = handle_average_backwards_compatibility(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start averaging (summing, ...) `tensor` over the process set in place: a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce that backpropagates: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, average: Any, name: Any, op: Any, prescale_factor: Any, postscale_factor: Any,
                process_set: Any) -> Any:
        ctx.average, ctx.op, ctx.prescale_factor, ctx.postscale_factor = average, op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        reduced = allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                            prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                            process_set=ctx.process_set)
        return reduced, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """`tensor` averaged (summed, ...) over the process set, as a new tensor; differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Average (sum, ...) `tensor` over the process set in place; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _check_group(tensors: Sequence[torch.Tensor], reducing: bool) -> None:
    if not tensors:
        raise ValueError("a grouped collective needs at least one tensor")
    for tensor in tensors:
        check_supported(tensor, reducing)
    if len({t.device.type for t in tensors}) > 1 or len({t.dtype for t in tensors}) > 1:
        raise HorovodInternalError("Grouped collectives need every tensor on the same device and of the same type.")


def _grouped_allreduce_async(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], name: Optional[str],
                             op: int, prescale_factor: float, postscale_factor: float,
                             process_set: ProcessSet) -> int:
    _check_reduction(op)
    _check_group(tensors, reducing=True)
    return _enqueue(Allreduce(list(tensors), list(outputs), name, process_set, grouped=True, op=op,
                              prescale=prescale_factor, postscale=postscale_factor))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                            op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce of every tensor of the list, answered together: a handle."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of every tensor of the list, answered together: a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce that backpropagates."""

    @staticmethod
    def forward(ctx: Any, average: Any, name: Any, op: Any, prescale_factor: Any, postscale_factor: Any,
                process_set: Any, *tensors: Any) -> Any:
        ctx.average, ctx.op, ctx.prescale_factor, ctx.postscale_factor = average, op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        handle = grouped_allreduce_async(list(tensors), average, name, op, prescale_factor, postscale_factor,
                                         process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output: Any) -> Any:
        reduced = grouped_allreduce([g.contiguous() for g in grad_output], average=ctx.average, op=ctx.op,
                                    prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                                    process_set=ctx.process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set
                      ) -> List[torch.Tensor]:
    """Every tensor of the list averaged (summed, ...) over the process set; differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors], strict=True)
    reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                            *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs, strict=True)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Every tensor of the list averaged (summed, ...) in place; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """A sparse tensor's indices and values allgathered (Horovod's sparse allreduce): a callable that waits and
    returns the combined sparse tensor."""
    indices = allgather_async(tensor._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                              process_set=process_set)
    values = allgather_async(tensor._values(), name=f"{name}.values", process_set=process_set)

    def finish() -> torch.Tensor:
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == AVERAGE:
            gathered_values = gathered_values / len(members(process_set.process_set_id) or [1])
        if gathered_indices.dim() == 0 or gathered_values.dim() == 0:
            return tensor.new().resize_as_(tensor)
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values, tensor.size(),
                                       dtype=tensor.dtype, device=tensor.device, check_invariants=False)

    return finish


# --- allgather ----------------------------------------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's `tensor` along the first dimension: a handle."""
    check_supported(tensor, reducing=False)
    return _enqueue(Allgather([tensor], [None], name, process_set))


def _set_size_and_rank(process_set: ProcessSet) -> tuple:
    ranks = members(process_set.process_set_id) or []
    return len(ranks), ranks.index(runtime.rank())


class HorovodAllgather(torch.autograd.Function):
    """Allgather that backpropagates: the gradient is averaged, then this rank's rows taken."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, name: Any, process_set: Any) -> Any:
        ctx.dim = tensor.shape[0] if tensor.dim() else 0
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        reduced = allreduce(grad_output.contiguous(), average=True, process_set=ctx.process_set)
        dims = allgather(torch.IntTensor([ctx.dim]), process_set=ctx.process_set)
        _, set_rank = _set_size_and_rank(ctx.process_set)
        offset = int(dims[:set_rank].sum()) if set_rank else 0
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along the first dimension; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of every tensor of the list, answered together: a handle."""
    _check_group(tensors, reducing=False)
    return _enqueue(Allgather(list(tensors), [None] * len(tensors), name, process_set, grouped=True))


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather that backpropagates."""

    @staticmethod
    def forward(ctx: Any, name: Any, process_set: Any, *tensors: Any) -> Any:
        ctx.dims = [t.shape[0] if t.dim() else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grad_output: Any) -> Any:
        reduced = grouped_allreduce([g.contiguous() for g in grad_output], average=True, process_set=ctx.process_set)
        dims = grouped_allgather([torch.IntTensor([d]) for d in ctx.dims], process_set=ctx.process_set)
        _, set_rank = _set_size_and_rank(ctx.process_set)
        grads = []
        for grad, gathered, dim in zip(reduced, dims, ctx.dims, strict=True):
            offset = int(gathered[:set_rank].sum()) if set_rank else 0
            grads.append(grad.narrow(0, offset, dim))
        return (None, None, *grads)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Every tensor of the list allgathered; differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# --- broadcast ----------------------------------------------------------------------------------------------------
def _broadcast_async(tensor: torch.Tensor, output: torch.Tensor, root_rank: int, name: Optional[str],
                     process_set: ProcessSet) -> int:
    check_supported(tensor, reducing=False)
    return _enqueue(Broadcast([tensor], [output], name, process_set, root=int(root_rank)))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start copying root's `tensor` (root a global rank) into a new tensor on every rank: a handle."""
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start copying root's `tensor` into `tensor` on every rank: a handle."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast that backpropagates: the averaged gradient reaches the root only."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, root_rank: Any, name: Any, process_set: Any) -> Any:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        reduced = allreduce(grad_output.contiguous(), average=True, process_set=ctx.process_set)
        if runtime.rank() != ctx.root_rank:
            reduced *= 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Root's `tensor` on every rank, as a new tensor; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Root's `tensor` copied into `tensor` on every rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- alltoall -----------------------------------------------------------------------------------------------------
def _splits(splits: Any) -> List[int]:
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError("alltoall expects a 1D splits tensor")
        if splits.dtype != torch.int32:
            raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start sending `splits[i]` rows of `tensor` to the i-th rank of the set (equal shares without splits): a
    handle whose result is (rows received, received splits)."""
    check_supported(tensor, reducing=False)
    set_size = len(members(process_set.process_set_id) or [])
    first = tensor.shape[0] if tensor.dim() else 0
    resolved = alltoall_splits(first, _splits(splits), max(set_size, 1)) if set_size else []
    where = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")
    return _enqueue(Alltoall([tensor], [None], name, process_set, splits=resolved, received_on=where))


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall that backpropagates: the gradient goes back by the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, splits: Any, name: Any, process_set: Any) -> Any:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad_output: Any, *unused: Any) -> Any:
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Rows of `tensor` exchanged with every rank of the set: the rows received, and with `splits` also the received
    splits; differentiable."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# --- reducescatter ------------------------------------------------------------------------------------------------
def _check_reducescatter(op: int) -> None:
    if op not in (AVERAGE, SUM):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = AVERAGE,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start reducing `tensor` over the set and keeping this rank's rows of the result: a handle."""
    _check_reducescatter(op)
    check_supported(tensor, reducing=True)
    return _enqueue(Reducescatter([tensor], [None], name, process_set, op=op, prescale=prescale_factor,
                                  postscale=postscale_factor))


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter that backpropagates: the gradient allgathered (scaled as the forward was)."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, name: Any, op: Any, process_set: Any, prescale_factor: Any,
                postscale_factor: Any) -> Any:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        if ctx.op == SUM:
            grad_output = grad_output * len(members(ctx.process_set.process_set_id) or [1])
        if ctx.prescale_factor != 1.0:
            grad_output = grad_output * ctx.prescale_factor
        if ctx.postscale_factor != 1.0:
            grad_output = grad_output * ctx.postscale_factor
        return allgather(grad_output.contiguous(), process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression=Compression.none, op: int = AVERAGE,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """`tensor` reduced over the set, this rank's rows of it; differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None, op: int = AVERAGE,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of every tensor of the list, answered together: a handle."""
    _check_reducescatter(op)
    _check_group(tensors, reducing=True)
    return _enqueue(Reducescatter(list(tensors), [None] * len(tensors), name, process_set, grouped=True, op=op,
                                  prescale=prescale_factor, postscale=postscale_factor))


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter that backpropagates."""

    @staticmethod
    def forward(ctx: Any, name: Any, op: Any, process_set: Any, prescale_factor: Any, postscale_factor: Any,
                *tensors: Any) -> Any:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        handle = grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor, postscale_factor)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output: Any) -> Any:
        grads = list(grad_output)
        if ctx.op == SUM:
            grads = [g * len(members(ctx.process_set.process_set_id) or [1]) for g in grads]
        if ctx.prescale_factor != 1.0:
            grads = [ctx.prescale_factor * g for g in grads]
        if ctx.postscale_factor != 1.0:
            grads = [ctx.postscale_factor * g for g in grads]
        return (None, None, None, None, None,
                *grouped_allgather([g.contiguous() for g in grads], process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None, compression=Compression.none,
                          op: int = AVERAGE, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Every tensor of the list reducescattered; differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors], strict=True)
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs, strict=True)]


# --- join and barrier ---------------------------------------------------------------------------------------------
def join(device: int = -1) -> int:
    """This rank has no more data: until every rank joined, it adds zeros to the others' allreduces. Returns the rank
    that joined last, on every rank."""
    state = runtime.active()
    state.join_device = int(device)
    try:
        return int(synchronize(_control(JOIN, "join.noname", global_process_set, device=int(device))))
    finally:
        state.join_device = -1


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the set reaches the barrier."""
    synchronize(_control(BARRIER, "barrier.noname", process_set))
