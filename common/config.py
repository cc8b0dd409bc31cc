"""The settings of a run: one frozen dataclass and the one argument parser both backends share."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from typing import NoReturn, Optional, Sequence

DATASETS = ("digits", "synthetic", "mnist", "cifar10", "imagefolder")
MODELS = ("mlp", "convnet", "mnist_net", "resnet18", "resnet50")
OPTIMIZERS = ("sgd", "adam", "adadelta")
LR_SCHEDULES = ("constant", "step", "cosine")
LR_SCALINGS = ("none", "linear")
COMPRESSIONS = ("none", "fp16")
AMP_MODES = ("off", "bf16", "fp16")


class UsageError(Exception):
    """Bad input: reported as one line and exit code 2 on every rank, before any collective."""


@dataclass(frozen=True)
class Config:
    """Every setting of a training run. Both backends read exactly these fields."""

    dataset: str = "digits"
    data_dir: Optional[str] = None
    image_size: Optional[int] = None
    synthetic_samples: int = 2048
    model: str = "convnet"
    pretrained: bool = False
    epochs: int = 10
    max_steps: Optional[int] = None
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    lr_schedule: str = "constant"
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    seed: int = 42
    workers: int = 0
    threads: Optional[int] = None
    eval_every: int = 1
    log_every: int = 1
    run_dir: str = "runs/latest"
    timeout: float = 300.0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: Optional[str] = None
    device: str = "auto"
    tensorboard: bool = False
    progress: str = "auto"
    compression: str = "none"
    bucket_mb: float = 25.0
    accumulate: int = 1
    amp: str = "off"
    clip_grad_norm: Optional[float] = None
    channels_last: bool = False
    profile: int = 0

    def to_dict(self) -> dict:
        """The settings as a JSON-ready dict."""
        return dataclasses.asdict(self)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only when there is one worth showing."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (prog: error: ...) and exits 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        fail_usage(self.prog, f"{message} (see --help)")


def _rank_hint() -> str:
    """The rank a launcher gave this process, read from its environment (no collective needed)."""
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var]
    return ""


def _print_error(line: str) -> None:
    rank = _rank_hint()
    prefix = f"[rank {rank}] " if rank else ""
    print(prefix + line, file=sys.stderr, flush=True)


#: how long a rank started by a launcher lingers after its error line before exiting: on a loaded
#: machine a sibling's Python start-up can lag by more than a second
SIBLING_GRACE_S = 3.0


def fail_usage(prog: str, message: str) -> NoReturn:
    """Print one error line naming the problem and the fix, then exit with code 2.

    Under a launcher every rank finds the same bad input at about the same moment; the launcher stops
    the others as soon as one exits (horovodrun, mpirun), so a rank lingers a moment for the others to
    print their own line too.
    """
    _print_error(f"{prog}: error: {message}")
    if _rank_hint():
        time.sleep(SIBLING_GRACE_S)
    sys.exit(2)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The one parser of training options; ddp_train and hvd_train both use it unchanged."""
    d = Config()
    p = OneLineParser(prog=prog, description=description,
                       formatter_class=_HelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default=d.dataset,
                      help="digits is embedded (scikit-learn's handwritten digits, no files needed)")
    data.add_argument("--data-dir", default=d.data_dir,
                      help="folder holding the dataset files (mnist, cifar10, imagefolder); never downloaded")
    data.add_argument("--image-size", type=_positive_int, default=d.image_size,
                      help="synthetic: side of the square images (default 8); imagefolder: resize to this (default 224)")
    data.add_argument("--synthetic-samples", type=_positive_int, default=d.synthetic_samples,
                      help="number of samples of the synthetic dataset")
    data.add_argument("--workers", type=_non_negative_int, default=d.workers,
                      help="DataLoader worker processes per rank")

    model = p.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, default=d.model)
    model.add_argument("--pretrained", action="store_true",
                       help="pretrained torchvision weights (not available offline: refused with a message)")

    opt = p.add_argument_group("optimisation")
    opt.add_argument("--epochs", type=_positive_int, default=d.epochs)
    opt.add_argument("--max-steps", type=_positive_int, default=d.max_steps,
                     help="stop after this many global optimizer steps")
    opt.add_argument("--batch-size", type=_positive_int, default=d.batch_size,
                     help="samples per process per step (global batch = this x world size)")
    opt.add_argument("--lr", type=_positive_float, default=d.lr, help="base learning rate")
    opt.add_argument("--momentum", type=_non_negative_float, default=d.momentum, help="SGD only")
    opt.add_argument("--weight-decay", type=_non_negative_float, default=d.weight_decay)
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    opt.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=d.lr_schedule,
                     help="step: x0.1 at 50%% and 75%% of training; cosine: to 0 at the last step")
    opt.add_argument("--lr-scaling", choices=LR_SCALINGS, default=d.lr_scaling,
                     help="linear: lr x world size, reached after --warmup-epochs (Horovod's rule)")
    opt.add_argument("--warmup-epochs", type=_non_negative_float, default=d.warmup_epochs,
                     help="epochs of linear warm-up from lr to the scaled lr")

    run = p.add_argument_group("run")
    run.add_argument("--seed", type=int, default=d.seed,
                     help="seeds weights, the train/validation split and the sample order")
    run.add_argument("--threads", type=_positive_int, default=d.threads,
                     help="intra-op CPU threads per process (default: cores / processes on this host)")
    run.add_argument("--eval-every", type=_positive_int, default=d.eval_every,
                     help="validate every N epochs (and always after the last)")
    run.add_argument("--log-every", type=_positive_int, default=d.log_every,
                     help="write a step event to metrics.jsonl every N steps")
    run.add_argument("--run-dir", default=d.run_dir, help="where rank 0 writes the run directory")
    run.add_argument("--timeout", type=_positive_float, default=d.timeout,
                     help="seconds a collective (or the rendezvous) may wait for another rank before the job "
                          "fails naming the ranks that stopped taking part")
    run.add_argument("--checkpoint-every", type=_non_negative_int, default=d.checkpoint_every,
                     help="also checkpoint every N optimizer steps (a checkpoint is always written at every "
                          "epoch end and when training stops); 0: epoch ends only")
    run.add_argument("--keep-checkpoints", type=_positive_int, default=d.keep_checkpoints,
                     help="how many of the newest checkpoints to keep in RUN_DIR/checkpoints")
    run.add_argument("--resume", default=d.resume, metavar="auto|PATH",
                     help="auto: continue from the newest valid checkpoint in --run-dir (or start fresh); "
                          "PATH: from that checkpoint file")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device,
                     help="auto: one CUDA device per local rank when available, else CPU")
    run.add_argument("--tensorboard", action="store_true",
                     help="also write TensorBoard event files to RUN_DIR/tensorboard (rank 0)")
    run.add_argument("--progress", choices=("auto", "on", "off"), default=d.progress,
                     help="tqdm progress bar on rank 0; auto: only when stderr is a terminal")

    tuning = p.add_argument_group("tuning (the same meaning on both backends)")
    tuning.add_argument("--compression", choices=COMPRESSIONS, default=d.compression,
                        help="gradients sent as float16: Horovod's Compression.fp16, DDP's fp16_compress_hook")
    tuning.add_argument("--bucket-mb", type=_positive_float, default=d.bucket_mb, metavar="MB",
                        help="MB of gradients reduced together: DDP's bucket_cap_mb (its default is 25); Horovod's "
                             "fusion threshold HOROVOD_FUSION_THRESHOLD (its own default is 64 MB; this flag wins "
                             "over the variable)")
    tuning.add_argument("--accumulate", type=_positive_int, default=d.accumulate, metavar="K",
                        help="micro-batches per optimizer step (gradient accumulation; each micro-batch's loss "
                             "counts 1/K); a step is one optimizer step and an epoch's incomplete tail of "
                             "micro-batches is dropped")
    tuning.add_argument("--amp", choices=AMP_MODES, default=d.amp,
                        help="autocast forward and loss: bf16 (CPU or CUDA), fp16 (CUDA only, with a GradScaler)")
    tuning.add_argument("--clip-grad-norm", type=_positive_float, default=d.clip_grad_norm, metavar="X",
                        help="clip the averaged gradients to total L2 norm X before each step (default: off)")
    tuning.add_argument("--channels-last", action="store_true",
                        help="model and 4-D inputs in torch.channels_last memory format")
    tuning.add_argument("--profile", type=_non_negative_int, default=d.profile, metavar="STEPS",
                        help="trace STEPS optimizer steps after 2 warm-up steps into RUN_DIR/profile/ (DDP: "
                             "torch.profiler chrome trace of rank 0; Horovod: Horovod timeline); 0: off")
    return p


