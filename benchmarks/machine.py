"""What every benchmark result records about where and how it ran (CPU model, cores, GPU, versions,
how busy the CPU was, command), and writing a result."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from common.compare.conditions import conditions
from common.launch.placement import cores  # noqa: F401  (the scripts import it from here)

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> Optional[str]:
    """The `model name` line of /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def mpi_version() -> Optional[str]:
    """The first line of `mpirun --version` ("mpirun (Open MPI) 4.1.4"), None without an mpirun."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        done = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0] if done.returncode == 0 and lines else None


def load() -> Dict[str, float]:
    """1, 5 and 15 minute load averages: other work on the machine disturbs timings."""
    one, five, fifteen = os.getloadavg()
    return {"1m": round(one, 2), "5m": round(five, 2), "15m": round(fifteen, 2)}


#: the share of all cores' time other programs may keep busy before a result counts as measured under load
BUSY_LIMIT = 0.25


def _cpu_times() -> Optional[Tuple[int, int]]:
    """(busy, total) jiffies of all cores since boot from /proc/stat's cpu line; None where there is none."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle and waiting on I/O
    return sum(fields) - idle, sum(fields)


def cpu_busy(seconds: float = 1.0) -> Optional[float]:
    """The share of all cores' time that was busy over the next `seconds`, while this process sleeps: other
    programs' use, now (the load average remembers the last minute, so it still shows a run that has ended).
    None where /proc/stat is missing."""
    before = _cpu_times()
    time.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def machine() -> Dict:
    """The machine a result was measured on."""
    import torch

    from common.rundir.records import versions

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"host": platform.node(), "cpu_model": cpu_model(), "cores": cores(), "memory_gib": mem_gib,
            "gpus": gpus, "versions": {**versions(), "mpi": mpi_version()}}


def under_load(load_before: Dict[str, float], n_cores: int, busy_before: Optional[float] = None) -> bool:
    """True when something besides the benchmark kept the cores busy: in the second before it started, more than
    BUSY_LIMIT of all cores' time was busy; where that was not measured, the 1-minute load before it started was
    above a quarter of the cores (its own processes raise the load after)."""
    if busy_before is not None:
        return busy_before > BUSY_LIMIT
    return load_before["1m"] > 0.25 * n_cores


class Record:
    """The part every result shares: started with the measurement (time, load before), finished into
    the result's header (benchmark name, machine, exact command, load before and after)."""

    def __init__(self, benchmark: str, argv: Optional[Sequence[str]]) -> None:
        self.benchmark = benchmark
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.busy_before = cpu_busy()  # before its own start-up work: another program's use
        self.started = time.time()
        self.load_before = load()
        self.machine = machine()  # the code and versions measured: a commit during the measurement is not in it

    def header(self) -> Dict:
        """The result's common fields: the machine and load as the measurement started, the load after it."""
        return {"benchmark": self.benchmark, "started": self.started, "machine": self.machine,
                "command": f"python -m benchmarks.{self.benchmark} " + " ".join(self.argv),
                "cpu_busy_before": self.busy_before, "load_before": self.load_before, "load_after": load(),
                "under_load": under_load(self.load_before, cores(), self.busy_before)}


def load_note(report: Dict) -> Optional[str]:
    """A line saying the result was measured under load, None when it was not."""
    if not report.get("under_load"):
        return None
    return f"note: measured under load ({conditions(report)}, on {report['machine']['cores']} cores)"


def figure_title(report: Dict) -> str:
    """The machine line a benchmark figure carries."""
    loaded = " (under load)" if report.get("under_load") else ""
    return f"{report['machine']['cpu_model']}, {report['machine']['cores']} cores{loaded}"


def write_json(path: Path, data: Dict) -> None:
    """Write a result atomically (a reader never sees half a file)."""
    from common.rundir.writer import json_safe

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def publish(report: Dict, path: Path, table: str) -> int:
    """Write a result and print its table, with a note when it was measured under load; the exit code:
    1 when some of the measurement failed (the rest is written), else 0."""
    write_json(path, report)
    print(table)
    note = load_note(report)
    if note:
        print(note)
    return 1 if report.get("failures") else 0
