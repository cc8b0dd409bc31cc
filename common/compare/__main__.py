"""python -m common.compare: train both backends through the real launchers and report how they
differ, or (--runs) compare run directories made elsewhere."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from common.launch import stopped_exit, terminating_like_ctrl_c
from common.launch.hosts import DEFAULT_PORT
from common.rundir.reader import Run, check_comparable, number_repeats, read_run
from . import arguments, benchmarks, ended, port, report, scripts
from . import floor
from ..config import given_options, is_exact, positive_float, positive_int
from ..errors import OneLineParser, print_error
from .analysis import DEFAULT_TOLERANCE, FLOOR_MARGIN, weight_difference
from .floor import DEFAULT_FLOOR_RUNS
from .matrix import MatrixRunner, Training, failure_record, plan, rerun_disturbed
from .sites import Hosts, SlurmAllocation, ThisHost

PROG = "compare-backends"
#: the exit code of a comparison that ran every run but could not judge a pair: a program that does not reproduce
#: itself (common.compare.reproducible)
CANNOT_JUDGE = 3


def build_compare_parser() -> argparse.ArgumentParser:
    """Options of the comparison itself; every other option is a training option."""
    p = OneLineParser(prog=PROG, description=__doc__,
                epilog="Any other option is a training option (see python -m ddp_train --help) and is passed "
                       "unchanged to every run, e.g. --model resnet18 --dataset synthetic --epochs 2.")
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
    p.add_argument("--out", type=Path, default=Path("runs/compare"), help="output folder (report and run dirs)")
    p.add_argument("--runs", nargs="+", type=Path, metavar="DIR",
                   help="compare these existing run directories instead of launching")
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
    p.add_argument("--force", action="store_true", help="compare runs even when they are not comparable")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="max |Δw| under which non-identical weights are called equal")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds before a run is stopped")
    p.add_argument("--bench", type=Path, metavar="DIR",
                   help="add the benchmark section from DIR/allreduce.json and DIR/throughput.json (made by "
                        "benchmarks/run_all.sh); without it, such files already in --out are used")
    return p


def fail(message: str) -> int:
    print_error(PROG, message, ranked=False)
    return 2


def choose_site(args: argparse.Namespace) -> ThisHost:
    """Where the runs go: --slurm, --hosts or this host (ValueError on a bad combination)."""
    if not 0 < args.rdzv_port < 65536 - 100:
        raise ValueError(f"--rdzv-port {args.rdzv_port} is not a TCP port; pick one in 1024-65000")
    if args.slurm:
        if args.hosts:
            raise ValueError("--slurm takes the allocation's nodes; drop --hosts")
        return SlurmAllocation(args.rdzv_port)
    if args.hosts:
        return Hosts(args.hosts, args.rdzv_port)
    return ThisHost()


def preflight(site: Hosts, world_sizes: List[int], port: int) -> List[str]:
    """The launch doctor's checks on the hosts the runs use (ssh, the project's paths, the rendezvous port,
    the interface): the failed ones, a line each with its fix; empty when every check passed."""
    import io

    from .. import doctor

    checks = doctor.run_checks(site.used_hosts(world_sizes), port, None, None, probe=False, out=io.StringIO())
    return [check.line().replace("\n", " ").replace("      fix:", " fix:") for check in checks if check.ok is False]


def measure_missing_floors(runs: List[Run], args: argparse.Namespace) -> Dict[int, str]:
    """Make the noise floor where runs differ and none was measured (given --runs: by rerunning one of them
    here with the disturbance; the new run joins `runs`); world size -> why the floor stays unknown."""
    unknown: Dict[int, str] = {}
    # A floor judges gaps beyond the tolerance; only for those is a run made here.
    for world in floor.missing(runs, lambda a, b: weight_difference(a, b) > args.tolerance):
        if args.noise_floor == "off":
            unknown[world] = "--noise-floor off"
        elif not args.runs:
            unknown[world] = f"no disturbed run was made at world size {world}"
        else:
            source = floor.to_disturb(runs, world)
            if source is None:
                unknown[world] = f"no undisturbed run at world size {world} to disturb"
                continue
            print(f"{PROG}: no disturbed run at world size {world} among --runs; rerunning {source.name}'s settings "
                  f"here with --perturb-ulp 1, {args.floor_runs} disturbance{'s' if args.floor_runs > 1 else ''}",
                  flush=True)
            made, why = rerun_disturbed(source, args.floor_runs, args.out, args.run_timeout,
                                        lambda line: print(line, flush=True))
            if not made:
                unknown[world] = why
                continue
            for path in made:
                disturbed = read_run(path)
                disturbed.launch["note"] = f"made by the comparison from {source.path}"
                runs.append(disturbed)
    number_repeats(runs)
    return unknown


def main(argv: Optional[List[str]] = None) -> int:
    """Run the comparison; 0 when every run succeeded and every pair was judged, 1 when a run failed, 2 on bad input,
    3 (CANNOT_JUDGE) when a program did not reproduce itself, so that its pairs could not be judged."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: List[str] = []
    if "--" in argv:  # what follows is the scripts' own
        argv, script_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args, train_args = build_compare_parser().parse_known_args(argv)
    ported = None
    if args.port:
        if args.scripts or args.runs:
            return fail("--port ports one Horovod script and compares it with its port: drop --scripts/--runs")
        if args.horovod_api:
            return fail("--port compares a Horovod script with its DDP port; --horovod-api compares it with itself on "
                        "the Horovod API: give one of them")
        if args.port.isdigit():
            return fail(f"--port {args.port}: --port takes the Horovod script to port; the rendezvous port is "
                        "--rdzv-port")
        if not Path(args.port).is_file():
            return fail(f"--port {args.port}: no such file; give the Horovod script's path from this folder")
        if train_args:  # refused before the port is written
            return fail(f"options ({' '.join(train_args)}) before -- are not the comparison's; with --port your "
                        "script's arguments go after --")
        try:
            if scripts.backend_of(Path(args.port)) != "horovod":
                return fail(f"--port {args.port}: it does not import horovod; --port takes a Horovod script")
            ported = port.port(Path(args.port), args.out, zero_step=args.zero_step)
            program = port.program(ported, args.port, script_args, args.steps, here=Path.cwd(), out=args.out)
        except ValueError as exc:
            return fail(str(exc))
        print(f"{PROG}: ported {args.port} to {ported.script_port} ({ported.source} into {ported.output}: "
              f"{len(ported.rewrites)} rewrites" + (f", {len(ported.unported)} lines left unported"
                                                     if ported.unported else "") + ")", flush=True)
        args.scripts = [args.port, ported.script_port]
    if args.horovod_api and not args.scripts:
        return fail("--horovod-api runs a Horovod script on the API and on Horovod: give it with --scripts "
                    "TRAIN_HOROVOD.py")
    if script_args and not args.scripts:
        return fail(f"arguments after -- ({' '.join(script_args)}) are a script's; they go with --scripts")
    if args.steps is not None and not args.scripts:
        return fail(f"--steps {args.steps} stops your scripts (--scripts, --port, --horovod-api); the project's own "
                    f"loop takes --max-steps {args.steps}")
    if args.scripts and not ported:
        if train_args:
            return fail(f"training options ({' '.join(train_args)}) are the project's own loop's; with --scripts "
                        "your scripts' arguments go after --")
        if args.runs:
            return fail("--scripts launches your scripts; --runs compares run directories: give one of them")
        try:
            program = (scripts.on_the_api if args.horovod_api else scripts.program)(
                args.scripts, script_args, args.steps, here=Path.cwd(), out=args.out)
        except ValueError as exc:
            return fail(str(exc))
    if args.repeats < 1:
        return fail("--repeats must be >= 1")
    # The training options, checked once here by the training parser itself (bad ones exit 2 with one line).
    given = given_options(train_args, PROG)
    if "run_dir" in given:
        return fail("--run-dir is set per run by the comparison; use --out for the output folder")

    try:
        bench = benchmarks.load(args.bench or args.out, args.out)
    except ValueError as exc:
        return fail(str(exc))
    if args.bench and bench is None:
        return fail(f"--bench {args.bench}: no allreduce.json or throughput.json there; run benchmarks/run_all.sh")

    notes: List[str] = []
    failures = []
    if args.runs:
        if train_args:
            return fail(f"training options ({' '.join(train_args)}) do nothing with --runs; remove them")
        if args.hosts or args.slurm:
            return fail(f"{'--slurm' if args.slurm else '--hosts'} says where to launch runs; --runs launches none, "
                        "remove it")
        try:
            runs = [read_run(path) for path in args.runs]
        except ValueError as exc:
            return fail(str(exc))
    else:
        # Exact mode leaves nothing to explain: its runs agree to the bit.
        explain = [] if "none" in args.explain or is_exact(given) else args.explain
        backends = args.backends
        if args.scripts:
            # DDP (or the Horovod API) first: the noise floor's disturbed runs are the first cell's, the candidate's
            explain, backends = [], sorted((backend for backend, _ in program.scripts),
                                           key=lambda b: b not in ("ddp", "horovod-api"))
        world_sizes = sorted(set(args.world_sizes))
        try:
            site = choose_site(args)
            planned = plan(backends, world_sizes, args.hvd_controllers, args.repeats, explain, site,
                           floor=args.floor_runs if args.noise_floor == "on" else 0)
        except ValueError as exc:
            return fail(str(exc))
        if isinstance(site, Hosts) and not site.slurm:
            findings = preflight(site, world_sizes, args.rdzv_port)
            if findings:
                for line in findings:
                    print(f"{PROG}: {line}", file=sys.stderr)
                return fail("the launch doctor found what would make the runs fail or hang (above); nothing was "
                            "launched")
        print(f"{PROG}: {len(planned)} runs into {args.out.resolve()}", flush=True)
        runner = MatrixRunner(program if args.scripts else Training(tuple(train_args)), args.out,
                              timeout_s=args.run_timeout,
                              echo=lambda line: print(line, flush=True), site=site)
        try:
            with terminating_like_ctrl_c():
                outcomes = runner.run_all(planned)
        except KeyboardInterrupt as stopped:  # the running job was stopped on the way out (common.launch.Job)
            return stopped_exit(PROG, stopped)
        notes += runner.notes(outcomes)
        runs = []
        for outcome in outcomes:
            if outcome.returncode != 0:
                failures.append(failure_record(outcome))
                continue
            try:
                run = read_run(outcome.run_dir)
            except ValueError as exc:
                outcome.error = str(exc)
                failures.append(failure_record(outcome))
                continue
            runs.append(run)

    number_repeats(runs)
    notes += ended.unpaired(runs, failures)
    reasons = check_comparable(runs)
    if args.scripts:  # scripts may take different numbers of steps: where they part is what the report says
        if args.steps is not None:
            notes.append(f"Each of the {len(runs)} runs that ended was ended after its training step {args.steps} "
                         f"(--steps {args.steps}).")
        notes += [f"{reason}." for reason in reasons if reason.startswith("steps differ")]
        reasons = [reason for reason in reasons if not reason.startswith("steps differ")]
    if reasons:
        if not args.force:
            return fail("runs are not comparable: " + "; ".join(reasons) + " (use --force to compare anyway)")
        notes.append("Compared with --force although: " + "; ".join(reasons) + ".")
    unknown = measure_missing_floors(runs, args)
    found = report.build(runs, failures, args.out, args.tolerance, notes, bench, unknown, args.floor_margin,
                         extra=[port.section(ported)] if ported else [],
                         relate=(lambda pairs: port.link(ported, pairs)) if ported else None)
    print(f"{PROG}: report {(args.out / report.REPORT_MD).resolve()} (and {report.REPORT_HTML} beside it)")
    for p in found.pairs:
        if p.kind != "repeat":
            print(f"  weights @{p.world_size}: {p.a} vs {p.b}: {p.verdict}")
    for v in found.speed:
        print(f"  speed: {v['verdict']}")
    for f in failures:
        print(f"  FAILED {f['name']}: {f['error']}")
    if failures:
        return 1
    return CANNOT_JUDGE if found.irreproducible else 0


if __name__ == "__main__":
    sys.exit(main())
