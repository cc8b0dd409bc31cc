"""Broadcasting a model's parameters, an optimizer's state and any picklable object, and gathering objects, as
Horovod does it (the names its collectives get, the order, its zero-gradient step)."""

from __future__ import annotations

import collections
import io
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import cloudpickle
import torch

from . import runtime
from .enqueue import synchronize
from .mpi_ops import allgather, broadcast_, broadcast_async_
from .process_sets import ProcessSet, global_process_set


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Copy root's tensors into every rank's: a `state_dict()` (broadcast in the order of its sorted names), or a list
    of parameters or (name, parameter) pairs."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = [broadcast_async_(p, root_rank, name) for name, p in items]
    for handle in handles:
        synchronize(handle)


def _is_distributed(optimizer: torch.optim.Optimizer) -> bool:
    return bool(getattr(optimizer, "_horovod_api_distributed", False))


def _initialize_state(optimizer: torch.optim.Optimizer, model: Optional[torch.nn.Module]) -> None:
    """Horovod's zero-gradient step: a fresh optimizer gets its state from one step with zero gradients (which moves
    the weights under weight decay, or Adam's decoupled decay). A DistributedOptimizer takes the step of the optimizer
    it wraps, so that no rank waits on allreduces here."""
    sparse: Set[int] = set()
    if model is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.sparse:
                sparse.update(id(p) for p in module.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    if _is_distributed(optimizer):
        optimizer._horovod_api_local_step()  # type: ignore[attr-defined]
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None) -> None:
    """Copy root's optimizer state and options (learning rate, ...) into every rank's optimizer. A fresh optimizer
    first takes Horovod's zero-gradient step (see _initialize_state), as Horovod does."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _initialize_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        return  # a stateless optimizer: nothing to broadcast

    tensors: List[Tuple[str, torch.Tensor]] = []
    scalars: Dict[str, Any] = {}
    assign: Dict[str, Callable[[Any], None]] = {}
    occurrences: Dict[str, int] = collections.defaultdict(int)

    def set_state(pid: int, key: str) -> Callable[[Any], None]:
        def apply(value: Any) -> None:
            state_dict["state"][pid][key] = value
        return apply

    def set_option(index: int, key: str) -> Callable[[Any], None]:
        def apply(value: Any) -> None:
            optimizer.param_groups[index][key] = value
        return apply

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key == "params":
                continue
            name = f"{key}.{index}"
            scalars[name] = value
            assign[name] = set_option(index, key)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue
            for key, value in state_dict["state"][pid].items():
                occurrences[key] += 1
                name = f"{key}.{occurrences[key]}"
                if torch.is_tensor(value):
                    tensors.append((name, value))
                else:
                    scalars[name] = value
                    assign[name] = set_state(pid, key)
    # The tensors are the optimizer's own (state_dict() shares them): broadcast in place.
    broadcast_parameters(tensors, root_rank)
    received = broadcast_object(scalars, root_rank)
    for name, value in received.items():
        assign[name](value)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Root's object (pickled with cloudpickle) on every rank of the set."""
    if name is None:
        name = type(obj).__name__
    if runtime.rank() == root_rank:
        buffer = io.BytesIO()
        cloudpickle.dump(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int32)
        broadcast_(length, root_rank, name + ".sz", process_set)
    else:
        length = torch.tensor([0], dtype=torch.int32)
        broadcast_(length, root_rank, name + ".sz", process_set)
        payload = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast_(payload, root_rank, name + ".t", process_set)
    if runtime.rank() == root_rank:
        return obj
    return cloudpickle.load(io.BytesIO(payload.numpy().tobytes()))


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Every rank's object (pickled with cloudpickle), in rank order."""
    if name is None:
        name = type(obj).__name__
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int32), name=name + ".sz").tolist()
    gathered = allgather(payload, name=name + ".t").numpy()
    objects = []
    start = 0
    for count in sizes:
        objects.append(cloudpickle.load(io.BytesIO(gathered[start:start + count].tobytes())))
        start += count
    return objects
