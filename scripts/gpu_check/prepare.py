"""`gpu_check.sh --prepare`: on a machine with PyPI, what the Horovod build needs offline, into the carry folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .settings import PROG
from .steps.horovod import HOROVOD_VERSION


def prepare(carry: Path) -> int:
    """Horovod's source, and cffi with pycparser for the GPU machine's Python (build_horovod.sh installs cffi),
    downloaded into `carry` (runs/gpu-carry); the exit code."""
    carry.mkdir(parents=True, exist_ok=True)
    python_version = os.environ.get("GPU_CHECK_CARRY_PYTHON", "3.12")
    commands = [
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}",
         "-d", str(carry)],
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--python-version",
         python_version, "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform",
         "manylinux2014_x86_64", "cffi", "pycparser", "-d", str(carry)],
    ]
    for cmd in commands:
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"{PROG}: error: {' '.join(cmd[3:5])} failed (above)", file=sys.stderr)
            return 1
    size = sum(p.stat().st_size for p in carry.iterdir() if p.is_file())
    print(f"[{PROG}] {carry}: {', '.join(sorted(p.name for p in carry.iterdir()))} ({size / 2**20:.1f} MiB)")
    return 0
