"""The comparison's verdicts, calibrated on a corpus of pairs whose answer is known.

Same-training pairs differ only by rounding: DDP against Horovod (Gloo and MPI) at 3 and 4 ranks, other
thread counts, several seeds, SGD and Adam, the ConvNet, PyTorch's MNIST net with dropout and a small
ResNet-18, including seeds where training branches. Real-difference pairs change one thing on the Horovod side:
the learning rate by 5%, the momentum, a weight decay, an lr schedule that changes only at half of training,
fp16 compression, the sample order, the batch split at the same global batch, and more. Each pair is judged
by the comparison's own code (common.compare.analysis.parity) against noise floors of 1 to --max-floor
disturbed runs of its setting, at several margins: a same-training pair called "beyond" is a false alarm, a
real difference not called "beyond" from its first differing step a miss. That step is known exactly: the
same change made to DDP alone (its twin run), against undisturbed DDP, differs first there.

    python -m benchmarks.verdicts                    # the whole corpus (about 100 runs: 1 to 2 hours on 2 cores)
    python -m benchmarks.verdicts --quick            # two pairs at a tiny size: checks the pipeline

Runs are kept in --work and reused when the script is run again and no file the training depends on has changed
since the clean revision that made them (a change to how pairs are judged re-judges the same runs; a run made by
other training code is launched again). Writes DIR/verdicts.json and prints a table.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from common import launch
from common.compare import analysis, floor, trajectory
from common.compare.results import ParityResult, as_json
from common.rundir.names import CONFIG_FILE, LAUNCH_LOG, SUMMARY_FILE
from common.rundir.reader import read_run

from . import stale
from .jobs import JobFailed, add_places, add_timeout, parser, run_cli, run_job
from .machine import Record

DDP = "torchrun"
GLOO, MPI = "horovodrun-gloo", "horovodrun-mpi"
#: margins the corpus is judged at, besides the comparison's default
MARGINS = (3.0, 10.0, 30.0)


@dataclass(frozen=True)
class Setting:
    """Training options and a world size that pairs and their noise floor share."""

    name: str
    np: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """A pair: DDP on `setting` (plus `a_extra`) against `launcher` on `setting` plus `extra`."""

    name: str
    kind: str  # "same" (rounding apart) or "real" (one real difference)
    setting: Setting
    launcher: str
    extra: tuple[str, ...] = ()
    a_extra: tuple[str, ...] = ()
    what: str = ""


DEFAULT = Setting("convnet, SGD, 3 ranks", 3, ())
DEFAULT4 = Setting("convnet, SGD, 4 ranks", 4, ())
SEED7 = Setting("convnet, SGD, seed 7, 3 ranks", 3, ("--seed", "7"))
SEED123 = Setting("convnet, SGD, seed 123, 3 ranks", 3, ("--seed", "123"))
ADAM = Setting("convnet, Adam, 3 ranks", 3, ("--optimizer", "adam", "--lr", "0.001"))
ADAM4 = Setting("convnet, Adam, 4 ranks", 4, ("--optimizer", "adam", "--lr", "0.001"))
ADAM_ISSUE = Setting("convnet, Adam, batch 12, seed 31, 2 ranks", 2,
                     ("--optimizer", "adam", "--lr", "0.001", "--batch-size", "12", "--seed", "31", "--epochs", "1"))
DROPOUT = Setting("mnist_net (dropout), SGD, 3 ranks", 3, ("--model", "mnist_net", "--lr", "0.02", "--epochs", "5"))
DROPOUT_ADAM = Setting("mnist_net (dropout), Adam, 3 ranks", 3,
                       ("--model", "mnist_net", "--optimizer", "adam", "--lr", "0.001", "--epochs", "5"))
RESNET = ("--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--batch-size", "8",
          "--max-steps", "30", "--threads", "1")
RESNET_ADAM = Setting("resnet18 32x32, Adam, 3 ranks", 3, RESNET + ("--optimizer", "adam", "--lr", "0.001",
                                                                    "--weight-decay", "0.01"))
RESNET_SGD = Setting("resnet18 32x32, SGD, 4 ranks", 4, RESNET + ("--lr", "0.02"))
#: both backends compress their gradients to float16 (the floor's runs round there too) or autocast to bfloat16
FP16 = Setting("convnet, SGD, fp16 compression, 3 ranks", 3, ("--compression", "fp16"))
BF16 = Setting("convnet, SGD, bf16 autocast, 3 ranks", 3, ("--amp", "bf16"))

CORPUS = [
    Case("ddp-gloo", "same", DEFAULT, GLOO, what="DDP vs Horovod/Gloo"),
    Case("ddp-mpi", "same", DEFAULT, MPI, what="DDP vs Horovod/MPI"),
    Case("ddp-predivide", "same", DEFAULT, GLOO, ("--predivide",), what="DDP vs Horovod/Gloo dividing before the sum"),
    Case("threads", "same", DEFAULT, GLOO, ("--threads", "2"), ("--threads", "1"),
         what="DDP 1 thread vs Horovod/Gloo 2 threads per rank"),
    Case("ddp-gloo-4", "same", DEFAULT4, GLOO, what="DDP vs Horovod/Gloo at 4 ranks"),
    Case("seed7", "same", SEED7, GLOO, what="DDP vs Horovod/Gloo, seed 7"),
    Case("seed123", "same", SEED123, MPI, what="DDP vs Horovod/MPI, seed 123"),
    Case("adam", "same", ADAM, GLOO, what="DDP vs Horovod/Gloo under Adam"),
    Case("adam-4", "same", ADAM4, MPI, what="DDP vs Horovod/MPI under Adam at 4 ranks"),
    Case("dropout", "same", DROPOUT, GLOO, what="DDP vs Horovod/Gloo, dropout"),
    Case("dropout-adam", "same", DROPOUT_ADAM, MPI, what="DDP vs Horovod/MPI, dropout, Adam"),
    Case("resnet-adam", "same", RESNET_ADAM, GLOO, what="DDP vs Horovod/Gloo, ResNet-18, Adam"),
    Case("resnet-sgd-4", "same", RESNET_SGD, GLOO, what="DDP vs Horovod/Gloo, ResNet-18, SGD, 4 ranks"),
    Case("fp16-both", "same", FP16, GLOO, what="DDP vs Horovod/Gloo, both compressing to fp16"),
    Case("fp16-both-mpi", "same", FP16, MPI, what="DDP vs Horovod/MPI, both compressing to fp16"),
    Case("bf16-both", "same", BF16, GLOO, what="DDP vs Horovod/Gloo, both under bf16 autocast"),
    Case("lr+5%", "real", DEFAULT, GLOO, ("--lr", "0.0525"), what="learning rate 5% higher"),
    Case("lr-5%", "real", DEFAULT, GLOO, ("--lr", "0.0475"), what="learning rate 5% lower"),
    Case("momentum", "real", DEFAULT, GLOO, ("--momentum", "0.85"), what="momentum 0.85 instead of 0.9"),
    Case("weight-decay", "real", DEFAULT, GLOO, ("--weight-decay", "5e-4"), what="weight decay 5e-4 instead of 0"),
    Case("schedule", "real", DEFAULT, GLOO, ("--lr-schedule", "step"),
         what="lr x0.1 from half of training (step schedule)"),
    Case("fp16", "real", DEFAULT, GLOO, ("--compression", "fp16"), what="fp16 compression of the gradients"),
    Case("sample-order", "real", DEFAULT, GLOO, ("--dataset", "benchmarks.corpus_data:reordered"),
         what="the same samples in another order"),
    Case("batch-split", "real", DEFAULT, GLOO, ("--batch-size", "16", "--accumulate", "2"),
         what="micro-batches of 16, twice, instead of 32 (same global batch; BatchNorm over 16)"),
    Case("seed", "real", DEFAULT, GLOO, ("--seed", "43"), what="another seed (initial weights, sample order)"),
    Case("bf16", "real", DEFAULT, GLOO, ("--amp", "bf16"), what="bf16 autocast"),
    Case("clip", "real", DEFAULT, GLOO, ("--clip-grad-norm", "0.5"), what="gradients clipped to norm 0.5"),
    Case("adam-lr", "real", ADAM_ISSUE, DDP, ("--lr", "0.0012"), what="Adam, lr 0.0012 instead of 0.001"),
    Case("adam-wd", "real", ADAM, GLOO, ("--weight-decay", "5e-4"), what="Adam with weight decay 5e-4"),
    Case("resnet-adam-lr", "real", RESNET_ADAM, GLOO, ("--lr", "0.00105"), what="ResNet-18, Adam, lr 5% higher"),
    Case("fp16-lr+5%", "real", FP16, GLOO, ("--lr", "0.0525"), what="both fp16, learning rate 5% higher"),
    Case("fp16-weight-decay", "real", FP16, GLOO, ("--weight-decay", "5e-4"),
         what="both fp16, weight decay 5e-4 instead of 0"),
    Case("fp16-momentum", "real", FP16, GLOO, ("--momentum", "0.85"), what="both fp16, momentum 0.85 instead of 0.9"),
    Case("bf16-clip", "real", BF16, GLOO, ("--clip-grad-norm", "0.5"), what="both bf16, gradients clipped to 0.5"),
]

# One process per run: the quick corpus checks the pipeline (launches, floors, judging, the grid), not the verdicts.
QUICK_SETTING = Setting("mlp, SGD, 1 process, 6 steps", 1, ("--model", "mlp", "--max-steps", "6", "--threads", "1"))
# The real difference runs on DDP, as adam-lr does: its run is its own twin, launched once.
QUICK = [Case("ddp-gloo", "same", QUICK_SETTING, GLOO, what="DDP vs Horovod/Gloo"),
         Case("lr+5%", "real", QUICK_SETTING, DDP, ("--lr", "0.0525"), what="learning rate 5% higher, on DDP")]


def reusable(run_dir: Path) -> bool:
    """Whether a run left in --work stands for a new launch: it is complete, and it was made by a clean revision of
    the project whose training is the same as here now (no file a run's training depends on has changed since,
    benchmarks.stale.training_inputs). A run of changes not committed, or of other training code, is launched again."""
    if not (run_dir / SUMMARY_FILE).is_file():
        return False
    try:
        made_by = json.loads((run_dir / CONFIG_FILE).read_text())["versions"]["project_git"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not made_by or made_by.endswith("-dirty"):
        return False
    try:
        return not stale.changed_since(made_by, stale.training_inputs())
    except RuntimeError:  # a revision this clone does not have
        return False


class Runner:
    """Launches runs through the registered launchers, each once: a run directory in --work named by its
    launcher, world size and options is reused when this Runner made it, or when it is complete and was made by
    the same training (`reusable`)."""

    def __init__(self, work: Path, timeout_s: float) -> None:
        self.work, self.timeout_s = work, timeout_s
        self.failures: list[dict] = []
        self.made: set[Path] = set()  # this invocation's runs: the same code, whatever the checkout's state

    @property
    def launched(self) -> int:
        """How many runs this Runner launched (and completed)."""
        return len(self.made)

    def run(self, launcher: str, np: int, args: Sequence[str]) -> Path | None:
        digest = hashlib.sha256(json.dumps([launcher, np, list(args)]).encode()).hexdigest()[:12]
        run_dir = self.work / f"{launcher}-{np}-{digest}"
        if run_dir in self.made or reusable(run_dir):
            return run_dir
        cmd = launch.get(launcher).command(np, [*args, "--run-dir", str(run_dir)])
        print(f"verdicts: {' '.join(cmd)}", flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)  # what another revision left, or a run cut short
        run_dir.mkdir(parents=True)
        try:
            run_job(cmd, run_dir / LAUNCH_LOG, self.timeout_s)
            self.made.add(run_dir)
            return run_dir
        except JobFailed as exc:
            print(f"verdicts: FAILED: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            self.failures.append({"command": " ".join(cmd), "error": str(exc)[-2000:]})
            return None


def floor_runs(runner: Runner, setting: Setting, count: int) -> tuple[Path | None, list[Path]]:
    """The undisturbed DDP run of a setting and its disturbed runs, patterns 1..count."""
    base = runner.run(DDP, setting.np, setting.args)
    disturbed = [runner.run(DDP, setting.np, [*setting.args, "--perturb-ulp", "1", "--perturb-pattern", str(k)])
                 for k in range(1, count + 1)]
    return base, [d for d in disturbed if d is not None]


def correct(case: Case, pair: ParityResult, expected: int | None) -> bool:
    """Whether a verdict is right: a same-training pair not called beyond; a real difference called beyond
    from its first differing step."""
    if case.kind == "same":
        return pair.within_noise_floor is not False
    return pair.within_noise_floor is False and pair.trains_differently_from == expected


def judged(case: Case, runner: Runner, base: Path | None, disturbed: list[Path]) -> dict[str, Any] | None:
    """One pair judged against floors of its first 1..N disturbed runs at every margin, with what it is; None when
    one of its runs failed."""
    setting = case.setting
    a_dir = base if not case.a_extra else runner.run(DDP, setting.np, [*setting.args, *case.a_extra])
    b_dir = runner.run(case.launcher, setting.np, [*setting.args, *case.extra])
    twin = runner.run(DDP, setting.np, [*setting.args, *case.extra]) if case.kind == "real" else None
    if base is None or a_dir is None or b_dir is None or not disturbed or (case.kind == "real" and twin is None):
        return None
    undisturbed, a, b = read_run(base), read_run(a_dir), read_run(b_dir)
    shadows = [read_run(d) for d in disturbed]
    expected = None
    if twin is not None:  # the change alone, on DDP: where it first acts
        expected = trajectory.first_differing(trajectory.step_gaps(undisturbed.step_states(),
                                                                   read_run(twin).step_states()))
    verdicts = {}
    for k in range(1, len(shadows) + 1):
        measured = floor.measure(undisturbed, shadows[:k])
        for margin in sorted({*MARGINS, analysis.FLOOR_MARGIN}):
            pair = analysis.parity(a, b, floor=measured, margin=margin)
            verdicts[f"{k}@{margin:g}"] = {
                "verdict": pair.verdict, "within_noise_floor": pair.within_noise_floor,
                "trains_differently_from": pair.trains_differently_from,
                "first_differing_step": pair.first_differing_step,
                "largest_band_ratio": as_json(pair.largest_band_ratio),
                "departure_ratio": pair.departure.ratio if pair.departure else None,
                "branches": pair.branches, "correct": correct(case, pair, expected)}
    return {"name": case.name, "kind": case.kind, "what": case.what, "setting": setting.name, "np": setting.np,
            "a": f"{DDP} {' '.join([*setting.args, *case.a_extra])}".strip(),
            "b": f"{case.launcher} {' '.join([*setting.args, *case.extra])}".strip(),
            "expected_step": expected, "steps": undisturbed.summary.get("steps"), "judged": verdicts}


def main(argv: Sequence[str] | None = None) -> int:
    """Launch (or reuse) the corpus's runs and judge every pair; 1 when a run failed, 2 on bad input."""
    p = parser("verdicts", __doc__)
    p.add_argument("--max-floor", type=int, default=5, help="judge against floors of 1..N disturbed runs")
    p.add_argument("--quick", action="store_true", help="two pairs at a tiny size (a check of the pipeline)")
    p.add_argument("--cases", default="", help="only these pairs of the corpus, by name (comma-separated)")
    add_timeout(p, 900, "seconds before a run is stopped")
    add_places(p, "runs/bench-verdicts")
    args = p.parse_args(argv)
    corpus = QUICK if args.quick else CORPUS
    if args.cases:
        chosen = args.cases.split(",")
        unknown = sorted(set(chosen) - {c.name for c in corpus})
        if unknown:
            p.error(f"--cases: no pair named {', '.join(unknown)}; the corpus has {', '.join(c.name for c in corpus)}")
        corpus = [c for c in corpus if c.name in chosen]
    record = Record("verdicts", argv)
    runner = Runner(args.work, args.timeout)
    settings = sorted({c.setting for c in corpus}, key=lambda s: s.name)
    floors = {s: floor_runs(runner, s, args.max_floor) for s in settings}
    cases = [found for found in (judged(case, runner, *floors[case.setting]) for case in corpus) if found is not None]
    return record.publish(args.out, cases=cases, grid=summarise(cases), runs_launched=runner.launched,
                          failures=runner.failures, settings={
                              "max_floor": args.max_floor, "margins": sorted({*MARGINS, analysis.FLOOR_MARGIN}),
                              "default_margin": analysis.FLOOR_MARGIN, "default_floor_runs": floor.DEFAULT_FLOOR_RUNS,
                              "quick": args.quick})


def summarise(cases: list[dict]) -> list[dict]:
    """Per floor size and margin: false alarms (same-training pairs called beyond), misses (real differences not
    called beyond from their first step) and the cases of each."""
    keys = sorted({key for c in cases for key in c["judged"]}, key=lambda k: (int(k.split("@")[0]),
                                                                                float(k.split("@")[1])))
    out = []
    for key in keys:
        k, margin = key.split("@")
        wrong = [c for c in cases if key in c["judged"] and not c["judged"][key]["correct"]]
        out.append({"floor_runs": int(k), "margin": float(margin),
                    "same": sum(c["kind"] == "same" for c in cases), "real": sum(c["kind"] == "real" for c in cases),
                    "false_alarms": [c["name"] for c in wrong if c["kind"] == "same"],
                    "misses": [c["name"] for c in wrong if c["kind"] == "real"]})
    return out


if __name__ == "__main__":
    sys.exit(run_cli(main, "verdicts"))
