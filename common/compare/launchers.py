"""The command lines that start a training job through each real launcher, on this host."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

def mpi_flags() -> List[str]:
    """OpenMPI refuses to start as root without --allow-run-as-root; oversubscribing lets a
    host run more ranks than it has cores (tests and small machines)."""
    return (["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []) + ["--oversubscribe"]


def _tool(name: str, python: str) -> str:
    """The launcher script installed beside `python` (the venv's), else the one on PATH."""
    beside = Path(python).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


@dataclass(frozen=True)
class LaunchSpec:
    """One job to start: which backend, controller (Horovod only) and how many processes."""

    backend: str
    np: int
    controller: str | None = None

    @property
    def label(self) -> str:
        """ddp, horovod-gloo, horovod-mpi."""
        return self.backend if self.controller is None else f"{self.backend}-{self.controller}"

    def command(self, train_args: Sequence[str], python: str = sys.executable) -> List[str]:
        """The full command line, as a user would type it on one host."""
        args = list(train_args)
        if self.backend == "ddp":
            return [_tool("torchrun", python), "--standalone", f"--nproc-per-node={self.np}",
                    "-m", "ddp_train", *args]
        if self.backend == "horovod" and self.controller in ("gloo", "mpi"):
            cmd = [_tool("horovodrun", python), "-np", str(self.np), "-H", f"localhost:{self.np}",
                   f"--{self.controller}"]
            if self.controller == "mpi":
                cmd.append("--mpi-args=" + " ".join(mpi_flags()))
            return cmd + [python, "-m", "hvd_train", *args]
        if self.backend == "horovod" and self.controller == "mpirun":
            return ["mpirun", *mpi_flags(), "-np", str(self.np), python, "-m", "hvd_train", *args]
        raise ValueError(f"cannot launch backend {self.backend!r} with controller {self.controller!r}")
