"""How long a first Ctrl-C takes to end a training job, under every launcher, when steps take seconds.

Each launcher starts a job whose steps take seconds (by default resnet18 on 224x224 synthetic images,
batch 24, one thread per rank); after a few steps the launcher's process group gets SIGINT, as a
terminal's Ctrl-C sends it. Measured: the longest step before the signal, when the last rank exited,
when the launcher exited, and whether the final checkpoint is the step the job stopped at. The bound
the job must meet is 15 s plus one step.

    python -m benchmarks.stop_latency --out benchmarks/results

Writes DIR/stop_latency.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common import launch
from common.compare import tables
from common.errors import print_error
from common.rundir.reader import events_so_far

from .jobs import add_np, add_places, add_timeout, job_env, run_cli
from .machine import REPO, Record, publish

LAUNCHERS = tuple(l.name for l in launch.host_launchers())
#: what the job must meet: every rank gone within this much after the signal, plus one step
BOUND_S = 15.0


def measure(name: str, np: int, train_args: List[str], work: Path, steps_before: int,
            timeout_s: float) -> Dict:
    """One launcher: start, wait for `steps_before` steps, Ctrl-C, time the end."""
    launcher = launch.get(name)
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous run's steps must not count as this one's
    cmd = launcher.command(np, [*train_args, "--log-every", "1", "--run-dir", str(run_dir)])
    with launch.Job(cmd, env=job_env(), cwd=REPO, log=work / f"{name}.log") as job:
        if not job.wait_until(lambda: len([e for e in events_so_far(run_dir) if e["event"] == "step"]) >= steps_before,
                              timeout_s):
            job.stop()
            raise RuntimeError(f"{name}: no {steps_before} steps within {timeout_s:.0f} s:\n{job.output[-2000:]}")
        steps = [e for e in events_so_far(run_dir) if e["event"] == "step"]
        step_s = max(e["step_s"] for e in steps[1:]) if len(steps) > 1 else steps[0]["step_s"]
        ranks = [proc for proc in job.family() if launch.runs_module(proc, [launcher.module])]
        if len(ranks) != np:
            job.stop()
            raise RuntimeError(f"{name}: found {len(ranks)} training processes, expected {np}")
        sent = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        ranks_s = None
        while time.monotonic() - sent < timeout_s:
            if not launch.still_running(ranks):
                ranks_s = time.monotonic() - sent
                break
            time.sleep(0.05)
        try:
            code = job.wait(timeout=max(1.0, timeout_s - (time.monotonic() - sent)))
        except launch.JobTimeout:
            code = None
        launcher_s = time.monotonic() - sent
    events = events_so_far(run_dir)
    stopped = [e for e in events if e["event"] == "stopped"]
    checkpoints = [e["step"] for e in events if e["event"] == "checkpoint"]
    stopped_step = stopped[0]["step"] if stopped else None
    return {"launcher": name, "world_size": np, "step_s": step_s, "ranks_exit_s": ranks_s,
            "launcher_exit_s": launcher_s, "exit_code": code, "stopped_step": stopped_step,
            "checkpoint_written": stopped_step is not None and stopped_step in checkpoints,
            "bound_s": BOUND_S + step_s,
            "within_bound": ranks_s is not None and ranks_s <= BOUND_S + step_s}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stop_latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launchers", default=",".join(LAUNCHERS), help=f"comma-separated, from {', '.join(LAUNCHERS)}")
    add_np(p, 2, "ranks per job")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps-before", type=int, default=2, help="steps logged before the signal")
    add_timeout(p, 300, "seconds each phase may take before it fails")
    add_places(p, "runs/bench-stop")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n for n in args.launchers.split(",") if n]
    unknown = [n for n in names if n not in LAUNCHERS]
    if unknown or not names:
        print_error("stop_latency", f"unknown launcher {', '.join(unknown) or '(none)'}; choose from "
                    f"{', '.join(LAUNCHERS)}", ranked=False)
        return 2
    record = Record("stop_latency", argv)
    # Epochs enough that no job ends by itself before the signal, however short its steps.
    samples = (args.steps_before + 20) * args.batch_size * args.np
    train_args = ["--model", args.model, "--dataset", "synthetic", "--image-size", str(args.image_size),
                  "--synthetic-samples", str(samples), "--batch-size", str(args.batch_size), "--epochs", "1000",
                  "--threads", str(args.threads)]
    rows, failures = [], []
    for name in names:
        print(f"stop_latency: {name} ...", flush=True)
        try:
            rows.append(measure(name, args.np, train_args, args.work, args.steps_before, args.timeout))
        except RuntimeError as exc:
            failures.append({"launcher": name, "error": str(exc)[-2000:]})
    report = {**record.header(), "settings": {"np": args.np, "train_args": train_args,
                                              "steps_before": args.steps_before, "bound": f"{BOUND_S:g} s + one step"},
              "rows": rows, "failures": failures}
    table = tables.text(["launcher", "step s", "ranks gone s", "launcher gone s", "bound s", "checkpoint"],
                        [[r["launcher"], f"{r['step_s']:.1f}", tables.number(r["ranks_exit_s"], ".1f"),
                          f"{r['launcher_exit_s']:.1f}", f"{r['bound_s']:.1f}",
                          f"step {r['stopped_step']}" if r["checkpoint_written"] else "none"] for r in rows])
    return publish(report, args.out / "stop_latency.json", table)


if __name__ == "__main__":
    sys.exit(run_cli(main, "stop_latency"))
