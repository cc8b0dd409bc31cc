"""Gradients as fixed-point integers, so that their sum is the same in any order, on any number of ranks.

Floating-point addition is not associative: (a + b) + c and a + (b + c) can differ in the last bit, so
a sum grouped differently by another world size or another backend gives other bits. Integer addition
is associative. Each micro-batch's gradient is turned into integers with a scale 2**k per parameter
tensor that every rank agrees on, the integers are summed (locally, then by the backends' integer
allreduce), and the sum is turned back: the same integers, hence the same bits, everywhere.

The scale of a tensor is chosen from the largest gradient element seen in the previous step, with
HEADROOM_BITS to spare, so that the sum of all micro-batches stays within int64. When a gradient
grows past that (and at the first step, which has no previous one) the step is computed again with a
scale from the maxima just measured. An element far smaller than its tensor's largest one (below
2**-(62 - HEADROOM_BITS - log2 micro-batches) of it) is rounded to that resolution: far below float32's
own rounding of the sum for every element within 2**24 of the largest.
"""

from __future__ import annotations

import itertools
import math
from typing import List, Optional, Sequence

import torch

#: bits of growth a gradient may show from one step to the next before its step is computed again
HEADROOM_BITS = 8
#: int64 leaves 62 bits for magnitudes, the sign and one bit of carry aside
MAGNITUDE_BITS = 62
#: the largest k with 2**k a float32
FLOAT32_MAX_EXPONENT = 127