def parse_config(argv: Optional[Sequence[str]], prog: str, description: str) -> Config:
    """Parse and check the command line; bad input exits with one line and code 2."""
    args = build_parser(prog, description).parse_args(argv)
    config = Config(**vars(args))
    try:
        check_config(config)
    except UsageError as exc:
        fail_usage(prog, str(exc))
    return config


def check_config(config: Config) -> None:
    """Checks that need more than one option at a time; raises UsageError."""
    if config.dataset in ("mnist", "cifar10", "imagefolder"):
        path = config.data_dir
        if not path:
            raise UsageError(f"--dataset {config.dataset} needs --data-dir pointing at its files")
        if not os.path.isdir(path):
            raise UsageError(f"--data-dir {path!r} is not a directory; point it at the {config.dataset} files")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"--data-dir {path!r} is not readable by this user; fix its permissions")
    if config.pretrained and config.model not in ("resnet18", "resnet50"):
        raise UsageError(f"--pretrained applies to resnet18/resnet50 only, not --model {config.model}")
    if config.pretrained:
        raise UsageError("--pretrained weights cannot be downloaded here (no network); "
                         "train from random init or load a checkpoint")
    if config.warmup_epochs > 0 and config.lr_scaling == "none":
        raise UsageError("--warmup-epochs ramps up to the scaled lr; use it with --lr-scaling linear")
    if config.amp == "fp16" and config.device == "cpu":
        raise UsageError(AMP_FP16_NEEDS_CUDA)


#: one line, shared by the option check and the device check made after the device is chosen
AMP_FP16_NEEDS_CUDA = ("--amp fp16 needs a CUDA device (float16 autocast with a GradScaler); on CPU use "
                       "--amp bf16 or --amp off")
