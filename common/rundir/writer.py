"""The run directory: the contract between a training run and the comparison layer.

Rank 0 writes config.json, metrics.jsonl, summary.json and model.pt; other ranks write nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

import torch

from common.checkpoints.format import atomic_save

from .names import METRICS_FILE, MODEL_FILE
from .reader import events_so_far

if TYPE_CHECKING:  # imported when a run asks for TensorBoard: it loads tensorboard
    from .tensorboard import TensorBoardSink


def weights_sha256(state_dict: Dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in key order: equal digests
    mean bitwise-equal weights, whichever backend or launcher produced them."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def json_safe(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class RunDir:
    """Writers for one run directory. On ranks other than 0 every method does nothing."""

    def __init__(self, path: str, is_main: bool, tensorboard: bool = False) -> None:
        self.path = path
        self.is_main = is_main
        self.tensorboard = tensorboard
        self._metrics: Optional[TextIO] = None
        self._sink: Optional[TensorBoardSink] = None

    @staticmethod
    def check_writable(path: str) -> Optional[str]:
        """None if `path` can be created and written, else the reason it cannot."""
        probe = os.path.abspath(path)
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if not os.path.isdir(probe):
            return f"--run-dir {path!r}: {probe!r} exists and is not a directory"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"--run-dir {path!r}: {probe!r} is not writable by this user"
        return None

    def open(self, keep_until_step: Optional[int] = None) -> None:
        """Create the directory and start metrics.jsonl: fresh, or, when resuming, keeping the
        events up to the checkpoint's step (later ones belong to the run that is being replaced)."""
        if not self.is_main:
            return
        os.makedirs(self.path, exist_ok=True)
        kept = [] if keep_until_step is None else [  # a line cut short by a crash is left out
            event for event in events_so_far(self.path)
            if event.get("event") != "summary" and event.get("step", 0) <= keep_until_step]
        self._metrics = open(os.path.join(self.path, METRICS_FILE), "w", buffering=1)
        self._metrics.writelines(json.dumps(event, sort_keys=True) + "\n" for event in kept)
        if self.tensorboard:
            from .tensorboard import TensorBoardSink

            self._sink = TensorBoardSink(self.path, purge_step=None if keep_until_step is None
                                         else keep_until_step + 1)

    def write_json(self, name: str, data: Dict[str, Any]) -> None:
        """Write one JSON file atomically."""
        if not self.is_main:
            return
        final = os.path.join(self.path, name)
        tmp = final + ".tmp"
        with open(tmp, "w") as f:
            json.dump(json_safe(data), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)

    def log(self, event: str, **fields: Any) -> None:
        """Append one event (step, epoch, eval, summary) to metrics.jsonl."""
        if not self.is_main or self._metrics is None:
            return
        record = {"event": event, "time": time.time(), **fields}
        self._metrics.write(json.dumps(json_safe(record), sort_keys=True) + "\n")
        if self._sink is not None:
            self._sink.event(event, fields)

    def save_model(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Write model.pt (plain state_dict, loadable with weights_only=True) atomically."""
        if not self.is_main:
            return
        atomic_save({k: v.detach().cpu() for k, v in state_dict.items()}, os.path.join(self.path, MODEL_FILE))

    def close(self) -> None:
        """Flush and close metrics.jsonl (and the TensorBoard event file)."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
