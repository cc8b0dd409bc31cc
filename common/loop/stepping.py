"""One optimizer step: what every kind of step offers the loop (`Step`), and the data-parallel way
(`AllreduceStep`): each rank runs its micro-batches through the wrapped model, the backend averages
the gradients during backward, they are unscaled and clipped, and the optimizer applies them."""

from __future__ import annotations

import contextlib
from typing import Any, List, Optional, Protocol, Tuple, Union

import torch
import torch.nn.functional as F

from ..inputs.perturb import GradientDisturbance
from .backend import Backend
from .metrics import SumMeter
from .precision import Precision


class Step(Protocol):
    """One optimizer step as the loop drives it; `AllreduceStep` and `common.exact.step.ExactStep` are two."""

    #: whether the training metrics it adds to the meter are already global (else this rank's, summed later)
    global_meter: bool
    #: what a rank in this step is said to do (common.faults.liveness)
    doing: str

    def __call__(self, group: List[Tuple[torch.Tensor, torch.Tensor]], meter: SumMeter,
                 step: int) -> Tuple[torch.Tensor, int]:
        """Train on `group` (the loader batches of step `step`), adding its metrics to `meter`; returns
        (the step's loss, samples in the step)."""

    def bytes_per_step(self) -> int:
        """Bytes each rank hands the collectives per step."""

    def take_comm_seconds(self) -> float:
        """Exposed communication time since the last call."""

    def state_dict(self) -> Any:
        """What a checkpoint keeps of the step (None: nothing)."""

    def load_state_dict(self, state: Any) -> None:
        """Restore what state_dict returned."""


class AllreduceStep:
    """A step whose gradients are averaged over ranks by the backend (DDP's buckets, Horovod's hooks)."""

    #: the epoch's training metrics it adds are this rank's; the epoch's end sums them over ranks
    global_meter = False
    #: what a rank in this step is said to do (common.faults.liveness); DDP's gradient allreduce runs inside backward
    doing = "forward, backward and the optimizer step"

    def __init__(self, model: torch.nn.Module, plain_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 backend: Backend, precision: Precision, clip_grad_norm: Optional[float],
                 disturbance: Optional[GradientDisturbance] = None) -> None:
        self.model, self.plain_model, self.optimizer = model, plain_model, optimizer
        self.backend, self.precision, self.clip_grad_norm = backend, precision, clip_grad_norm
        self.disturbance = disturbance  # the noise floor's runs whose gradients are rounded below float32

    def __call__(self, group: List[Tuple[torch.Tensor, torch.Tensor]], meter: SumMeter,
                 step: int) -> Tuple[torch.Tensor, int]:
        """Forward and backward over the micro-batches of one step, then the optimizer step. Each
        micro-batch's mean loss counts 1/K; gradients add up locally and are exchanged after the last
        backward. Returns (the step's loss: the mean of the micro-batch losses, samples in the step)."""
        self.optimizer.zero_grad()  # set_to_none (the default); Horovod takes no argument
        k = len(group)
        step_loss: Union[float, torch.Tensor] = 0.0
        samples = 0
        for i, (images, labels) in enumerate(group):
            exchange = i == k - 1
            with contextlib.nullcontext() if exchange else self.backend.accumulating(self.model):
                with self.precision.autocast():
                    logits = self.model(images)
                    loss = F.cross_entropy(logits, labels)
                self.precision.scale(loss / k).backward()
            n = labels.size(0)
            meter.add(n, loss=loss.detach() * n, correct=(logits.detach().argmax(dim=1) == labels).sum())
            step_loss = step_loss + loss.detach()
            samples += n
        with self.backend.gradients_ready(self.optimizer):
            if self.disturbance is not None:
                self.disturbance(self.plain_model.parameters(), step)
            self.precision.unscale(self.optimizer)
            if self.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.plain_model.parameters(), self.clip_grad_norm)
        self.backend.step(self.optimizer, self.precision.scaler)
        assert isinstance(step_loss, torch.Tensor)  # a step has at least one micro-batch
        return step_loss / k, samples

    def bytes_per_step(self) -> int:
        """Bytes each rank hands the allreduce per step: every gradient once, half with --compression fp16."""
        sent = sum(p.numel() * p.element_size() for p in self.plain_model.parameters() if p.requires_grad)
        return sent // 2 if self.backend.tuning.config.compression == "fp16" else sent

    def take_comm_seconds(self) -> float:
        """Exposed gradient-communication time since the last call, as the backend measured it."""
        return self.backend.take_comm_seconds()

    def state_dict(self) -> None:
        """Nothing beyond the optimizer's state."""
        return None

    def load_state_dict(self, state) -> None:
        """Nothing to restore."""
