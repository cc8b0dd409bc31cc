"""Horovod's checks of one collective across the ranks that asked for it, with its messages: the same type, the same
operation, the same shapes (all but the first dimension for gathers and alltoall), scale factors, reduction op, root
rank and device kind on every rank, and what cannot run while ranks have joined. Pure: requests in, a message out."""

from __future__ import annotations

from typing import List, Optional, Sequence

from .dtypes import DTYPES
from .messages import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER, REDUCING, Request

#: what Horovod says of each kind of collective that cannot run while ranks have joined
NOT_WITH_JOIN = {
    ALLGATHER: "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if using "
               "DistributedOptimizer",
    ALLTOALL: "Alltoall is not supported with Join at this time.",
    REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
    BROADCAST: "Broadcast is not supported with Join at this time.",
}


def shape_text(shape: Sequence[int]) -> str:
    """A shape as Horovod's TensorShape::DebugString writes it: [17, 17]."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def factor_text(value: float) -> str:
    """A double as C++'s default stream writes it (6 significant digits)."""
    return f"{value:g}"


def _first_difference(requests: Sequence[Request], key) -> Optional[Request]:
    first = key(requests[0])
    return next((r for r in requests[1:] if key(r) != first), None)


def _gather_shapes(requests: Sequence[Request], kind: str) -> Optional[str]:
    """Allgather and alltoall: the same rank and every dimension but the first equal."""
    shape = requests[0].shape
    if not shape:
        return f"Process-set rank zero tried to {kind} a rank-zero tensor."
    for request in requests[1:]:
        other = request.shape
        if len(other) != len(shape):
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of rank {len(shape)}, but another rank "
                    f"sent a tensor of rank {len(other)}.")
        for dim in range(1, len(shape)):
            if shape[dim] != other[dim]:
                return (f"Mismatched {kind} tensor shapes: One rank sent a tensor with dimension {dim} equal to "
                        f"{shape[dim]}, but another rank sent a tensor with dimension {dim} equal to {other[dim]}.")
    return None


def mismatch(requests: Sequence[Request], joined: int = 0, fusion_threshold: int = 128 * 2 ** 20) -> Optional[str]:
    """Why these requests (one per asking rank, in set-rank order) cannot run together, as Horovod says it; None
    when they can. `joined`: how many ranks of the set have joined."""
    first = requests[0]
    kind = first.kind
    other = _first_difference(requests, lambda r: r.dtype)
    if other is not None:
        return f"Mismatched data types: One rank had type {first.dtype}, but another rank had type {other.dtype}."
    other = _first_difference(requests, lambda r: r.kind)
    if other is not None:
        return f"Mismatched operations: One rank did an {kind}, but another rank did an {other.kind}."
    if kind in (ALLREDUCE, BROADCAST, REDUCESCATTER):
        other = _first_difference(requests, lambda r: list(r.shape))
        if other is not None:
            return (f"Mismatched {kind} tensor shapes: One rank sent a tensor of shape {shape_text(first.shape)}, "
                    f"but another rank sent a tensor of shape {shape_text(other.shape)}.")
    if kind in REDUCING:
        other = _first_difference(requests, lambda r: (r.prescale, r.postscale))
        if other is not None:
            return (f"Mismatched prescale and/or postscale factors: One rank sent factors "
                    f"({factor_text(first.prescale)}, {factor_text(first.postscale)}), but another rank sent factors "
                    f"({factor_text(other.prescale)}, {factor_text(other.postscale)}).")
    if kind == ALLREDUCE:
        other = _first_difference(requests, lambda r: r.op)
        if other is not None:
            return (f"Mismatched reduction operation: One rank sent reduction op {first.op}, but another rank sent "
                    f"reduction op {other.op}.")
    if kind in NOT_WITH_JOIN and joined:
        return NOT_WITH_JOIN[kind]
    if kind in (ALLGATHER, ALLTOALL):
        problem = _gather_shapes(requests, kind)
        if problem:
            return problem
    if kind == REDUCESCATTER:
        if not first.shape:
            return f"Process-set rank zero tried to {kind} a rank-zero tensor."
        if first.prescale != 1.0:
            size = 1
            for dim in first.shape:
                size *= dim
            nbytes = size * DTYPES[first.dtype].itemsize
            if nbytes > fusion_threshold:
                return (f"Reducescatter with prescale_factor == {factor_text(first.prescale)} != 1.0: The fusion "
                        f"buffer is not large enough to hold the input tensor ({nbytes} bytes); increase "
                        "HOROVOD_FUSION_THRESHOLD.")
    if kind == BROADCAST:
        other = _first_difference(requests, lambda r: r.root)
        if other is not None:
            return (f"Mismatched {kind} root ranks: One rank specified root rank {first.root}, but another rank "
                    f"specified root rank {other.root}.")
    other = _first_difference(requests, lambda r: r.device < 0)
    if other is not None:
        return (f"Mismatched {kind} CPU/GPU device selection: One rank specified device "
                f"{'CPU' if first.device < 0 else 'GPU'}, but another rank specified device "
                f"{'CPU' if other.device < 0 else 'GPU'}.")
    return None


def set_ranks_problem(requests: Sequence[Request]) -> Optional[str]:
    """A process set added or removed: every rank must name the same one."""
    other = _first_difference(requests, lambda r: (list(r.ranks), r.set_id))
    if other is not None:
        return (f"Mismatched process set: One rank gave ranks {requests[0].ranks}, but another rank gave ranks "
                f"{other.ranks}; call hvd.add_process_set and hvd.remove_process_set with the same ranks on every "
                "rank, in the same order.")
    return None


def fused_bytes(shapes: List[List[int]], itemsize: int) -> int:
    """The bytes of tensors of these shapes."""
    total = 0
    for shape in shapes:
        count = 1
        for dim in shape:
            count *= dim
        total += count * itemsize
    return total
