"""Training throughput per backend and world size, through the real entry points and launchers.

    python -m benchmarks.throughput --np 1,2 --models convnet,resnet18 --out benchmarks/results
    python -m benchmarks.throughput --np 2 --backends horovod-gloo --sweep HOROVOD_CYCLE_TIME=auto,1,5 -- --threads 1

Each run is `python -m ddp_train` or `python -m hvd_train` under its launcher at a fixed per-rank batch; samples/s
and the time split come from its summary.json. Every cell is run once per repeat, every other repeat backwards (A B,
B A). Per case: median and spread, scaling efficiency, exchange overhead against N independent world-size-1
processes, and our loop's step time over two bare DDP loops' (benchmarks/bare_ddp.py). --sweep KNOB=v1,v2 repeats
the matrix per value of a training option (lower case; on/off for a flag) or an environment variable (upper case);
`auto` leaves it unset. Options after `--` go to every run. Writes DIR/throughput.json and DIR/throughput.png.
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import sys
import time
from argparse import ArgumentParser, ArgumentTypeError, Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from common import launch
from common.compare import stats
from common.config import build_parser as training_parser
from common.rundir.names import CONFIG_FILE, LAUNCH_LOG, SUMMARY_FILE

from .jobs import (Env, JobFailed, add_np, add_places, add_timeout, parser, refuse, run_cli, run_job,
                   run_jobs_together, schedule)
from .machine import Record, cores, figure_title, publish

#: label -> the launcher its runs are started with: the first the registry has for it (common.launch)
BACKENDS: dict[str, str] = {}
for _launcher in launch.host_launchers():
    BACKENDS.setdefault(_launcher.label, _launcher.name)
#: --baselines name -> (the label of its runs, the bare loop's --data-path, the result's key for its loop ratio)
BARE = {"bare": ("bare-ddp", "seed", "loop_ratio"), "bare-batched": ("bare-ddp-batched", "batched",
                                                                     "loop_ratio_batched")}
BARE_BY_LABEL = {label: data_path for label, data_path, _ in BARE.values()}
BASELINES = (*BARE, "independent")
#: options of a run the benchmark sets itself
OWNED = ("--run-dir", "--model", "--dataset", "--image-size", "--batch-size", "--max-steps", "--epochs",
         "--synthetic-samples")
VAL_FRACTION = 0.2  # common.inputs.data's train/validation split


def children_cpu_s() -> float:
    """CPU seconds of every finished child process: around one job at a time, that job's (load disturbs it less)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Case:
    """One setting to measure: a model at an image size, plus the swept knob's value (if any)."""

    model: str
    image_size: int
    steps: int  # optimizer steps per run, the first not timed
    knob: str | None = None
    value: str | None = None
    train_args: list[str] = field(default_factory=list)
    env: Env = field(default_factory=dict)  # None: removed from the job's environment

    @property
    def is_reference(self) -> bool:
        """The case the bare loops are measured in: no knob set, or a value that sets nothing (auto, a flag's off)."""
        return self.knob is None or (not self.train_args and all(value is None for value in self.env.values()))

    @property
    def name(self) -> str:
        return self.model + (f" {self.knob}={self.value}" if self.knob else "")

    @property
    def slug(self) -> str:
        return self.model + (f"-{self.knob}-{self.value}" if self.knob else "")


def per_model(what: str, example: str, least: int) -> Callable[[str], dict[str, int]]:
    """A parser of one number for every model ('64') or one per model ('convnet=32,resnet18=224') -> {model or '*':
    number}, each at least `least`."""
    def parse(text: str) -> dict[str, int]:
        try:
            out = {(part.split("=")[0].strip() if "=" in part else "*"): int(part.split("=")[-1])
                   for part in text.split(",") if part.strip()}
        except ValueError:
            raise ArgumentTypeError(f"{text!r}: write {what} for every model or model=N pairs ({example})") from None
        if not out or min(out.values()) < least:
            raise ArgumentTypeError(f"{text!r}: {what} must be >= {least}")
        return out
    return parse


