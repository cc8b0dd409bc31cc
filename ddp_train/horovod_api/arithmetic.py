"""Horovod's arithmetic, so that the API's results have Horovod's bits: how a buffer is scaled before and after the
sum, what Average divides by, how reducescatter splits the first dimension, and what alltoall's splits may be.

Horovod (its ScaleBuffer on CPU) multiplies a float32 buffer by the factor cast to float32, a float64 buffer by the
factor, a float16 buffer in float32 rounded back to float16, and an integer buffer by the factor in float64,
truncated toward zero. Average is a sum, then a multiplication by postscale_factor / size computed in float64: at
world size 3 a float32 gradient is multiplied by float32(1/3), not divided by 3.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .dtypes import AVERAGE


def scale_(buffer: torch.Tensor, factor: float) -> None:
    """Multiply `buffer` in place by `factor` as Horovod's ScaleBuffer does; a factor of 1 leaves it untouched."""
    if factor == 1.0:
        return
    if buffer.dtype.is_floating_point:
        # A Python float multiplies a float32 (float16) tensor as a float32 number in float32 arithmetic (rounded
        # to float16), a float64 tensor in float64: Horovod's (float)factor * x, and factor * x.
        buffer.mul_(factor)
    else:
        buffer.copy_(buffer.to(torch.float64).mul_(factor).trunc_())


def postscale(op: int, postscale_factor: float, set_size: int) -> float:
    """The factor applied after the sum: Average folds 1/size into it, in float64, as Horovod's controller does."""
    return postscale_factor / set_size if op == AVERAGE else postscale_factor


def reducescatter_rows(first_dim: int, set_size: int) -> List[int]:
    """The rows of the first dimension each rank of a reducescatter receives: equal shares, one more for each of the
    first `first_dim % set_size` ranks."""
    share, extra = divmod(first_dim, set_size)
    return [share + (1 if rank < extra else 0) for rank in range(set_size)]


def alltoall_splits(first_dim: int, splits: Sequence[int], set_size: int) -> List[int]:
    """The rows sent to each rank; ValueError with Horovod's text where `splits` cannot be."""
    if not splits:
        if first_dim % set_size:
            raise ValueError("splits not provided, but first dimension of tensor is not an even multiple of the "
                             "number of workers.")
        return [first_dim // set_size] * set_size
    if len(splits) != set_size:
        raise ValueError("Number of entries in splits does not equal number of workers.")
    if sum(splits) > first_dim:
        raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
    return list(splits)
