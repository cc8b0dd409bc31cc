"""The report's figures of training and parity (matplotlib, written as PNG files): learning curves with the noise
floor's spread, and the per-step gaps of each pair against its floor. Its figures of speed are in speed_plots."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from common.rundir.reader import Run  # noqa: E402
from . import floor, speed_plots  # noqa: E402
from .results import ParityResult  # noqa: E402
from .speed_plots import empty, save  # noqa: E402

#: every figure of a report, by its name in summary.json
PLOTS = {"curves": "curves.png", **speed_plots.FILES, "parity": "parity.png"}


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


def parity(pairs: List[ParityResult], floors: Dict[int, Dict], out: Path, margin: Optional[float] = None) -> str:
    """Draw parity_figure into `out` (parity.png); the file's name."""
    return save(parity_figure(pairs, floors, margin), out / PLOTS["parity"])


def parity_figure(pairs: List[ParityResult], floors: Dict[int, Dict], margin: Optional[float] = None):
    """Per-step gaps of every pair that is not a repeat, the loss (left) and the weights' fingerprint (middle),
    each with its world size's noise-floor band shaded, `margin` times the band dashed, `margin` times the floor's
    branches dashed in a pair's colour where the pair is judged against those (common.compare.branches), and the
    step where a pair trains differently marked; right: the final parameters' largest ‖Δ‖/‖w‖ per pair, the
    floor's marked."""
    pairs = [p for p in pairs if p.kind != "repeat"]
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
            series = getattr(p, key)
            steps = sorted(series, key=int)
            if not steps:
                continue
            # a zero gap (the same bits) has no place on a log axis: the line breaks there
            line, = ax.plot([int(s) for s in steps], [series[s] if series[s] > 0 else float("nan") for s in steps],
                            lw=1, marker=".", ms=2, label=f"{p.a} vs {p.b}")
            start = p.trains_differently_from
            if start is not None:
                ax.axvline(int(start), color=line.get_color(), ls=":", lw=1)
            # after a branch of its own, a pair is judged against the floor's branches, not the band: draw that
            judged = p.branch_levels.get(quantity) or {}
            if judged and margin:
                at = sorted(judged, key=int)
                ax.step([int(s) for s in at], [margin * judged[s] for s in at], where="post", color=line.get_color(),
                        ls="--", lw=0.8, label=f"{margin:g}x rounding's branches, judging {p.a} vs {p.b}")
        title = "rank 0's loss" if quantity == "loss" else "the weights' fingerprint (per-tensor norms)"
        ax.set(xlabel="step", ylabel="relative gap", title=f"Per-step gap of {title}", yscale="log")
        ax.set_ylim(bottom=bottom)
    names = [f"{p.a}\nvs {p.b}" for p in pairs]
    values = [max(p.gap, tiny) if p.gap != float("inf") else 1.0 for p in pairs]
    colors = ["#66c2a5" if p.bitwise_identical or p.within_noise_floor else
              "#fc8d62" if p.within_noise_floor is False else "#bbbbbb" for p in pairs]
    bars = ax_w.bar(names, values, color=colors)
    for i, (bar, p) in enumerate(zip(bars, pairs)):
        ax_w.annotate("identical" if p.bitwise_identical else f"{p.gap:.1e}",
                      (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        if p.noise_floor is not None:
            ax_w.plot([i - 0.4, i + 0.4], [max(p.noise_floor, tiny)] * 2, color="black", ls="--",
                      label="noise floor" if i == next(j for j, q in enumerate(pairs) if q.noise_floor is not None)
                      else None)
    ax_w.set_yscale("log")
    marks = values + [max(p.noise_floor, tiny) for p in pairs if p.noise_floor is not None]
    if marks:
        ax_w.set_ylim(min(marks) / 10, max(marks) * 10)
    ax_w.set(ylabel="parameters' largest ‖Δ‖/‖w‖", title="Final weight gap (green: identical or within the floor)")
    ax_w.tick_params(axis="x", labelsize=6, rotation=30)
    if not pairs:
        for ax in (ax_loss, ax_fp, ax_w):
            empty(ax, "needs two runs at one world size")
    for ax in (ax_loss, ax_fp, ax_w):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    return fig
