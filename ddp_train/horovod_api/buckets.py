"""A DistributedOptimizer's gradients asked for by bucket after its first step, as DDP's reducer does: the
parameters in buckets of consecutive parameters in the reverse of their order (the order backward produces their
gradients), each closed once it holds 1 MiB (the first, so that communication starts early) or 25 MiB (the others;
DDP's defaults, or HOROVOD_FUSION_THRESHOLD where it is smaller). As in DDP, the gradient that reaches the size goes
in, so only the last bucket is smaller: that bucket is complete only when backward ends, and nothing hides its
reduction. A bucket's gradients travel as one flat tensor, one request, once all of them are ready: the same sums,
element by element, as the tensors fused one by one, for a fraction of the per-tensor work. Every rank forms its
buckets itself; the first step checks that every rank formed the same ones (a digest, agreed by one allreduce), and
where they differ the gradients stay one request each."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import torch

#: DDP's bucket sizes (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES and bucket_cap_mb)
FIRST_BUCKET_BYTES = 2 ** 20
BUCKET_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class Slot:
    """One parameter as the layout sees it: its place in the optimizer, its gradient's bytes, and what a bucket's
    members must share (dtype and device)."""

    index: int
    nbytes: int
    kind: Tuple[Any, ...]


def layout(slots: Sequence[Slot], cap: int, first_cap: int = FIRST_BUCKET_BYTES) -> List[List[int]]:
    """The buckets of `slots` (given in backward's order) by DDP's rule: consecutive runs of one kind, each closed
    once it holds at least `cap` bytes (the first, `first_cap`), the slot that reaches the size included; the slots'
    indices."""
    buckets: List[List[int]] = []
    current: List[int] = []
    size, kind = 0, None
    for slot in slots:
        if current and slot.kind != kind:
            buckets.append(current)
            current, size = [], 0
        current.append(slot.index)
        size += slot.nbytes
        kind = slot.kind
        if size >= (first_cap if not buckets else cap):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def digest(names: Sequence[Sequence[str]]) -> int:
    """A number in [1, 2**62) that differs, but for chance, between two different layouts (buckets of names)."""
    text = "\n".join("\t".join(bucket) for bucket in names).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % (2 ** 62 - 1) + 1


class Bucket:
    """Parameters whose gradients are reduced together: their request's name, a buffer that holds their gradients
    one after the other (views of it in the parameters' shapes), each member's backward passes still to come before
    its gradient counts (backward_passes_per_step), and how many members' gradients arrived this step."""

    def __init__(self, name: str, params: List[torch.Tensor], passes: int) -> None:
        self.name = name
        self.params = params
        self.passes = passes
        self.delays = [passes] * len(params)
        self.arrived = 0
        self.checked = False  # every rank's request of it was matched once
        self.hooked = True  # every member's gradient is counted as it comes (else: asked for when backward ends)
        self.accumulators: List[Any] = []  # unhooked: the members' gradient accumulators (autograd nodes)
        self.grads: List[torch.Tensor] = []  # the gradients flat() read, which scatter() writes
        first = params[0]
        self.buffer = torch.empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
        self.views = [part.view(p.shape) for part, p in zip(self.buffer.split([p.numel() for p in params]), params,
                                                           strict=True)]

    def restart(self, passes: int) -> None:
        """A new step: every member's passes to come, none arrived."""
        self.passes = passes
        self.delays = [passes] * len(self.params)
        self.arrived = 0

    def flat(self) -> torch.Tensor:
        """The members' gradients copied into the buffer (zeros where a gradient is missing): the buffer."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):  # (`None in grads` would compare tensors with ==)
            for i, p in enumerate(self.params):
                if p.grad is None:
                    p.grad = grads[i] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        torch._foreach_copy_(self.views, grads)  # type: ignore[arg-type]
        self.grads = grads  # type: ignore[assignment]  # no None left
        return self.buffer

    def scatter(self, reduced: torch.Tensor) -> None:
        """The reduced flat tensor (the buffer, or a tensor like it) back, in place, into the gradients flat() read
        (a list of tensors read once: a parameter's .grad is a call)."""
        parts = self.views if reduced.data_ptr() == self.buffer.data_ptr() else [
            part.view(view.shape) for part, view in zip(reduced.split([v.numel() for v in self.views]), self.views,
                                                        strict=True)]
        torch._foreach_copy_(self.grads, parts)
