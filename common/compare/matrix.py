"""Launch a matrix of training runs through the real launchers, one at a time, with progress."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from common.rundir.names import LAUNCH_LOG, LAUNCH_RECORD, WORKING_DIR
from common.rundir.reader import DISTURBED, Run, read_run, run_name
from .. import launch
from ..config import config_argv
from ..launch import userscript
from ..launch.hosts import parse_hosts
from ..launch.remote import run_commands, shown as shown_commands
from . import ended
from .clashes import Watch, named_paths
from .failures import cause, failed_with
from .sites import ThisHost
from .workdir import LinkedFolder

EPOCH_LINE = re.compile(r"^epoch (\d+) step (\d+)/(\d+)")


#: runs that explain a gap between DDP and Horovod at 3 ranks or more: Horovod with the division before the
#: sum, as DDP does it (how much of the gap is the order of division), and Horovod without tensor fusion,
#: twice (whether Horovod is then reproducible); each names the training options it adds
EXPLAIN = {"predivide": ("--predivide",), "deterministic": ("--deterministic",)}
EXPLAIN_REPEATS = {"predivide": 1, "deterministic": 2}
#: the noise floor's runs: the first backend again with its initial weights moved by one ulp, each with its own
#: pattern of directions (common.compare.floor), at each world size where backends can differ; skipped when they
#: did not
FLOOR = DISTURBED


def floor_variant(pattern: int) -> str:
    """The variant name of the floor's run with --perturb-pattern `pattern`: perturbed2."""
    return f"{FLOOR}{pattern}"


def variant_args(variant: Optional[str]) -> List[str]:
    """The training options a variant adds."""
    if variant is None:
        return []
    if variant.startswith(FLOOR):
        return ["--perturb-ulp", "1", "--perturb-pattern", variant[len(FLOOR):]]
    return list(EXPLAIN[variant])


@dataclass
class PlannedRun:
    """One cell of the matrix: a launcher, a world size, which timing repeat it is, and the training options
    of an explaining variant."""

    launcher: launch.Launcher
    np: int
    repeat: int
    variant: Optional[str] = None
    #: run only when the cells at this world size ended with different weights (the noise floor's run)
    if_cells_differ: bool = False

    @property
    def label(self) -> str:
        return self.launcher.label + (f"+{self.variant}" if self.variant else "")

    @property
    def extra_args(self) -> List[str]:
        return variant_args(self.variant)

    @property
    def name(self) -> str:
        return run_name(self.label, self.np, self.repeat)

    @property
    def dirname(self) -> str:
        return f"{self.label}-np{self.np}-r{self.repeat + 1}"


def plan(backends: Sequence[str], world_sizes: Sequence[int], controllers: Optional[Sequence[str]],
         repeats: int, explain: Sequence[str] = ("predivide",), site: Optional[ThisHost] = None,
         floor: int = 3) -> List[PlannedRun]:
    """The runs to make. Repeats are interleaved (all cells once, then again) so that drift in
    the machine's speed spreads over every cell. With controllers=None Horovod runs the Gloo
    controller at every size and the MPI controller at the largest (under Slurm: MPI at every size).
    With both backends and a world size of 3 or more, the `explain` variants of Horovod (Gloo; under
    Slurm MPI; see EXPLAIN) run at the largest size. Every world size of 2 or more where two cells meet gets
    `floor` noise-floor runs of its first cell, each with its own disturbance (FLOOR), made only when the cells
    ended with different weights (at 2 ranks correct backends are bitwise identical). ValueError when the site
    cannot run a cell."""
    site = site or ThisHost()
    largest = max(world_sizes)
    if controllers is None and site.slurm:
        controllers = ["mpi"]
    cells = []
    for np in world_sizes:
        for backend in backends:
            if backend != "horovod":  # ddp, horovod-api: one launcher each
                cells.append((site.launcher(backend, None), np))
            elif controllers is None:
                cells.append((site.launcher("horovod", "gloo"), np))
                if np == largest:
                    cells.append((site.launcher("horovod", "mpi"), np))
            else:
                cells += [(site.launcher("horovod", c), np) for c in controllers]
    runs = [PlannedRun(launcher, np, r) for r in range(repeats) for launcher, np in cells]
    if {"ddp", "horovod"} <= set(backends) and largest >= 3:
        horovod = site.launcher("horovod", "mpi" if site.slurm else "gloo")
        runs += [PlannedRun(horovod, largest, r, variant) for variant in explain
                 for r in range(EXPLAIN_REPEATS[variant])]
    for np in world_sizes:
        here = [launcher for launcher, size in cells if size == np]
        if np >= 2 and len(here) >= 2:
            runs += [PlannedRun(here[0], np, 0, floor_variant(k), if_cells_differ=True) for k in range(1, floor + 1)]
    site.check(sorted({run.launcher for run in runs}, key=lambda launcher: launcher.name), world_sizes)
    return runs


