"""Atomic, verified saving and loading of tensors and checkpoints."""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import torch


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
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    with open(path + ".sha256", "w") as f:
        f.write(f"{digest}  {os.path.basename(path)}\n")
    return digest


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_load(path: str) -> Any:
    """Load with weights_only=True after checking the SHA-256 written beside the file.

    Raises ValueError naming the file when the digest does not match (truncated or corrupt).
    """
    sidecar = path + ".sha256"
    if os.path.exists(sidecar):
        with open(sidecar) as f:
            expected = f.read().split()[0]
        actual = file_sha256(path)
        if actual != expected:
            raise ValueError(f"{path} is corrupt: SHA-256 {actual[:12]}... does not match {expected[:12]}...")
    return torch.load(path, map_location="cpu", weights_only=True)
