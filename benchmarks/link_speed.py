"""Speed across a shaped link: 2 ranks, one on each simulated host (tests/cluster.py: network namespaces node0 and
node1 over a veth pair), one thread each, with the link between them held to a cluster's bandwidth by tc
(common.launch.link) in both directions.

    python -m benchmarks.link_speed --script HOROVOD/examples/pytorch/pytorch_synthetic_benchmark.py \\
        --links unshaped,10gbit,1gbit --repeats 2

It runs itself on node0 (as a user on the first host starts a job) and starts every job from there; where the hosts
are not up (`.venv/bin/python tests/cluster.py up`), it brings them up for the measurement and down after it (as
root: namespaces and tc need CAP_NET_ADMIN). The cells, each
at every link setting:

- synthetic: Horovod's pytorch_synthetic_benchmark.py, unchanged (resnet18 at 224), under the Horovod API
  (torchrun on both hosts, -m ddp_train.horovod_api), its plain DDP port (python -m ddp_train.port), Horovod/Gloo and
  Horovod/MPI (horovodrun -H node0:1,node1:1): the Total img/sec it prints;
- small-tensors: the same four on benchmarks.horovod_api's script of 160 small gradient tensors and little compute;
- for both, after each run, the same run under the probe (python -m common.probe, --no-probe to skip): the share of
  its steps spent waiting on communication (the probe's time split: DDP's wait at the end of backward, Horovod's
  in step()), its step and the bytes it reduced (what a forecast reads); the images/s stay the unprobed run's;
- loop: the project's loop (torchrun -m ddp_train, horovodrun --gloo -m hvd_train) and the bare DDP loop
  (benchmarks.bare_ddp), on resnet18 with synthetic images: samples/s, and for the project's loop the share of the
  step spent on exposed communication after backward (its summary.json time split).

Every repeat runs every cell once, every other repeat in the opposite order, so that the machine's drift falls on all
alike; the link is set before each cell and given back unshaped after the last one, also when a run fails. Writes
DIR/link_speed.json and DIR/link_speed.png.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from common import launch
from common.compare import forecast
from common.compare.arguments import csv_list
from common.launch.hosts import DEFAULT_PORT
from common.launch.link import SETTINGS, ShapingRefused, shaped
from common.launch.remote import commands_for, run_commands, shown
from common.launch.simulated import HOSTS, hosts_up, link_ends, on_host
from common.compare.matrix import PROBE_MODULE
from common.rundir.names import SUMMARY_FILE

from .horovod_api import API_MODULE, SMALL_TENSORS_SCRIPT, TOTAL
from .jobs import JobFailed, checked, add_out, add_timeout, job_env, parser, refuse, run_cli, run_job, schedule
from .machine import REPO, Record, cores, figure_title, publish
from .sections import LINK_TARGETS

PROG = "link_speed"
PLACEMENT = ",".join(f"{host}:1" for host in HOSTS)
#: a script's backends: label -> the registered launcher that starts it
SCRIPT_BACKENDS = {"api": "torchrun", "port": "torchrun", "horovod-gloo": "horovodrun-gloo",
                   "horovod-mpi": "horovodrun-mpi"}
#: the loops: label -> (launcher, module)
LOOPS = {"ddp_train": ("torchrun", "ddp_train"), "hvd_train": ("horovodrun-gloo", "hvd_train"),
         "bare_ddp": ("torchrun", "benchmarks.bare_ddp")}
PROGRAMS = ("synthetic", "small-tensors", "loop")


@dataclass(frozen=True)
class Cell:
    """One measurement: a program under a backend at a link setting."""

    program: str
    backend: str
    link: str

    @property
    def tag(self) -> str:
        return f"{self.program}-{self.backend}-{self.link}"


@dataclass
class Figures:
    """What one run of a cell gave: images (samples) per second, and where the run records them (the loops), the
    share of its steps spent waiting on communication after backward, its mean step and what a forecast reads."""

    img_s: float
    comm_frac: Optional[float] = None
    reduced_bytes_per_step: Optional[int] = None
    step_ms: Optional[float] = None
    summary: Optional[Dict[str, Any]] = None


@dataclass
class Plan:
    """What the run was asked: each program's script under each backend, the options of each kind of run, where logs
    go; and what the runs gave, per cell tag."""

    scripts: Dict[str, Dict[str, str]]
    script_args: List[str]
    loop_args: List[str]
    logs: Path
    timeout: float
    probe: bool = True
    results: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)


def on_node0() -> bool:
    """Whether this process runs in node0's network namespace."""
    named = subprocess.run(["ip", "netns", "identify"], capture_output=True, text=True, check=False).stdout
    return named.strip() == HOSTS[0]


