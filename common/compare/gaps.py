"""How far apart two runs ended, in numbers that mean something: per tensor, relative to the tensor's size,
parameters and buffers apart; and the per-step loss gap relative to the loss."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from common.rundir.reader import Run

#: how many of the tensors that differ most a gap names
TOP = 3


def _relative(a: torch.Tensor, b: torch.Tensor) -> Dict[str, Any]:
    a, b = a.double(), b.double()
    delta = float((a - b).norm())
    size = max(float(a.norm()), float(b.norm()))
    rel = delta / size if size > 0 else (0.0 if delta == 0 else float("inf"))
    return {"rel": rel, "abs": float((a - b).abs().max()) if a.numel() else 0.0}


def _group(rows: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: -r["rel"])
    return {"tensors": len(rows), "max_rel": rows[0]["rel"], "max_abs": max(r["abs"] for r in rows),
            "largest": [r for r in rows[:TOP] if r["rel"] > 0]}


def tensor_gaps(a: Run, b: Run) -> Optional[Dict[str, Any]]:
    """Per tensor ‖Δ‖/‖w‖ (and max |Δ|) of the final weights, grouped into parameters and buffers, each with
    its largest relative gap and the tensors that dominate; None when the two state dicts do not match."""
    wa, wb = a.weights(), b.weights()
    if wa.keys() != wb.keys() or any(wa[k].shape != wb[k].shape for k in wa):
        return None
    buffers = a.buffer_names() | b.buffer_names()
    groups: Dict[str, List[Dict[str, Any]]] = {"parameters": [], "buffers": []}
    for name in wa:
        if not wa[name].is_floating_point():  # counters such as num_batches_tracked
            continue
        groups["buffers" if name in buffers else "parameters"].append({"tensor": name, **_relative(wa[name], wb[name])})
    return {kind: _group(rows) for kind, rows in groups.items()}


def relative_loss_gaps(a: Run, b: Run) -> Dict[int, float]:
    """|Δloss| / |loss| at every step both runs logged (rank 0's loss)."""
    la, lb = a.step_losses(), b.step_losses()
    out = {}
    for step in sorted(set(la) & set(lb)):
        size = max(abs(la[step]), abs(lb[step]))
        out[step] = abs(la[step] - lb[step]) / size if size > 0 else 0.0
    return out


def headline(gaps: Optional[Dict[str, Any]]) -> float:
    """The one number a verdict compares: the largest per-tensor relative gap of the parameters (of the
    buffers for a model without floating-point parameters; inf when the state dicts do not match)."""
    if gaps is None:
        return float("inf")
    group = gaps["parameters"] or gaps["buffers"]
    return group["max_rel"] if group else 0.0


def dominant(gaps: Optional[Dict[str, Any]]) -> Optional[str]:
    """The parameter tensor with the largest relative gap."""
    group = (gaps or {}).get("parameters") or (gaps or {}).get("buffers")
    return group["largest"][0]["tensor"] if group and group["largest"] else None
