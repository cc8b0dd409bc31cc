"""The settings of a run: one frozen dataclass whose fields are the options.

Each option is declared once, as a field of `Config` made by `option(...)`: its name, type,
default, help, choices and group. The parser both entry points share (`build_parser`) and the
option table of docs/training.md (`options_markdown`) are both built from those declarations.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .choices import DATASETS, FILE_DATASETS, MODELS, OPTIMIZERS, PRETRAINABLE_MODELS
from .errors import OneLineParser, UsageError, fail_usage

LR_SCHEDULES = ("constant", "step", "cosine")
LR_SCALINGS = ("none", "linear")
COMPRESSIONS = ("none", "fp16")
AMP_MODES = ("off", "bf16", "fp16")
REDUCTIONS = ("allreduce", "exact")
#: exact mode's global batch when --global-batch is not given: 12 micro-batches of 8, which 1, 2, 3, 4, 6
#: and 12 ranks can share (a default that does not depend on the world size)
EXACT_GLOBAL_BATCH = 96

#: option groups, in the order --help and the docs show them
GROUPS = {
    "data": "data",
    "model": "model",
    "optimisation": "optimisation",
    "run": "run",
    "reduction": "how gradients are summed",
    "tuning": "tuning (the same meaning on both backends)",
}


# --- value checks used as argparse types -------------------------------------------------------
def positive_int(text: str) -> int:
    """An int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A float > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def factory_or(builtins: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse `type` for --model/--dataset: one of `builtins` or a factory's import path
    (package.module:function, or torchvision:NAME for models)."""

    def parse(text: str) -> str:
        if text in builtins:
            return text
        if ":" in text:
            module, _, attribute = text.partition(":")
            if all(part.isidentifier() for part in module.split(".")) and attribute.isidentifier():
                return text
            raise argparse.ArgumentTypeError(f"{text!r} is not an import path; write package.module:function")
        raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose one of {', '.join(builtins)}, or name "
                                         "your own as package.module:function")

    return parse


def key_value(text: str) -> str:
    """KEY=VALUE with KEY a Python identifier (the value is read as a Python literal when the model is built)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. depth=4, dropout=0.1)")
    return text


