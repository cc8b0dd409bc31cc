"""Which tensors Horovod's torch API takes for which collective, and the names its messages give types and ops."""

from __future__ import annotations

from typing import Dict, FrozenSet

import torch

#: torch dtype -> Horovod's DataType name (message.h), for the dtypes its torch extension registers
TYPE_NAMES: Dict[torch.dtype, str] = {
    torch.uint8: "HOROVOD_UINT8", torch.int8: "HOROVOD_INT8", torch.int16: "HOROVOD_INT16",
    torch.int32: "HOROVOD_INT32", torch.int64: "HOROVOD_INT64", torch.float16: "HOROVOD_FLOAT16",
    torch.float32: "HOROVOD_FLOAT32", torch.float64: "HOROVOD_FLOAT64",
}
DTYPES: Dict[str, torch.dtype] = {name: dtype for dtype, name in TYPE_NAMES.items()}

#: reductions (allreduce, reducescatter) take these; gathers, broadcasts and alltoalls take every type above
REDUCIBLE: FrozenSet[torch.dtype] = frozenset({torch.int32, torch.int64, torch.float16, torch.float32, torch.float64})

# Horovod's reduction ops, with the values of its ReduceOp enum (hvd.Average == 0, ...).
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5

#: the device a request names for CPU tensors (Horovod's CPU_DEVICE_ID)
CPU_DEVICE = -1


def legacy_type(tensor: torch.Tensor) -> str:
    """`tensor.type()`, the name Horovod's messages use ("torch.FloatTensor", "torch.cuda.HalfTensor")."""
    return tensor.type()


def check_supported(tensor: torch.Tensor, reducing: bool) -> None:
    """ValueError, as Horovod raises it, for a tensor its torch extension has no function for, or not contiguous."""
    allowed = REDUCIBLE if reducing else TYPE_NAMES.keys()
    if tensor.dtype not in allowed or tensor.layout != torch.strided or tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"Tensor type {legacy_type(tensor)} is not supported.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def device_id(tensor: torch.Tensor) -> int:
    """The device a request names: the CUDA index, or CPU_DEVICE."""
    return tensor.device.index if tensor.device.type == "cuda" and tensor.device.index is not None else (
        torch.cuda.current_device() if tensor.device.type == "cuda" else CPU_DEVICE)
