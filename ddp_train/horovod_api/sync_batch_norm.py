"""Horovod's SyncBatchNorm: batch normalization with the statistics of the whole batch across the ranks, on CPU as on
CUDA (Horovod's runs on CUDA only).

Forward gathers every rank's sample count, per-channel mean and sum of squared deviations (one allgather, float64)
and combines them exactly (Chan's parallel formula), so a rank's output is what BatchNorm gives on the concatenated
batch; backward sums the two per-channel reductions of the input gradient over the ranks. As in Horovod, the
weight's and bias's gradients stay local (the DistributedOptimizer averages them), and running statistics move with
the global batch's mean and unbiased variance."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import runtime
from .dtypes import SUM
from .mpi_ops import allgather, allreduce


def _channel_view(values: torch.Tensor, dims: int) -> torch.Tensor:
    """Per-channel values shaped to broadcast over an (N, C, ...) tensor of `dims` dimensions."""
    return values.view(1, -1, *([1] * (dims - 2)))


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, eps: Any,
                momentum: Any) -> Any:
        x = input.contiguous()
        channels = x.size(1)
        dims = [0, *range(2, x.dim())]
        count = x.numel() // channels
        var, mean = torch.var_mean(x.double(), dim=dims, unbiased=False)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device), mean, var * count])
        stats = allgather(local.unsqueeze(0), name="sync_batch_norm.stats")
        counts, means, m2s = stats[:, 0], stats[:, 1:1 + channels], stats[:, 1 + channels:]
        total = counts.sum()
        global_mean = (counts.unsqueeze(1) * means).sum(0) / total
        m2 = m2s.sum(0) + (counts.unsqueeze(1) * (means - global_mean) ** 2).sum(0)
        global_var = m2 / total
        invstd = torch.rsqrt(global_var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = global_var * total / max(float(total) - 1.0, 1.0)
                running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_x = global_mean.to(x.dtype)
        invstd_x = invstd.to(x.dtype)
        out = (x - _channel_view(mean_x, x.dim())) * _channel_view(invstd_x, x.dim())
        if weight is not None:
            out = out * _channel_view(weight, x.dim())
        if bias is not None:
            out = out + _channel_view(bias, x.dim())
        ctx.save_for_backward(x, weight, mean_x, invstd_x)
        ctx.total = float(total)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        x, weight, mean, invstd = ctx.saved_tensors
        grad = grad_output.contiguous()
        dims = [0, *range(2, x.dim())]
        centred = x - _channel_view(mean, x.dim())
        sum_dy = grad.sum(dims)
        sum_dy_xmu = (grad * centred).sum(dims)
        need_input, need_weight, need_bias = ctx.needs_input_grad[0:3]
        grad_weight = sum_dy_xmu * invstd if weight is not None and need_weight else None
        grad_bias = sum_dy if need_bias else None
        grad_input = None
        if need_input:
            channels = x.size(1)
            summed = allreduce(torch.cat([sum_dy, sum_dy_xmu]).double(), op=SUM, name="sync_batch_norm.grad")
            mean_dy = (summed[:channels] / ctx.total).to(x.dtype)
            mean_dy_xmu = (summed[channels:] / ctx.total).to(x.dtype)
            scale = invstd if weight is None else invstd * weight
            grad_input = (grad - _channel_view(mean_dy, x.dim())
                          - centred * _channel_view(invstd * invstd * mean_dy_xmu, x.dim())) * _channel_view(
                scale, x.dim())
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the whole batch of every rank (any number of dimensions, N x C x ...)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _factor(self) -> float:
        if self.momentum is not None:
            return float(self.momentum)
        return 1.0 / float(self.num_batches_tracked) if self.num_batches_tracked is not None else 0.0

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        if runtime.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True,
                                self._factor(), self.eps)
        return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
                                    self._factor())


