"""BatchNorm running statistics in exact mode: updated in global micro-batch order on every rank.

In training, each forward pass of a BatchNorm layer folds its batch's mean and variance into the
running statistics. Which micro-batches a rank sees depends on the world size, so with the usual
update the statistics would too. Here each micro-batch's statistics are captured as BatchNorm itself
computes them (with momentum 1 the running values become the batch's own, then they are put back),
gathered from all ranks, and folded in on every rank in the order of the micro-batches of the global
batch: the same statistics at every world size, on every rank.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Tuple

import torch
from torch import nn


def batchnorm_layers(model: nn.Module) -> List[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers of `model` that keep running statistics."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def running_statistics(layer: nn.modules.batchnorm._BatchNorm) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's running mean, variance and batch count (every layer batchnorm_layers() gives keeps them)."""
    mean, var, tracked = layer.running_mean, layer.running_var, layer.num_batches_tracked
    assert mean is not None and var is not None and tracked is not None
    return mean, var, tracked


class ShardStatistics:
    """Captures each micro-batch's BatchNorm statistics and folds them in, in micro-batch order."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = batchnorm_layers(model)
        #: values per micro-batch: every layer's mean then variance, concatenated
        self.width = sum(2 * layer.num_features for layer in self.layers)

    @contextlib.contextmanager
    def capture(self, out: torch.Tensor) -> Iterator[None]:
        """Around one micro-batch's forward and backward passes (backward reads the running statistics
        forward wrote): its statistics go into `out` (width values), the running statistics are left as
        they were."""
        running = [running_statistics(layer) for layer in self.layers]
        saved = [(mean.clone(), var.clone(), tracked.clone(), layer.momentum)
                 for layer, (mean, var, tracked) in zip(self.layers, running, strict=True)]
        for layer, (mean, var, _) in zip(self.layers, running, strict=True):
            # momentum 1: running = 0 * running + 1 * batch statistic, exactly the batch's own
            mean.zero_()
            var.fill_(1.0)
            layer.momentum = 1.0
        try:
            yield
            offset = 0
            for layer, (mean, var, _) in zip(self.layers, running, strict=True):
                n = layer.num_features
                # + 0.0 turns a -0.0 into 0.0, as the sum with other ranks' zeros would
                out[offset:offset + n] = mean.detach().to(out.dtype) + 0.0
                out[offset + n:offset + 2 * n] = var.detach().to(out.dtype) + 0.0
                offset += 2 * n
        finally:
            for layer, (mean, var, tracked), (saved_mean, saved_var, saved_tracked, momentum) in zip(
                    self.layers, running, saved, strict=True):
                mean.copy_(saved_mean)
                var.copy_(saved_var)
                tracked.copy_(saved_tracked)
                layer.momentum = momentum

    @torch.no_grad()
    def fold_in(self, per_micro_batch: torch.Tensor) -> None:
        """Fold the statistics of every micro-batch of the step (rows, in global order) into the running
        statistics, as BatchNorm's own update would, one micro-batch after the other."""
        for row in per_micro_batch:
            offset = 0
            for layer in self.layers:
                running_mean, running_var, tracked = running_statistics(layer)
                n = layer.num_features
                mean = row[offset:offset + n].to(running_mean.dtype)
                var = row[offset + n:offset + 2 * n].to(running_var.dtype)
                offset += 2 * n
                tracked += 1
                factor = layer.momentum if layer.momentum is not None else 1.0 / float(tracked)
                running_mean.mul_(1 - factor).add_(mean, alpha=factor)
                running_var.mul_(1 - factor).add_(var, alpha=factor)
