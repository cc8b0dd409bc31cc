"""One trial step of the model on two training samples, on every rank before any collective.

It finds, as one-line UsageErrors, what would otherwise fail mid-training or make the backends train
differently: a model that cannot take the data, an output that is not (batch, classes) logits, sparse
gradients, parameters that get no gradient, and (for --reduction exact) buffers other than BatchNorm's
that training changes. The trial runs on a copy, with the random state restored: the run itself is
unchanged by it.
"""

from __future__ import annotations

import copy
from typing import List

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from common.errors import UsageError
from .data import samples_in
from .factories import describe_exception

TRIAL_SAMPLES = 2  # BatchNorm in training mode needs more than one value per channel


def check_trainable(model: nn.Module, name: str, train: Dataset, num_classes: int, exact: bool) -> None:
    """Run one forward and backward of a copy of `model` on the first training samples; UsageError naming
    what stops it from training, or from training the same way under both backends."""
    trial = copy.deepcopy(model).train()
    batch = default_collate([train[i] for i in range(min(TRIAL_SAMPLES, samples_in(train)))])
    inputs, labels = batch[0], torch.as_tensor(batch[1])
    buffers = {key: value.clone() for key, value in _other_buffers(trial)}
    with torch.random.fork_rng(devices=[]):
        try:
            out = trial(inputs)
        except Exception as exc:  # the model's own code
            raise UsageError(f"--model {name} fails on the dataset's inputs of shape {tuple(inputs.shape[1:])} "
                             f"({inputs.dtype}): {describe_exception(exc)}") from None
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != inputs.shape[0] \
                or out.shape[1] != num_classes:
            shown = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise UsageError(f"--model {name} returns {shown} for a batch of {inputs.shape[0]}; it must return "
                             f"logits of shape (batch, {num_classes}) for the dataset's {num_classes} classes")
        F.cross_entropy(out.float(), labels).backward()
    sparse = [key for key, p in trial.named_parameters() if p.grad is not None and p.grad.is_sparse]
    if sparse:
        raise UsageError(f"--model {name}: parameters {', '.join(sparse)} get sparse gradients, which Horovod "
                         "allgathers (or densifies with sparse_as_dense) and DDP reduces its own way, so the two "
                         "cannot train alike; build them dense (nn.Embedding(..., sparse=False))")
    unused = [key for key, p in trial.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        raise UsageError(f"--model {name}: parameters {_some(unused)} get no gradient; DDP would need "
                         "find_unused_parameters=True and Horovod would give them zero gradients, which momentum "
                         "and weight decay turn into updates on one backend only; freeze them "
                         "(requires_grad_(False)) or remove them")
    changed = [key for key, value in _other_buffers(trial) if not torch.equal(value, buffers[key])]
    if exact and changed:
        raise UsageError(f"--model {name}: buffers {_some(changed)} change in training and are not BatchNorm "
                         "statistics, which --reduction exact cannot fold in global order; use --reduction allreduce")


def _other_buffers(model: nn.Module):
    """(name, buffer) of every buffer that is not a BatchNorm's running statistic."""
    norms = {prefix for prefix, module in model.named_modules() if isinstance(module, nn.modules.batchnorm._NormBase)}
    for key, value in model.named_buffers():
        if key.rpartition(".")[0] not in norms:
            yield key, value


def _some(names: List[str], shown: int = 4) -> str:
    """The first few names, and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
