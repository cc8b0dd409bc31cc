"""How BENCHMARKS.md shows numbers, labels and settings, and what frames every table: the command that
wrote its result and the file it came from (or the note that the file is not there yet)."""

from __future__ import annotations

import math
import shlex
from datetime import datetime, timezone
from typing import Callable, Dict, List, Optional, Sequence

from common.compare import tables
from common.compare.conditions import conditions

from .result_files import MISSING_FILE, Results

#: how a series or run label reads in the tables
NAMES = {"torch-gloo": "torch gloo", "horovod-gloo": "Horovod/Gloo", "horovod-mpi": "Horovod/MPI",
         "mpi": "Open MPI alone", "ddp": "DDP", "bare-ddp": "bare DDP (seed)",
         "bare-ddp-batched": "bare DDP (batched)", "independent": "independent N x 1"}

# ---- numbers as the document shows them ----

def rounded(value: Optional[float], digits: int = 3) -> str:
    """`digits` significant digits without an exponent: 2162.8 -> "2163", 15.43 -> "15.4", 0.1362 -> "0.136"."""
    if value is None or not math.isfinite(value):
        return tables.MISSING
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def ms(seconds: Optional[float]) -> str:
    """Seconds as milliseconds, two significant digits: "0.14 ms", "15 ms", "218 ms"."""
    return tables.MISSING if seconds is None else f"{rounded(seconds * 1e3, 2)} ms"


def spread_cell(cell: Optional[Dict]) -> str:
    """A throughput cell: median (min–max), three significant digits."""
    if not cell:
        return tables.MISSING
    decimals = max(0, 2 - math.floor(math.log10(abs(cell["median"])))) if cell["median"] else 0
    return tables.measured(cell["median"], cell["min"], cell["max"], f".{decimals}f")


def when(result: Dict) -> str:
    """The UTC day a result was measured, "–" when it does not say."""
    started = result.get("started")
    return datetime.fromtimestamp(started, tz=timezone.utc).strftime("%Y-%m-%d") if started else tables.MISSING


# ---- what every table carries: its command and its source ----

def command_block(result: Dict, width: int = 100) -> str:
    """The command that wrote a result, wrapped between options (an option stays with its values)."""
    groups: List[str] = []
    for word in shlex.split(result["command"]):
        piece = shlex.quote(word)
        if groups and not word.startswith("-"):
            groups[-1] += " " + piece
        else:
            groups.append(piece)
    lines = [""]
    for group in groups:
        if lines[-1] and len(lines[-1]) + len(group) + 1 > width:
            lines[-1] += " \\"
            lines.append("    " + group)
        else:
            lines[-1] = f"{lines[-1]} {group}" if lines[-1] else group
    return "```bash\n" + "\n".join(lines) + "\n```"


def source_line(results: Results, name: str) -> str:
    """Which file the numbers above come from, when they were measured and under what load."""
    result = results.get(name)
    loaded = ", **under load**" if result.get("under_load") else ""
    return f"Source: `{results.path(name)}` (measured {when(result)}, {conditions(result)}{loaded})."


def framed(results: Results, names: Sequence[str], body: Callable[[], str]) -> str:
    """The commands, the block's body and its sources; the missing-file note instead when a file is not there."""
    missing = [n for n in names if results.get(n) is None]
    if missing:
        return "\n\n".join(MISSING_FILE.format(path=results.path(n)) for n in missing)
    commands = "\n\n".join(command_block(results.get(n)) for n in names)
    sources = " ".join(source_line(results, n) for n in names)
    return f"{commands}\n\n{body()}\n\n{sources}"


def setting(case: Dict) -> str:
    """What a throughput case set: "no knob set", "HOROVOD_CYCLE_TIME unset (auto)", "HOROVOD_CYCLE_TIME=5"."""
    if case.get("knob") is None:
        return "no knob set"
    if case["value"] == "auto":
        return f"{case['knob']} unset (auto)"
    return f"{case['knob']}={case['value']}"


def met(ok: Optional[bool]) -> str:
    """Whether a target or bound was met: yes, no, or not measured."""
    return "not measured" if ok is None else "yes" if ok else "no"


def row_at(series: Dict, nbytes: int) -> Optional[Dict]:
    """An allreduce series' row at `nbytes`, None when it was not measured."""
    return next((r for r in series["results"] if r["bytes"] == nbytes), None)


def failed_case(failure: Dict) -> str:
    """What a failed run or case was: its backend, label, controller, launcher, model, mode (those it has)."""
    named = [failure.get(k) for k in ("backend", "label", "controller", "launcher", "model", "mode")]
    return " ".join(str(n) for n in named if n)


def failures(result: Dict) -> str:
    """The failed runs of a result, one line each, to follow its table ("" when none failed)."""
    lines = [f"- **FAILED** {failed_case(f)} "
             f"x{f.get('world_size', '')}: {f['error'].splitlines()[0] if f.get('error') else ''}"
             for f in result.get("failures", [])]
    return ("\n\n" + "\n".join(lines)) if lines else ""
