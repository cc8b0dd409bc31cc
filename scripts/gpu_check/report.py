"""The check's report: the lines it prints as it goes, and at the end gpu_check.json with the logs' archive beside
it (docs/gpu-check.md#the-json)."""

from __future__ import annotations

import datetime
import json
import tarfile
from collections.abc import Sequence
from typing import Any

from .clock import Clock
from .context import Findings
from .record import StepRecord
from .settings import PROG, Settings


def print_line(text: str) -> None:
    """One line of the check's progress, as it happens."""
    print(f"[{PROG}] {text}", flush=True)


def start_line(settings: Settings) -> str:
    """What the check is about to do."""
    return (f"{settings.device}: steps {','.join(settings.only)}; budget {settings.budget:.0f} s; "
            f"work in {settings.work}")


def step_line(record: StepRecord) -> str:
    """What became of a step, in a line: its outcome and time, then its error, why it was skipped, or the main of
    what it measured."""
    text = f"{record.name}: {record.outcome} in {record.seconds:.1f} s"
    if record.error:
        return f"{text}: {record.error}"
    if record.reason:
        return f"{text} ({record.reason})"
    r = record.result
    if record.name == "install":
        text += f": {r.get('method')}" + (f" ({r['pip_error']})" if r.get("pip_error") else "")
    if "samples_per_s" in r and r["samples_per_s"]:
        text += f": {r['process_group']}, {r['devices']}, {r['samples_per_s']:.0f} samples/s"
    if "repeat_identical" in r:
        text += f": repeat identical {r['repeat_identical']}, across world sizes {r['world_sizes_identical']}"
    if "img_sec_total" in r:
        text += f": {r['size']} worker(s), {r['img_sec_total']:.0f} img/s"
    if "verdicts" in r:
        text += f": {r['verdicts']}"
    return text


def step_json(record: StepRecord) -> dict[str, Any]:
    """A step as gpu_check.json's `steps` have it."""
    found: dict[str, Any] = {
        "name": record.name, "issue_step": record.spec.issue_step, "required": record.spec.required,
        "outcome": record.outcome, "started_s": record.started_s, "seconds": round(record.seconds, 2),
        "limit_s": record.limit_s, "commands": record.commands, "error": record.error, "result": record.result,
        "log": record.log}
    if record.reason:
        found["reason"] = record.reason
    return found


def write(settings: Settings, found: Findings, records: Sequence[StepRecord], interrupted: str | None,
          clock: Clock) -> int:
    """gpu_check.json and gpu_check_logs.tar.gz in the out folder, and the verdict's line: the exit code, 0 when
    every required step ran well and nothing interrupted the check, else 1."""
    failed = [record.name for record in records if record.spec.required and record.failed]
    ok = not failed and interrupted is None
    wall_s = round(clock.since_start(), 2)
    check = {"check": "scripts/gpu_check.sh", "device": settings.device, "rehearsal": settings.rehearsal,
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "ok": ok, "failed": failed, "interrupted": interrupted,
             "wall_s": wall_s, "budget_s": settings.budget, "world_size": found.nproc,
             "install": found.install_method, "versions": found.versions, "compat": found.compat,
             "forced_failures": list(settings.force_fail), "steps": [step_json(record) for record in records]}
    path = settings.out / "gpu_check.json"
    path.write_text(json.dumps(check, indent=2) + "\n")
    logs = settings.work / "logs"
    if logs.is_dir():
        with tarfile.open(settings.out / "gpu_check_logs.tar.gz", "w:gz") as tar:
            tar.add(logs, arcname="logs")
    verdict = "ok" if ok else f"FAILED: {', '.join(failed) or interrupted}"
    print_line(f"{verdict} in {wall_s:.0f} s; {path}")
    return 0 if ok else 1
