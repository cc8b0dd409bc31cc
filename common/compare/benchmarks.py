"""The report's benchmark section: allreduce bus bandwidth and training throughput measured by the
scripts under benchmarks/ (DIR/allreduce.json, DIR/throughput.json), when they were measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import tables
from .conditions import conditions

FILES = {"allreduce": "allreduce.json", "throughput": "throughput.json"}


def load(directory: Path, out: Path) -> Optional[Dict[str, Any]]:
    """The benchmark results found in `directory` (None when there are none), with their figures
    copied into `out` as bench_<name>.png so that report.md can show them. A file that is not a benchmark result
    raises ValueError naming it."""
    found: Dict[str, Any] = {}
    for kind, name in FILES.items():
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} is not readable JSON ({exc}); re-run python -m benchmarks.{kind}") from None
        if data.get("benchmark") != kind:
            raise ValueError(f"{path} is not a {kind} benchmark result; re-run python -m benchmarks.{kind}")
        figure = data.get("plot")
        data["plot"] = None
        if figure and (path.parent / figure).is_file():
            # Prefixed: the report draws a throughput.png of its own into the same folder.
            data["plot"] = f"bench_{figure}"
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path.parent / figure, out / data["plot"])
        data["source"] = str(path)
        found[kind] = data
    return found or None


def series_name(series: Dict[str, Any]) -> str:
    """An allreduce series as a column: "horovod-mpi x2", with the Open MPI algorithm when one was chosen."""
    algorithm = f" {series['mpi_algorithm']}" if series.get("mpi_algorithm") else ""
    return f"{series['name']}{algorithm} x{series['world_size']}"


def loop_ratios(case: Dict[str, Any]) -> Tuple[Any, ...]:
    """({N: loop / seed-style bare}, {N: loop / bare on the batched data path}) of a throughput case;
    results written before the batched bare loop existed have only the first."""
    return case.get("loop_ratio") or {}, case.get("loop_ratio_batched") or {}


def _where(data: Dict[str, Any]) -> str:
    m = data.get("machine") or {}
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    text = (f"Measured on {m.get('cpu_model')}, {m.get('cores')} cores, {gpus}, torch "
            f"{(m.get('versions') or {}).get('torch')}, horovod {(m.get('versions') or {}).get('horovod')}; "
            f"{conditions(data)}")
    if data.get("under_load"):
        text += " (**under load**: other work shared the cores, numbers are disturbed)"
    return text + f". Command: `{data.get('command')}`."


def markdown(bench: Optional[Dict[str, Any]]) -> List[str]:
    """Lines of the report's "Benchmarks" section (empty when nothing was measured)."""
    if not bench:
        return []
    md = ["## Benchmarks", ""]
    ar = bench.get("allreduce")
    if ar:
        limit = ar["memcpy"]["limit_GBps"]
        md += ["### Allreduce bandwidth", "", _where(ar), "",
               f"Bus bandwidth busbw = algbw x 2(n-1)/n, algbw = bytes / time per allreduce (slowest rank), "
               f"as nccl-tests define them; the limit is the memory-copy bandwidth, {limit:.1f} GB/s "
               f"({ar['memcpy']['limit']}). Each cell: time per allreduce, busbw and busbw / limit.", ""]
        series = ar["series"]
        sizes = sorted({r["bytes"] for s in series for r in s["results"]})
        rows = []
        for size in sizes:
            row = [tables.size(size)]
            for s in series:
                r = next((r for r in s["results"] if r["bytes"] == size), None)
                row.append("–" if r is None else
                           f"{r['time_s'] * 1e6:.0f} µs, {r['busbw_GBps']:.2f} GB/s ({100 * r['busbw_of_limit']:.0f}%)")
            rows.append(row)
        md += [tables.markdown(["size"] + [series_name(s) for s in series], rows), ""]
        for f in ar.get("failures", []):
            md.append(f"- **FAILED** {f['backend']} x{f['world_size']}: {f['error'].splitlines()[0]}")
        if ar.get("plot"):
            md += [f"![allreduce latency and bus bandwidth]({ar['plot']})", ""]
    tp = bench.get("throughput")
    if tp:
        st = tp["settings"]
        md += ["### Training throughput", "", _where(tp), "",
               f"{st.get('dataset', 'synthetic').capitalize()} data, per-rank batch {st['batch_size']}, "
               f"{st['steps']} steps per run (first not timed), median (min–max) of {st['repeats']} repeat(s). "
               f"Scaling efficiency = throughput(N) / (N x throughput(1)); exchange overhead = 1 − throughput(N) / "
               f"N independent world-size-1 processes run together (same per-rank work, no gradient exchange); "
               f"loop / bare = our DDP loop's step time / a bare DDP loop's (target ≤ 1.02), against the seed-style "
               f"bare loop (per-sample DataLoader, what a user would write) and against a bare loop on our batched "
               f"data path (what the loop's bookkeeping costs); job CPU s = CPU seconds of the whole run, all "
               f"processes (less disturbed by other load than samples/s).", ""]
        for case in tp["cases"]:
            rows = []
            for key, cell in case["throughput"].items():
                label, np = key.split("@")
                scaling = case["scaling_efficiency"].get(label, {}).get(np)
                overhead = case["exchange_overhead"].get(label, {}).get(np)
                ratios = [ratios.get(np) if label == "ddp" else None for ratios in loop_ratios(case)]
                rows.append([label, np, f"{cell['median']:.1f} ({cell['min']:.1f}–{cell['max']:.1f})",
                             tables.number(scaling, ".2f"), tables.percent(overhead),
                             *(tables.number(r, ".3f") for r in ratios), tables.number(cell.get("job_cpu_s"), ".0f")])
            md += [f"**{case['name']}** (image {case['image_size']})", ""]
            md += [tables.markdown(["run", "world size", "samples/s", "scaling efficiency", "exchange overhead",
                                    "loop / bare (seed)", "loop / bare (batched)", "job CPU s"], rows), ""]
        for f in tp.get("failures", []):
            md.append(f"- **FAILED** {f['case']} {f['label']} x{f['world_size']}: {f['error'].splitlines()[0]}")
        if tp.get("plot"):
            md += [f"![training throughput and scaling]({tp['plot']})", ""]
    return md


def summary(bench: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What the report's summary.json keeps of the benchmarks: the tables, not every run."""
    if not bench:
        return None
    out: Dict[str, Any] = {}
    if "allreduce" in bench:
        ar = bench["allreduce"]
        out["allreduce"] = {"source": ar["source"], "under_load": ar.get("under_load"), "memcpy": ar["memcpy"],
                            "series": [{k: s[k] for k in ("name", "world_size", "results")} for s in ar["series"]]}
    if "throughput" in bench:
        tp = bench["throughput"]
        out["throughput"] = {"source": tp["source"], "under_load": tp.get("under_load"), "cases": [
            {k: c.get(k, {}) for k in ("name", "throughput", "scaling_efficiency", "exchange_overhead", "loop_ratio",
                                       "loop_ratio_batched")}
            for c in tp["cases"]]}
    return out
