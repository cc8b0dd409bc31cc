"""Non-finite values never reach a checkpoint or model.pt: the loss is watched every step and the
weights and buffers are checked before anything is written.

On CPU the loss is read every step (a read costs nothing there). On a GPU a read would make every
step wait for the device, so a device-side flag collects whether any step's loss was not finite, and
the host reads it only where it synchronises anyway: logged steps, checkpoints, stop checks.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

from .backend import Backend


class NonFinite(Exception):
    """A non-finite loss, weight or buffer; the message says where. Training stops, exit code 1."""


class LossWatch:
    """Watches every step's loss for NaN or infinity."""

    def __init__(self, device: torch.device) -> None:
        self.on_device = device.type != "cpu"
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=device) if self.on_device else None

    def observe(self, loss: torch.Tensor, step: int) -> None:
        """Record step `step`'s loss; on CPU a non-finite one raises NonFinite at once."""
        first_bad_step = self.first_bad_step
        if first_bad_step is None:  # on CPU
            value = loss.item()
            if not math.isfinite(value):
                raise NonFinite(_loss_message(value, step))
            return
        bad = ~torch.isfinite(loss.detach())
        self.first_bad_step = torch.where(bad & (first_bad_step < 0), step, first_bad_step)

    def check(self) -> None:
        """NonFinite when a loss observed so far was not finite (reads the device flag: a sync)."""
        if self.first_bad_step is not None:  # on a device
            step = int(self.first_bad_step.item())
            if step >= 0:
                raise NonFinite(_loss_message(float("nan"), step, exact=False))


def _loss_message(value: float, step: int, exact: bool = True) -> str:
    what = f"loss is {value}" if exact else "loss is not finite"
    return (f"{what} at step {step}; stopping without writing a checkpoint (the last good one is kept); "
            "lower --lr or check the data")


def nonfinite_tensors(module: torch.nn.Module) -> List[str]:
    """Names of the parameters and buffers of `module` that hold a NaN or an infinity."""
    bad = []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad.append(name)
    return bad


def weights_message(bad_by_rank: List[Optional[List[str]]], step: int, what: str) -> Optional[str]:
    """The error for non-finite weights or buffers found on some ranks before writing `what`, or None."""
    found = [(rank, names) for rank, names in enumerate(bad_by_rank) if names]
    if not found:
        return None
    rank, names = found[0]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"non-finite values in {shown} (rank {rank}) at step {step}; {what} not written (the last good "
            "checkpoint is kept); lower --lr or check the data")


def refuse_nonfinite(bad_by_rank: List[Optional[List[str]]], step: int, what: str) -> None:
    """NonFinite when some rank found non-finite weights or buffers (`bad_by_rank`, gathered from every rank)
    before writing `what`."""
    message = weights_message(bad_by_rank, step, what)
    if message:
        raise NonFinite(message)


def check_weights(backend: Backend, model: torch.nn.Module, step: int, what: str) -> None:
    """NonFinite on every rank when any rank's weights or buffers hold a NaN or an infinity (a collective)."""
    refuse_nonfinite(backend.all_gather_object(nonfinite_tensors(model)), step, what)
