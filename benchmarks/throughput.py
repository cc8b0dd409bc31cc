"""Training throughput per backend and world size, through the real entry points and launchers.

    python -m benchmarks.throughput --np 1,2 --models convnet,resnet18 --out benchmarks/results
    python -m benchmarks.throughput --np 2 --models resnet18 --sweep bucket-mb=4,25 -- --amp bf16
    python -m benchmarks.throughput --np 2 --backends horovod-gloo --sweep HOROVOD_CYCLE_TIME=auto,1,5
    python -m benchmarks.throughput --np 1,2 --models convnet --dataset digits --steps 40

Each run is `python -m ddp_train` under torchrun or `python -m hvd_train` under horovodrun on
synthetic data (or the digits) at a fixed per-rank batch; its samples/s is read from summary.json
(the first step is excluded), and its time split (data wait / compute / exposed communication)
from the same file. Every run of every case and sweep value is made once per repeat, every other repeat in
the opposite order (A B, B A), so that the machine's drift over minutes falls on every setting alike.
Reported per model and setting, median and spread over --repeats:

- scaling efficiency: throughput(N) / (N x throughput(1)), each backend against its own one process;
- exchange overhead: 1 - throughput(N) / throughput of N independent world-size-1 processes started
  together, each with the threads of one rank (the same per-rank work and core sharing, no gradient
  exchange), so what remains is what exchanging gradients costs;
- loop ratios: our DDP loop's step time / a bare DDP loop's (benchmarks/bare_ddp.py) at the same
  world size, against two bare loops: the seed-style one (a per-sample DataLoader, what a user would
  write) and one on our batched data path (common.inputs.data.make_loaders), which isolates what the loop's
  bookkeeping (logging, meters, checkpoints, stop checks) costs; 1.00 means nothing.

--sweep KNOB=v1,v2 repeats the matrix for each value: a lower-case KNOB is a training option
(`--KNOB v`; on/off for flags such as channels-last), an upper-case one an environment variable of
the job (e.g. HOROVOD_CYCLE_TIME). The value `auto` leaves the knob unset (the variable is removed
from the job's environment even when this shell sets it), so the program makes its own choice; it
takes the place of the run with no knob set. Options after `--` go to every training run.
Writes DIR/throughput.json and DIR/throughput.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from common import launch
from common.compare import stats, tables
from common.config import build_parser as training_parser
from common.errors import print_error
from common.rundir.names import CONFIG_FILE, LAUNCH_LOG, SUMMARY_FILE

from .jobs import (add_np, add_places, add_timeout, JobFailed, children_cpu_s, launcher_by_label, run_cli, run_job,
                   run_jobs_together, worker_command)
from .machine import Record, cores, figure_title, load_note, write_json

#: label -> the launcher its runs are started with (common.launch)
BACKENDS = launcher_by_label()


class BareLoop(NamedTuple):
    """A bare DDP loop measured as a reference (benchmarks/bare_ddp.py)."""

    label: str  # the label of its runs
    data_path: str  # its --data-path
    ratio: str  # the result's key for our loop's step time / this loop's


#: --baselines name -> the bare DDP loop it runs
BARE = {"bare": BareLoop("bare-ddp", "seed", "loop_ratio"),
        "bare-batched": BareLoop("bare-ddp-batched", "batched", "loop_ratio_batched")}
BARE_BY_LABEL = {bare.label: bare for bare in BARE.values()}
BASELINES = (*BARE, "independent")
#: a sweep value that leaves the knob unset
AUTO = "auto"
VAL_FRACTION = 0.2  # common.inputs.data's train/validation split
DATASETS = ("synthetic", "digits")


def sets_nothing(train_args: List[str], env: Dict[str, Optional[str]]) -> bool:
    """A swept value that changes no option and sets no variable (auto, or a flag's off): its runs are those
    of the case with no knob."""
    return not train_args and all(value is None for value in env.values())


@dataclass
class Case:
    """One setting to measure: a model at an image size, plus the swept knob's value (if any)."""

    model: str
    image_size: int
    steps: int  # optimizer steps per run, the first not timed
    knob: Optional[str] = None
    value: Optional[str] = None
    train_args: List[str] = field(default_factory=list)
    env: Dict[str, Optional[str]] = field(default_factory=dict)  # None: removed from the job's environment

    @property
    def is_reference(self) -> bool:
        """The case the bare loops are measured in: no knob set, or a value that sets nothing."""
        return self.knob is None or sets_nothing(self.train_args, self.env)

    @property
    def name(self) -> str:
        return self.model + (f" {self.knob}={self.value}" if self.knob else "")

    @property
    def slug(self) -> str:
        return self.model + (f"-{self.knob}-{self.value}" if self.knob else "")


def per_model(what: str, example: str, least: int) -> Callable[[str], Dict[str, int]]:
    """A parser of one number for every model ('64') or one per model ('convnet=32,resnet18=224') ->
    {model or '*': number}, each at least `least`."""

    def parse(text: str) -> Dict[str, int]:
        out = {}
        try:
            for part in text.split(","):
                if "=" in part:
                    model, number = part.split("=", 1)
                    out[model.strip()] = int(number)
                elif part.strip():
                    out["*"] = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: write {what} for every model or model=N pairs ({example})")
        if not out or min(out.values()) < least:
            raise argparse.ArgumentTypeError(f"{text!r}: {what} must be >= {least}")
        return out

    return parse


#: --image-size: '64', or per model
parse_image_sizes = per_model("an image size", "convnet=32,resnet18=224", 1)
#: --steps: '12', or per model, so that a fast model's runs time as long as a slow one's (the first step is not timed)
parse_steps = per_model("a step count", "convnet=150,resnet18=12", 2)


def for_model(numbers: Dict[str, int], model: str) -> Optional[int]:
    """A model's number from a per-model option: its own, or the one for every model."""
    return numbers.get(model, numbers.get("*"))


def parse_sweep(text: str) -> Tuple[str, List[str]]:
    """'bucket-mb=4,25' -> ('bucket-mb', ['4', '25'])."""
    knob, _, values = text.partition("=")
    knob = knob.strip().lstrip("-")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not knob or not items:
        raise argparse.ArgumentTypeError(f"--sweep {text!r}: write KNOB=v1,v2, e.g. bucket-mb=4,25")
    return knob, items


def knob_args(knob: str, value: str) -> Tuple[List[str], Dict[str, Optional[str]]]:
    """Training options and environment that set `knob` to `value` (auto: unset, the variable removed);
    ValueError naming the fix when the training options have no such knob."""
    if knob[0].isupper():
        return [], {knob: None if value == AUTO else value}
    actions = training_parser("train", "")._option_string_actions
    action = actions.get(f"--{knob}")
    if action is None:
        known = sorted(o[2:] for o in actions if o.startswith("--") and o != "--help")
        raise ValueError(f"--sweep {knob}: the training options have no --{knob}; choose from {', '.join(known)}")
    if value == AUTO:
        return [], {}
    if action.nargs == 0:  # a flag such as --channels-last
        if value.lower() in ("on", "true", "1", "yes"):
            return [f"--{knob}"], {}
        if value.lower() in ("off", "false", "0", "no"):
            return [], {}
        raise ValueError(f"--sweep {knob}: --{knob} is a flag; sweep it as {knob}=off,on")
    return [f"--{knob}", value], {}


def build_cli() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, [1, 2, 4], "world sizes, e.g. 1,2,4", dest="world_sizes")
    p.add_argument("--backends", default="ddp,horovod-gloo", help=f"comma-separated, from {', '.join(BACKENDS)}")
    p.add_argument("--models", default="convnet,resnet18", help="comma-separated models")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic",
                   help="synthetic (any --image-size) or digits (8x8 images, in memory: the data-wait case)")
    p.add_argument("--image-size", type=parse_image_sizes, default=None,
                   help="synthetic image size: one for all (64) or per model (default convnet=32,resnet18=224)")
    p.add_argument("--batch-size", type=int, default=16, help="per-rank batch (fixed across world sizes)")
    p.add_argument("--steps", type=parse_steps, default=parse_steps("12"),
                   help="optimizer steps per run (the first is not timed): one for all (12) or per model "
                        "(convnet=150,resnet18=12)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of every cell; median and spread. Repeats are interleaved across every case and sweep "
                        "value, every other one backwards")
    p.add_argument("--baselines", default=",".join(BASELINES),
                   help="reference runs: bare (benchmarks/bare_ddp.py, per-sample DataLoader as a user writes it), "
                        "bare-batched (the same loop on our batched data path), independent (no exchange), or none")
    p.add_argument("--sweep", type=parse_sweep, action="append", default=[], metavar="KNOB=v1,v2",
                   help="measure again for each value of a training option or environment variable (auto: unset)")
    add_places(p, "runs/bench")
    add_timeout(p, 1800)
    return p


