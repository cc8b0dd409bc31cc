"""The statistics of repeated timings that the report and the benchmarks share: the spread of a
cell's repeats, the repeat that stands for the cell, and scaling efficiency.

A throughput table maps "label@world_size" (e.g. "ddp@2") to the spread of samples/s over repeats."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")


def spread(values: Sequence[float]) -> Dict[str, Any]:
    """Median, min, max and count of repeated measurements (and the values themselves)."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def median_item(items: Sequence[T], key: Callable[[T], float]) -> Optional[T]:
    """The item whose `key` is the median (the lower one of an even count), so that what is reported
    beside a median (e.g. a time split) describes the repeat the median stands for."""
    ordered = sorted(items, key=key)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def split_key(key: str) -> Tuple[Any, ...]:
    """"ddp@2" -> ("ddp", 2)."""
    label, world = key.rsplit("@", 1)
    return label, int(world)


def single_process_baseline(throughput: Dict[str, Dict[str, Any]], label: str) -> Optional[float]:
    """Median single-process throughput of `label`; labels of one family ("horovod-gloo", "horovod-mpi")
    share one baseline when only one of them ran at world size 1 (one process does not communicate)."""
    if f"{label}@1" in throughput:
        return float(throughput[f"{label}@1"]["median"])
    family = label.split("-")[0]
    for key, value in throughput.items():
        other, world = split_key(key)
        if world == 1 and other.split("-")[0] == family:
            return float(value["median"])
    return None


def scaling_efficiency(throughput: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[int, float]]:
    """throughput(N) / (N x throughput(1)) per label and world size, from median samples/s; labels with
    no single-process baseline are left out."""
    out: Dict[str, Dict[int, float]] = {}
    for key, value in throughput.items():
        label, world = split_key(key)
        base = single_process_baseline(throughput, label)
        if base:
            out.setdefault(label, {})[world] = value["median"] / (world * base)
    return out


def labels(throughput: Dict[str, Dict[str, Any]]) -> List[str]:
    """The labels of a throughput table, sorted."""
    return sorted({split_key(key)[0] for key in throughput})


def series(throughput: Dict[str, Dict[str, Any]], label: str) -> List[Tuple[int, Dict[str, Any]]]:
    """(world size, spread) of one label, by world size."""
    return sorted((split_key(k)[1], v) for k, v in throughput.items() if split_key(k)[0] == label)