@dataclass
class Outcome:
    """How one launched run ended."""

    planned: PlannedRun
    run_dir: Path
    returncode: int
    seconds: float
    command: str
    error: Optional[str]
    #: the run started with what an earlier run wrote (common.compare.clashes), in one line
    clash: Optional[str] = None


def _fmt_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass(frozen=True)
class Training:
    """The project's own training (ddp_train / hvd_train) with these options."""

    args: Tuple[str, ...]

    def module(self, planned: PlannedRun) -> Optional[str]:
        return None  # the launcher's training module

    def workdir(self, planned: PlannedRun, run_dir: Path) -> Path:
        """Where a run starts: the folder the comparison was started in (the loop writes only to its run directory;
        --model and --dataset import the user's factories from there)."""
        return Path.cwd()

    def watch(self) -> Optional[Watch]:
        """What the runs share on disk: nothing beyond their run directories."""
        return None

    def argv(self, planned: PlannedRun, run_dir: Path) -> List[str]:
        return [*self.args, *planned.extra_args, "--run-dir", str(run_dir)]

    def env(self, base: Dict[str, str], ranks_per_host: int) -> Dict[str, str]:
        """What the runs' environment adds to `base`: nothing (the loop sets its threads and Open MPI's settings
        itself)."""
        return {}


@dataclass(frozen=True)
class Scripts:
    """Users' own training scripts, unmodified, each run under the probe (common.probe): `scripts` names the
    script of each backend (ddp, horovod) as its runs give it to python, `args` are the scripts' own arguments;
    `max_steps` ends every run at that step (None: where the script ends). `folders` says what each backend's runs
    link in their working directories (common.compare.workdir)."""

    scripts: Tuple[Tuple[str, str], ...]
    args: Tuple[str, ...]
    max_steps: Optional[int] = None
    folders: Tuple[Tuple[str, LinkedFolder], ...] = ()

    def module(self, planned: PlannedRun) -> Optional[str]:
        return PROBE_MODULE

    def workdir(self, planned: PlannedRun, run_dir: Path) -> Path:
        """The run's own working directory, RUN_DIR/cwd, made afresh with the links to its backend's folder."""
        here = run_dir / WORKING_DIR
        if here.exists():  # a comparison run again into the same --out
            shutil.rmtree(here)
        return dict(self.folders)[planned.launcher.backend].make(here)

    def watch(self) -> Optional[Watch]:
        """What the runs share on disk: the folders their working directories link to and the absolute paths their
        arguments name (common.compare.clashes)."""
        roots: List[Path] = []
        left_out: List[Path] = []
        for _, folder in self.folders:
            roots += [root for root in folder.roots() if root not in roots]
            left_out += [path for path in folder.left_out if path not in left_out]
        return Watch(roots, named_paths(self.args), left_out)

    def argv(self, planned: PlannedRun, run_dir: Path) -> List[str]:
        script = dict(self.scripts)[planned.launcher.backend]
        api = ["--api", planned.launcher.api] if planned.launcher.api else []
        stop = ["--max-steps", str(self.max_steps)] if self.max_steps is not None else []
        return ["--run-dir", str(run_dir), *api, *stop, *planned.extra_args, script, *self.args]

    def env(self, base: Dict[str, str], ranks_per_host: int) -> Dict[str, str]:
        """PYTHONSAFEPATH for the probe (a `common` module in the scripts' folder must not shadow the probe's
        package: common.launch.userscript), and the same thread count for both backends' ranks, as the loop gives
        them: torchrun sets OMP_NUM_THREADS=1 and horovodrun nothing, so torch would take every core per rank."""
        return {**userscript.safe_path_env(base), "OMP_NUM_THREADS": str(launch.default_threads(ranks_per_host))}


