"""--reduction exact: one optimizer step with the same bits on both backends, at every world size.

The step's global batch is cut into micro-batches of --micro-batch samples, numbered in the order of
the global batch; each rank computes a contiguous block of them, one after the other, each exactly as
any other world size would compute it (the same samples, weights, thread count and random numbers).
What would make the result depend on who computed what is taken out:

- the sum of gradients: fixed-point integers, summed by the backend's integer allreduce (fixedpoint.py),
  made tensor by tensor as backward finishes each gradient, and started bucket by bucket during the
  rank's last micro-batch (buckets.py);
- the order of anything else summed: each micro-batch's loss, correct count, largest gradient and
  BatchNorm statistics travel in one float64 vector where every value has its own slot, zero elsewhere,
  so the allreduce adds only zeros to it (x + 0 = x exactly), and every rank then reads all values and
  combines them in micro-batch order;
- random numbers (dropout): drawn from a generator seeded by (seed, step, micro-batch);
- BatchNorm running statistics: folded in micro-batch order on every rank (shardstats.py).

Clipping and the optimizer then act on the same gradients on every rank.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from common.config import Config
from common.loop.backend import Backend
from common.loop.batches import Batches
from common.loop.finite import NonFinite
from common.loop.metrics import SumMeter
from common.loop.precision import Precision
from .buckets import BucketedSum
from .fixedpoint import FixedPoint, tensor_maxima
from .shardstats import ShardStatistics


def micro_batch_seed(seed: int, step: int, micro_batch: int) -> int:
    """The random seed of one micro-batch of one step: the same whichever rank computes it."""
    digest = hashlib.blake2b(f"{seed}/{step}/{micro_batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ExactStep:
    """A step of --reduction exact on this rank's block of micro-batches (see the module's docstring)."""

    #: the epoch's training metrics it adds are the global ones, the same on every rank
    global_meter = True
    #: what a rank in this step is said to do (common.faults.liveness); its integer sums mark themselves as waits
    doing = "forward, backward and the exact sum"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, backend: Backend,
                 precision: Precision, config: Config, batches: Batches) -> None:
        self.model, self.optimizer, self.backend, self.precision = model, optimizer, backend, precision
        self.clip_grad_norm, self.seed, self.micro_batch = config.clip_grad_norm, config.seed, config.micro_batch
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.count = batches.micro_batches
        self.world = backend.world_size
        self.local = self.count // self.world
        self.first = backend.rank * self.local
        self.fixed = FixedPoint([p.numel() for p in self.params], self.count)
        self.stats = ShardStatistics(model)
        self.sums = BucketedSum([p.numel() for p in self.params], max(1, int(config.bucket_mb * 2**20) // 8))
        self._comm_s = 0.0
        self._integers: Optional[torch.Tensor] = None  # this rank's integer sum of its micro-batches' gradients
        self._micro: Optional[_MicroBatch] = None  # the micro-batch whose backward is running
        for index, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(functools.partial(self._gradient_done, index))
        # Slots of the exchanged vector: losses, correct counts, each rank's largest gradients, whether
        # each rank's gradients fitted the scales, BatchNorm statistics of each micro-batch.
        tensors = len(self.params)
        self._losses = slice(0, self.count)
        self._correct = slice(self._losses.stop, 2 * self.count)
        self._maxima = slice(self._correct.stop, self._correct.stop + self.world * tensors)
        self._unfit = slice(self._maxima.stop, self._maxima.stop + self.world)
        self._stats = slice(self._unfit.stop, self._unfit.stop + self.count * self.stats.width)
        self.width = self._stats.stop

    def __call__(self, group: List[Tuple[torch.Tensor, torch.Tensor]], meter: SumMeter,
                 step: int) -> Tuple[torch.Tensor, int]:
        """Compute, sum and apply the gradients of `step`; add the step's global metrics to `meter`.
        Returns (the mean loss over the global batch, samples in the global batch)."""
        (images, labels), = group
        shards = list(zip(images.split(self.micro_batch), labels.split(self.micro_batch), strict=True))
        while True:
            exchanged, integers, fitted = self._micro_batches(shards, step)
            self._timed(self.sums.wait)  # the integer sums the last micro-batch started
            self._timed(functools.partial(self.backend.all_reduce_, exchanged))
            maxima = exchanged[self._maxima].view(self.world, -1).max(dim=0).values
            if not bool(torch.isfinite(maxima).all()):
                raise NonFinite(f"a gradient is not finite at step {step + 1}; stopping without writing a checkpoint "
                                "(the last good one is kept); lower --lr or check the data")
            if fitted and not bool(exchanged[self._unfit].any()):
                break
            self.fixed.rescale(maxima)  # a gradient outgrew its scale (or the first step): again, to scale
        grads: List[torch.Tensor] = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.empty_like(p)
            grads.append(p.grad)
        self.fixed.mean_into(integers, self.count, grads)
        self.fixed.rescale(maxima)  # the next step's scales, from this step's largest gradients
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
        self.optimizer.step()
        self.stats.fold_in(exchanged[self._stats].view(self.count, -1))
        losses, correct = exchanged[self._losses].tolist(), exchanged[self._correct].tolist()
        loss_sum = 0.0
        for value in losses:  # in micro-batch order, so the sums are the same at every world size
            loss_sum += value * self.micro_batch
        meter.add(self.count * self.micro_batch, loss=torch.tensor(loss_sum), correct=torch.tensor(float(sum(correct))))
        return torch.tensor(loss_sum / (self.count * self.micro_batch)), self.count * self.micro_batch

    def _micro_batches(self, shards, step: int):
        """This rank's micro-batches: their integer gradient sum (its allreduce started), the vector of values
        to exchange, and whether every gradient fitted its scale (if not, the integers are of no use)."""
        device = self.params[0].device
        exchanged = torch.zeros(self.width, dtype=torch.float64, device=device)
        if self._integers is None:  # kept between steps: a new one would be paged in afresh every step
            self._integers = torch.empty(sum(p.numel() for p in self.params), dtype=torch.int64, device=device)
        integers = self._integers  # every rank has at least one micro-batch (Batches), whose integers are written
        local_maxima = torch.zeros(len(self.params), dtype=torch.float64, device=device)
        fitted = True
        stats = exchanged[self._stats].view(self.count, -1)
        for i, (x, y) in enumerate(shards):
            index = self.first + i
            torch.manual_seed(micro_batch_seed(self.seed, step, index))
            for p in self.params:  # zeroed, not dropped: backward adds into them instead of allocating them anew
                if p.grad is not None:
                    p.grad.zero_()
            # The rank's last micro-batch starts the sums; without scales (the first step) every rank knows that
            # no gradient fits them, and nothing is worth summing.
            scaled = self.fixed.exponents is not None
            starts = scaled and i == len(shards) - 1
            if starts:
                self.sums.begin(integers, self.backend.all_reduce_start_)
            self._micro = micro = _MicroBatch(integers, local_maxima, first=i == 0, scaled=scaled, starts=starts,
                                              added=[False] * len(self.params))
            try:
                with self.stats.capture(stats[index]):  # around backward too: it reads the running statistics
                    with self.precision.autocast():
                        logits = self.model(x)
                        loss = F.cross_entropy(logits, y)
                    loss.backward()  # each gradient's integers are added as soon as it is done (_gradient_done)
                for t, p in enumerate(self.params):  # the tensors backward gave no gradient
                    if not micro.added[t]:
                        self._add(micro, t, p.grad if p.grad is not None else torch.zeros_like(p))
            finally:
                self._micro = None
            fitted = fitted and self.fixed.fits(local_maxima)  # if not, the integers are of no use
            exchanged[self._losses][index] = loss.detach().to(torch.float64)
            exchanged[self._correct][index] = (logits.detach().argmax(dim=1) == y).sum().to(torch.float64)
        exchanged[self._maxima].view(self.world, -1)[self.backend.rank] = local_maxima
        exchanged[self._unfit][self.backend.rank] = 0.0 if fitted else 1.0
        return exchanged, integers, fitted

    def _gradient_done(self, index: int, param: torch.Tensor) -> None:
        """Backward has finished the gradient of parameter `index` in one of this step's micro-batches."""
        # Not a backward of this step's when there is no micro-batch (none runs elsewhere in exact mode); the
        # hook runs once the gradient is there.
        if self._micro is not None and param.grad is not None:
            self._add(self._micro, index, param.grad)

    def _add(self, micro: _MicroBatch, index: int, grad: torch.Tensor) -> None:
        """Tensor `index`'s gradient in the running micro-batch `micro`: its largest magnitude and its integers;
        then the bucket sums that are complete start."""
        micro.maxima[index] = torch.maximum(micro.maxima[index], tensor_maxima([grad])[0])
        if micro.scaled:
            self.fixed.add_tensor_integers(index, grad, micro.integers, first=micro.first)
        micro.added[index] = True
        if micro.starts:
            self.sums.added(index)

    def _timed(self, collective) -> None:
        started = time.perf_counter()
        collective()
        self._comm_s += time.perf_counter() - started

    def bytes_per_step(self) -> int:
        """Bytes each rank hands the allreduces per step (none repeated): int64 gradient sums and the
        float64 vector of per-micro-batch values."""
        return 8 * sum(p.numel() for p in self.params) + 8 * self.width

    def take_comm_seconds(self) -> float:
        """Seconds spent in this step's collectives since the last call (none of it hidden by compute)."""
        seconds, self._comm_s = self._comm_s, 0.0
        return seconds

    def state_dict(self) -> dict:
        """What a checkpoint must keep for the next step to round as an undisturbed run would."""
        return self.fixed.state_dict()

    def load_state_dict(self, state) -> None:
        """Restore it."""
        self.fixed.load_state_dict(state)


@dataclass
class _MicroBatch:
    """The running micro-batch, as backward finishes its gradients one by one."""

    integers: torch.Tensor  # this rank's integer sum, which its gradients are added to
    maxima: torch.Tensor  # this rank's largest magnitude per tensor so far this step
    first: bool  # this rank's first micro-batch: its integers are written, not added
    scaled: bool  # there are scales to make integers with
    starts: bool  # its tensors start the bucket sums (the rank's last micro-batch, scaled)
    added: List[bool] = field(default_factory=list)  # per tensor: its gradient was handled