parse_image_sizes = per_model("an image size", "convnet=32,resnet18=224", 1)
#: a fast model takes more steps than a slow one, so that both runs time seconds (the first step is not timed)
parse_steps = per_model("a step count", "convnet=150,resnet18=12", 2)


def for_model(numbers: dict[str, int], model: str) -> int | None:
    """A model's number from a per-model option: its own, or the one for every model."""
    return numbers.get(model, numbers.get("*"))


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """'bucket-mb=4,25' -> ('bucket-mb', ['4', '25'])."""
    knob, _, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not knob.strip("- ") or not items:
        raise ArgumentTypeError(f"--sweep {text!r}: write KNOB=v1,v2, e.g. bucket-mb=4,25")
    return knob.strip().lstrip("-"), items


def knob_args(knob: str, value: str) -> tuple[list[str], Env]:
    """Training options and environment that set `knob` to `value` (auto: unset, the variable removed); ValueError
    naming the fix when the training options have no such knob."""
    if knob[0].isupper():
        return [], {knob: None if value == "auto" else value}
    actions = training_parser("train", "")._option_string_actions
    if f"--{knob}" not in actions:
        known = sorted(o[2:] for o in actions if o.startswith("--") and o != "--help")
        raise ValueError(f"--sweep {knob}: the training options have no --{knob}; choose from {', '.join(known)}")
    if value == "auto":
        return [], {}
    if actions[f"--{knob}"].nargs != 0:
        return [f"--{knob}", value], {}
    flag = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}
    if value.lower() not in flag:
        raise ValueError(f"--sweep {knob}: --{knob} is a flag; sweep it as {knob}=off,on")
    return ([f"--{knob}"] if flag[value.lower()] else []), {}


