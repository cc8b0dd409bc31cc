"""How busy the machine was as a benchmark result started, in words: the report's benchmark section, BENCHMARKS.md
and the scripts' own notes say it alike."""

from __future__ import annotations

from typing import Any, Dict


def conditions(result: Dict[str, Any]) -> str:
    """How busy the machine was as a benchmark result started: "12% of the CPU busy in the second before starting,
    1-minute load 0.3" (results written before the CPU share was recorded give the load alone)."""
    load = f"1-minute load {(result.get('load_before') or {}).get('1m')}"
    busy = result.get("cpu_busy_before")
    if busy is None:
        return f"{load} before starting"
    return f"{busy:.0%} of the CPU busy in the second before starting, {load}"
