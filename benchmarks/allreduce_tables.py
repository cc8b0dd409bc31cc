"""The allreduce blocks of BENCHMARKS.md: the memory-copy limit, time and busbw per size, Open MPI's algorithms."""

from __future__ import annotations

from typing import Dict, Optional

from common.compare import arguments, tables

from .formatting import NAMES, failures, framed, ms, rounded, row_at
from .result_files import MISSING_FILE, Results

def series_title(series: Dict) -> str:
    """A column of an allreduce table."""
    name = NAMES.get(series["name"], series["name"])
    algorithm = f" ({series['mpi_algorithm']})" if series.get("mpi_algorithm") else ""
    return f"{name}{algorithm} x{series['world_size']}"


def allreduce_cell(row: Optional[Dict]) -> str:
    """Time per allreduce; from 1 MB up also busbw and its share of the limit."""
    if row is None:
        return tables.MISSING
    if row["bytes"] < 2**20:
        return ms(row["time_s"])
    return (f"{ms(row['time_s'])}, {rounded(row['busbw_GBps'], 2)} GB/s "
            f"({100 * row['busbw_of_limit']:.0f}%)")


def allreduce_limit(results: Results, name: str) -> str:
    """The memory-copy limit and the copy/add floor of one allreduce result, in words."""
    ar = results.get(name)
    if ar is None:
        return MISSING_FILE.format(path=results.path(name))
    c = ar["memcpy"]
    text = (f"Memory-copy limit: {c['limit_GBps']:.1f} GB/s ({c['limit']}; one thread {c['cpu_1thread_GBps']:.1f} "
            f"GB/s, all cores {c['cpu_all_cores_GBps']:.1f} GB/s).")
    floor = ar.get("floor")
    if floor:
        size = max((r["bytes"] for s in ar["series"] for r in s["results"]), default=None)
        text += (f" Copy/add floor: one thread copies {floor['copy_GBps']:.1f} GB/s and adds {floor['add_GBps']:.1f} "
                 f"GB/s on {tables.size(floor['bytes'])} buffers, so a copy-based ring allreduce reaches at most "
                 f"{floor['busbw_GBps']:.1f} GB/s busbw, {100 * floor['of_limit']:.0f}% of the limit")
        if size:
            least = size * floor_factor(2) / floor["busbw_GBps"] / 1e9
            text += f" (at least {ms(least)} for {tables.size(size)} at world size 2)"
        text += "."
    else:
        text += (" The copy/add floor is not in this result (it was measured before the benchmark recorded it); "
                 "the next run of `benchmarks/run_all.sh` adds it.")
    return text + f" Source: `{results.path(name)}`."


def floor_factor(world_size: int) -> float:
    """busbw = bytes x floor_factor / time: 2(n-1)/n."""
    return 2 * (world_size - 1) / world_size


def allreduce_table(results: Results, name: str, sizes: Optional[str] = None) -> str:
    """Time per allreduce (and busbw) by size, one column per series; `sizes` picks rows ("4,4K,1M")."""

    def body() -> str:
        ar = results.get(name)
        series = ar["series"]
        all_sizes = sorted({r["bytes"] for s in series for r in s["results"]})
        if sizes:
            wanted = {arguments.byte_size(s) for s in sizes.split(",")}
            all_sizes = [b for b in all_sizes if b in wanted]
        rows = [[tables.size(b)] + [allreduce_cell(row_at(s, b)) for s in series] for b in all_sizes]
        table = tables.markdown(["size"] + [series_title(s) for s in series], rows)
        return table + failures(ar)

    return framed(results, [name], body)


def allreduce_algorithms(results: Results, name: str) -> str:
    """Open MPI's allreduce algorithms at the largest size: one row per algorithm, one column per series."""

    def body() -> str:
        ar = results.get(name)
        columns = list(dict.fromkeys(f"{NAMES.get(s['name'], s['name'])} x{s['world_size']}" for s in ar["series"]))
        algorithms = list(dict.fromkeys(s.get("mpi_algorithm") or "default" for s in ar["series"]))
        size = max(r["bytes"] for s in ar["series"] for r in s["results"])
        rows = []
        for algorithm in algorithms:
            row = [algorithm]
            for column in columns:
                s = next((s for s in ar["series"] if (s.get("mpi_algorithm") or "default") == algorithm
                          and f"{NAMES.get(s['name'], s['name'])} x{s['world_size']}" == column), None)
                row.append(allreduce_cell(row_at(s, size)) if s else tables.MISSING)
            rows.append(row)
        return f"At {tables.size(size)}:\n\n" + tables.markdown(["algorithm"] + columns, rows) + failures(ar)

    return framed(results, [name], body)
