"""A cheap fingerprint of the weights at a logged step: every parameter tensor's L2 norm, in float64.

Two runs whose fingerprints differ after step s had different weights after step s, so the comparison can
tell the step a difference acts on (a learning rate, a weight decay, a compression changes the very first
update) without storing the weights of every step. Norms are taken in float64 so that a difference of one
unit in the last place of float32 weights still shows.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def _norms(tensors: Sequence[torch.Tensor]) -> List[float]:
    """The L2 norm of each tensor in float64, taken together."""
    if not tensors:
        return []
    norms: List[float] = torch.stack([torch.linalg.vector_norm(t.detach(), dtype=torch.float64)
                                      for t in tensors]).cpu().tolist()
    return norms


def tensor_norms(tensors: Sequence[Optional[torch.Tensor]]) -> List[Optional[float]]:
    """The L2 norm of each tensor in float64 (None for a missing one, e.g. a parameter without a gradient)."""
    norms = iter(_norms([t for t in tensors if t is not None]))
    return [next(norms) if t is not None else None for t in tensors]


def weight_norms(model: torch.nn.Module) -> List[float]:
    """The L2 norm of every parameter of `model`, in named_parameters() order (float64)."""
    return _norms(list(model.parameters()))


def parameter_names(model: torch.nn.Module) -> List[str]:
    """The names weight_norms() gives its norms in."""
    return [name for name, _ in model.named_parameters()]
