"""The run directory: the contract between a training run and the comparison layer.

Rank 0 writes config.json, metrics.jsonl, summary.json and model.pt; other ranks write nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Any, Dict, Optional

import torch

from .checkpoint import atomic_save

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"


def weights_sha256(state_dict: Dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in key order: equal digests
    mean bitwise-equal weights, whichever backend or launcher produced them."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def versions() -> Dict[str, Optional[str]]:
    """Versions of everything that can change the numbers."""
    import torchvision

    try:
        import horovod

        hvd_version = horovod.__version__
    except ImportError:
        hvd_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "horovod": hvd_version,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "project_git": _git_revision(),
    }


def _git_revision() -> Optional[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def detect_launcher() -> str:
    """Which launcher started this process, from the variables each one sets."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or "HOROVOD_HOSTNAME" in env:
        return "horovodrun"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env or "PMIX_RANK" in env:
        return "srun" if "SLURM_JOB_ID" in env and "OMPI_COMM_WORLD_SIZE" not in env else "mpirun"
    if "SLURM_PROCID" in env:
        return "srun"
    return "none"


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
        self._metrics = None
        self._sink = None

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
        path = os.path.join(self.path, METRICS_FILE)
        kept = []
        if keep_until_step is not None and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        event = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a crash
                    if event.get("event") != "summary" and event.get("step", 0) <= keep_until_step:
                        kept.append(line if line.endswith("\n") else line + "\n")
        self._metrics = open(path, "w", buffering=1)
        self._metrics.writelines(kept)
        if self.tensorboard:
            from .tensorboard_log import TensorBoardSink

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


def command_line() -> str:
    """How this process was started, for the record."""
    return " ".join([os.path.basename(sys.executable), *sys.argv])
