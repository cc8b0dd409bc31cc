"""`bash scripts/gpu_check.sh [--prepare]`: the settings, the run, gpu_check.json and the logs, the exit code."""

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import fields
from pathlib import Path

from .context import PROG, Context, Settings, carry_folder, refuse
from .horovod import HOROVOD_VERSION
from .runner import NAMES, STEPS, Runner, print_line


def main() -> int:
    """The check, or --prepare; the exit code: 0 when every step that should work did, 1 otherwise, 2 a bad setting."""
    args = sys.argv[1:]
    if args == ["--prepare"]:
        return prepare(carry_folder(os.environ))
    if args:
        refuse(f"unknown arguments {' '.join(args)}; the check takes none but --prepare (its settings are "
               "GPU_CHECK_* variables: docs/gpu-check.md)")
    settings = Settings.from_environ(os.environ, sys.executable, NAMES)
    # SIGTERM as SIGINT: the runner stops every command and the record is still written
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shutil.rmtree(settings.work, ignore_errors=True)
    settings.work.mkdir(parents=True)
    settings.out.mkdir(parents=True, exist_ok=True)
    print_line(f"{settings.device}: steps {','.join(settings.only)}; budget {settings.budget:.0f} s; "
               f"work in {settings.work}")
    runner = Runner(STEPS, Context(settings), settings.budget)
    return write(runner, runner.run())


def write(runner: Runner, interrupted: str | None) -> int:
    """gpu_check.json and gpu_check_logs.tar.gz in the out folder, and the verdict's line; the exit code."""
    ctx, settings, records = runner.ctx, runner.ctx.settings, [(s, runner.records[s.name]) for s in runner.specs]
    failed = [spec.name for spec, record in records if spec.required and record.failed]
    ok, wall_s = not failed and interrupted is None, round(time.monotonic() - runner.start, 2)
    steps = [{"name": r.name, "issue_step": spec.issue_step, "required": spec.required,
              **{f.name: getattr(r, f.name) for f in fields(r)[1:] if f.name != "reason" or r.reason},
              "seconds": round(r.seconds, 2)} for spec, r in records]  # the record's fields in order, its reason if any
    check = {"check": "scripts/gpu_check.sh", "device": settings.device, "rehearsal": settings.device == "cpu",
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "ok": ok, "failed": failed, "interrupted": interrupted, "wall_s": wall_s, "budget_s": settings.budget,
             "world_size": ctx.nproc, "install": ctx.install_method, "versions": ctx.versions, "compat": ctx.compat,
             "forced_failures": list(settings.force_fail), "steps": steps}
    path = settings.out / "gpu_check.json"
    path.write_text(json.dumps(check, indent=2) + "\n")
    if (settings.work / "logs").is_dir():
        with tarfile.open(settings.out / "gpu_check_logs.tar.gz", "w:gz") as tar:
            tar.add(settings.work / "logs", arcname="logs")
    print_line(f"{'ok' if ok else 'FAILED: ' + (', '.join(failed) or str(interrupted))} in {wall_s:.0f} s; {path}")
    return 0 if ok else 1


def prepare(carry: Path) -> int:
    """Horovod's source, and cffi and pycparser (build_horovod.sh installs cffi) downloaded into `carry`."""
    carry.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps"]
    for cmd in ([*pip, "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}", "-d", str(carry)],
                [*pip, "--only-binary", ":all:", "--python-version", os.environ.get("GPU_CHECK_CARRY_PYTHON", "3.12"),
                 "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform",
                 "manylinux2014_x86_64", "cffi", "pycparser", "-d", str(carry)]):
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"{PROG}: error: {' '.join(cmd[3:5])} failed (above)", file=sys.stderr)
            return 1
    size = sum(p.stat().st_size for p in carry.iterdir() if p.is_file())
    print_line(f"{carry}: {', '.join(sorted(p.name for p in carry.iterdir()))} ({size / 2**20:.1f} MiB)")
    return 0