def script_commands(backend: str, script: str, args: Sequence[str], port: int,
                    probe_dir: Optional[Path] = None) -> Dict[str, List[str]]:
    """`python SCRIPT ARGS` on both hosts under `backend` as a user starts it: under the API's module or as the
    port's script through torchrun (one per host), itself under horovodrun; with `probe_dir`, under the probe
    writing its run directory there."""
    launcher = launch.get(SCRIPT_BACKENDS[backend])
    probe = ["--run-dir", str(probe_dir)] if probe_dir is not None else []
    if backend == "api":
        module, words = (PROBE_MODULE, [*probe, "--api", "horovod"]) if probe else (API_MODULE, [])
        return commands_for(launcher, 2, [*words, script, *args], python=sys.executable, module=module,
                            hosts=PLACEMENT, port=port)
    commands = commands_for(launcher, 2, args, python=sys.executable, hosts=PLACEMENT, port=port)
    for cmd in commands.values():  # the launcher's `-m TRAINING_MODULE` replaced by the script
        at = cmd.index("-m")
        cmd[at:at + 2] = ["-m", PROBE_MODULE, *probe, script] if probe else [script]
    return commands


def probed(cell: Cell, plan: Plan, repeat: int, port: int, img_s: float) -> Figures:
    """A script cell's figures: `img_s` (its own run's), and from its run again under the probe the share of its
    steps spent on exposed communication, its step and what a forecast reads."""
    run_dir = (plan.logs / f"probe-{cell.tag}-{repeat}").resolve()
    commands = script_commands(cell.backend, plan.scripts[cell.program][cell.backend], plan.script_args, port,
                               probe_dir=run_dir)
    log = plan.logs / f"{PROG}-{cell.tag}-{repeat}-probe.log"
    checked(run_commands(commands, plan.timeout, env=job_env({"OMP_NUM_THREADS": "1"}), cwd=REPO, log=log),
            plan.timeout)
    return figures(img_s, json.loads((run_dir / SUMMARY_FILE).read_text()))


def figures(img_s: float, summary: Dict[str, Any]) -> Figures:
    """A run's figures from its summary.json (the project's loop's, or the probe's of a script)."""
    split = summary.get("time_split") or {}
    kept = {key: summary.get(key) for key in ("world_size", "backend", "reduced_bytes_per_step", "time_split")}
    return Figures(img_s, split.get("comm_frac"), summary.get("reduced_bytes_per_step"), split.get("step_ms"), kept)


def measure(cell: Cell, plan: Plan, repeat: int, port: int) -> Figures:
    """Run one cell once (the link already set); JobFailed when it fails or prints no figure."""
    log = plan.logs / f"{PROG}-{cell.tag}-{repeat}.log"
    env: Dict[str, Optional[str]] = {"OMP_NUM_THREADS": "1"}
    if cell.program != "loop":
        commands = script_commands(cell.backend, plan.scripts[cell.program][cell.backend], plan.script_args,
                                   port)
        checked(run_commands(commands, plan.timeout, env=job_env(env), cwd=REPO, log=log), plan.timeout)
        printed = TOTAL.findall(log.read_text())
        if not printed:
            raise JobFailed(f"printed no Total img/sec line ({shown(commands)})")
        img_s = float(printed[-1][1])
        return probed(cell, plan, repeat, port + 1, img_s) if plan.probe else Figures(img_s)
    launcher, module = LOOPS[cell.backend]
    run_dir = plan.logs / f"run-{cell.tag}-{repeat}"
    commands = commands_for(launch.get(launcher), 2, [*plan.loop_args, "--run-dir", str(run_dir.resolve())],
                            python=sys.executable, module=module, hosts=PLACEMENT, port=port)
    checked(run_commands(commands, plan.timeout, env=job_env(env), cwd=REPO, log=log), plan.timeout)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    return figures(float(summary["samples_per_s"]), summary)


def summarize(plan: Plan) -> Dict[str, Dict[str, Any]]:
    """Per cell tag: its program, backend and link, every repeat, the median images/s, exposed share and step, and
    every repeat's summary (what a forecast reads)."""
    table: Dict[str, Dict[str, Any]] = {}
    for tag, runs in plan.results.items():
        first = runs[0]
        shares = [r["comm_frac"] for r in runs if r["comm_frac"] is not None]
        steps = [r["step_ms"] for r in runs if r.get("step_ms")]
        table[tag] = {"program": first["program"], "backend": first["backend"], "link": first["link"],
                      "img_s": [r["img_s"] for r in runs], "median": statistics.median(r["img_s"] for r in runs),
                      "comm_frac": statistics.median(shares) if shares else None,
                      "reduced_bytes_per_step": first["reduced_bytes_per_step"],
                      "step_ms": statistics.median(steps) if steps else None,
                      "summaries": [r["summary"] for r in runs if r.get("summary")]}
    return table


