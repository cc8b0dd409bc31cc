"""The check's settings (the GPU_CHECK_* variables, docs/gpu-check.md#settings), and its clock."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
PROG = "gpu_check"
BUDGET = {"cuda": 480, "cpu": 300}  # the whole check, seconds (GPU_CHECK_BUDGET)
#: what GPU_CHECK_FAIL adds to a step's command: an option every program of the project refuses
FORCED_FAILURE = "--gpu-check-forced-failure"


def refuse(message: str) -> NoReturn:
    """A setting the check cannot run with: one line, exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def carry_folder(environ: Mapping[str, str]) -> Path:
    """The folder with what the offline Horovod build needs (GPU_CHECK_CARRY, default runs/gpu-carry)."""
    return Path(environ.get("GPU_CHECK_CARRY") or ROOT / "runs" / "gpu-carry").resolve()


@dataclass(frozen=True)
class Settings:
    """What the check was asked to do."""

    device: str                 # cuda, or cpu for the rehearsal
    python: str                 # the interpreter that runs everything
    work: Path                  # run directories and logs
    out: Path                   # gpu_check.json and the logs' archive
    carry: Path
    budget: float               # seconds for the whole check
    only: tuple[str, ...]       # the steps to run (GPU_CHECK_STEPS)
    force_fail: tuple[str, ...]
    build_wanted: str           # GPU_CHECK_HOROVOD_BUILD: auto, 1, 0
    nproc_wanted: str | None    # GPU_CHECK_NPROC

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], python: str, steps: Sequence[str]) -> Settings:
        """The settings in `environ`, for `python` and the check's `steps`; refused (exit 2) where one is wrong."""
        device = environ.get("GPU_CHECK_DEVICE", "cuda")
        if device not in ("cuda", "cpu"):
            refuse(f"GPU_CHECK_DEVICE={device}: choose cuda or cpu")
        work = Path(environ.get("GPU_CHECK_WORK") or ROOT / "runs" / "gpu-check" / device).resolve()
        default_out = ROOT / "benchmarks" / "results" / "gpu" if device == "cuda" else work
        try:
            budget = float(environ.get("GPU_CHECK_BUDGET") or BUDGET[device])
        except ValueError:
            refuse(f"GPU_CHECK_BUDGET={environ['GPU_CHECK_BUDGET']}: give seconds")
        only, force_fail = (tuple(s for s in environ.get(key, "").split(",") if s)
                            for key in ("GPU_CHECK_STEPS", "GPU_CHECK_FAIL"))
        for name in [*only, *force_fail]:
            if name not in steps:
                refuse(f"unknown step {name!r} in GPU_CHECK_STEPS/GPU_CHECK_FAIL; the steps: {','.join(steps)}")
        return cls(device=device, python=python, work=work,
                   out=Path(environ.get("GPU_CHECK_OUT") or default_out).resolve(), carry=carry_folder(environ),
                   budget=budget, only=only or tuple(steps), force_fail=force_fail,
                   build_wanted=environ.get("GPU_CHECK_HOROVOD_BUILD", "auto"),
                   nproc_wanted=environ.get("GPU_CHECK_NPROC"))

    def forced(self, name: str) -> list[str]:
        """What step `name`'s command gets so that it fails (GPU_CHECK_FAIL): an option no program takes."""
        return [FORCED_FAILURE] if name in self.force_fail else []


@dataclass(frozen=True)
class Clock:
    """When the check started and when its budget runs out, in monotonic seconds (as every time box)."""

    start: float
    deadline: float

    @classmethod
    def started(cls, budget: float) -> Clock:
        """A clock started now, with `budget` seconds."""
        start = time.monotonic()
        return cls(start, start + budget)

    def since_start(self) -> float:
        """Seconds since the check started."""
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds left in the budget."""
        return self.deadline - time.monotonic()
