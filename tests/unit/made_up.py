"""Made-up runs for the unit layer: `Run` objects built in memory, with the events, settings and final weights a
test gives, as the comparison reads them from run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import torch

from common.rundir.reader import Run


def made_run(backend: str = "ddp", world_size: int = 3, *, controller: Optional[str] = None,
             settings: Optional[Dict] = None, events: Optional[List[Dict]] = None, config: Optional[Dict] = None,
             summary: Optional[Dict] = None, weights: Optional[Dict[str, torch.Tensor]] = None,
             repeat: int = 0) -> Run:
    """A run as read from a run directory: `backend` (ddp, horovod with `controller`), world size, the training
    `settings` (perturb_ulp, ...), metrics events, more of config.json and summary.json, and its final weights."""
    state = weights if weights is not None else {"w": torch.ones(3)}
    run = Run(Path("/made-up"), {"config": dict(settings or {}), "backend": {"name": backend, "controller": controller},
                                 **(config or {})},
              {"world_size": world_size, "weights_sha256": str(hash(tuple(float(v.sum()) for v in state.values()))),
               **(summary or {})}, list(events or []), repeat=repeat)
    run._weights = state
    return run


def start(built: Optional[List[float]] = None, wnorm: Optional[List[float]] = None) -> Dict:
    """The start event: the weights' fingerprint before a disturbance (`built`, as the probe records it) and after."""
    event: Dict = {"event": "start", "step": 0, "wnorm": wnorm if wnorm is not None else built}
    if built is not None:
        event["built"] = built
    return event


def step(n: int, loss: float, wnorm: List[float], lr: float = 0.1, inputs: Optional[List] = None) -> Dict:
    """A step event; `inputs`: every rank's input fingerprints (runs of the probe)."""
    event: Dict = {"event": "step", "step": n, "loss": loss, "wnorm": wnorm, "lr": lr}
    if inputs is not None:
        event["ranks"] = [{"inputs": batch} for batch in inputs]
    return event
