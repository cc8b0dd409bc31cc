"""The training runs of the steps: their options, the torchrun command, what a run's directory and output say,
and the checks every run passes (NCCL, a rank per device, a finite loss)."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..context import Context
from ..record import StepFailed, StepRecord

#: the training of every run: resnet18 on synthetic 224x224 images on a GPU, a set small enough to be generated once
#: and kept (common.inputs.data.SYNTHETIC_KEEP_BYTES: 128 MB), since generating a batch on access takes longer than
#: a GPU's step; a tiny ConvNet in the CPU rehearsal
TRAIN = {"cuda": {"--model": "resnet18", "--dataset": "synthetic", "--image-size": "224", "--synthetic-samples": "212",
                  "--epochs": "1000", "--eval-every": "1000", "--max-steps": "40"},
         "cpu": {"--model": "convnet", "--dataset": "synthetic", "--image-size": "8", "--synthetic-samples": "256",
                 "--batch-size": "8", "--epochs": "100", "--max-steps": "4", "--threads": "1"}}
#: on a GPU, samples per rank and step: 32, fewer where the 169 training samples of the kept set would not make
#: 2 steps an epoch
GPU_BATCH, KEPT_TRAIN_SAMPLES = 32, 169
BANNER = re.compile(r"\[ddp\] rank (\d+)/(\d+) local_rank (\d+)/(\d+) host (\S+) device (\S+)")
NCCL_VERSION = re.compile(r"NCCL version (\S+)")


@dataclass
class TrainingRun:
    """What one run's directory and output say (a step's result, or one of its `runs`)."""

    run_dir: str  # relative to the work folder
    world_size: int
    process_group: str | None
    nccl: str | None  # NCCL's version line, where NCCL started a communicator
    devices: list[str]  # each rank's
    local_ranks: list[int]
    precision: dict[str, Any] | None
    channels_last: bool | None
    reduction: Any
    global_batch: int | None
    steps: int | None
    samples_per_s: float | None
    step_ms: float | None
    data_ms: float | None
    comm_frac: float | None
    train_loss: float | None
    wall_s: float | None
    weights_sha256: str | None
    buffers_keyword: str | None


def options(ctx: Context, **changes: str | None) -> list[str]:
    """The training options of every run, with `changes` (option name without dashes, underscores for dashes;
    None drops the option, "" gives it without a value)."""
    chosen: dict[str, str | None] = dict(TRAIN[ctx.settings.device])
    if ctx.settings.device == "cuda":
        chosen["--batch-size"] = str(max(1, min(GPU_BATCH, KEPT_TRAIN_SAMPLES // (2 * ctx.found.nproc))))
    for key, value in changes.items():
        chosen["--" + key.replace("_", "-")] = value
    return [word for option, value in chosen.items() if value is not None
            for word in ((option,) if value == "" else (option, value))]


def console_script(python: str, name: str) -> list[str]:
    """A console script of this python (torchrun, horovodrun), else `python -m` its module."""
    beside = Path(python).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    modules = {"torchrun": "torch.distributed.run", "horovodrun": "horovod.runner.launch"}
    return [python, "-m", modules[name]]


def torchrun(ctx: Context, nproc: int, program: list[str]) -> list[str]:
    """`program` under torchrun with `nproc` processes and the project's loopback rendezvous."""
    return [*console_script(ctx.settings.python, "torchrun"), "--rdzv-backend", "loopback",
            f"--nproc-per-node={nproc}", *program]


def train(ctx: Context, record: StepRecord, until: float, train_options: list[str], run_dir: Path,
          nproc: int | None = None, key: str | None = None) -> TrainingRun:
    """One ddp_train run under torchrun: what its run directory and output say, recorded in the step's result
    (under runs/`key` with a key), then checked."""
    n = nproc or ctx.found.nproc
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = torchrun(ctx, n, ["-m", "ddp_train", "--device", ctx.settings.device, *train_options, "--run-dir",
                            str(run_dir), *ctx.settings.forced(record.name)])
    output = ctx.run(record, cmd, until)
    run = read_run(ctx, run_dir, output)
    if key:
        record.result.setdefault("runs", {})[key] = asdict(run)
    else:
        record.result.update(asdict(run))
    check_run(ctx, run_dir.name, run, n)
    return run


def read_run(ctx: Context, run_dir: Path, output: str) -> TrainingRun:
    """What a run's directory and output say: its process group, each rank's device, NCCL's version line, its
    precision and memory format, speed, loss and weights."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise StepFailed(f"{run_dir.name}: no complete run directory ({exc})") from None
    devices = {int(m.group(1)): {"local_rank": int(m.group(3)), "device": m.group(6)}
               for m in BANNER.finditer(output)}
    nccl = NCCL_VERSION.findall(output)
    split = summary.get("time_split") or {}
    return TrainingRun(
        run_dir=str(run_dir.relative_to(ctx.settings.work)), world_size=config["world_size"],
        process_group=config["backend"].get("process_group"), nccl=nccl[0] if nccl else None,
        devices=[str(devices[r]["device"]) for r in sorted(devices)],
        local_ranks=[int(devices[r]["local_rank"]) for r in sorted(devices)],
        precision=config.get("precision"), channels_last=config["config"].get("channels_last"),
        reduction=config.get("reduction"), global_batch=config.get("global_batch"),
        steps=summary.get("steps"), samples_per_s=summary.get("samples_per_s"),
        step_ms=split.get("step_ms"), data_ms=split.get("data_ms"), comm_frac=split.get("comm_frac"),
        train_loss=summary.get("train_loss"), wall_s=summary.get("wall_s"),
        weights_sha256=summary.get("weights_sha256"),
        buffers_keyword=config["backend"].get("ddp_built", {}).get("buffers_keyword"))


def check_run(ctx: Context, name: str, run: TrainingRun, n: int) -> None:
    """NCCL (Gloo in the rehearsal), every rank on the device of its local rank, a finite loss."""
    cuda = ctx.settings.device == "cuda"
    want = "nccl" if cuda else "gloo"
    if run.process_group != want:
        raise StepFailed(f"{name}: the process group is {run.process_group}, not {want}")
    if len(run.devices) != n:
        raise StepFailed(f"{name}: {len(run.devices)} of {n} ranks said which device they train on")
    for rank, (device, local_rank) in enumerate(zip(run.devices, run.local_ranks, strict=True)):
        want_device = f"cuda:{local_rank}" if cuda else "cpu"
        if device != want_device:
            raise StepFailed(f"{name}: rank {rank} (local rank {local_rank}) trains on {device}, not {want_device}")
    if cuda and not run.nccl:
        raise StepFailed(f"{name}: NCCL never started a communicator (no 'NCCL version' line under "
                         "NCCL_DEBUG=VERSION)")
    if not math.isfinite(run.train_loss if run.train_loss is not None else float("nan")):
        raise StepFailed(f"{name}: the training loss is {run.train_loss}")
