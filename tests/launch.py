"""Start training runs through the real launchers and read what they wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

from common.compare.launchers import LaunchSpec

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent

LAUNCHERS = ("none-ddp", "none-hvd", "torchrun", "horovodrun-gloo", "horovodrun-mpi", "mpirun")


def command(launcher: str, np: int, args: List[str]) -> List[str]:
    """The command line a user would type for this launcher."""
    if launcher == "none-ddp":
        return [PY, "-m", "ddp_train", *args]
    if launcher == "none-hvd":
        return [PY, "-m", "hvd_train", *args]
    spec = {"torchrun": LaunchSpec("ddp", np), "horovodrun-gloo": LaunchSpec("horovod", np, "gloo"),
            "horovodrun-mpi": LaunchSpec("horovod", np, "mpi"), "mpirun": LaunchSpec("horovod", np, "mpirun")}
    return spec[launcher].command(args, python=PY)


def backend_of(launcher: str) -> str:
    """Which backend a launcher runs."""
    return "ddp" if launcher in ("none-ddp", "torchrun") else "horovod"


@dataclass
class Result:
    """What a launched job returned and printed."""

    returncode: int
    output: str
    seconds: float
    cmd: List[str]

    def check(self) -> "Result":
        assert self.returncode == 0, f"{' '.join(self.cmd)} exited {self.returncode}:\n{self.output[-4000:]}"
        return self


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a run gets: the venv first on PATH, unbuffered output."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra or {})
    return env


def run_cmd(cmd: List[str], timeout: float = 240, env: Optional[Dict[str, str]] = None) -> Result:
    """Run a command in its own process group; on timeout the whole group is killed."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} did not finish in {timeout}s:\n{out[-4000:]}")
    return Result(proc.returncode, out, time.monotonic() - started, cmd)


def launch(launcher: str, np: int, args: List[str], timeout: float = 240,
           env: Optional[Dict[str, str]] = None) -> Result:
    """Launch one training job the way a user would."""
    return run_cmd(command(launcher, np, args), timeout=timeout, env=env)


def read_run(run_dir: Path) -> Dict:
    """config.json, summary.json, metrics events and model.pt of a run directory."""
    run_dir = Path(run_dir)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {
        "config": json.loads((run_dir / "config.json").read_text()),
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "events": events,
        "model": torch.load(run_dir / "model.pt", weights_only=True),
    }


def step_losses(run: Dict) -> List[float]:
    """Rank 0's loss at every logged step."""
    return [e["loss"] for e in run["events"] if e["event"] == "step"]


def max_abs_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    """Largest element-wise |a - b| over two state_dicts with the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)
