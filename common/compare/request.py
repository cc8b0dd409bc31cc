"""What `python -m common.compare` was asked: its options, and the check of the request as a whole before anything
runs (a bad combination is one line, exit 2, and nothing launched)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from common.launch.hosts import DEFAULT_PORT
from . import arguments, benchmarks, port, scripts
from ..config import given_options, positive_float, positive_int
from ..errors import OneLineParser
from .analysis import DEFAULT_TOLERANCE, FLOOR_MARGIN
from .floor import DEFAULT_FLOOR_RUNS
from .matrix import Scripts

PROG = "compare-backends"
DESCRIPTION = ("python -m common.compare: train both backends through the real launchers and report how they differ, "
               "or (--runs) compare run directories made elsewhere.")


class Refused(ValueError):
    """A request the comparison will not run: its message is the one line printed, naming the fix."""


@dataclass
class Request:
    """A checked request: the comparison's options, the training options passed to every run (`train_args`, with
    `given` the ones set), the scripts' own arguments, and what --scripts/--port/--bench resolved to."""

    args: argparse.Namespace
    train_args: List[str]
    script_args: List[str]
    given: Dict[str, Any] = field(default_factory=dict)
    program: Optional[Scripts] = None
    ported: Optional[port.Ported] = None
    bench: Optional[Dict[str, Any]] = None


def build_compare_parser() -> argparse.ArgumentParser:
    """Options of the comparison itself; every other option is a training option."""
    p = OneLineParser(prog=PROG, description=DESCRIPTION,
                      epilog="Any other option is a training option (see python -m ddp_train --help) and is passed "
                             "unchanged to every run, e.g. --model resnet18 --dataset synthetic --epochs 2.")
    _matrix_options(p)
    _floor_options(p)
    _site_options(p)
    _script_options(p)
    _report_options(p)
    return p


def _matrix_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", type=arguments.csv_list(str, ("ddp", "horovod")), default=["ddp", "horovod"],
                   help="comma-separated: ddp,horovod")
    p.add_argument("--np", dest="world_sizes", type=arguments.world_sizes, default=[1, 2, 3],
                   help="comma-separated world sizes, e.g. 1,2,4 (3: the first where two correct implementations "
                        "can differ)")
    p.add_argument("--hvd-controllers", type=arguments.csv_list(str, ("gloo", "mpi")), default=None,
                   help="Horovod controllers at every size (default: gloo at every size, mpi at the largest)")
    p.add_argument("--repeats", type=int, default=2, help="timing repeats of every cell")
    p.add_argument("--explain", type=arguments.csv_list(str, ("predivide", "deterministic", "none")),
                   default=["predivide"],
                   help="runs that explain a gap between DDP and Horovod at 3 ranks or more, at the largest world "
                        "size: predivide (Horovod dividing before the sum, as DDP does), deterministic (Horovod "
                        "without tensor fusion, twice: is it reproducible then?), none")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds before a run is stopped")


def _floor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--noise-floor", choices=("on", "off"), default="on",
                   help="on: where backends end with different weights (3 ranks or more), --floor-runs more runs of "
                        "the first backend, each with its initial weights moved by one ulp in its own pattern, measure "
                        "how far rounding alone carries a run at every step, and gaps are judged against that spread; "
                        "with --runs, disturbed runs among them are used, else they are made by rerunning a given "
                        "run's settings here")
    p.add_argument("--floor-runs", type=positive_int, default=DEFAULT_FLOOR_RUNS,
                   help="how many disturbed runs make the noise floor (docs/comparing.md says why the default)")
    p.add_argument("--floor-margin", type=positive_float, default=FLOOR_MARGIN,
                   help="a pair's gap at a step up to this many times the noise floor's band there is within it")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="max |Δw| under which non-identical weights are called equal")


def _site_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", "-H", metavar="HOST:SLOTS,...",
                   help="run across these hosts, as horovodrun -H spells them (node0:4,node1:4); each world size is "
                        "placed on them in order. Needs passwordless ssh and the same paths on every host; the "
                        "launch doctor checks both before any run")
    p.add_argument("--rdzv-port", type=int, default=DEFAULT_PORT, metavar="P",
                   help="with --hosts or --slurm: the rendezvous port of the first run on the first host (run i "
                        "uses P + i)")
    p.add_argument("--slurm", action="store_true",
                   help="inside a Slurm allocation: start every run with srun on the allocation's nodes (DDP one "
                        "task per process, Horovod through PMI: srun --mpi=$SRUN_MPI, default pmix)")


def _script_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scripts", nargs="+", metavar="SCRIPT",
                   help="compare your own training scripts, unmodified: HOROVOD_SCRIPT DDP_SCRIPT (or one of them "
                        "alone), run under horovodrun and torchrun with the probe, which records every step, each run "
                        "in a working directory of its own linked to this folder (OUT/runs/RUN/cwd); the scripts' own "
                        "arguments go after --, where {run_dir} is each run's directory")
    p.add_argument("--port", metavar="TRAIN_HOROVOD.py",
                   help="port this Horovod script's folder to DDP into OUT/port (python -m ddp_train.port) and compare "
                        "the script with its port there as --scripts does, with the port's report beside the "
                        "verdicts; the scripts' own arguments go after --")
    p.add_argument("--zero-step", choices=("drop", "keep"), default="drop",
                   help="with --port: hvd.broadcast_optimizer_state's step on a fresh optimizer, dropped (DDP's idiom; "
                        "the verdicts name what that changes) or kept, so that the port trains as the script does")
    p.add_argument("--steps", type=positive_int, default=None, metavar="N",
                   help="with --scripts, --port or --horovod-api: end every run after its N-th training step (the "
                        "probe's --max-steps), for scripts whose epochs are longer than you need to judge them; the "
                        "project's own loop takes --max-steps N")
    p.add_argument("--horovod-api", action="store_true",
                   help="with --scripts TRAIN_HOROVOD.py: run the Horovod script under horovodrun (Horovod itself) and "
                        "under torchrun on this project's Horovod API (python -m ddp_train.horovod_api), and compare")


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/compare"), help="output folder (report and run dirs)")
    p.add_argument("--runs", nargs="+", type=Path, metavar="DIR",
                   help="compare these existing run directories instead of launching")
    p.add_argument("--force", action="store_true", help="compare runs even when they are not comparable")
    p.add_argument("--bench", type=Path, metavar="DIR",
                   help="add the benchmark section from DIR/allreduce.json and DIR/throughput.json (made by "
                        "benchmarks/run_all.sh); without it, such files already in --out are used")


