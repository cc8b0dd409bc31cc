"""Figures (matplotlib, written as PNG files): the report's, and the axis-level drawings that the report
and the benchmark scripts share (throughput and scaling efficiency against world size)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from common.rundir.reader import Run  # noqa: E402
from . import floor, stats  # noqa: E402

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


def _floor_spread(runs: List[Run], floor: Dict) -> Dict[int, Dict[str, float]]:
    """Per epoch, how far the noise floor's disturbed runs are from their base at most: |Δ train loss|, |Δ top-1|."""
    by_name = {r.name: r for r in runs}
    base = by_name.get(floor["base"])
    disturbed = [by_name[name] for name in floor["disturbed"] if name in by_name]
    if base is None or not disturbed:
        return {}
    spread: Dict[int, Dict[str, float]] = {}
    for other in disturbed:
        theirs = {e["epoch"]: e for e in other.epochs()}
        for e in base.epochs():
            mine = theirs.get(e["epoch"])
            if mine is None:
                continue
            top1 = (e.get("val_top1"), mine.get("val_top1"))
            here = spread.setdefault(e["epoch"], {"loss": 0.0, "top1": 0.0})
            here["loss"] = max(here["loss"], abs(e["train_loss"] - mine["train_loss"]))
            if None not in top1:
                here["top1"] = max(here["top1"], abs(top1[0] - top1[1]))
    return spread


def curves(runs: List[Run], out: Path, floors: Optional[Dict[int, Dict]] = None) -> str:
    """Training loss and validation top-1/top-5 against epoch, one line per backend x world size; where a
    noise floor was measured, a band of its spread (the disturbed run's distance from its base) around each
    curve of that world size."""
    floors = floors or {}
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for run in [r for r in runs if r.repeat == 0 and not floor.is_disturbed(r)]:
        epochs = run.epochs()
        spread = _floor_spread(runs, floors[run.world_size]) if run.world_size in floors else {}
        xs = [e["epoch"] + 1 for e in epochs]
        losses = [e["train_loss"] for e in epochs]
        line, = ax_loss.plot(xs, losses, marker="o", ms=3, label=run.key)
        if spread:
            d = [spread.get(e["epoch"], {}).get("loss", 0.0) for e in epochs]
            ax_loss.fill_between(xs, [y - w for y, w in zip(losses, d)], [y + w for y, w in zip(losses, d)],
                                 color=line.get_color(), alpha=0.2, lw=0)
            ax_loss.errorbar(xs, losses, yerr=d, fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.6)
        evals = [e for e in epochs if e.get("val_top1") is not None]
        top1 = [100 * e["val_top1"] for e in evals]
        ax_acc.plot([e["epoch"] + 1 for e in evals], top1, marker="o", ms=3,
                    color=line.get_color(), label=f"{run.key} top-1")
        if spread:
            d = [100 * spread.get(e["epoch"], {}).get("top1", 0.0) for e in evals]
            ax_acc.fill_between([e["epoch"] + 1 for e in evals], [y - w for y, w in zip(top1, d)],
                                [y + w for y, w in zip(top1, d)], color=line.get_color(), alpha=0.2, lw=0)
            ax_acc.errorbar([e["epoch"] + 1 for e in evals], top1, yerr=d, fmt="none", ecolor=line.get_color(),
                            capsize=3, alpha=0.6)  # a band of one epoch is a bar
        ax_acc.plot([e["epoch"] + 1 for e in evals], [100 * e["val_top5"] for e in evals], ls="--",
                    color=line.get_color(), label=f"{run.key} top-5")
    title = "Training loss" + (" (bands: noise floor)" if floors else "")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title=title, yscale="log")
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


def parity(pairs: List[Dict], floors: Dict[int, Dict], out: Path, margin: Optional[float] = None) -> str:
    """Per-step gaps of every pair that is not a repeat, the loss (left) and the weights' fingerprint (middle),
    each with its world size's noise-floor band shaded, `margin` times the band dashed, and the step where a pair
    trains differently marked; right: the final parameters' largest ‖Δ‖/‖w‖ per pair, the floor's marked."""
    pairs = [p for p in pairs if p["kind"] != "repeat"]
    fig, (ax_loss, ax_fp, ax_w) = plt.subplots(1, 3, figsize=(16, 4.5))
    tiny = 1e-12
    bottom = 1e-9  # two orders of magnitude below a float32 number's last bit
    for ax, quantity, key in ((ax_loss, "loss", "rel_loss_diff"), (ax_fp, "weights", "rel_weight_diff")):
        for world, f in sorted(floors.items()):
            band = f["band"][quantity]
            steps = sorted(band, key=int)
            if steps:
                xs = [int(s) for s in steps]
                ax.fill_between(xs, [bottom] * len(steps), [band[s] for s in steps], color="gray", alpha=0.25, lw=0,
                                step="post", label=f"noise floor @{world} ({f['runs']} disturbed runs)")
                if margin:
                    ax.step(xs, [margin * band[s] for s in steps], where="post", color="gray", ls="--", lw=0.8,
                            label=f"{margin:g}x the floor: beyond it, trains differently")
        for p in pairs:
            series = p[key]
            steps = sorted(series, key=int)
            if not steps:
                continue
            # a zero gap (the same bits) has no place on a log axis: the line breaks there
            line, = ax.plot([int(s) for s in steps], [series[s] if series[s] > 0 else float("nan") for s in steps],
                            lw=1, marker=".", ms=2, label=f"{p['a']} vs {p['b']}")
            start = p.get("trains_differently_from")
            if start is not None:
                ax.axvline(int(start), color=line.get_color(), ls=":", lw=1)
        title = "rank 0's loss" if quantity == "loss" else "the weights' fingerprint (per-tensor norms)"
        ax.set(xlabel="step", ylabel="relative gap", title=f"Per-step gap of {title}", yscale="log")
        ax.set_ylim(bottom=bottom)
    names = [f"{p['a']}\nvs {p['b']}" for p in pairs]
    values = [max(p["gap"], tiny) if p["gap"] != float("inf") else 1.0 for p in pairs]
    colors = ["#66c2a5" if p["bitwise_identical"] or p["within_noise_floor"] else
              "#fc8d62" if p["within_noise_floor"] is False else "#bbbbbb" for p in pairs]
    bars = ax_w.bar(names, values, color=colors)
    for i, (bar, p) in enumerate(zip(bars, pairs)):
        ax_w.annotate("identical" if p["bitwise_identical"] else f"{p['gap']:.1e}",
                      (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        if p["noise_floor"] is not None:
            ax_w.plot([i - 0.4, i + 0.4], [max(p["noise_floor"], tiny)] * 2, color="black", ls="--",
                      label="noise floor" if i == next(j for j, q in enumerate(pairs) if q["noise_floor"] is not None)
                      else None)
    ax_w.set_yscale("log")
    marks = values + [max(p["noise_floor"], tiny) for p in pairs if p["noise_floor"] is not None]
    if marks:
        ax_w.set_ylim(min(marks) / 10, max(marks) * 10)
    ax_w.set(ylabel="parameters' largest ‖Δ‖/‖w‖", title="Final weight gap (green: identical or within the floor)")
    ax_w.tick_params(axis="x", labelsize=6, rotation=30)
    if not pairs:
        for ax in (ax_loss, ax_fp, ax_w):
            _empty(ax, "needs two runs at one world size")
    for ax in (ax_loss, ax_fp, ax_w):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    return save(fig, out / PLOTS["parity"])
