"""A DistributedOptimizer's gradients asked for by bucket after its first step, as DDP's reducer does: the
parameters in buckets of consecutive parameters in the reverse of their order (the order backward produces their
gradients), the first bucket at most 1 MiB so that communication starts early, the others at most 25 MiB (DDP's
defaults) or HOROVOD_FUSION_THRESHOLD where it is smaller. A bucket's gradients travel as one flat tensor, one
request, once all of them are ready: the same sums, element by element, as the tensors fused one by one, for a
fraction of the per-tensor work. Every rank forms its buckets itself; the first step checks that every rank formed
the same ones (a digest, agreed by one allreduce), and where they differ the gradients stay one request each."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
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
    """The buckets of `slots` (given in backward's order): consecutive runs of one kind, each at most `cap` bytes
    (the first at most `first_cap`), a parameter larger than the cap alone; the slots' indices."""
    buckets: List[List[int]] = []
    current: List[int] = []
    size, kind = 0, None
    for slot in slots:
        limit = first_cap if not buckets else cap
        if current and (slot.kind != kind or size + slot.nbytes > limit):
            buckets.append(current)
            current, size = [], 0
        current.append(slot.index)
        size += slot.nbytes
        kind = slot.kind
    if current:
        buckets.append(current)
    return buckets


def digest(names: Sequence[Sequence[str]]) -> int:
    """A number in [1, 2**62) that differs, but for chance, between two different layouts (buckets of names)."""
    text = "\n".join("\t".join(bucket) for bucket in names).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % (2 ** 62 - 1) + 1


@dataclass(eq=False)
class Bucket:
    """Parameters whose gradients are reduced together: their request's name, and how many arrived this step."""

    name: str
    params: List[torch.Tensor]
    arrived: int = 0
    checked: bool = False  # every rank's request of it was matched once
    sizes: List[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sizes = [p.numel() for p in self.params]

    def flat(self) -> torch.Tensor:
        """The members' gradients, one after the other, in one new tensor (zeros where a gradient is missing)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        return torch.cat([p.grad.reshape(-1) for p in self.params])  # type: ignore[union-attr]

    def scatter(self, reduced: torch.Tensor) -> None:
        """The reduced flat tensor back into the members' gradients."""
        grads = [p.grad for p in self.params]
        parts = [part.view(g.shape) for part, g in zip(reduced.split(self.sizes), grads, strict=True)]  # type: ignore
        torch._foreach_copy_(grads, parts)  # type: ignore[arg-type]
