"""Figures of speed (matplotlib, written as PNG files): throughput and scaling efficiency against world size, and
where a step's time goes. The comparison's report draws them, and the benchmark scripts draw on their axes. Nothing
here judges parity (common.compare.plots does), so a change to how runs are judged is no input of a speed result."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from . import stats

#: the files these figures are written to, in a report's folder
FILES = {"throughput": "throughput.png", "scaling": "scaling_efficiency.png", "time_split": "time_split.png"}

#: one colour per backend in every figure (a variant, +predivide, keeps its backend's); others from the palette
BACKEND_COLORS = {"ddp": "#1f77b4", "horovod-gloo": "#ff7f0e", "horovod-mpi": "#2ca02c", "horovod-api": "#9467bd",
                  "horovod": "#d62728", "local": "#7f7f7f"}
PALETTE = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
#: a line style and marker per backend, so lines that coincide stay visible over each other
BACKEND_STYLES = {"ddp": ("-", "o"), "horovod-gloo": ("--", "s"), "horovod-mpi": (":", "^"),
                  "horovod-api": ("-.", "D")}


def backend_of(label: str) -> str:
    """The backend of a run's label or key: horovod-gloo for horovod-gloo+predivide[lr=0.1]@3."""
    return label.split("@")[0].split("[")[0].split("+")[0]


def color_of(label: str) -> str:
    """The colour of a backend, in every figure of a report and the benchmarks."""
    backend = backend_of(label)
    return BACKEND_COLORS.get(backend) or PALETTE[sum(map(ord, backend)) % len(PALETTE)]


def style_of(label: str) -> Tuple[str, str]:
    """(line style, marker) of a backend."""
    return BACKEND_STYLES.get(backend_of(label), ("-", "o"))


def save(fig: Figure, path: Path, dpi: int = 110, tight: bool = True) -> str:
    """Write `fig` to `path` (its folder made if needed), close it, and return the file's name; `tight`: lay it out
    first (a figure with a legend outside its axes lays itself out)."""
    if tight:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name


def empty(ax: Axes, text: str) -> None:
    """Say `text` in the middle of an axis that has nothing to draw."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def draw_throughput(ax: Axes, table: Dict[str, Dict[str, Any]], ideal: bool = True,
                    references: Sequence[str] = ()) -> None:
    """samples/s against world size per label of a throughput table ("label@N" -> spread), min-max over
    repeats as error bars; with `ideal`, linear scaling from each label's single-process median dotted.
    `references` (e.g. a bare loop) are dashed and get no ideal line."""
    labels = stats.labels(table)
    for label in labels:
        points = stats.series(table, label)
        xs = [w for w, _ in points]
        med = [v["median"] for _, v in points]
        err = [[v["median"] - v["min"] for _, v in points], [v["max"] - v["median"] for _, v in points]]
        line = ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label, color=color_of(label),
                           ls="--" if label in references else "-")
        if ideal and label not in references and xs and xs[0] == 1:
            ax.plot(xs, [med[0] * w for w in xs], ls=":", color=line[0].get_color(), label=f"{label} ideal")
    if not labels:
        empty(ax, "no throughput measured")
    ax.set(xlabel="world size (processes)", ylabel="samples/s")
    ax.set_xticks(sorted({stats.split_key(k)[1] for k in table}) or [1])
    ax.grid(alpha=0.3)
    if labels:
        ax.legend(fontsize=7)


def draw_scaling(ax: Axes, table: Dict[str, Dict[int, float]]) -> None:
    """Scaling efficiency against world size per label ({label: {N: efficiency}}); 1.0, perfect, dotted."""
    worlds = set()
    for label, points in sorted(table.items()):
        points = {int(w): e for w, e in points.items()}  # JSON keeps world sizes as strings
        xs = sorted(points)
        worlds.update(xs)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label, color=color_of(label))
    ax.axhline(1.0, color="gray", ls=":", label="ideal")
    if not table:
        empty(ax, "needs runs at world size 1")
    top = max([v for points in table.values() for v in points.values()], default=1.0)
    ax.set(xlabel="world size (processes)", ylabel="throughput(N) / (N x throughput(1))",
           ylim=(0, max(1.15, 1.1 * top)))
    if worlds:
        ax.set_xticks(sorted(worlds))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def throughput(table: Dict[str, Dict[str, Any]], out: Path) -> str:
    """samples/s against world size per backend (min-max over repeats as error bars), with
    ideal linear scaling from each backend's single-process throughput."""
    fig, ax = plt.subplots(figsize=(6, 4))
    draw_throughput(ax, table)
    ax.set_title("Throughput")
    return save(fig, out / FILES["throughput"])


def scaling(table: Dict[str, Dict[int, float]], out: Path) -> str:
    """Scaling efficiency against world size per backend; 1.0 is perfect."""
    fig, ax = plt.subplots(figsize=(6, 4))
    draw_scaling(ax, table)
    ax.set_title("Scaling efficiency")
    return save(fig, out / FILES["scaling"])


def time_split(rows: List[Dict[str, Any]], out: Path) -> str:
    """Mean time per step split into data / compute / exposed communication, one bar per run."""
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4))
    names = [r["run"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, color in (("data_ms", "#8da0cb"), ("compute_ms", "#66c2a5"), ("comm_ms", "#fc8d62")):
        values = [r.get(part) or 0.0 for r in rows]
        ax.bar(names, values, bottom=bottom, color=color, label=part.replace("_ms", ""))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="ms per step", title="Where a step's time goes")
    ax.tick_params(axis="x", rotation=45, labelsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, out / FILES["time_split"])
