"""Exact validation: every validation sample counted once across ranks, with rank 0's buffers."""

from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F

from .backend import Backend
from .metrics import SumMeter, topk_correct
from .precision import Precision

VAL_METRICS = ["loss", "top1", "top5"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, backend: Backend, precision: Precision,
             to_device: Callable) -> Dict[str, float]:
    """Validation loss, top-1 and top-5 over the whole validation set: each rank evaluates its own shard
    (no padding) and the sums and counts are reduced. Rank 0's buffers (BatchNorm statistics) are
    broadcast first, so the model evaluated is the model saved."""
    backend.broadcast_buffers(model)
    backend.activity.set("evaluation")
    model.eval()
    meter = SumMeter(VAL_METRICS, backend.device)
    for images, labels in loader:
        images, labels = to_device(images, labels)
        with precision.autocast():
            logits = model(images)
        top1, top5 = topk_correct(logits, labels, (1, 5))
        meter.add(labels.size(0), loss=F.cross_entropy(logits, labels, reduction="sum"), top1=top1, top5=top5)
    model.train()
    means = SumMeter.means(VAL_METRICS, backend.all_reduce_sum(meter.values()))
    return {"loss": means["loss"], "top1": means["top1"], "top5": means["top5"], "samples": means["count"]}