def forecasts(table: Dict[str, Dict[str, Any]], links: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per cell at a shaped link: its step time forecast from the same cell's unshaped runs (the median of each
    repeat's forecast, common.compare.forecast; a script's from its probed runs), its median step, and how far the
    forecast lands (forecast / measured - 1)."""
    found: Dict[str, Dict[str, Any]] = {}
    for tag, cell in table.items():
        rate = SETTINGS[cell["link"]].rate_bits
        base = table.get(f"{cell['program']}-{cell['backend']}-unshaped") or {}
        measured = [m for m in map(forecast.Measured.of, base.get("summaries") or []) if m is not None]
        if rate is None or not measured or not cell.get("step_ms"):
            continue
        ms = 1e3 * statistics.median(forecast.step_s(m, forecast.Link(rate)) for m in measured)
        found[tag] = {"forecast_ms": ms, "measured_ms": cell["step_ms"], "error": ms / cell["step_ms"] - 1}
    return found


def ratios(table: Dict[str, Dict[str, Any]], links: Sequence[str]) -> Dict[str, Optional[float]]:
    """The ratios the targets read, at every link: the API over its port (synthetic, small-tensors), ddp_train over
    the bare loop, hvd_train over Horovod/Gloo's own benchmark (synthetic)."""
    pairs = {**LINK_TARGETS, "api/port small-tensors": ("small-tensors-api", "small-tensors-port")}
    found: Dict[str, Optional[float]] = {}
    for link in links:
        for name, (a, b) in pairs.items():
            top, bottom = table.get(f"{a}-{link}"), table.get(f"{b}-{link}")
            found[f"{name} @{link}"] = top["median"] / bottom["median"] if top and bottom and bottom["median"] \
                else None
    return found


def cells_of(programs: Sequence[str], backends: Sequence[str], loops: Sequence[str], links: Sequence[str]) -> \
        List[Cell]:
    """Every (program, backend) at every link, link by link."""
    pairs = [(p, b) for p in programs if p != "loop" for b in backends] + \
        [("loop", b) for b in (loops if "loop" in programs else ())]
    return [Cell(p, b, link) for link in links for p, b in pairs]


def run_cells(cells: List[Cell], plan: Plan, repeats: int, failures: List[Dict[str, Any]]) -> None:
    """Every cell once a repeat, interleaved, each under its link setting (undone after it, however it ends)."""
    for job, (repeat, cell) in enumerate(schedule(cells, repeats)):
        try:
            with shaped(link_ends(), SETTINGS[cell.link]):
                got = measure(cell, plan, repeat, DEFAULT_PORT + job % 50)
        except JobFailed as exc:
            print(f"{PROG}: FAILED {cell.tag} repeat {repeat}: {str(exc).splitlines()[0]}", file=sys.stderr,
                  flush=True)
            failures.append({"backend": cell.backend, "label": cell.program, "case": cell.link, "repeat": repeat,
                             "error": str(exc)[-2000:]})
            continue
        plan.results.setdefault(cell.tag, []).append({"program": cell.program, "backend": cell.backend,
                                                       "link": cell.link, **vars(got)})
        share = f", {100 * got.comm_frac:.0f}% exposed communication" if got.comm_frac is not None else ""
        print(f"{PROG}: {cell.tag} repeat {repeat}: {got.img_s:.2f} img/s{share}", flush=True)


def prepare_scripts(script: Path, logs: Path, backends: Sequence[str]) -> Dict[str, Dict[str, str]]:
    """The scripts each program runs under each backend: the Horovod script itself, and under `port` its port
    (python -m ddp_train.port); JobFailed where the port fails."""
    logs.mkdir(parents=True, exist_ok=True)
    small = (logs / "small_tensors_horovod.py").resolve()
    small.write_text(SMALL_TENSORS_SCRIPT)
    scripts = {"synthetic": script.resolve(), "small-tensors": small}
    by_backend: Dict[str, Dict[str, str]] = {}
    for program, path in scripts.items():
        by_backend[program] = {b: str(path) for b in backends}
        if "port" in backends:
            ported = logs / f"{path.stem}_ported.py"
            run_job([sys.executable, "-m", "ddp_train.port", str(path), "-o", str(ported)],
                    logs / f"{PROG}-port-{program}.log", 120)
            by_backend[program]["port"] = str(ported.resolve())
    return by_backend


