"""Tables and the formatting of their cells, shared by the report, the benchmark scripts' printed
summaries and BENCHMARKS.md: markdown for documents, aligned plain text for terminals."""

from __future__ import annotations

import math
from typing import Optional, Sequence

#: what a cell shows when there is no value
MISSING = "–"


def markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown (GitHub) table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain table for a terminal, every column right-aligned to its widest cell."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def number(value: Optional[float], spec: str = ".4f", missing: str = MISSING) -> str:
    """`value` formatted with `spec`; `missing` for None, NaN and infinities."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def percent(fraction: Optional[float], spec: str = ".1f", missing: str = MISSING) -> str:
    """0.034 -> "3.4%"."""
    return missing if fraction is None else number(100 * fraction, spec, missing) + "%"


def size(nbytes: float, spaced: bool = True) -> str:
    """Bytes in binary units: 4096 -> "4 KB" ("4K" when not `spaced`)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}B" if spaced else f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g} B" if spaced else f"{nbytes:g}"


def measured(median: float, low: float, high: float, spec: str = ".1f") -> str:
    """A median with its range over repeats: "2109.0 (2086.9–2131.1)"; the range is left out when
    the repeats agree to the shown precision."""
    shown = format(median, spec)
    lo, hi = format(low, spec), format(high, spec)
    return shown if lo == hi == shown else f"{shown} ({lo}–{hi})"