#: the module that runs a user's script under the probe
PROBE_MODULE = "common.probe"


class MatrixRunner:
    """Runs a plan sequentially (runs on one host must not compete for its cores)."""

    def __init__(self, program: Union[Training, Scripts], out: Path, python: str = sys.executable,
                 timeout_s: float = 1800, echo: Callable[[str], None] = print, site: Optional[ThisHost] = None) -> None:
        self.program = program
        self.watch = program.watch()
        self.site = site or ThisHost()
        self.out = out
        self.python = python
        self.timeout_s = timeout_s
        self.echo = echo

    def run_all(self, runs: List[PlannedRun]) -> List[Outcome]:
        """Launch every planned run; a failure is recorded and the rest still run. Ctrl-C stops the
        running job (and every rank it started) before it propagates."""
        outcomes: List[Outcome] = []
        started = time.monotonic()
        for index, planned in enumerate(runs):
            if planned.if_cells_differ:
                needed, why = ended.floor_needed(planned.np, first_cells(outcomes))
                if not needed:
                    self.echo(f"[{index + 1}/{len(runs)}] skipped {planned.name}: {why}")
                    continue
            outcome = self._run_one(planned, index, len(runs), started, outcomes)
            outcomes.append(outcome)
            status = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode}): {outcome.error}"
            self.echo(f"[{index + 1}/{len(runs)}] finished {planned.name} in {outcome.seconds:.1f}s: {status}")
        return outcomes

    @staticmethod
    def _eta(index: int, total: int, fraction: float, current_s: float, done: List[Outcome]) -> float:
        """Seconds left: the current run's rest (from its progress), plus the runs still to
        start at the mean duration of the finished ones (or of this one, before any finished)."""
        current_total = current_s / fraction if fraction > 0 else current_s
        per_run = sum(o.seconds for o in done) / len(done) if done else current_total
        return max(current_total - current_s, 0.0) + per_run * (total - index - 1)

    def _run_one(self, planned: PlannedRun, index: int, total: int, started: float,
                 done: List[Outcome]) -> Outcome:
        run_dir = (self.out / "runs" / planned.dirname).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        cwd = self.program.workdir(planned, run_dir)
        commands = self.site.commands(planned.launcher, planned.np, self.program.argv(planned, run_dir),
                                      python=self.python, index=index, module=self.program.module(planned))
        shown = shown_commands(commands)
        self.echo(f"[{index + 1}/{total}] starting {planned.name}: {shown}")
        clash = self.watch.before(planned.name) if self.watch else None
        if clash is not None:
            self.echo(f"[{index + 1}/{total}] clash: {clash.line()}")
        t0 = time.monotonic()

        def progress(line: str) -> None:
            match = EPOCH_LINE.match(line)
            if match:
                step, steps = int(match.group(2)), int(match.group(3))
                eta = self._eta(index, total, step / steps, time.monotonic() - t0, done)
                self.echo(f"    {planned.name} epoch {match.group(1)} step {step}/{steps} "
                          f"· elapsed {_fmt_seconds(time.monotonic() - started)} · ETA {_fmt_seconds(eta)}")

        env = launch.job_env(python=self.python)
        env.update(self.program.env(env, ranks_per_host(self.site.placement(planned.np), planned.np)))
        result = run_commands(commands, timeout=self.timeout_s, env=env, cwd=cwd,
                              log=run_dir / LAUNCH_LOG, on_line=progress)
        if self.watch:
            self.watch.after(planned.name)
        lines = result.output.splitlines()
        if result.timed_out:
            lines.append(f"compare-backends: error: run exceeded --run-timeout {self.timeout_s:.0f}s")
        returncode = result.returncode if not result.timed_out else (result.returncode or 124)
        error = None if returncode == 0 else failed_with(cause(lines), clash.line() if clash else None)
        (run_dir / LAUNCH_RECORD).write_text(json.dumps(
            {"command": shown, "commands": {host or "here": " ".join(cmd) for host, cmd in commands.items()},
             "cwd": str(cwd), "placement": self.site.placement(planned.np), "returncode": returncode,
             "seconds": result.seconds, "name": planned.name, "backend": planned.label, "np": planned.np,
             "repeat": planned.repeat + 1, "clash": clash.line() if clash else None},
            indent=2) + "\n")
        return Outcome(planned, run_dir, returncode, result.seconds, shown, error, clash.line() if clash else None)

    def notes(self, outcomes: Sequence[Outcome]) -> List[str]:
        """The report's notes on what the runs shared on disk: each run that ended although it started with what an
        earlier run wrote (a failed one says so in its error), and each that wrote into the user's folder."""
        found = [f"{o.clash}." for o in outcomes if o.clash and o.returncode == 0]
        return found + [f"{line}." for line in (self.watch.notes() if self.watch else [])]


