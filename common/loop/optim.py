"""Optimizers and the learning-rate schedule, computed per global step the same way on every backend."""

from __future__ import annotations

import math

import torch

from common.choices import OPTIMIZERS, registry
from common.config import Config

#: --optimizer's optimizers, each built from the config over the parameters
OPTIMIZER_BUILDERS = registry(OPTIMIZERS, {
    "sgd": lambda config, params: torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                                                  weight_decay=config.weight_decay),
    "adam": lambda config, params: torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay),
    "adadelta": lambda config, params: torch.optim.Adadelta(params, lr=config.lr, weight_decay=config.weight_decay),
}, "optimizer")


def make_optimizer(config: Config, params) -> torch.optim.Optimizer:
    """The configured optimizer over `params` (lr is set per step by lr_at)."""
    if config.optimizer not in OPTIMIZER_BUILDERS:
        raise ValueError(f"unknown optimizer {config.optimizer!r}")
    return OPTIMIZER_BUILDERS[config.optimizer](config, params)


def lr_at(config: Config, step: int, steps_per_epoch: int, total_steps: int, world_size: int) -> float:
    """Learning rate for global step `step` (0-based).

    --lr-scaling linear multiplies the base lr by the world size, reached by a linear ramp over
    --warmup-epochs (Horovod's examples' rule: lr x (1 + e (N-1) / warmup) at fractional epoch e).
    The schedule then multiplies by 1 (constant), by 0.1 at 50% and again at 75% of the steps
    (step), or by a half-cosine that reaches 0 at the last step (cosine).
    """
    lr = config.lr
    if config.lr_scaling == "linear":
        epoch = step / steps_per_epoch
        if config.warmup_epochs > 0 and epoch < config.warmup_epochs:
            lr = config.lr * (1.0 + epoch * (world_size - 1) / config.warmup_epochs)
        else:
            lr = config.lr * world_size
    progress = step / max(total_steps, 1)
    if config.lr_schedule == "step":
        lr *= 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
    elif config.lr_schedule == "cosine":
        lr *= 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
