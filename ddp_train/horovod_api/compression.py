"""Horovod's gradient compression: none, or float16 on the wire (floating-point tensors only)."""

from __future__ import annotations

from typing import Any, Tuple

import torch


class Compressor:
    """How a tensor travels: compress() gives what is sent and what decompress() needs to undo it."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The tensor as it is (the default)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own type; others as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        compressed = tensor.type(torch.float16) if tensor.dtype.is_floating_point else tensor
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class Compression:
    """hvd.Compression.none, hvd.Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