def ranks_per_host(placement: Optional[str], np: int) -> int:
    """The most ranks a run of `np` processes places on one host ("node0:4,node1:2" gives 4; this host alone, np)."""
    return max((slots for _, slots in parse_hosts(placement)), default=np) if placement else np


def first_cells(done: Sequence[Outcome]) -> List[ended.Cell]:
    """The first runs of the matrix's cells (no variant, first repeat) as they went."""
    cells = []
    for outcome in done:
        planned = outcome.planned
        if planned.repeat != 0 or planned.variant is not None:
            continue
        weights = None
        if outcome.returncode == 0:
            try:
                weights = read_run(outcome.run_dir).summary.get("weights_sha256")
            except ValueError:  # not a complete run directory: it did not end
                cells.append(ended.Cell(planned.name, planned.np, False))
                continue
        cells.append(ended.Cell(planned.name, planned.np, outcome.returncode == 0, weights))
    return cells


def failure_record(outcome: Outcome) -> Dict[str, Any]:
    """A failed run as the report shows it."""
    return {"name": outcome.planned.name, "returncode": outcome.returncode, "error": outcome.error,
            "command": outcome.command, "log": str(outcome.run_dir / LAUNCH_LOG)}


def rerun_disturbed(run: Run, count: int, out: Path, timeout_s: float,
                    echo: Callable[[str], None]) -> Tuple[List[Path], str]:
    """Run `run`'s recorded settings again on this host, through its backend's launcher, with each of the noise
    floor's first `count` disturbances: (the new run directories, "") or ([], why they could not be made)."""
    backend = run.config.get("backend") or {}
    if backend.get("script"):
        return [], (f"{run.name} is a run of a script, which has no training options to rerun: compare the scripts "
                    "with --scripts, which makes the floor, or give runs made with python -m common.probe "
                    "--perturb-ulp 1 --perturb-pattern K")
    try:
        launcher = ThisHost().launcher(backend.get("name", ""), backend.get("controller"))
    except (KeyError, ValueError) as exc:
        return [], f"{run.name} has no launcher here ({exc})"
    runner = MatrixRunner(Training(tuple(config_argv(run.settings, leave_out=("run_dir", "resume", "perturb_ulp",
                                                                              "perturb_pattern")))),
                          out, timeout_s=timeout_s, echo=echo)
    outcomes = runner.run_all([PlannedRun(launcher, run.world_size, 0, floor_variant(k)) for k in range(1, count + 1)])
    failed = [o for o in outcomes if o.returncode != 0]
    if failed:
        return [], f"rerunning {run.name} with --perturb-ulp 1 here failed: {failed[0].error}"
    return [o.run_dir for o in outcomes], ""
