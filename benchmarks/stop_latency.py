"""How long a first Ctrl-C (SIGINT to the launcher's process group) takes to end a training job whose steps take
seconds, per launcher: the last rank's and the launcher's exit, and whether the final checkpoint is the step the job
stopped at. The bound is 15 s plus one step.

    python -m benchmarks.stop_latency --out benchmarks/results
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from common import launch
from common.compare.arguments import csv_list
from common.rundir.reader import events_so_far

from .jobs import add_np, add_places, add_timeout, job_env, parser, run_cli
from .machine import REPO, Record

LAUNCHERS = tuple(launcher.name for launcher in launch.host_launchers())
#: every rank gone within this much after the signal, plus one step
BOUND_S = 15.0


def steps(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in events_so_far(run_dir) if e["event"] == "step"]


def measure(name: str, np: int, train_args: list[str], work: Path, steps_before: int, timeout_s: float) -> dict:
    """One launcher: start, wait for `steps_before` steps, Ctrl-C, time the end."""
    launcher, run_dir = launch.get(name), work / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous run's steps must not count as this one's
    cmd = launcher.command(np, [*train_args, "--log-every", "1", "--run-dir", str(run_dir)])
    with launch.Job(cmd, env=job_env(), cwd=REPO, log=work / f"{name}.log") as job:
        if not job.wait_until(lambda: len(steps(run_dir)) >= steps_before, timeout_s):
            job.stop()
            raise RuntimeError(f"{name}: no {steps_before} steps within {timeout_s:.0f} s:\n{job.output[-2000:]}")
        logged = steps(run_dir)
        step_s = max(e["step_s"] for e in logged[1:]) if len(logged) > 1 else logged[0]["step_s"]
        ranks = [proc for proc in job.family() if launch.runs_module(proc, [launcher.module])]
        if len(ranks) != np:
            job.stop()
            raise RuntimeError(f"{name}: found {len(ranks)} training processes, expected {np}")
        sent = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        while time.monotonic() - sent < timeout_s and launch.still_running(ranks):
            time.sleep(0.05)
        ranks_s = None if launch.still_running(ranks) else time.monotonic() - sent
        try:
            code = job.wait(timeout=max(1.0, timeout_s - (time.monotonic() - sent)))
        except launch.JobTimeout:
            code = None
        launcher_s = time.monotonic() - sent
    events = events_so_far(run_dir)
    stopped = next((e["step"] for e in events if e["event"] == "stopped"), None)
    return {"launcher": name, "world_size": np, "step_s": step_s, "ranks_exit_s": ranks_s,
            "launcher_exit_s": launcher_s, "exit_code": code, "stopped_step": stopped, "bound_s": BOUND_S + step_s,
            "checkpoint_written": stopped is not None and stopped in [e["step"] for e in events
                                                                       if e["event"] == "checkpoint"],
            "within_bound": ranks_s is not None and ranks_s <= BOUND_S + step_s}


def main(argv: Sequence[str] | None = None) -> int:
    """Stop a job under every launcher; exit 1 when one could not be measured, 2 on bad input."""
    p = parser("stop_latency", __doc__)
    p.add_argument("--launchers", type=csv_list(str, LAUNCHERS), default=",".join(LAUNCHERS),
                   help=f"comma-separated, from {', '.join(LAUNCHERS)}")
    add_np(p, 2, "ranks per job")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps-before", type=int, default=2, help="steps logged before the signal")
    add_timeout(p, 300, "seconds each phase may take before it fails")
    add_places(p, "runs/bench-stop")
    args = p.parse_args(argv)
    record = Record("stop_latency", argv)
    # Epochs enough that no job ends by itself before the signal, however short its steps.
    train_args = ["--model", args.model, "--dataset", "synthetic", "--image-size", str(args.image_size),
                  "--synthetic-samples", str((args.steps_before + 20) * args.batch_size * args.np),
                  "--batch-size", str(args.batch_size), "--epochs", "1000", "--threads", str(args.threads)]
    rows, failures = [], []
    for name in args.launchers:
        print(f"stop_latency: {name} ...", flush=True)
        try:
            rows.append(measure(name, args.np, train_args, args.work, args.steps_before, args.timeout))
        except RuntimeError as exc:
            failures.append({"launcher": name, "error": str(exc)[-2000:]})
    settings = {"np": args.np, "train_args": train_args, "steps_before": args.steps_before,
                "bound": f"{BOUND_S:g} s + one step"}
    return record.publish(args.out, settings=settings, rows=rows, failures=failures)


if __name__ == "__main__":
    sys.exit(run_cli(main, "stop_latency"))
