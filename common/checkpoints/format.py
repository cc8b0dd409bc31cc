"""Atomic, verified checkpoints: save, keep the last K, find the newest valid one, resume.

A checkpoint is a plain dict of tensors and numbers, loaded with torch.load(weights_only=True):
a file that carries pickled code is refused and the code never runs. Keys: model, optimizer,
scaler (the GradScaler's state under --amp fp16, else None), epoch, batch (micro-batches of the
epoch done), step (optimizer steps), world_size, backend, settings, rng and meter (per rank).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

FORMAT = 1
CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
#: settings a checkpoint must share with the run that resumes it (accumulate: the epoch's position
#: is counted in micro-batches, and a step's size must not change under the lr schedule; the reduction
#: and its batches: exact mode's position is counted in global steps)
MUST_MATCH = ("model", "dataset", "image_size", "batch_size", "global_batch", "accumulate", "reduction",
              "micro_batch")
#: the value of a setting in a checkpoint written before the setting existed
SETTING_DEFAULTS = {"accumulate": 1, "global_batch": None, "reduction": "allreduce", "micro_batch": None}


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the reason."""


def atomic_save(obj: Any, path: str) -> str:
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`, so a
    reader never sees a half-written file. Writes `path`.sha256 beside it; returns the digest."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        digest = file_sha256(tmp)
        sidecar_tmp = tmp + ".sha256"
        with open(sidecar_tmp, "w") as f:
            f.write(f"{digest}  {os.path.basename(path)}\n")
            f.flush()
            os.fsync(f.fileno())
        # The digest lands first: a crash between the renames leaves an old file with a new
        # digest, which reads as corrupt, never a corrupt file that reads as good.
        os.replace(sidecar_tmp, path + ".sha256")
        os.replace(tmp, path)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        for leftover in (tmp, tmp + ".sha256"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise
    return digest


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_load(path: str) -> Any:
    """Check the SHA-256 written beside `path`, then torch.load it with weights_only=True.

    Raises CheckpointError naming the file when it is missing, truncated or corrupt (digest
    mismatch), or carries pickled objects other than tensors and plain containers.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    sidecar = path + ".sha256"
    if not os.path.isfile(sidecar):
        raise CheckpointError(f"{path}: no {os.path.basename(sidecar)} beside it, cannot verify it")
    with open(sidecar) as f:
        expected = (f.read().split() or [""])[0]
    actual = file_sha256(path)
    if actual != expected:
        raise CheckpointError(f"{path} is corrupt or truncated: SHA-256 {actual[:12]}... "
                              f"does not match {expected[:12]}...")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "disallowed object"
        raise CheckpointError(f"{path} was refused: it holds pickled objects that are not plain weights "
                              f"({reason}); nothing in it was run") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"{path} cannot be read ({exc})") from None


def checkpoint_path(run_dir: str, step: int) -> str:
    """Where the checkpoint after global step `step` lives."""
    return os.path.join(run_dir, CHECKPOINT_DIR, f"ckpt-{step:09d}.pt")


def list_checkpoints(run_dir: str) -> List[str]:
    """Checkpoint files in the run directory, newest (highest step) first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), str(p)) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found, reverse=True)]


def prune(run_dir: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (and their digests)."""
    for path in list_checkpoints(run_dir)[keep:]:
        for victim in (path, path + ".sha256"):
            if os.path.exists(victim):
                os.unlink(victim)


def find_newest_valid(run_dir: str) -> Tuple[Optional[Dict], Optional[str], List[str]]:
    """(checkpoint, path, problems): the newest checkpoint that verifies, and why each newer one
    was passed over. (None, None, problems) when there is none."""
    problems: List[str] = []
    for path in list_checkpoints(run_dir):
        try:
            return check_format(verified_load(path), path), path, problems
        except CheckpointError as exc:
            problems.append(str(exc))
    return None, None, problems


def check_format(ckpt: Any, path: str) -> Dict:
    """The checkpoint if it is one of ours, else CheckpointError."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint of this program (format {FORMAT})")
    return ckpt


def check_matches(ckpt: Dict, settings: Dict, path: str) -> None:
    """CheckpointError naming every setting in MUST_MATCH that differs from the checkpoint's."""
    saved = {**SETTING_DEFAULTS, **ckpt["settings"]}
    diffs = [f"{key} {saved.get(key)!r} in the checkpoint, {settings.get(key)!r} now" for key in MUST_MATCH
             if saved.get(key) != settings.get(key)]
    if diffs:
        raise CheckpointError(f"{path} belongs to another run: " + "; ".join(diffs))
