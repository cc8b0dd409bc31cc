"""What config.json and summary.json say about a run (RunDir writes them; this builds their contents)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Dict, List, Optional

import psutil
import torch

from common.config import Config
from common.inputs.data import samples_in
from common.inputs.opening import Inputs
from common.launch.placement import cores, launcher_name
from common.loop.backend import Backend
from common.loop.batches import Batches
from common.rundir.fingerprint import parameter_names
from common.loop.position import Position
from common.loop.precision import Precision
from common.loop.profiling import StepProfiler
from common.loop.stepping import Step
from common.loop.steptimer import StepTimer
from .writer import weights_sha256

#: installed distributions whose versions can change the numbers (read from their metadata, not imported)
VERSIONED = ("torch", "torchvision", "horovod")


def versions() -> Dict[str, Optional[str]]:
    """Versions of everything that can change the numbers."""
    found: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["torch"] = torch.__version__  # with its build tag (+cu128, +cpu)
    found["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    found["platform"] = platform.platform()
    found["project_git"] = git_revision()
    return found


#: tracked paths whose changes do not make the code differ from its commit: results, documents, tests
NOT_CODE = ("benchmarks/results", "BENCHMARKS.md", "benchmarks/BENCHMARKS.template.md", "README.md", "docs", "tests")


def git_revision() -> Optional[str]:
    """The project's git commit, with -dirty when tracked code changed; None outside a checkout. Benchmark
    results, documents and tests are not code: writing them leaves the revision clean, so the later steps of a
    benchmark run record the same revision as the first, and a run is not marked for an edited sentence."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top)", *(f":(top,exclude){path}" for path in NOT_CODE)],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def command_line() -> str:
    """How this process was started, for the record."""
    return " ".join([os.path.basename(sys.executable), *sys.argv])


@dataclass(frozen=True)
class RunSetup:
    """What config.json records of a run as it starts, from the parts of the run: what it trains on (`inputs`),
    its `batches`, and `model`, the model's own module (unwrapped), whose buffers and parameters it names."""

    config: Config
    backend: Backend
    rank_hosts: List[str]
    threads: int
    inputs: Inputs
    batches: Batches
    model: torch.nn.Module
    precision: Precision
    profiler: StepProfiler
    resumed_from: Optional[str]


@dataclass(frozen=True)
class RunOutcome:
    """What summary.json records of a run as it ends, from the parts of the run: where training ended
    (`position`), the `timer`'s throughput and time split, what the `step` handed the collectives, the final
    training and validation metrics, and `state`, the final weights."""

    config: Config
    backend: Backend
    position: Position
    batches: Batches
    timer: StepTimer
    step: Step
    train: Dict[str, float]
    evaluation: Dict[str, float]
    state: Dict[str, torch.Tensor]


def config_record(run: RunSetup) -> Dict[str, Any]:
    """config.json: the resolved settings and everything about where and how the run ran. `factories` names
    where a model or dataset given by import path came from (None for the built-ins); `buffers` names the
    model's buffers (state that is not a parameter, such as BatchNorm's running statistics); `parameters` names
    its parameters in the order of the step events' `wnorm` (common.rundir.fingerprint)."""
    config, backend, batches, info = run.config, run.backend, run.batches, run.inputs.info
    factories = {"model": run.inputs.model_choice.record(), "dataset": info.factory}
    return {
        "config": config.to_dict(),
        "backend": backend.describe(),
        "world_size": backend.world_size,
        "hosts": sorted(set(run.rank_hosts)),
        "rank_hosts": run.rank_hosts,
        "launcher": launcher_name(os.environ),
        "command": command_line(),
        "threads": run.threads,
        "cores": cores(),
        "ranks_per_host": backend.local_world_size,
        "device": str(backend.device),
        "dataset": {"train_samples": samples_in(run.inputs.train_set), "val_samples": samples_in(run.inputs.val_set),
                    "channels": info.channels, "image_size": info.image_size, "num_classes": info.num_classes},
        "factories": factories,
        "buffers": [name for name, _ in run.model.named_buffers()],
        "parameters": parameter_names(run.model),
        "steps_per_epoch": batches.steps_per_epoch,
        "total_steps": batches.total_steps,
        "global_batch": batches.global_batch,
        "per_rank_batch": batches.per_rank_batch,
        "reduction": config.reduction,
        "micro_batches_per_step": batches.micro_batches if batches.exact else config.accumulate,
        "precision": run.precision.describe(),
        "profile": run.profiler.describe(),
        "resumed_from": run.resumed_from,
        "versions": versions(),
    }


def summary_record(run: RunOutcome) -> Dict[str, Any]:
    """summary.json: the run's final numbers and the checksum of its final weights."""
    config, backend, train, evaluation, position = run.config, run.backend, run.train, run.evaluation, run.position
    return {
        "backend": backend.name,
        "backend_options": backend.describe(),
        "world_size": backend.world_size,
        "model": config.model,
        "dataset": config.dataset,
        "epochs": position.epoch + (1 if position.batch else 0),  # an epoch cut short by --max-steps counts
        "steps": position.step,
        "resumed_from": position.resumed_from,
        "global_batch": run.batches.global_batch,
        "samples_per_s": run.timer.samples_per_s(),
        "train_s": run.timer.train_seconds,
        "wall_s": time.time() - psutil.Process().create_time(),  # whole process, imports included
        "train_loss": train.get("loss"),
        "train_top1": train.get("top1"),
        "val_loss": evaluation.get("loss"),
        "val_top1": evaluation.get("top1"),
        "val_top5": evaluation.get("top5"),
        "time_split": run.timer.time_split(),
        "reduced_bytes_per_step": run.step.bytes_per_step(),
        "weights_sha256": weights_sha256(run.state),
    }
