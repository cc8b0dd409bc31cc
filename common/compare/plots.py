"""Figures (matplotlib, written as PNG files): the report's, and the axis-level drawings that the report
and the benchmark scripts share (throughput and scaling efficiency against world size)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from . import stats  # noqa: E402
from .rundirs import Run  # noqa: E402

PLOTS = {
    "curves": "curves.png",
    "throughput": "throughput.png",
    "scaling": "scaling_efficiency.png",
    "time_split": "time_split.png",
    "parity": "parity.png",
}


def save(fig, path: Path, dpi: int = 110) -> str:
    """Write `fig` to `path` (its folder made if needed), close it, and return the file's name."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def curves(runs: List[Run], out: Path) -> str:
    """Training loss and validation top-1/top-5 against epoch, one line per backend x world size."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for run in [r for r in runs if r.repeat == 0]:
        epochs = run.epochs()
        xs = [e["epoch"] + 1 for e in epochs]
        line, = ax_loss.plot(xs, [e["train_loss"] for e in epochs], marker="o", ms=3, label=run.key)
        evals = [e for e in epochs if e.get("val_top1") is not None]
        ax_acc.plot([e["epoch"] + 1 for e in evals], [100 * e["val_top1"] for e in evals], marker="o", ms=3,
                    color=line.get_color(), label=f"{run.key} top-1")
        ax_acc.plot([e["epoch"] + 1 for e in evals], [100 * e["val_top5"] for e in evals], ls="--",
                    color=line.get_color(), label=f"{run.key} top-5")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="Training loss", yscale="log")
    ax_acc.set(xlabel="epoch", ylabel="validation accuracy (%)", title="Validation top-1 (solid), top-5 (dashed)")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    return save(fig, out / PLOTS["curves"])


def draw_throughput(ax, table: Dict[str, Dict], ideal: bool = True, references: Sequence[str] = ()) -> None:
    """samples/s against world size per label of a throughput table ("label@N" -> spread), min-max over
    repeats as error bars; with `ideal`, linear scaling from each label's single-process median dotted.
    `references` (e.g. a bare loop) are dashed and get no ideal line."""
    labels = stats.labels(table)
    for label in labels:
        points = stats.series(table, label)
        xs = [w for w, _ in points]
        med = [v["median"] for _, v in points]
        err = [[v["median"] - v["min"] for _, v in points], [v["max"] - v["median"] for _, v in points]]
        line = ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label,
                           ls="--" if label in references else "-")
        if ideal and label not in references and xs and xs[0] == 1:
            ax.plot(xs, [med[0] * w for w in xs], ls=":", color=line[0].get_color(), label=f"{label} ideal")
    if not labels:
        _empty(ax, "no throughput measured")
    ax.set(xlabel="world size (processes)", ylabel="samples/s")
    ax.set_xticks(sorted({stats.split_key(k)[1] for k in table}) or [1])
    ax.grid(alpha=0.3)
    if labels:
        ax.legend(fontsize=7)


def draw_scaling(ax, table: Dict[str, Dict[int, float]]) -> None:
    """Scaling efficiency against world size per label ({label: {N: efficiency}}); 1.0, perfect, dotted."""
    worlds = set()
    for label, points in sorted(table.items()):
        points = {int(w): e for w, e in points.items()}  # JSON keeps world sizes as strings
        xs = sorted(points)
        worlds.update(xs)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.axhline(1.0, color="gray", ls=":", label="ideal")
    if not table:
        _empty(ax, "needs runs at world size 1")
    top = max([v for points in table.values() for v in points.values()], default=1.0)
    ax.set(xlabel="world size (processes)", ylabel="throughput(N) / (N x throughput(1))",
           ylim=(0, max(1.15, 1.1 * top)))
    if worlds:
        ax.set_xticks(sorted(worlds))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def throughput(table: Dict[str, Dict], out: Path) -> str:
    """samples/s against world size per backend (min-max over repeats as error bars), with
    ideal linear scaling from each backend's single-process throughput."""
    fig, ax = plt.subplots(figsize=(6, 4))
    draw_throughput(ax, table)
    ax.set_title("Throughput")
    return save(fig, out / PLOTS["throughput"])


def scaling(table: Dict[str, Dict[int, float]], out: Path) -> str:
    """Scaling efficiency against world size per backend; 1.0 is perfect."""
    fig, ax = plt.subplots(figsize=(6, 4))
    draw_scaling(ax, table)
    ax.set_title("Scaling efficiency")
    return save(fig, out / PLOTS["scaling"])


def time_split(rows: List[Dict], out: Path) -> str:
    """Mean time per step split into data / compute / exposed communication, one bar per run."""
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4))
    names = [r["run"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, color in (("data_ms", "#8da0cb"), ("compute_ms", "#66c2a5"), ("comm_ms", "#fc8d62")):
        values = [r.get(part) or 0.0 for r in rows]
        ax.bar(names, values, bottom=bottom, color=color, label=part.replace("_ms", ""))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(ylabel="ms per step", title="Where a step's time goes")
    ax.tick_params(axis="x", rotation=45, labelsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, out / PLOTS["time_split"])


def parity(pairs: List[Dict], out: Path) -> str:
    """Per-step |Δloss| between backends, and the final max |Δw| per pair."""
    pairs = [p for p in pairs if p["kind"] == "backends"]
    fig, (ax_loss, ax_w) = plt.subplots(1, 2, figsize=(11, 4))
    for p in pairs:
        steps = sorted(p["loss_diff"], key=int)
        ax_loss.plot([int(s) for s in steps], [p["loss_diff"][s] for s in steps], label=f"{p['a']} vs {p['b']}")
    ax_loss.set(xlabel="step", ylabel="|Δ loss| (rank 0)", title="Per-step loss difference")
    ax_loss.set_yscale("symlog", linthresh=1e-9)
    worst_loss = max([max(p["loss_diff"].values(), default=0.0) for p in pairs], default=0.0)
    ax_loss.set_ylim(0, max(worst_loss * 10, 1e-8))
    names = [f"{p['a']}\nvs {p['b']}" for p in pairs]
    values = [p["max_abs_weight_diff"] for p in pairs]
    bars = ax_w.bar(names, values, color=["#66c2a5" if p["bitwise_identical"] else "#fc8d62" for p in pairs])
    for bar, p in zip(bars, pairs):
        ax_w.annotate("identical" if p["bitwise_identical"] else f"{p['max_abs_weight_diff']:.1e}",
                      (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax_w.set_yscale("symlog", linthresh=1e-9)
    finite = [v for v in values if v != float("inf")]
    ax_w.set_ylim(0, max(max(finite, default=0.0) * 10, 1e-8))
    ax_w.set(ylabel="final max |Δw|", title="Final weight difference")
    ax_w.tick_params(axis="x", labelsize=6)
    if not pairs:
        _empty(ax_loss, "needs two backends at one world size")
        _empty(ax_w, "needs two backends at one world size")
    for ax in (ax_loss, ax_w):
        ax.grid(alpha=0.3)
    if ax_loss.lines:
        ax_loss.legend(fontsize=7)
    return save(fig, out / PLOTS["parity"])