def plot(report: Dict[str, Any], out: Path) -> str:
    """link_speed.png: per program, images/s against the link setting, a line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.compare import speed_plots

    links = list(report["links"])
    programs = [p for p in PROGRAMS if any(c["program"] == p for c in report["cells"].values())] or ["nothing"]
    fig, axes = plt.subplots(1, len(programs), figsize=(4.6 * len(programs), 3.8), squeeze=False)
    for ax, program in zip(axes[0], programs, strict=True):
        backends = sorted({c["backend"] for c in report["cells"].values() if c["program"] == program})
        for backend in backends:
            medians = [report["cells"].get(f"{program}-{backend}-{link}", {}).get("median") for link in links]
            ax.plot(range(len(links)), [m if m is not None else float("nan") for m in medians], marker="o",
                    label=backend)
        ax.set_xticks(range(len(links)), [report["links"][link]["shown"] for link in links])
        ax.set(title=program, xlabel="link", ylabel="images/s (2 ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(figure_title(report), fontsize=9)
    return speed_plots.save(fig, out / f"{PROG}.png", dpi=100)


def on_the_first_host(argv: List[str]) -> int:
    """Run this benchmark on node0, bringing the simulated hosts up for it (and down after) where they are not."""
    cluster = [sys.executable, str(REPO / "tests" / "cluster.py")]
    brought_up = not hosts_up()
    if brought_up:
        up = subprocess.run([*cluster, "up"], cwd=REPO, capture_output=True, text=True, check=False)
        if up.returncode != 0:
            return refuse(PROG, f"the simulated hosts did not come up: {(up.stderr or up.stdout).strip()[-300:]}")
    try:
        return subprocess.run(on_host(HOSTS[0], [sys.executable, "-m", f"benchmarks.{PROG}", *argv]),
                              cwd=REPO).returncode
    finally:
        if brought_up:
            subprocess.run([*cluster, "down"], cwd=REPO, check=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure every cell at every link setting; exit 1 when a run failed (the rest is written), 2 on bad input."""
    p = parser(PROG, __doc__)
    p.add_argument("--script", type=Path, required=True,
                   help="Horovod's examples/pytorch/pytorch_synthetic_benchmark.py (from a Horovod checkout)")
    p.add_argument("--links", type=csv_list(str, tuple(SETTINGS)), default=",".join(SETTINGS),
                   help=f"link settings, of {', '.join(SETTINGS)}")
    p.add_argument("--programs", type=csv_list(str, PROGRAMS), default=",".join(PROGRAMS))
    p.add_argument("--backends", type=csv_list(str, tuple(SCRIPT_BACKENDS)), default=",".join(SCRIPT_BACKENDS))
    p.add_argument("--loops", type=csv_list(str, tuple(LOOPS)), default=",".join(LOOPS))
    p.add_argument("--repeats", type=int, default=3, help="runs of every cell, interleaved")
    p.add_argument("--batch-size", type=int, default=8, help="images per rank and step (resnet18 at 224)")
    p.add_argument("--steps", type=int, default=5, help="timed steps of every run (after 2 warm-up steps)")
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="do not run each script run again under the probe (no exposed share for the scripts)")
    add_timeout(p, 900.0)
    add_out(p, "where link_speed.json goes")
    args = p.parse_args(argv)
    if not args.script.is_file():
        return refuse(PROG, f"{args.script}: no such file; give Horovod's "
                            "examples/pytorch/pytorch_synthetic_benchmark.py")
    if not on_node0():  # a job starts on the first host, as a user starts it
        return on_the_first_host(list(sys.argv[1:] if argv is None else argv))
    record = Record(PROG, argv)
    logs = args.out / "logs"
    try:
        scripts = prepare_scripts(args.script, logs, args.backends)
    except JobFailed as exc:
        return refuse(PROG, f"python -m ddp_train.port failed: {str(exc).splitlines()[0]}")
    script_args = ["--model", "resnet18", "--batch-size", str(args.batch_size), "--no-cuda", "--num-warmup-batches",
                   "2", "--num-batches-per-iter", "1", "--num-iters", str(args.steps)]
    loop_args = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "224", "--batch-size",
                 str(args.batch_size), "--max-steps", str(args.steps + 2), "--threads", "1"]
    plan = Plan(scripts, script_args, loop_args, logs, args.timeout, args.probe)
    failures: List[Dict[str, Any]] = []
    try:
        run_cells(cells_of(args.programs, args.backends, args.loops, args.links), plan, args.repeats, failures)
    except ShapingRefused as refused:
        return refuse(PROG, str(refused))
    table = summarize(plan)
    links = {name: {"rate_bits": SETTINGS[name].rate_bits, "shown": SETTINGS[name].describe()}
             for name in args.links}
    report = {**record.header(), "np": 2, "hosts": list(HOSTS), "threads_per_rank": 1, "model": "resnet18",
              "image_size": 224, "batch_size": args.batch_size, "steps": args.steps, "links": links,
              "repeats": args.repeats, "probed": args.probe, "script_args": script_args, "loop_args": loop_args,
              "cells": table,
              "ratios": ratios(table, args.links), "forecasts": forecasts(table, args.links), "failures": failures,
              "cores": cores()}
    plot(report, args.out)
    return publish(report, args.out / f"{PROG}.json")


if __name__ == "__main__":
    sys.exit(run_cli(main, f"benchmarks.{PROG}"))