def build_cli() -> ArgumentParser:
    p = parser("throughput", __doc__)
    add_np(p, [1, 2, 4], "world sizes, e.g. 1,2,4", dest="world_sizes")
    p.add_argument("--backends", default="ddp,horovod-gloo", help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--models", default="convnet,resnet18", help="comma-separated models")
    p.add_argument("--dataset", choices=("synthetic", "digits"), default="synthetic",
                   help="synthetic (any --image-size) or digits (8x8 images, in memory: the data-wait case)")
    p.add_argument("--image-size", type=parse_image_sizes, default=None,
                   help="synthetic image size: one for all (64) or per model (default convnet=32,resnet18=224)")
    p.add_argument("--batch-size", type=int, default=16, help="per-rank batch (fixed across world sizes)")
    p.add_argument("--steps", type=parse_steps, default=parse_steps("12"),
                   help="optimizer steps per run (the first not timed): one for all (12) or per model")
    p.add_argument("--repeats", type=int, default=3, help="runs of every cell, interleaved; median and spread")
    p.add_argument("--baselines", default=",".join(BASELINES),
                   help="reference runs: bare (benchmarks/bare_ddp.py, per-sample DataLoader), bare-batched (the same "
                        "loop on our batched data path), independent (no exchange), or none")
    p.add_argument("--sweep", type=parse_sweep, action="append", default=[], metavar="KNOB=v1,v2",
                   help="measure again for each value of a training option or environment variable (auto: unset)")
    add_places(p, "runs/bench")
    add_timeout(p, 1800)
    return p


def cases_of(args: Namespace, models: list[str], extra: list[str]) -> list[Case]:
    """Every case to measure; ValueError naming the fix when one cannot run."""
    if args.dataset == "digits":
        from common.inputs.models import MIN_IMAGE_SIZE

        if args.image_size is not None:
            raise ValueError("--image-size is for synthetic data; the digits are 8x8 images")
        steps_per_epoch, side = digits_epoch(args.batch_size, max(args.world_sizes))
        too_big = [m for m in models if MIN_IMAGE_SIZE.get(m, 1) > side]
        if too_big:
            raise ValueError(f"--models {','.join(too_big)} needs larger images than the digits' {side}x{side}; "
                             "use e.g. --models convnet,mlp")
        longest = max(for_model(args.steps, m) or 0 for m in models)
        if longest > steps_per_epoch:
            raise ValueError(f"--steps {longest} is more than the {steps_per_epoch} steps of one digits epoch at world "
                             f"size {max(args.world_sizes)} and batch {args.batch_size}; lower --steps or --batch-size")
    sizes = {"*": side} if args.dataset == "digits" else args.image_size or parse_image_sizes("convnet=32,resnet18=224")
    cases: list[Case] = []
    for model in models:
        size, steps = for_model(sizes, model), for_model(args.steps, model)
        if size is None or steps is None:
            what = "--image-size" if size is None else "--steps"
            raise ValueError(f"no {what} for {model}; add {model}=N or give one for all")
        swept = [Case(model, size, steps, knob, value, *knob_args(knob, value))
                 for knob, values in args.sweep for value in values]
        # A value that sets nothing (auto, a flag's off) is the case with no knob: measured once, by its name.
        cases += ([] if any(c.is_reference for c in swept) else [Case(model, size, steps)]) + swept
    for case in cases:  # every training option checked once, here, by the training parser itself
        training_parser("throughput", "").parse_args(base_args(case, args, 1, Path("x")) + case.train_args + extra)
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; exit 0 when every run succeeded, 1 when some failed (the rest is reported), 2 on bad input."""
    raw = list(sys.argv[1:] if argv is None else argv)
    cut = raw.index("--") if "--" in raw else len(raw)
    args, extra = build_cli().parse_args(raw[:cut]), raw[cut + 1:]
    backends, models = [b for b in args.backends.split(",") if b], [m for m in args.models.split(",") if m]
    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
    if not backends or set(backends) - set(BACKENDS):
        return refuse("throughput", f"--backends {args.backends!r}: choose from {', '.join(BACKENDS)}")
    if set(baselines) - set(BASELINES):
        return refuse("throughput", f"--baselines {args.baselines!r}: choose from {', '.join(BASELINES)} or none")
    if min(args.repeats, args.batch_size) < 1 or len(args.sweep) > 1:
        return refuse("throughput", "--repeats and --batch-size must be >= 1, and one --sweep at a time")
    clash = [a for a in extra if a.split("=")[0] in OWNED]
    if clash:
        return refuse("throughput", f"{', '.join(clash)} after -- is set by the benchmark; use its own options")
    try:
        cases = cases_of(args, models, extra)
    except ValueError as exc:
        return refuse("throughput", str(exc))
    record = Record("throughput", raw)
    bench = Bench(args, extra)
    bench.measure(cases, backends, baselines)
    report = {**record.header(), "cases": bench.cases, "failures": bench.failures,
              "settings": {"world_sizes": args.world_sizes, "backends": backends, "batch_size": args.batch_size,
                           "steps": {case.model: case.steps for case in cases}, "repeats": args.repeats,
                           "extra_train_args": extra, "dataset": args.dataset}}
    report["plot"] = plot(report, args.out)
    return publish(report, args.out / "throughput.json")


def digits_epoch(batch_size: int, world_size: int) -> tuple[int, int]:
    """(steps of one epoch per rank, image side) of the digits, from the loader training builds."""
    from common.config import Config
    from common.inputs.data import make_loaders, open_datasets

    config = Config(dataset="digits", batch_size=batch_size)
    train, val, info = open_datasets(config)
    return len(make_loaders(config, train, val, rank=0, world_size=world_size, pin_memory=False)[0]), info.image_size


def base_args(case: Case, args: Namespace, world_size: int, run_dir: Path) -> list[str]:
    """Training options of one run: data enough that every rank, at the largest world size, takes all its steps
    within one epoch (no epoch boundary inside the timing; cases_of checks that the digits are)."""
    data = ["--dataset", "digits"]
    if args.dataset != "digits":
        samples = math.ceil((case.steps + 1) * args.batch_size * max(args.world_sizes) / (1 - VAL_FRACTION)) + 1
        data = ["--dataset", "synthetic", "--image-size", str(case.image_size), "--synthetic-samples", str(samples)]
    return ["--model", case.model, *data, "--batch-size", str(args.batch_size), "--epochs", "1", "--max-steps",
            str(case.steps), "--run-dir", str(run_dir)]


class Cell(NamedTuple):
    """One run to make in every repeat: a case's backend, bare loop or independent processes at a world size."""

    case: int  # index into the cases
    label: str
    world_size: int


class Bench:
    """Runs every cell of every case, repeats interleaved across all of them, and keeps the numbers."""

    def __init__(self, args: Namespace, extra: list[str]) -> None:
        self.args, self.extra = args, extra
        self.cases: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []

    def cells(self, cases: list[Case], backends: list[str], baselines: list[str]) -> list[Cell]:
        """Every run of one repeat. The bare loops run only in the reference case (they have none of the knobs)."""
        return [Cell(index, label, np) for index, case in enumerate(cases) for np in self.args.world_sizes
                for label in [*backends, *(BARE[b][0] for b in baselines if b in BARE and case.is_reference),
                              *(["independent"] if "independent" in baselines and np > 1 else [])]]

    def measure(self, cases: list[Case], backends: list[str], baselines: list[str]) -> None:
        """Run the schedule, then summarise each case from its runs."""
        runs: list[list[dict[str, Any]]] = [[] for _ in cases]
        for order, (repeat, cell) in enumerate(schedule(self.cells(cases, backends, baselines), self.args.repeats)):
            run = self.run(cases[cell.case], cell, repeat)
            if run is not None:
                runs[cell.case].append({**run, "order": order + 1})
        self.cases = [summarise(case, case_runs, backends) for case, case_runs in zip(cases, runs, strict=True)]

    def run(self, case: Case, cell: Cell, repeat: int) -> dict[str, Any] | None:
        """One cell's run: its samples/s, CPU time, time split and what it ran; None when it failed (kept)."""
        np, label = cell.world_size, cell.label
        run_dir = self.args.work / case.slug / f"{label}-{np}-r{repeat + 1}"
        train = base_args(case, self.args, np, run_dir) + case.train_args + self.extra
        dirs, logs = [run_dir], [run_dir / LAUNCH_LOG]
        if label in BACKENDS:
            cmds = [launch.get(BACKENDS[label]).command(np, train)]
        elif label in BARE_BY_LABEL:  # the base settings and the options after --, not the swept knob: it has none
            cmds = [launch.get("torchrun").command(np, ["--data-path", BARE_BY_LABEL[label], *base_args(
                case, self.args, np, run_dir), *self.extra], module="benchmarks.bare_ddp")]
        else:  # N processes alone share the cores as N ranks do, unless the options after -- set the threads
            threads = [] if "--threads" in self.extra else ["--threads", str(max(1, cores() // np))]
            dirs = [run_dir / f"p{i}" for i in range(np)]
            logs = [d.parent / f"{d.name}.log" for d in dirs]
            cmds = [[sys.executable, "-m", "ddp_train", *base_args(case, self.args, np, d), *case.train_args,
                     *self.extra, *threads] for d in dirs]
        print(f"throughput: {case.name} {label} x{np} #{repeat + 1} ...", end=" ", flush=True)
        started, cpu_before = time.monotonic(), children_cpu_s()
        try:
            if len(cmds) == 1:
                run_job(cmds[0], logs[0], self.args.timeout, env=case.env)
            else:
                run_jobs_together(cmds, logs, self.args.timeout, env=case.env)
            summaries = [json.loads((d / SUMMARY_FILE).read_text()) for d in dirs]
            config = json.loads((dirs[0] / CONFIG_FILE).read_text()) if (dirs[0] / CONFIG_FILE).exists() else {}
        except (JobFailed, OSError, ValueError) as exc:
            print("FAILED", flush=True)
            self.failures.append({"case": case.name, "label": label, "world_size": np, "repeat": repeat + 1,
                                  "command": " ".join(map(str, cmds[0])), "error": str(exc)[-2000:]})
            return None
        sps, cpu_s = sum(s["samples_per_s"] or 0.0 for s in summaries), children_cpu_s() - cpu_before
        first = summaries[0]
        print(f"{sps:.1f} samples/s ({time.monotonic() - started:.0f} s, {cpu_s:.0f} CPU s)", flush=True)
        # N processes alone: each one's own figure too, since N ranks in step go at the pace of the slowest.
        each = {"process_samples_per_s": [s["samples_per_s"] for s in summaries]} if len(summaries) > 1 else {}
        return {"label": label, "world_size": np, "repeat": repeat + 1, "samples_per_s": sps, **each,
                # the intra-op threads per rank: the bare loop's summary, the training loop's config.json
                "threads": first.get("threads", config.get("threads")), "job_cpu_s": cpu_s,
                "job_wall_s": time.monotonic() - started, "time_split": first.get("time_split"),
                "steps": first.get("steps"), "run_dirs": [str(d) for d in dirs],
                "command": " ".join(map(str, cmds[0])), "backend_options": first.get("backend_options")}


def summarise(case: Case, runs: list[dict[str, Any]], backends: list[str]) -> dict[str, Any]:
    """Median/min/max per label and world size, then scaling, exchange overhead, the loop ratios, and the time
    split of the repeat at the median (so that it describes the run the samples/s stands for)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: (r["label"], r["world_size"])):
        cells.setdefault(f"{r['label']}@{r['world_size']}", []).append(r)
    throughput = {key: {**stats.spread([r["samples_per_s"] for r in cell]),
                        "job_cpu_s": statistics.median(r["job_cpu_s"] for r in cell)} for key, cell in cells.items()}
    med = {key: cell["median"] for key, cell in throughput.items()}
    sizes = sorted({r["world_size"] for r in runs})
    overhead = {label: {str(n): 1 - med[f"{label}@{n}"] / med[f"independent@{n}"] for n in sizes
                        if n > 1 and med.get(f"independent@{n}") and med.get(f"{label}@{n}")}
                for label in [*backends, *(bare for bare, _, _ in BARE.values())]}
    ratios = {key: {str(n): med[f"{label}@{n}"] / med[f"ddp@{n}"] for n in sizes
                    if med.get(f"ddp@{n}") and med.get(f"{label}@{n}")} for label, _, key in BARE.values()}
    splits = {key: middle["time_split"] for key, cell in cells.items()
              for middle in [stats.median_item([r for r in cell if r["time_split"]], key=lambda r: r["samples_per_s"])]
              if middle}
    return {"name": case.name, "model": case.model, "image_size": case.image_size, "steps": case.steps,
            "knob": case.knob, "value": case.value, "train_args": case.train_args, "env": case.env, "runs": runs,
            "throughput": throughput, "time_split": splits, **ratios,
            "scaling_efficiency": {label: {str(n): e for n, e in points.items()}
                                   for label, points in stats.scaling_efficiency(throughput).items()},
            "exchange_overhead": {k: v for k, v in overhead.items() if v}}


def plot(report: dict[str, Any], out: Path) -> str:
    """throughput.png: per case, samples/s against world size (the references dashed) and scaling efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.compare import speed_plots

    cases = report["cases"] or [{"name": "nothing measured", "throughput": {}, "scaling_efficiency": {}}]
    fig, axes = plt.subplots(len(cases), 2, figsize=(11, 3.8 * len(cases)), squeeze=False)
    for (ax_t, ax_s), case in zip(axes, cases, strict=True):
        speed_plots.draw_throughput(ax_t, case["throughput"], ideal=False,
                                    references=[*BARE_BY_LABEL, "independent"])
        speed_plots.draw_scaling(ax_s, case["scaling_efficiency"])
        ax_t.set_title(f"{case['name']}: throughput")
        ax_s.set_title(f"{case['name']}: scaling efficiency")
    fig.suptitle(figure_title(report), fontsize=9)
    return speed_plots.save(fig, out / "throughput.png", dpi=100)


if __name__ == "__main__":
    sys.exit(run_cli(main, "throughput"))