def check_request(argv: List[str]) -> Request:
    """Parse `argv` and check the request as a whole (Refused naming the problem and its fix); with --port, the
    script is ported here, into OUT/port."""
    script_args: List[str] = []
    if "--" in argv:  # what follows is the scripts' own
        argv, script_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args, train_args = build_compare_parser().parse_known_args(argv)
    request = Request(args, train_args, script_args)
    if args.port:
        _port_the_script(request)
    _check_scripts(request)
    if args.repeats < 1:
        raise Refused("--repeats must be >= 1")
    # The training options, checked once here by the training parser itself (bad ones exit 2 with one line).
    request.given = given_options(train_args, PROG)
    if "run_dir" in request.given:
        raise Refused("--run-dir is set per run by the comparison; use --out for the output folder")
    _check_bench(request)
    if args.runs:
        _check_given_runs(request)
    return request


def _port_the_script(request: Request) -> None:
    """--port: refuse what does not go with it, port the script's folder into OUT/port, and compare the two."""
    args = request.args
    if args.scripts or args.runs:
        raise Refused("--port ports one Horovod script and compares it with its port: drop --scripts/--runs")
    if args.horovod_api:
        raise Refused("--port compares a Horovod script with its DDP port; --horovod-api compares it with itself on "
                      "the Horovod API: give one of them")
    if args.port.isdigit():
        raise Refused(f"--port {args.port}: --port takes the Horovod script to port; the rendezvous port is "
                      "--rdzv-port")
    if not Path(args.port).is_file():
        raise Refused(f"--port {args.port}: no such file; give the Horovod script's path from this folder")
    if request.train_args:  # refused before the port is written
        raise Refused(f"options ({' '.join(request.train_args)}) before -- are not the comparison's; with --port "
                      "your script's arguments go after --")
    try:
        if scripts.backend_of(Path(args.port)) != "horovod":
            raise Refused(f"--port {args.port}: it does not import horovod; --port takes a Horovod script")
        ported = port.port(Path(args.port), args.out, zero_step=args.zero_step)
        request.program = port.program(ported, args.port, request.script_args, args.steps, here=Path.cwd(),
                                       out=args.out)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    request.ported = ported
    print(f"{PROG}: ported {args.port} to {ported.script_port} ({ported.source} into {ported.output}: "
          f"{len(ported.rewrites)} rewrites" + (f", {len(ported.unported)} lines left unported"
                                                 if ported.unported else "") + ")", flush=True)
    args.scripts = [args.port, ported.script_port]


def _check_scripts(request: Request) -> None:
    """--scripts, --horovod-api, --steps and the arguments after --: what goes with what; the scripts' program."""
    args = request.args
    if args.horovod_api and not args.scripts:
        raise Refused("--horovod-api runs a Horovod script on the API and on Horovod: give it with --scripts "
                      "TRAIN_HOROVOD.py")
    if request.script_args and not args.scripts:
        raise Refused(f"arguments after -- ({' '.join(request.script_args)}) are a script's; they go with --scripts")
    if args.steps is not None and not args.scripts:
        raise Refused(f"--steps {args.steps} stops your scripts (--scripts, --port, --horovod-api); the project's "
                      f"own loop takes --max-steps {args.steps}")
    if not args.scripts or request.ported:
        return
    if request.train_args:
        raise Refused(f"training options ({' '.join(request.train_args)}) are the project's own loop's; with "
                      "--scripts your scripts' arguments go after --")
    if args.runs:
        raise Refused("--scripts launches your scripts; --runs compares run directories: give one of them")
    try:
        request.program = (scripts.on_the_api if args.horovod_api else scripts.program)(
            args.scripts, request.script_args, args.steps, here=Path.cwd(), out=args.out)
    except ValueError as exc:
        raise Refused(str(exc)) from None


def _check_bench(request: Request) -> None:
    """The benchmark section's files: --bench DIR, else such files already in --out."""
    args = request.args
    try:
        request.bench = benchmarks.load(args.bench or args.out, args.out)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    if args.bench and request.bench is None:
        raise Refused(f"--bench {args.bench}: no allreduce.json or throughput.json there; run benchmarks/run_all.sh")


def _check_given_runs(request: Request) -> None:
    """--runs launches nothing: training options and where to launch are refused with it."""
    args = request.args
    if request.train_args:
        raise Refused(f"training options ({' '.join(request.train_args)}) do nothing with --runs; remove them")
    if args.hosts or args.slurm:
        raise Refused(f"{'--slurm' if args.slurm else '--hosts'} says where to launch runs; --runs launches none, "
                      "remove it")
