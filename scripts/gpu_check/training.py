"""Steps 1 to 3, ddp_train under torchrun: the training of every run, its record and checks; the exact runs."""

import json
import math
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .context import Context, Skipped, StepFailed, StepRecord, TimedOut, require

#: the training of every run: on a GPU resnet18 on synthetic images, few enough to be generated once and kept
#: (common.inputs.data.SYNTHETIC_KEEP_BYTES), since a batch generated on access takes longer than a GPU's step
TRAIN = {"cuda": {"--model": "resnet18", "--dataset": "synthetic", "--image-size": "224", "--synthetic-samples": "212",
                  "--epochs": "1000", "--eval-every": "1000", "--max-steps": "40"},
         "cpu": {"--model": "convnet", "--dataset": "synthetic", "--image-size": "8", "--synthetic-samples": "256",
                 "--batch-size": "8", "--epochs": "100", "--max-steps": "4", "--threads": "1"}}
#: on a GPU, samples per rank and step: 32, fewer where the kept set's 169 training samples make < 2 steps an epoch
GPU_BATCH, KEPT_TRAIN_SAMPLES = 32, 169
#: --reduction exact: samples per micro-batch and steps (the global batch is 2 micro-batches per rank)
EXACT = {"cuda": {"micro_batch": 8, "max_steps": 20}, "cpu": {"micro_batch": 4, "max_steps": 4}}
BANNER = re.compile(r"\[ddp\] rank (\d+)/(\d+) local_rank (\d+)/(\d+) host (\S+) device (\S+)")
NCCL_VERSION = re.compile(r"NCCL version (\S+)")


