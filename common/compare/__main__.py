"""python -m common.compare: train both backends through the real launchers and report how they
differ, or (--runs) compare run directories made elsewhere."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from common.launch import stopped_exit, terminating_like_ctrl_c
from common.rundir.reader import Run, check_comparable, number_repeats, read_run
from . import ended, floor, port, report
from ..config import is_exact
from ..errors import print_error
from .analysis import weight_difference
from .matrix import MatrixRunner, PlannedRun, Training, failure_record, plan, rerun_disturbed
from .request import PROG, Refused, Request, check_request
from .sites import Hosts, SlurmAllocation, ThisHost

#: the exit code of a comparison that ran every run but could not judge a pair: a program that does not reproduce
#: itself (common.compare.reproducible)
CANNOT_JUDGE = 3


def fail(message: str) -> int:
    """Print `message` as the comparison's one-line error; the exit code of bad input."""
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


@dataclass
class Collected:
    """The runs to compare, the failed runs' records, and notes for the report."""

    runs: List[Run]
    failures: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def plan_runs(request: Request) -> Tuple[ThisHost, List[PlannedRun]]:
    """Where the runs go and which: the backends (with --scripts, DDP or the Horovod API first: the noise floor's
    disturbed runs are the first cell's), world sizes, controllers, repeats, explaining and floor runs; Refused on a
    bad combination, or where the launch doctor finds hosts that would fail or hang the runs."""
    args = request.args
    # Exact mode leaves nothing to explain: its runs agree to the bit.
    explain = [] if "none" in args.explain or is_exact(request.given) else args.explain
    backends = args.backends
    if request.program is not None:
        explain, backends = [], sorted((backend for backend, _ in request.program.scripts),
                                       key=lambda b: b not in ("ddp", "horovod-api"))
    world_sizes = sorted(set(args.world_sizes))
    try:
        site = choose_site(args)
        planned = plan(backends, world_sizes, args.hvd_controllers, args.repeats, explain, site,
                       floor=args.floor_runs if args.noise_floor == "on" else 0)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    if isinstance(site, Hosts) and not site.slurm:
        findings = preflight(site, world_sizes, args.rdzv_port)
        if findings:
            for line in findings:
                print(f"{PROG}: {line}", file=sys.stderr)
            raise Refused("the launch doctor found what would make the runs fail or hang (above); nothing was "
                          "launched")
    return site, planned


def run_planned(request: Request, site: ThisHost, planned: List[PlannedRun]) -> Collected:
    """Launch the planned runs one after the other (KeyboardInterrupt once the running job is stopped) and read
    what each wrote; a run that failed, or whose directory cannot be read, becomes a failure record."""
    args = request.args
    print(f"{PROG}: {len(planned)} runs into {args.out.resolve()}", flush=True)
    runner = MatrixRunner(request.program or Training(tuple(request.train_args)), args.out,
                          timeout_s=args.run_timeout, echo=lambda line: print(line, flush=True), site=site)
    with terminating_like_ctrl_c():
        outcomes = runner.run_all(planned)
    collected = Collected([], notes=runner.notes(outcomes))
    for outcome in outcomes:
        if outcome.returncode == 0:
            try:
                collected.runs.append(read_run(outcome.run_dir))
                continue
            except ValueError as exc:
                outcome.error = str(exc)
        collected.failures.append(failure_record(outcome))
    return collected


def judge(request: Request, collected: Collected) -> report.Comparison:
    """Pair the runs, check they are comparable (Refused unless --force), make the missing noise floors, and write
    the report."""
    args, runs, notes = request.args, collected.runs, collected.notes
    number_repeats(runs)
    notes += ended.unpaired(runs, collected.failures)
    reasons = check_comparable(runs)
    if args.scripts:  # scripts may take different numbers of steps: where they part is what the report says
        if args.steps is not None:
            notes.append(f"Each of the {len(runs)} runs that ended was ended after its training step {args.steps} "
                         f"(--steps {args.steps}).")
        notes += [f"{reason}." for reason in reasons if reason.startswith("steps differ")]
        reasons = [reason for reason in reasons if not reason.startswith("steps differ")]
    if reasons:
        if not args.force:
            raise Refused("runs are not comparable: " + "; ".join(reasons) + " (use --force to compare anyway)")
        notes.append("Compared with --force although: " + "; ".join(reasons) + ".")
    unknown = measure_missing_floors(runs, args)
    ported = request.ported
    return report.build(runs, collected.failures, args.out, args.tolerance, notes, request.bench, unknown,
                        args.floor_margin, extra=[port.section(ported)] if ported else [],
                        relate=(lambda pairs: port.link(ported, pairs)) if ported else None)


def print_summary(request: Request, found: report.Comparison, failures: List[Dict[str, Any]]) -> None:
    """Where the report is, and its verdicts, a line each."""
    out = request.args.out
    print(f"{PROG}: report {(out / report.REPORT_MD).resolve()} (and {report.REPORT_HTML} beside it)")
    for p in found.pairs:
        if p.kind != "repeat":
            print(f"  weights @{p.world_size}: {p.a} vs {p.b}: {p.verdict}")
    for v in found.speed:
        print(f"  speed: {v['verdict']}")
    for f in failures:
        print(f"  FAILED {f['name']}: {f['error']}")


def main(argv: Optional[List[str]] = None) -> int:
    """Run the comparison; 0 when every run succeeded and every pair was judged, 1 when a run failed, 2 on bad input,
    3 (CANNOT_JUDGE) when a program did not reproduce itself, so that its pairs could not be judged."""
    try:
        request = check_request(list(sys.argv[1:] if argv is None else argv))
        if request.args.runs:
            try:
                collected = Collected([read_run(path) for path in request.args.runs])
            except ValueError as exc:
                raise Refused(str(exc)) from None
        else:
            site, planned = plan_runs(request)
            try:
                collected = run_planned(request, site, planned)
            except KeyboardInterrupt as stopped:  # the running job was stopped on the way out (common.launch.Job)
                return stopped_exit(PROG, stopped)
        found = judge(request, collected)
    except Refused as refused:
        return fail(str(refused))
    print_summary(request, found, collected.failures)
    if collected.failures:
        return 1
    return CANNOT_JUDGE if found.irreproducible else 0


if __name__ == "__main__":
    sys.exit(main())