def _fail(message: str) -> int:
    print_error("throughput", message, ranked=False)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure; exit 0 when every run succeeded, 1 when some failed (the rest is reported), 2 on bad input."""
    raw = list(sys.argv[1:] if argv is None else argv)
    argv, extra = raw, []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = build_cli().parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    models = [m for m in args.models.split(",") if m]
    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
    if not backends or any(b not in BACKENDS for b in backends):
        return _fail(f"--backends {args.backends!r}: choose from {', '.join(BACKENDS)}")
    if any(b not in BASELINES for b in baselines):
        return _fail(f"--baselines {args.baselines!r}: choose from {', '.join(BASELINES)} or none")
    if min(args.repeats, args.batch_size) < 1:
        return _fail("--repeats and --batch-size must be >= 1")
    if len(args.sweep) > 1:
        return _fail("one --sweep at a time (each value is measured against the same baseline)")
    owned = ("--run-dir", "--model", "--dataset", "--image-size", "--batch-size", "--max-steps", "--epochs",
             "--synthetic-samples")
    clash = [a for a in extra if a.split("=")[0] in owned]
    if clash:
        return _fail(f"{', '.join(clash)} after -- is set by the benchmark; use its own options instead")

    if args.dataset == "digits":
        if args.image_size is not None:
            return _fail("--image-size is for synthetic data; the digits are 8x8 images")
        from common.inputs.models import MIN_IMAGE_SIZE

        steps_per_epoch, side = digits_epoch(args.batch_size, max(args.world_sizes))
        sizes = {"*": side}
        too_big = [m for m in models if MIN_IMAGE_SIZE.get(m, 1) > side]
        if too_big:
            return _fail(f"--models {','.join(too_big)} needs larger images than the digits' {side}x{side}; "
                         "use e.g. --models convnet,mlp")
        longest = max(for_model(args.steps, m) or 0 for m in models)
        if longest > steps_per_epoch:
            return _fail(f"--steps {longest} is more than the {steps_per_epoch} steps of one digits epoch at "
                         f"world size {max(args.world_sizes)} and batch {args.batch_size}; lower --steps or --batch-size")
    else:
        sizes = args.image_size or parse_image_sizes("convnet=32,resnet18=224")
    cases: List[Case] = []
    for model in models:
        size = sizes.get(model, sizes.get("*"))
        if size is None:
            return _fail(f"no --image-size for {model}; add {model}=N or give one size for all")
        steps = for_model(args.steps, model)
        if steps is None:
            return _fail(f"no --steps for {model}; add {model}=N or give one step count for all")
        swept = []
        for knob, values in args.sweep:
            for value in values:
                try:
                    k_args, k_env = knob_args(knob, value)
                except ValueError as exc:
                    return _fail(str(exc))
                swept.append(Case(model, size, steps, knob, value, k_args, k_env))
        # A value that sets nothing (auto, a flag's off) is the case with no knob: measured once, by its name.
        if not any(sets_nothing(case.train_args, case.env) for case in swept):
            cases.append(Case(model, size, steps))
        cases.extend(swept)
    # Check every training option once, here, with the training parser itself.
    for case in cases:
        training_parser("throughput", "").parse_args(base_args(case, args, 1, Path("x")) + case.train_args + extra)

    record = Record("throughput", raw)
    bench = Bench(args, extra)
    bench.measure(cases, backends, baselines)
    report = {**record.header(),
              "settings": {"world_sizes": args.world_sizes, "backends": backends, "batch_size": args.batch_size,
                           "steps": {case.model: case.steps for case in cases}, "repeats": args.repeats, "extra_train_args": extra,
                           "dataset": args.dataset},
              "definitions": DEFINITIONS, "cases": bench.cases, "failures": bench.failures}
    report["plot"] = plot(report, args.out)
    write_json(args.out / "throughput.json", report)
    print_summary(report)
    print(f"throughput: wrote {(args.out / 'throughput.json').resolve()} and {(args.out / report['plot']).resolve()}")
    return 1 if bench.failures else 0


DEFINITIONS = {
    "samples_per_s": "summary.json samples_per_s over all ranks, first step excluded; median over repeats",
    "scaling_efficiency": "throughput(N) / (N x throughput(1)) of the same backend",
    "exchange_overhead": "1 - throughput(N) / sum of samples/s of N independent world-size-1 ddp_train "
                         "processes started together with the threads of one rank each",
    "process_samples_per_s": "an independent run's processes, each one's samples/s (their sum is the run's)",
    "loop_ratio": "our DDP loop's step time / the seed-style bare DDP loop's (per-sample DataLoader) at the same "
                  "world size (= bare-ddp samples/s / ddp samples/s)",
    "loop_ratio_batched": "our DDP loop's step time / the bare DDP loop's on our batched data path at the same "
                          "world size (= bare-ddp-batched samples/s / ddp samples/s)",
    "job_cpu_s": "CPU seconds of the whole job, every process (start-up and evaluation included); median",
    "order": "a run's place in the schedule: every cell of every case once per repeat, every other repeat backwards",
    "time_split": "summary.json time_split (comm, step and data wait per step) of the median repeat by samples/s",
}


def digits_epoch(batch_size: int, world_size: int) -> Tuple[int, int]:
    """(steps of one epoch per rank, image side) of the digits, from the loader training builds."""
    from common.config import Config
    from common.inputs.data import make_loaders, open_datasets

    config = Config(dataset="digits", batch_size=batch_size)
    train, val, info = open_datasets(config)
    train_loader, _, _ = make_loaders(config, train, val, rank=0, world_size=world_size, pin_memory=False)
    return len(train_loader), info.image_size


def base_args(case: Case, args, world_size: int, run_dir: Path) -> List[str]:
    """Training options of one run: data large enough that every rank, at the largest world size,
    takes all its steps within one epoch (no epoch boundary inside the timing); main() checks that
    the digits are."""
    if args.dataset == "digits":
        return ["--model", case.model, "--dataset", "digits", "--batch-size", str(args.batch_size), "--epochs", "1",
                "--max-steps", str(case.steps), "--run-dir", str(run_dir)]
    per_rank = (case.steps + 1) * args.batch_size
    samples = math.ceil(per_rank * max(args.world_sizes) / (1 - VAL_FRACTION)) + 1
    return ["--model", case.model, "--dataset", "synthetic", "--image-size", str(case.image_size),
            "--synthetic-samples", str(samples), "--batch-size", str(args.batch_size), "--epochs", "1",
            "--max-steps", str(case.steps), "--run-dir", str(run_dir)]


def run_threads(run_dir: Path, summary: Dict) -> Optional[int]:
    """The intra-op threads per rank a run used: the training loop's config.json, the bare loop's summary."""
    if "threads" in summary:
        return summary["threads"]
    config = run_dir / CONFIG_FILE
    return json.loads(config.read_text()).get("threads") if config.exists() else None


class Cell(NamedTuple):
    """One run to make in every repeat: a case's backend, bare loop or independent processes at a world size."""

    case: int  # index into the cases
    label: str
    world_size: int