def options(ctx: Context, **changes: str | None) -> list[str]:
    """The training options of every run with `changes` (amp="fp16"; None drops an option, "" gives it bare)."""
    chosen: dict[str, str | None] = dict(TRAIN[ctx.settings.device])
    if ctx.settings.device == "cuda":
        chosen["--batch-size"] = str(max(1, min(GPU_BATCH, KEPT_TRAIN_SAMPLES // (2 * ctx.nproc))))
    chosen.update({"--" + key.replace("_", "-"): value for key, value in changes.items()})
    return [word for option, value in chosen.items() if value is not None
            for word in ((option,) if value == "" else (option, value))]


def torchrun(ctx: Context, nproc: int, program: list[str]) -> list[str]:
    """`program` under torchrun (the check's python's, else PATH's, else its module) with the loopback rendezvous."""
    beside = Path(ctx.settings.python).parent / "torchrun"
    found = str(beside) if beside.exists() else shutil.which("torchrun")
    return [*([found] if found else [ctx.settings.python, "-m", "torch.distributed.run"]), "--rdzv-backend",
            "loopback", f"--nproc-per-node={nproc}", *program]


def train(ctx: Context, record: StepRecord, until: float, train_options: list[str], run_dir: Path,
          nproc: int | None = None, key: str | None = None) -> dict[str, Any]:
    """One run, recorded (under runs/`key` with a key) and checked: NCCL, a rank per device, a finite loss."""
    n, cuda, name = nproc or ctx.nproc, ctx.settings.device == "cuda", run_dir.name
    shutil.rmtree(run_dir, ignore_errors=True)
    output = ctx.run(record, torchrun(ctx, n, ["-m", "ddp_train", "--device", ctx.settings.device, *train_options,
                                               "--run-dir", str(run_dir), *ctx.settings.forced(record.name)]), until)
    run = read_run(ctx, run_dir, output)
    if key:
        record.result.setdefault("runs", {})[key] = run
    else:
        record.result.update(run)
    want = "nccl" if cuda else "gloo"
    require(run["process_group"] == want, f"{name}: the process group is {run['process_group']}, not {want}")
    require(len(run["devices"]) == n, f"{name}: {len(run['devices'])} of {n} ranks said which device they train on")
    for rank, (device, local_rank) in enumerate(zip(run["devices"], run["local_ranks"], strict=True)):
        on = f"cuda:{local_rank}" if cuda else "cpu"
        require(device == on, f"{name}: rank {rank} (local rank {local_rank}) trains on {device}, not {on}")
    require(run["nccl"] or not cuda,
            f"{name}: NCCL never started a communicator (no 'NCCL version' line under NCCL_DEBUG=VERSION)")
    loss = run["train_loss"]
    require(math.isfinite(loss if loss is not None else float("nan")), f"{name}: the training loss is {loss}")
    return run


def read_run(ctx: Context, run_dir: Path, output: str) -> dict[str, Any]:
    """What a run's directory and output say, as the JSON has it."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise StepFailed(f"{run_dir.name}: no complete run directory ({exc})") from None
    ranks = {int(m.group(1)): (int(m.group(3)), m.group(6)) for m in BANNER.finditer(output)}
    nccl, split = NCCL_VERSION.findall(output), summary.get("time_split") or {}
    return {"run_dir": str(run_dir.relative_to(ctx.settings.work)), "world_size": config["world_size"],
            "process_group": config["backend"].get("process_group"), "nccl": nccl[0] if nccl else None,
            "devices": [ranks[r][1] for r in sorted(ranks)], "local_ranks": [ranks[r][0] for r in sorted(ranks)],
            "precision": config.get("precision"), "channels_last": config["config"].get("channels_last"),
            **{key: config.get(key) for key in ("reduction", "global_batch")},
            **{key: summary.get(key) for key in ("steps", "samples_per_s")},
            **{key: split.get(key) for key in ("step_ms", "data_ms", "comm_frac")},
            **{key: summary.get(key) for key in ("train_loss", "wall_s", "weights_sha256")},
            "buffers_keyword": config["backend"].get("ddp_built", {}).get("buffers_keyword")}


@dataclass(frozen=True)
class Training:
    """A step that is one run (in work/STEP) with `changes`, checked by `expect`, else failing with `error`."""

    changes: Mapping[str, str] = field(default_factory=dict)
    expect: Callable[[dict[str, Any]], bool] | None = None
    error: str = ""
    cuda_only: str | None = None  # where it does not run in the rehearsal: why

    def __call__(self, ctx: Context, record: StepRecord, until: float) -> None:
        """The run, recorded and checked."""
        if self.cuda_only and ctx.settings.device == "cpu":
            raise Skipped(self.cuda_only)
        run = train(ctx, record, until, options(ctx, **self.changes), ctx.settings.work / record.name)
        require(not self.expect or self.expect(run), self.error.format(run=run))


def exact(ctx: Context, record: StepRecord, until: float) -> None:
    """Step 3: the same bits twice at the GPU count and at 1; where two differ, whether --deterministic agrees."""
    nproc, device, folder = ctx.nproc, ctx.settings.device, ctx.settings.work / "exact"
    micro = EXACT[device]["micro_batch"]
    exact_options = options(ctx, reduction="exact", micro_batch=str(micro), global_batch=str(2 * micro * nproc),
                            max_steps=str(EXACT[device]["max_steps"]), batch_size=None)
    plan = [("a", nproc), ("b", nproc)] + ([("one", 1)] if nproc >= 2 else [])
    sha = {name: train(ctx, record, until, exact_options, folder / name, nproc=n, key=name)["weights_sha256"]
           for name, n in plan}
    record.result.update({"weights_sha256": sha, "repeat_identical": sha["a"] == sha["b"],
                          "world_sizes_identical": sha["a"] == sha["one"] if "one" in sha else None})
    short = {name: (value or "")[:12] for name, value in sha.items()}
    if sha["a"] != sha["b"]:
        try:  # within the step's box, whatever it finds
            again = [train(ctx, record, until, [*exact_options, "--deterministic"], folder / name, key=name)
                     for name in ("deterministic_a", "deterministic_b")]
            record.result["deterministic"] = {"identical": again[0]["weights_sha256"] == again[1]["weights_sha256"]}
        except (StepFailed, TimedOut) as exc:
            record.result["deterministic"] = {"error": str(exc)}
        raise StepFailed(f"two --reduction exact runs at world size {nproc} end with different weights "
                         f"({short['a']} and {short['b']})")
    require(sha.get("one", sha["a"]) == sha["a"], f"--reduction exact at world size 1 and {nproc} end with "
            f"different weights ({short.get('one')} and {short['a']})")