def non_negative_float(text: str) -> float:
    """A float >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def option(default: Any, group: str, help: str, *, parse: Optional[Callable[[str], Any]] = None,
           choices: Optional[Sequence[str]] = None, metavar: Optional[str] = None, doc: Optional[str] = None,
           doc_default: Optional[str] = None, repeat: bool = False):
    """Declare one option: a dataclass field whose metadata the parser and the docs are built from.

    `parse` converts and checks the command-line text (default: the field's type); a bool field is a
    flag; a `repeat` option may be given several times and holds a tuple of its values. `doc` is the longer
    text of the docs' table (default: `help`); `doc_default` replaces the default shown there when the
    real one is computed at run time.
    """
    assert group in GROUPS, group
    return dataclasses.field(default=default, metadata={
        "group": group, "help": help, "parse": parse, "choices": tuple(choices) if choices else None,
        "metavar": metavar, "doc": doc, "doc_default": doc_default, "repeat": repeat})


@dataclass(frozen=True)
class Config:
    """Every setting of a training run. Both backends read exactly these fields."""

    # data
    dataset: str = option("digits", "data", "digits is embedded (scikit-learn's handwritten digits, no files "
                                            "needed); or package.module:function returning (train, val)",
                          parse=factory_or(DATASETS, "dataset"), metavar="{" + ",".join(DATASETS) + "}|MODULE:FUNCTION",
                          doc=(
                              "`digits` is scikit-learn's handwritten digits (8x8, shipped inside the wheel: no files, "
                              "no network); `synthetic` is a seeded learnable task of any shape (`--image-size`, "
                              "`--synthetic-samples`), for throughput; `mnist`, `cifar10`, `imagefolder` read "
                              "`--data-dir`; `package.module:function` is yours, called as `function(data_dir=, "
                              "seed=)` and returning `(train, val)` (see docs/your-model-and-data.md)"))
    data_dir: Optional[str] = option(None, "data", "folder holding the dataset files (mnist, cifar10, imagefolder); "
                                     "never downloaded", doc=(
                                         "files for `mnist` (`MNIST/raw/*-ubyte`), `cifar10` "
                                         "(`cifar-10-batches-py/`), `imagefolder` (`train/<class>/`, "
                                         "`val/<class>/`). Nothing is ever downloaded"))
    image_size: Optional[int] = option(None, "data", "synthetic: side of the square images (default: the model's, "
                                                     "224 for ImageNet models, else 8); imagefolder: resize to this "
                                                     "(default 224)", parse=positive_int)
    synthetic_samples: int = option(2048, "data", "number of samples of the synthetic dataset", parse=positive_int)
    workers: int = option(0, "data", "DataLoader worker processes per rank", parse=non_negative_int)
    # model
    model: str = option("convnet", "model", "the network to train: a built-in, torchvision:NAME, or "
                                            "package.module:function returning a torch.nn.Module",
                        parse=factory_or(MODELS, "model"),
                        metavar="{" + ",".join(MODELS) + "}|torchvision:NAME|MODULE:FUNCTION", doc=(
        "`convnet`: the classic MNIST ConvNet (two conv-BN-ReLU-pool blocks + linear); `mnist_net`: PyTorch's MNIST "
        "example net (with dropout); ResNets from torchvision, random init; `mlp`: tiny, for tests; "
        "`torchvision:NAME`: any torchvision classification model, random init; `package.module:function`: yours, "
        "called as `function(num_classes=, channels=, image_size=, **model_args)` (see "
        "docs/your-model-and-data.md). Channels, image size and classes follow the dataset"))
    model_arg: Tuple[str, ...] = option((), "model", "KEY=VALUE keyword argument of the model's builder (a Python "
                                                     "literal, else a string); repeat for more",
                                        parse=key_value, metavar="KEY=VALUE", repeat=True, doc_default="none")
    pretrained: bool = option(False, "model", "pretrained torchvision weights (not available offline: refused "
                                              "with a message)")
    # optimisation
    epochs: int = option(10, "optimisation", "passes over the training set", parse=positive_int)
    max_steps: Optional[int] = option(None, "optimisation", "stop after this many global optimizer steps",
                                      parse=positive_int)
    batch_size: int = option(32, "optimisation", "samples per process per step (global batch = this x world size)",
                             parse=positive_int)
    global_batch: Optional[int] = option(None, "optimisation", "samples per loader batch over all processes (per "
                                                               "step, times --accumulate); the per-rank batch is this "
                                                               "/ world size (refused when it does not divide); "
                                                               "replaces --batch-size",
                                         parse=positive_int, metavar="G",
                                         doc_default=f"off (`{EXACT_GLOBAL_BATCH}` with `--reduction exact`)")
    lr: float = option(0.05, "optimisation", "base learning rate", parse=positive_float)
    momentum: float = option(0.9, "optimisation", "SGD only", parse=non_negative_float)
    weight_decay: float = option(0.0, "optimisation", "L2 penalty of the optimizer", parse=non_negative_float)
    optimizer: str = option("sgd", "optimisation", "the optimizer", choices=OPTIMIZERS)
    lr_schedule: str = option("constant", "optimisation", "step: x0.1 at 50%% and 75%% of training; "
                                                          "cosine: to 0 at the last step", choices=LR_SCHEDULES)
    lr_scaling: str = option("none", "optimisation", "linear: lr x world size, reached after --warmup-epochs "
                                                     "(Horovod's rule)", choices=LR_SCALINGS)
    warmup_epochs: float = option(0.0, "optimisation", "epochs of linear warm-up from lr to the scaled lr",
                                  parse=non_negative_float)
    # run
    seed: int = option(42, "run", "seeds weights, the train/validation split and the sample order", parse=int)
    threads: Optional[int] = option(None, "run", "intra-op CPU threads per process (default: cores / processes on "
                                                 "this host; 1 with --reduction exact)", parse=positive_int,
                                    doc_default="cores / processes per host; 1 in exact mode")
    eval_every: int = option(1, "run", "validate every N epochs (and always after the last)", parse=positive_int)
    log_every: int = option(1, "run", "write a step event to metrics.jsonl every N steps", parse=positive_int)
    run_dir: str = option("runs/latest", "run", "where rank 0 writes the run directory")
    timeout: float = option(300.0, "run", "seconds a collective (or the rendezvous) may wait for another rank before "
                                          "the job fails saying where every rank is (time spent computing never "
                                          "counts)",
                            parse=positive_float)
    checkpoint_every: int = option(0, "run", "also checkpoint every N optimizer steps (a checkpoint is always written "
                                             "at every epoch end and when training stops); 0: epoch ends only",
                                   parse=non_negative_int)
    keep_checkpoints: int = option(3, "run", "how many of the newest checkpoints to keep in RUN_DIR/checkpoints",
                                   parse=positive_int)
    resume: Optional[str] = option(None, "run", "auto: continue from the newest valid checkpoint in --run-dir (or "
                                                "start fresh); PATH: from that checkpoint file", metavar="auto|PATH")
    device: str = option("auto", "run", "auto: one CUDA device per local rank when available, else CPU",
                         choices=("auto", "cpu", "cuda"))
    tensorboard: bool = option(False, "run", "also write TensorBoard event files to RUN_DIR/tensorboard (rank 0)")
    progress: str = option("auto", "run", "tqdm progress bar on rank 0; auto: only when stderr is a terminal",
                           choices=("auto", "on", "off"))
    perturb_ulp: int = option(0, "run", "move every nonzero initial weight N units in the last place (which way: "
                                        "--perturb-pattern), and with --compression fp16 every reduced gradient one "
                                        "float16 unit at every step: the smallest disturbance, whose effect on "
                                        "training is the noise floor compare-backends measures; 0: off",
                              parse=non_negative_int, metavar="N")
    perturb_pattern: int = option(1, "run", "with --perturb-ulp, which way each parameter tensor moves: 1 every "
                                            "tensor away from zero, 2 toward zero, 3 and up each tensor one way or "
                                            "the other (drawn from the number): distinct disturbances of the same "
                                            "size, whose outcomes make the noise floor's spread",
                                  parse=positive_int, metavar="P")
    # reduction
    reduction: str = option("allreduce", "reduction", "allreduce: each backend's own gradient averaging (fast; "
                                                      "bitwise equal across backends at 1 and 2 ranks); exact: "
                                                      "fixed-point sums of micro-batch gradients, the same bits on "
                                                      "both backends, at every world size, run after run",
                            choices=REDUCTIONS)
    micro_batch: int = option(8, "reduction", "exact: samples per micro-batch; the global batch is cut into "
                                              "micro-batches whose number every world size must divide",
                              parse=positive_int, metavar="M")
    deterministic: bool = option(False, "reduction", "the same bits run after run: Horovod reduces every tensor "
                                                     "alone (no fusion, whose grouping follows timing), torch uses "
                                                     "deterministic algorithms")
    predivide: bool = option(False, "reduction", "divide gradients by the world size before summing them, as DDP does "
                                                 "(Horovod's gradient_predivide_factor = world size); DDP: no change")
    # tuning
    compression: str = option("none", "tuning", "gradients sent as float16: Horovod's Compression.fp16, DDP's "
                                                "fp16_compress_hook", choices=COMPRESSIONS)
    bucket_mb: float = option(25.0, "tuning", "MB of gradients reduced together: DDP's bucket_cap_mb (at its default, "
                                              "25, DDP keeps its first bucket of 1 MiB); Horovod's fusion threshold "
                                              "HOROVOD_FUSION_THRESHOLD (its own default is 128 MB; this flag wins "
                                              "over the variable); with --reduction exact, the least MB of whole "
                                              "tensors in one integer allreduce",
                              parse=positive_float, metavar="MB")
    accumulate: int = option(1, "tuning", "micro-batches per optimizer step (gradient accumulation; each "
                                          "micro-batch's loss counts 1/K); a step is one optimizer step and an epoch's "
                                          "incomplete tail of micro-batches is dropped", parse=positive_int,
                             metavar="K")
    amp: str = option("off", "tuning", "autocast forward and loss: bf16 (CPU or CUDA), fp16 (CUDA only, with a "
                                       "GradScaler)", choices=AMP_MODES)
    clip_grad_norm: Optional[float] = option(None, "tuning", "clip the averaged gradients to total L2 norm X before "
                                                             "each step (default: off)", parse=positive_float,
                                             metavar="X")
    channels_last: bool = option(False, "tuning", "model and 4-D inputs in torch.channels_last memory format")
    profile: int = option(0, "tuning", "trace STEPS optimizer steps after 2 warm-up steps into RUN_DIR/profile/ "
                                       "(DDP: torch.profiler chrome trace of rank 0; Horovod: Horovod timeline); "
                                       "0: off",
                          parse=non_negative_int, metavar="STEPS")

    def to_dict(self) -> dict:
        """The settings as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @property
    def exact(self) -> bool:
        """--reduction exact: fixed-point sums of micro-batch gradients."""
        return is_exact(self.to_dict())

    @property
    def gradient_precision(self) -> str:
        """The precision the gradients are exchanged at: float16 with --compression fp16, else float32 (under
        --amp the gradients of the float32 weights are float32; the forward's lower precision is reached by the
        initial weights' disturbance, as measured in benchmarks/results/verdicts.json)."""
        return "float16" if self.compression == "fp16" else "float32"

    @property
    def fixed_global_batch(self) -> bool:
        """Whether the global batch stays the same at every world size (--reduction exact, or --global-batch);
        otherwise the per-rank batch does and the global batch follows the world size."""
        return fixed_global_batch(self.to_dict())


def is_exact(settings: Dict[str, Any]) -> bool:
    """The rule of `Config.exact` on settings as a dict (a Config's, config.json's "config", a checkpoint's
    "settings"): whether they say --reduction exact."""
    return settings.get("reduction") == "exact"


def fixed_global_batch(settings: Dict[str, Any]) -> bool:
    """The rule of `Config.fixed_global_batch` on settings as a dict (a Config's, config.json's "config")."""
    return is_exact(settings) or settings.get("global_batch") is not None


def options() -> List[dataclasses.Field]:
    """The declared options, in declaration order."""
    return list(dataclasses.fields(Config))


def flag_of(field: dataclasses.Field) -> str:
    """The command-line spelling of an option: --data-dir for data_dir."""
    return "--" + field.name.replace("_", "-")


def _help(field: dataclasses.Field) -> str:
    """An option's help line, with its default where there is one worth showing."""
    shown = field.default not in (None, False, ()) and not field.metadata["repeat"]
    return field.metadata["help"] + (f" (default: {field.default})" if shown else "")


# --- the parser and the docs, from the declarations --------------------------------------------
def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The one parser of training options; ddp_train and hvd_train both use it unchanged. It sets no default: the
    namespace it returns holds exactly the options given (`given_options`), and Config's fields give the rest."""
    parser = OneLineParser(prog=prog, description=description, argument_default=argparse.SUPPRESS)
    groups = {name: parser.add_argument_group(title) for name, title in GROUPS.items()}
    for field in options():
        meta = field.metadata
        kwargs: Dict[str, Any] = {"help": _help(field), "dest": field.name}
        if field.type in (bool, "bool"):
            kwargs["action"] = "store_true"
        elif meta["repeat"]:
            kwargs.update(action="append", type=meta["parse"] or str, metavar=meta["metavar"])
        else:
            kwargs["type"] = meta["parse"] or str
            if meta["choices"]:
                kwargs["choices"] = meta["choices"]
            if meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
        groups[meta["group"]].add_argument(flag_of(field), **kwargs)
    return parser


def given_options(argv: Optional[Sequence[str]], prog: str, description: str = "training options") -> Dict[str, Any]:
    """The training options given on a command line, by field name (a repeated option as a tuple); bad input exits
    with one line and code 2."""
    values = vars(build_parser(prog, description).parse_args(argv))
    for field in options():
        if field.metadata["repeat"] and field.name in values:
            values[field.name] = tuple(values[field.name])
    return values


def options_markdown() -> str:
    """The option table of docs/training.md, one row per option, from the declarations."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for field in options():
        meta = field.metadata
        name = flag_of(field)
        if meta["choices"]:
            name += " {" + ",".join(meta["choices"]) + "}"
        elif meta["metavar"]:
            name += f" {meta['metavar']}"
        if meta["doc_default"] is not None:
            default = meta["doc_default"]
        elif field.default is None or field.default is False:
            default = "off" if field.type in (bool, "bool") else ""
        else:
            default = f"`{field.default}`"
        text = (meta["doc"] or meta["help"]).replace("%%", "%").replace("|", "\\|")
        name = name.replace("|", "\\|")  # GitHub's tables take an escaped pipe, also inside code
        rows.append(f"| `{name}` | {default} | {text} |")
    return "\n".join(rows) + "\n"


def config_argv(settings: Dict[str, Any], leave_out: Sequence[str] = ("run_dir", "resume")) -> List[str]:
    """The training options that give these settings (config.json's "config"), defaults left out."""
    argv: List[str] = []
    for field in options():
        value = settings.get(field.name, field.default)
        if field.name in leave_out or value == field.default or (field.metadata["repeat"] and not value):
            continue
        if field.name == "batch_size" and fixed_global_batch(settings):
            continue  # the global batch sets it
        flag = flag_of(field)
        if field.type in (bool, "bool"):
            argv.append(flag)
        elif field.metadata["repeat"]:
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def parse_config(argv: Optional[Sequence[str]], prog: str, description: str) -> Config:
    """Parse and check the command line; bad input exits with one line and code 2."""
    given = given_options(argv, prog, description)
    config = Config(**given)
    try:
        if config.global_batch is not None and "batch_size" in given:
            raise UsageError("--global-batch and --batch-size both set the batch; give one of them")
        if config.exact and "batch_size" in given:
            raise UsageError("--batch-size does not apply to --reduction exact: its batch does not depend on the world "
                             f"size; give --global-batch (default {EXACT_GLOBAL_BATCH}) instead")
        check_config(config)
    except UsageError as exc:
        fail_usage(prog, str(exc))
    return config


def check_data_dir(config: Config) -> None:
    """A dataset read from files has a readable --data-dir; UsageError naming what is wrong."""
    if config.dataset in FILE_DATASETS:
        path = config.data_dir
        if not path:
            raise UsageError(f"--dataset {config.dataset} needs --data-dir pointing at its files")
        if not os.path.isdir(path):
            raise UsageError(f"--data-dir {path!r} is not a directory; point it at the {config.dataset} files")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"--data-dir {path!r} is not readable by this user; fix its permissions")


def check_run_dir(path: str) -> None:
    """The run directory can be made and written (rank 0 writes it; every rank checks it alike, before any
    collective, and makes nothing); UsageError naming why not."""
    target = os.path.abspath(path)
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--run-dir {path!r}: {existing} is not a directory; give a folder you can write to")
    if existing == target:
        if not os.access(target, os.W_OK | os.X_OK):
            raise UsageError(f"--run-dir {path!r} is not writable by this user; give a folder you can write to")
        return
    try:  # the folders below `existing` are made when the run starts: try one there, and take it away
        os.rmdir(tempfile.mkdtemp(prefix=".run-dir-check-", dir=existing))
    except OSError as exc:
        raise UsageError(f"--run-dir {path!r} cannot be created in {existing} ({exc.strerror or exc}); give a "
                         "folder you can write to") from None


def check_config(config: Config) -> None:
    """Checks that need more than one option at a time, or the file system; raises UsageError."""
    check_data_dir(config)
    check_run_dir(config.run_dir)
    if config.pretrained and config.model not in PRETRAINABLE_MODELS:
        raise UsageError(f"--pretrained applies to {'/'.join(PRETRAINABLE_MODELS)} only, not --model {config.model}")
    if config.pretrained:
        raise UsageError("--pretrained weights cannot be downloaded here (no network); "
                         "train from random init or load a checkpoint")
    if config.warmup_epochs > 0 and config.lr_scaling == "none":
        raise UsageError("--warmup-epochs ramps up to the scaled lr; use it with --lr-scaling linear")
    if config.amp == "fp16" and config.device == "cpu":
        raise UsageError(AMP_FP16_NEEDS_CUDA)
    if config.exact:
        check_exact(config)
    elif config.micro_batch != Config.micro_batch:
        raise UsageError("--micro-batch applies to --reduction exact; drop it or add --reduction exact")


#: knobs that cannot work in exact mode, and why (one line each)
EXACT_REFUSES = {
    "compression": ("fp16", "--compression fp16 does not apply to --reduction exact: it sends integer sums; drop it"),
    "amp": ("fp16", "--amp fp16 does not apply to --reduction exact: its GradScaler skips steps on overflow, which "
                    "exact mode's integer sums never have; use --amp bf16 or off"),
    "lr_scaling": ("linear", "--lr-scaling linear does not apply to --reduction exact: its global batch does not "
                             "change with the world size; drop it"),
    "predivide": (True, "--predivide does not apply to --reduction exact: its sums are exact, in any order; drop it"),
}


def check_exact(config: Config) -> None:
    """--reduction exact's own checks; raises UsageError naming the knob and the fix."""
    for name, (value, reason) in EXACT_REFUSES.items():
        if getattr(config, name) == value:
            raise UsageError(reason)
    if config.accumulate != 1:
        raise UsageError("--accumulate does not apply to --reduction exact: it already cuts the global batch into "
                         "micro-batches; use --micro-batch")
    global_batch = exact_global_batch(config)
    if global_batch % config.micro_batch:
        raise UsageError(f"--global-batch {global_batch} is not a multiple of --micro-batch {config.micro_batch}; "
                         "change one of them")


def exact_global_batch(config: Config) -> int:
    """The global batch of exact mode (--global-batch, or a default that does not depend on the world size)."""
    return config.global_batch or EXACT_GLOBAL_BATCH


#: one line, shared by the option check and the device check made after the device is chosen
AMP_FP16_NEEDS_CUDA = ("--amp fp16 needs a CUDA device (float16 autocast with a GradScaler); on CPU use "
                       "--amp bf16 or --amp off")


if __name__ == "__main__":
    # python -m common.config prints the option table (docs/training.md holds it between markers).
    sys.stdout.write(options_markdown())
