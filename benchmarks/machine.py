"""What every benchmark result records about where it ran (CPU model, cores, GPU, versions,
load), and the small output helpers the scripts share (result JSON, text table)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Dict, List, Optional

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


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load() -> Dict[str, float]:
    """1, 5 and 15 minute load averages: other work on the machine disturbs timings."""
    one, five, fifteen = os.getloadavg()
    return {"1m": round(one, 2), "5m": round(five, 2), "15m": round(fifteen, 2)}


def machine() -> Dict:
    """The machine a result was measured on."""
    import torch

    from common.rundir import versions

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"host": platform.node(), "cpu_model": cpu_model(), "cores": cores(), "memory_gib": mem_gib,
            "gpus": gpus, "versions": versions()}


def under_load(load_before: Dict[str, float], n_cores: int) -> bool:
    """True when something besides the benchmark kept the cores busy: the 1-minute load before it
    started was above a quarter of the cores (its own processes raise the load after)."""
    return load_before["1m"] > 0.25 * n_cores


def write_json(path: Path, data: Dict) -> None:
    """Write a result atomically (a reader never sees half a file)."""
    from common.rundir import json_safe

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def print_table(headers: List[str], rows: List[List], file=sys.stdout) -> None:
    """A plain aligned text table."""
    text = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)), file=file)
    for row in text:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=file)


def csv_ints(text: str) -> List[int]:
    """'1,2,4' -> [1, 2, 4] (argparse type), each >= 1."""
    import argparse

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give world sizes >= 1, e.g. 1,2,4")
    return values