def schedule(cells: Sequence[Cell], repeats: int) -> List[Tuple[int, Cell]]:
    """(repeat, cell) in the order to run them: every cell of every case once, then again; every other repeat
    backwards, so that a steady drift in the machine's speed falls on every cell alike (A B, B A) instead of
    favouring whichever runs first."""
    order = []
    for repeat in range(repeats):
        order += [(repeat, cell) for cell in (cells if repeat % 2 == 0 else reversed(cells))]
    return order


class Bench:
    """Runs every cell of every case, repeats interleaved across all of them, and keeps the numbers."""

    def __init__(self, args, extra: List[str]) -> None:
        self.args, self.extra = args, extra
        self.cases: List[Dict] = []
        self.failures: List[Dict] = []

    def _train_args(self, case: Case, np: int, run_dir: Path) -> List[str]:
        return base_args(case, self.args, np, run_dir) + case.train_args + self.extra

    def cells(self, cases: List[Case], backends: List[str], baselines: List[str]) -> List[Cell]:
        """Every run of one repeat. The bare loops run only in the reference case (they have none of the knobs)."""
        out = []
        for index, case in enumerate(cases):
            for np in self.args.world_sizes:
                out += [Cell(index, label, np) for label in backends]
                if case.is_reference:
                    out += [Cell(index, BARE[b].label, np) for b in baselines if b in BARE]
                if "independent" in baselines and np > 1:
                    out.append(Cell(index, "independent", np))
        return out

    def measure(self, cases: List[Case], backends: List[str], baselines: List[str]) -> None:
        """Run the schedule, then summarise each case from its runs."""
        runs: List[List[Dict]] = [[] for _ in cases]
        for order, (repeat, cell) in enumerate(schedule(self.cells(cases, backends, baselines), self.args.repeats)):
            run = self._cell(cases[cell.case], cell, repeat)
            if run is not None:
                runs[cell.case].append({**run, "order": order + 1})
        self.cases = [summarise(case, case_runs, backends) for case, case_runs in zip(cases, runs)]

    def _cell(self, case: Case, cell: Cell, repeat: int) -> Optional[Dict]:
        args, np, label = self.args, cell.world_size, cell.label
        work = args.work / case.slug
        run_dir = work / f"{label}-{np}-r{repeat + 1}"
        if label in BACKENDS:
            cmd = launch.get(BACKENDS[label]).command(np, self._train_args(case, np, run_dir))
            return self._one(case, label, np, repeat, [cmd], [run_dir])
        if label in BARE_BY_LABEL:
            bare = BARE_BY_LABEL[label]
            # The bare loop gets the base settings and the options after -- (its threads above all), not the
            # swept knob: it has none of the tuning knobs.
            cmd = worker_command("torchrun", np, "benchmarks.bare_ddp",
                                 ["--data-path", bare.data_path, *base_args(case, args, np, run_dir), *self.extra])
            return self._one(case, label, np, repeat, [cmd], [run_dir])
        # N processes alone share the cores as the N ranks do, unless the options after -- set threads.
        threads = [] if "--threads" in self.extra else ["--threads", str(max(1, cores() // np))]
        dirs = [run_dir / f"p{i}" for i in range(np)]
        cmds = [[sys.executable, "-m", "ddp_train", *self._train_args(case, np, d), *threads] for d in dirs]
        return self._one(case, label, np, repeat, cmds, dirs)

    def _one(self, case: Case, label: str, np: int, repeat: int, cmds: List[List[str]],
             dirs: List[Path]) -> Optional[Dict]:
        name = f"{case.name} {label} x{np} #{repeat + 1}"
        print(f"throughput: {name} ...", end=" ", flush=True)
        logs = [d / LAUNCH_LOG if len(dirs) == 1 else d.parent / f"{d.name}.log" for d in dirs]
        started, cpu_before = time.monotonic(), children_cpu_s()
        try:
            if len(cmds) == 1:
                run_job(cmds[0], logs[0], self.args.timeout, env=case.env)
            else:
                run_jobs_together(cmds, logs, self.args.timeout, env=case.env)
            summaries = [json.loads((d / SUMMARY_FILE).read_text()) for d in dirs]
            threads = run_threads(dirs[0], summaries[0])
        except (JobFailed, OSError, ValueError) as exc:
            print("FAILED", flush=True)
            self.failures.append({"case": case.name, "label": label, "world_size": np, "repeat": repeat + 1,
                                  "command": " ".join(map(str, cmds[0])), "error": str(exc)[-2000:]})
            return None
        sps = sum(s["samples_per_s"] or 0.0 for s in summaries)
        cpu_s = children_cpu_s() - cpu_before
        print(f"{sps:.1f} samples/s ({time.monotonic() - started:.0f} s, {cpu_s:.0f} CPU s)", flush=True)
        first = summaries[0]
        # N processes alone: each one's own figure too, since N ranks in step go at the pace of the slowest.
        each = {"process_samples_per_s": [s["samples_per_s"] for s in summaries]} if len(summaries) > 1 else {}
        return {"label": label, "world_size": np, "repeat": repeat + 1, "samples_per_s": sps, **each,
                "threads": threads, "job_cpu_s": cpu_s, "job_wall_s": time.monotonic() - started,
                "time_split": first.get("time_split"), "steps": first.get("steps"),
                "run_dirs": [str(d) for d in dirs], "command": " ".join(map(str, cmds[0])),
                "backend_options": first.get("backend_options")}


def summarise(case: Case, runs: List[Dict], backends: List[str]) -> Dict:
    """Median/min/max per label and world size, then scaling, exchange overhead and the loop ratios."""
    throughput: Dict[str, Dict] = {}
    for key in sorted({(r["label"], r["world_size"]) for r in runs}):
        cell = [r for r in runs if (r["label"], r["world_size"]) == key]
        throughput[f"{key[0]}@{key[1]}"] = {**stats.spread([r["samples_per_s"] for r in cell]),
                                             "job_cpu_s": statistics.median(r["job_cpu_s"] for r in cell)}

    def med(label: str, np: int) -> Optional[float]:
        cell = throughput.get(f"{label}@{np}")
        return cell["median"] if cell else None

    sizes = sorted({r["world_size"] for r in runs})
    scaling = {label: {str(n): e for n, e in points.items()}
               for label, points in stats.scaling_efficiency(throughput).items()}
    overhead = {}
    for label in backends + [bare.label for bare in BARE.values()]:
        indep = {n: med("independent", n) for n in sizes if n > 1 and med("independent", n)}
        overhead[label] = {str(n): 1 - med(label, n) / v for n, v in indep.items() if med(label, n)}
    ratios = {bare.ratio: {str(n): med(bare.label, n) / med("ddp", n)
                           for n in sizes if med("ddp", n) and med(bare.label, n)} for bare in BARE.values()}
    splits = {}
    for key in throughput:
        # The repeat at the median, so the split describes the run the samples/s column stands for.
        middle = stats.median_item([r for r in runs if f"{r['label']}@{r['world_size']}" == key and r["time_split"]],
                                   key=lambda r: r["samples_per_s"])
        if middle:
            splits[key] = middle["time_split"]
    return {"name": case.name, "model": case.model, "image_size": case.image_size, "steps": case.steps,
            "knob": case.knob,
            "value": case.value, "train_args": case.train_args, "env": case.env, "runs": runs,
            "throughput": throughput, "scaling_efficiency": scaling,
            "exchange_overhead": {k: v for k, v in overhead.items() if v}, **ratios, "time_split": splits}


def print_summary(report: Dict) -> None:
    """Per case: samples/s, scaling efficiency, exchange overhead and the loop ratios per cell."""
    for case in report["cases"]:
        print(f"\n{case['name']} ({report['settings']['dataset']}, image {case['image_size']}, "
              f"per-rank batch {report['settings']['batch_size']})")
        rows = []
        for key, cell in case["throughput"].items():
            label, np = key.split("@")
            split = case["time_split"].get(key) or {}
            ratios = [case[bare.ratio].get(np) if label == "ddp" else None for bare in BARE.values()]
            rows.append([label, np, f"{cell['median']:.1f}", f"{cell['min']:.1f}-{cell['max']:.1f}",
                         tables.number(case["scaling_efficiency"].get(label, {}).get(np), ".2f", ""),
                         tables.percent(case["exchange_overhead"].get(label, {}).get(np), missing=""),
                         *(tables.number(r, ".3f", "") for r in ratios),
                         tables.number(split.get("comm_ms"), ".1f", ""), tables.number(split.get("step_ms"), ".1f", ""),
                         tables.percent(split.get("data_frac"), missing=""), f"{cell['job_cpu_s']:.0f}"])
        print(tables.text(["run", "np", "samples/s", "min-max", "scaling", "exch.ovh", "loop/seed", "loop/batched",
                           "comm ms", "step ms", "data %", "job CPU s"], rows))
    for f in report["failures"]:
        print(f"FAILED {f['case']} {f['label']} x{f['world_size']} #{f['repeat']}: {f['error'].splitlines()[0]}")
    note = load_note(report)
    if note:
        print(note)


def plot(report: Dict, out: Path) -> str:
    """throughput.png: per case, samples/s against world size (the references dashed) and scaling efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.compare import speed_plots

    cases = report["cases"] or [{"name": "nothing measured", "throughput": {}, "scaling_efficiency": {}}]
    references = [bare.label for bare in BARE.values()] + ["independent"]
    fig, axes = plt.subplots(len(cases), 2, figsize=(11, 3.8 * len(cases)), squeeze=False)
    for (ax_t, ax_s), case in zip(axes, cases):
        speed_plots.draw_throughput(ax_t, case["throughput"], ideal=False, references=references)
        speed_plots.draw_scaling(ax_s, case["scaling_efficiency"])
        ax_t.set_title(f"{case['name']}: throughput")
        ax_s.set_title(f"{case['name']}: scaling efficiency")
    fig.suptitle(figure_title(report), fontsize=9)
    return speed_plots.save(fig, out / "throughput.png", dpi=100)


if __name__ == "__main__":
    sys.exit(run_cli(main, "throughput"))