class FixedPoint:
    """Per-tensor scales and the conversions between float gradients and their integer sums."""

    def __init__(self, sizes: Sequence[int], micro_batches: int) -> None:
        self.sizes = list(sizes)
        self.offsets = [0, *itertools.accumulate(self.sizes)][:-1]  # where each tensor starts in the flat gradients
        self.sum_bits = max(math.ceil(math.log2(micro_batches)), 0)  # bits the sum of all micro-batches adds
        self.exponents: Optional[List[int]] = None  # per tensor: its largest element is below 2**exponent
        self._wide: Optional[torch.Tensor] = None  # add_integers' work buffers
        self._narrow: Optional[torch.Tensor] = None
        self._float: Optional[torch.Tensor] = None

    # --- the scales ---------------------------------------------------------------------------------
    def fits(self, maxima: torch.Tensor) -> bool:
        """Whether gradients with these per-tensor largest magnitudes fit the current scales."""
        if self.exponents is None:
            return False
        return all(_exponent(m) <= e + HEADROOM_BITS for m, e in zip(maxima.tolist(), self.exponents, strict=True))

    def rescale(self, maxima: torch.Tensor) -> None:
        """Scales for gradients whose per-tensor largest magnitudes are `maxima` (the same on every rank)."""
        self.exponents = [_exponent(m) for m in maxima.tolist()]

    def _ks(self) -> List[int]:
        """Per tensor, the k of its scale 2**k: a tensor's largest element, grown by up to HEADROOM_BITS, maps below
        2**(62 - sum_bits), so the sum over all micro-batches stays below 2**62."""
        assert self.exponents is not None, "rescale() sets the scales before any conversion"
        return [MAGNITUDE_BITS - self.sum_bits - HEADROOM_BITS - e for e in self.exponents]

    # --- the conversions ----------------------------------------------------------------------------
    def to_integers(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat float gradient as int64 multiples of each tensor's 2**-k (see add_integers)."""
        total = torch.empty(flat.numel(), dtype=torch.int64, device=flat.device)
        self.add_integers(list(flat.split(self.sizes)), total, first=True)
        return total

    def add_integers(self, grads: Sequence[torch.Tensor], total: torch.Tensor, first: bool = False) -> None:
        """Add the integers of one micro-batch's gradients (one tensor per parameter, in order) to the flat int64
        `total`, or write them there when `first` (see add_tensor_integers)."""
        for index, grad in enumerate(grads):
            self.add_tensor_integers(index, grad, total, first)

    def add_tensor_integers(self, index: int, grad: torch.Tensor, total: torch.Tensor, first: bool = False) -> None:
        """Add the integers of one micro-batch's gradient of tensor `index` to its slice of the flat int64 `total`,
        or write them there when `first`: round(g x 2**k) per element, half to even, made in work buffers kept
        between calls, so that no gradient-sized tensor is allocated per call.

        The product is exact in float32 when 0 <= k <= 127: 2**k is a float32, and g x 2**k is at most 2**62
        (see _ks) and no smaller than g, so it neither overflows nor loses a bit to underflow; it is then the
        same real number as in float64, rounded to the same integer. Other scales take the float64 path."""
        wides, narrows, floats = self._work(total)
        k, start = self._ks()[index], self.offsets[index]
        end = start + self.sizes[index]
        if 0 <= k <= FLOAT32_MAX_EXPONENT:
            scaled = floats[start:end]
            torch.mul(grad.reshape(-1), 2.0 ** k, out=scaled)
        else:
            scaled = wides[start:end]
            scaled.copy_(grad.reshape(-1))  # float32 to float64: exact
            scaled.mul_(2.0 ** k)  # a power of two: exact
        scaled.round_()
        if first:
            total[start:end].copy_(scaled)  # an integer below 2**62: exact
        else:
            narrow = narrows[start:end]
            narrow.copy_(scaled)
            total[start:end].add_(narrow)

    def mean_into(self, total: torch.Tensor, count: int, grads: Sequence[torch.Tensor]) -> None:
        """Write the mean over `count` micro-batches of the summed integers into `grads` (float32, one tensor per
        parameter, in order): float32(float64(sum) / (count x 2**k)) per element, tensor by tensor.
        One division rounds the same real number as multiplying by 2**-k (exact) and then dividing by `count` would,
        so the bits are those of the mean. One pass per tensor: the divisor is a float64 tensor, so the integers are
        divided in float64 (a Python float would make it float32) and only the quotient is rounded to float32."""
        for grad, k, start, size in zip(grads, self._ks(), self.offsets, self.sizes, strict=True):
            divisor = torch.tensor(count * 2.0 ** k, dtype=torch.float64)
            torch.div(total[start:start + size], divisor, out=grad.view(-1))

    def _work(self, total: torch.Tensor):
        """The float64, int64 and float32 work buffers, the size of the flat gradients (made once)."""
        if self._wide is None or self._wide.numel() != total.numel() or self._wide.device != total.device:
            self._wide = torch.empty(total.numel(), dtype=torch.float64, device=total.device)
            self._narrow = torch.empty(total.numel(), dtype=torch.int64, device=total.device)
            self._float = torch.empty(total.numel(), dtype=torch.float32, device=total.device)
        return self._wide, self._narrow, self._float

    def to_floats(self, total: torch.Tensor, count: int) -> torch.Tensor:
        """The mean over `count` micro-batches of the summed integers, as one flat float32 tensor (see mean_into)."""
        flat = torch.empty(total.numel(), dtype=torch.float32, device=total.device)
        self.mean_into(total, count, list(flat.split(self.sizes)))
        return flat

    def state_dict(self) -> dict:
        """The scales, for a checkpoint: a resumed run must round the next step exactly as the first run."""
        return {"exponents": self.exponents}

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Restore the scales (None: the next step measures them)."""
        self.exponents = list(state["exponents"]) if state and state.get("exponents") is not None else None


def _exponent(value: float) -> int:
    """The e with value < 2**e (0 for a zero tensor)."""
    return math.frexp(value)[1] if value > 0 else 0


def tensor_maxima(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The largest magnitude of each tensor, float64 (exactly the float32 values), from its smallest and largest
    element: one pass, no copy of the tensor's magnitudes; a NaN stays a NaN."""
    return torch.stack([_largest_magnitude(t.detach()) if t.numel() else
                        torch.zeros((), dtype=torch.float64, device=t.device) for t in tensors])


def _largest_magnitude(t: torch.Tensor) -> torch.Tensor:
    smallest, largest = torch.aminmax(t)
    return torch.maximum(largest, -smallest).abs().to(torch.float64)  # abs: a zero tensor gives +0
