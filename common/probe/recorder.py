"""What the probe records of one rank of a user's script, step by step, into RUN_DIR/probe/rank-R.jsonl.

A step is one training step of the script: the forward passes and backward() calls since the last optimizer
step, then the optimizer's step(). Per step the rank records the loss the script backpropagated (the sum of
what its backward() calls were given, unscaled under a GradScaler), a fingerprint of each input batch of the
outermost forward (shape, sum and sum of squares in float64), every param group's settings (lr, momentum,
weight decay, ...), the optimizer's state before the step (which parameters had state, Adam's step counts),
the gradients' per-tensor norms as the step saw them (after Horovod's allreduce), the weights' per-tensor norms
after it, and the step's time split: data (before its first forward), exposed communication (the rank waiting on
its gradients' reduction: the part of a CPU backward() its thread spent off the CPU, where DDP waits for its last
buckets, and the part of a Horovod optimizer's step() before its wrapped optimizer's own step, synchronize()), and
compute (the rest). An optimizer step with no backward before it (Horovod's
broadcast_optimizer_state on a fresh optimizer runs one) is recorded as a stepless step.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import torch

from common.rundir.fingerprint import tensor_norms

#: an input batch's fingerprint: [shape, sum, sum of squares]
InputFingerprint = List[Union[List[int], float]]

#: param-group entries that are not settings
NOT_SETTINGS = ("params",)


def input_fingerprint(value: Any) -> Optional[InputFingerprint]:
    """[shape, sum, sum of squares] of the first tensor in a forward's arguments (float64), None without one."""
    if isinstance(value, torch.Tensor):
        x = value.detach()
        if x.is_floating_point() or x.is_complex():
            total, squares = torch.sum(x, dtype=torch.float64), torch.sum(x.double() ** 2)
        else:
            total, squares = torch.sum(x.long()).double(), torch.sum(x.double() ** 2)
        return [list(x.shape), float(total), float(squares)]
    if isinstance(value, (list, tuple)):
        for item in value:
            found = input_fingerprint(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = input_fingerprint(item)
            if found is not None:
                return found
    return None


def group_settings(optimizer: torch.optim.Optimizer) -> List[Dict[str, Any]]:
    """Every param group's settings (lr, momentum, weight_decay, betas, ...), JSON-ready."""
    out = []
    for group in optimizer.param_groups:
        settings = {}
        for key, value in group.items():
            if key in NOT_SETTINGS:
                continue
            if isinstance(value, torch.Tensor):
                value = value.item() if value.numel() == 1 else value.tolist()
            if isinstance(value, (bool, int, float, str, type(None))) or (
                    isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value)):
                settings[key] = list(value) if isinstance(value, tuple) else value
        out.append(settings)
    return out


def state_summary(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> Dict[str, Any]:
    """What the optimizer holds before a step: how many parameters have state, their step counts (Adam's
    `step`), and the norm of their momentum buffers."""
    holding, steps, buffers = 0, set(), []
    for p in params:
        state = optimizer.state.get(p) or {}
        if state:
            holding += 1
        step = state.get("step")
        if step is not None:
            steps.add(float(step))
        buffer = state.get("momentum_buffer")
        buffers.append(buffer)
    found = {"with_state": holding, "steps": sorted(steps)}
    if any(b is not None for b in buffers):
        found["momentum_norms"] = tensor_norms(buffers)
    return found


@dataclass
class StepRecord:
    """One training step of the script on this rank, filled in as it happens."""

    losses: List[float] = field(default_factory=list)
    inputs: List[Optional[InputFingerprint]] = field(default_factory=list)
    started: Optional[float] = None          # the step's first forward
    backward_ended: Optional[float] = None   # its last backward
    optimizer_started: Optional[float] = None
    comm_s: float = 0.0                      # exposed communication seen so far


class Recorder:
    """This rank's record file and the step being recorded."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.rank = rank
        self.dir = os.path.join(run_dir, "probe")
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, f"rank-{rank}.jsonl")
        self._file = open(self.path, "w", buffering=1)
        self.current = StepRecord()
        self.steps = 0
        self.last_step_end = time.perf_counter()

    def write(self, event: str, **fields: Any) -> None:
        """Append one record."""
        self._file.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    def forward(self, fingerprint: Optional[InputFingerprint]) -> None:
        """An outermost training forward with these inputs."""
        if self.current.started is None:
            self.current.started = time.perf_counter()
        self.current.inputs.append(fingerprint)

    def backward(self, loss: Optional[float]) -> None:
        """A backward() of this loss value (None: not a scalar) ran."""
        if loss is not None:
            self.current.losses.append(loss)
        self.current.backward_ended = time.perf_counter()

    def waited(self, seconds: float) -> None:
        """The rank waited `seconds` on its gradients' communication."""
        self.current.comm_s += max(seconds, 0.0)

    @property
    def in_step(self) -> bool:
        """Whether a backward was seen since the last optimizer step."""
        return self.current.backward_ended is not None

    def optimizer_started(self) -> None:
        if self.current.optimizer_started is None:
            self.current.optimizer_started = time.perf_counter()

    def step(self, before: Dict[str, Any], wnorm: List[Optional[float]]) -> None:
        """The optimizer step that ends a training step: `before` is what the step saw (settings, state,
        gradient norms), `wnorm` the weights after it."""
        now = time.perf_counter()
        c = self.current
        started = c.started if c.started is not None else c.optimizer_started or now
        self.steps += 1
        self.write("step", step=self.steps, loss=sum(c.losses) if c.losses else None, backwards=len(c.losses),
                   inputs=c.inputs, groups=before["groups"], state=before["state"], gnorm=before["gnorm"],
                   wnorm=wnorm, data_s=max(started - self.last_step_end, 0.0),
                   compute_s=max(now - started - c.comm_s, 0.0), comm_s=c.comm_s)
        self.current = StepRecord()
        self.last_step_end = now

    def stepless(self, before: Dict[str, Any], wnorm: List[Optional[float]]) -> None:
        """An optimizer step with no backward before it."""
        self.write("stepless", before_step=self.steps + 1, groups=before["groups"], state=before["state"],
                   gnorm=before["gnorm"], wnorm_before=before["wnorm_before"], wnorm=wnorm)
        self.current.optimizer_started = None

    def close(self) -> None:
        self._file.close()
