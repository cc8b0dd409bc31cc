"""What every benchmark result records about where and how it ran (CPU model, cores, GPUs, versions, how busy
the CPU was, the command), and writing a result."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from common.compare.conditions import conditions
from common.launch.placement import cores

REPO = Path(__file__).resolve().parents[1]
#: the share of all cores' time other programs may keep busy before a result counts as measured under load
BUSY_LIMIT = 0.25


def cpu_model() -> str | None:
    """The `model name` line of /proc/cpuinfo (Linux), else platform.processor()."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    named = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return named[0] if named else platform.processor() or None


def mpi_version() -> str | None:
    """The first line of `mpirun --version` ("mpirun (Open MPI) 4.1.4"), None without an mpirun."""
    try:
        done = subprocess.run([shutil.which("mpirun") or "mpirun", "--version"], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def load() -> dict[str, float]:
    """1, 5 and 15 minute load averages: other work on the machine disturbs timings."""
    return dict(zip(("1m", "5m", "15m"), (round(x, 2) for x in os.getloadavg()), strict=True))


def cpu_busy(seconds: float = 1.0) -> float | None:
    """The share of all cores' time that was busy over the next `seconds`, while this process sleeps: other
    programs' use now (the load average remembers the last minute). None where /proc/stat is missing."""
    def busy_and_total() -> tuple[int, int] | None:  # jiffies of all cores since boot, from /proc/stat's cpu line
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        return sum(fields) - fields[3] - fields[4], sum(fields)  # less idle and waiting on I/O

    before = busy_and_total()
    time.sleep(seconds)
    after = busy_and_total()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def under_load(load_before: dict[str, float], n_cores: int, busy_before: float | None = None) -> bool:
    """Whether something besides the benchmark kept the cores busy: more than BUSY_LIMIT of all cores' time in the
    second before it started; where that was not measured, a 1-minute load above a quarter of the cores."""
    return busy_before > BUSY_LIMIT if busy_before is not None else load_before["1m"] > 0.25 * n_cores


def machine() -> dict[str, Any]:
    """The machine a result was measured on."""
    import torch

    from common.rundir.records import versions

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {"host": platform.node(), "cpu_model": cpu_model(), "cores": cores(), "memory_gib": memory,
            "gpus": gpus, "versions": {**versions(), "mpi": mpi_version()}}


class Record:
    """The fields every result shares, started with the measurement: the machine and the code measured (a commit
    made while it runs is not in it), the load before and after, the exact command."""

    def __init__(self, benchmark: str, argv: Sequence[str] | None) -> None:
        self.benchmark = benchmark
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.busy_before = cpu_busy()  # before its own start-up work: another program's use
        self.started, self.load_before, self.machine = time.time(), load(), machine()

    def header(self) -> dict[str, Any]:
        """The result's common fields."""
        return {"benchmark": self.benchmark, "started": self.started, "machine": self.machine,
                "command": " ".join(["python", "-m", f"benchmarks.{self.benchmark}", *self.argv]),
                "cpu_busy_before": self.busy_before, "load_before": self.load_before, "load_after": load(),
                "under_load": under_load(self.load_before, cores(), self.busy_before)}

    def publish(self, out: Path, **fields: Any) -> int:
        """Publish the result of the common fields and `fields` as OUT/<benchmark>.json."""
        return publish({**self.header(), **fields}, out / f"{self.benchmark}.json")


def figure_title(report: dict[str, Any]) -> str:
    """The machine line a benchmark figure carries."""
    loaded = " (under load)" if report.get("under_load") else ""
    return f"{report['machine']['cpu_model']}, {report['machine']['cores']} cores{loaded}"


def publish(report: dict[str, Any], path: Path) -> int:
    """Write a result atomically (a reader never sees half a file) and print its section of BENCHMARKS.md, with a
    note when it was measured under load; the exit code: 1 when some of the measurement failed (the rest is
    written), else 0."""
    from common.rundir.writer import json_safe

    from .sections import section  # what a result shows; it measures nothing (benchmarks.stale)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_safe(report), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    print(section(report))
    if report.get("under_load"):
        print(f"note: measured under load ({conditions(report)}, on {report['machine']['cores']} cores)")
    print(f"{report['benchmark']}: wrote {path.resolve()}")
    return 1 if report.get("failures") else 0
