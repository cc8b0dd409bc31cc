"""The integer sum of the gradients, started bucket by bucket while backward still computes the rest.

Backward computes the gradients of the last layers first. The flat integers are cut, from the last
tensor back, into buckets of whole tensors of at least --bucket-mb each. During a rank's last
micro-batch, a bucket's sum starts as soon as every tensor in it has all of this rank's micro-batches
added, and the buckets start in that fixed order on every rank (the backends pair the ranks'
collectives by the order they start in), whatever order backward finishes its tensors in. Integer
sums are the same in any grouping, so starting them early changes no bit.
"""

from __future__ import annotations

import itertools
from typing import Callable, List, Optional, Sequence

import torch

#: starts an in-place sum over all ranks and returns its wait (Backend.all_reduce_start_)
Start = Callable[[torch.Tensor], Callable[[], None]]


class BucketedSum:
    """The buckets of the flat integer gradients, and the sums started so far in one step."""

    def __init__(self, sizes: Sequence[int], bucket_elements: int) -> None:
        self.buckets: List[range] = []  # the tensor indices of each bucket, in starting order
        end, elements = len(sizes), 0
        for index in reversed(range(len(sizes))):
            elements += sizes[index]
            if elements >= bucket_elements or index == 0:
                self.buckets.append(range(index, end))
                end, elements = index, 0
        self._bucket_of = {index: b for b, tensors in enumerate(self.buckets) for index in tensors}
        offsets = [0, *itertools.accumulate(sizes)]
        self._slices = [slice(offsets[tensors.start], offsets[tensors.stop]) for tensors in self.buckets]
        self._integers: Optional[torch.Tensor] = None
        self._start: Optional[Start] = None
        self._missing: List[int] = []
        self._started = 0
        self._waits: List[Callable[[], None]] = []

    def begin(self, integers: torch.Tensor, start: Start) -> None:
        """This rank's last micro-batch begins: no tensor of it added to `integers` yet."""
        self._integers, self._start = integers, start
        self._missing = [len(tensors) for tensors in self.buckets]
        self._started, self._waits = 0, []

    def added(self, index: int) -> None:
        """Tensor `index` has every micro-batch of this rank added: start each bucket now complete, in order."""
        start, integers = self._start, self._integers
        assert start is not None and integers is not None, "begin() comes first"
        self._missing[self._bucket_of[index]] -= 1
        while self._started < len(self.buckets) and self._missing[self._started] == 0:
            self._waits.append(start(integers[self._slices[self._started]]))
            self._started += 1

    def wait(self) -> None:
        """Until every started sum is done (all of them once every tensor was added; none if begin() was not
        called this step)."""
        waits, self._waits = self._waits, []
        for wait in waits:
            wait()
