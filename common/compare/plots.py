"""The report's figures of training and parity (matplotlib, written as PNG files): learning curves with the noise
floor's spread, and the per-step gaps of each pair against its floor. Its figures of speed are in speed_plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from common.rundir.reader import Run
from . import speed_plots
from .results import ParityResult
from .speed_plots import color_of, empty, save, style_of

#: every figure of a report, by its name in summary.json
PLOTS = {"curves": "curves.png", **speed_plots.FILES, "parity": "parity.png"}


def _floor_spread(runs: List[Run], floor: Dict[str, Any]) -> Dict[int, Dict[str, float]]:
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
            ours, theirs_top1 = e.get("val_top1"), mine.get("val_top1")
            here = spread.setdefault(e["epoch"], {"loss": 0.0, "top1": 0.0})
            here["loss"] = max(here["loss"], abs(e["train_loss"] - mine["train_loss"]))
            if ours is not None and theirs_top1 is not None:
                here["top1"] = max(here["top1"], abs(ours - theirs_top1))
    return spread


def agreement(pairs: Sequence[ParityResult], world: int) -> List[str]:
    """What the figure says of runs that coincide at a world size: "ddp = horovod-gloo (bitwise identical)", or
    within rounding, for the pairs whose lines lie on each other."""
    out = []
    for p in pairs:
        if p.kind == "repeat" or p.world_size != world:
            continue
        a, b = p.a.split("@")[0], p.b.split("@")[0]
        if p.bitwise_identical:
            out.append(f"{a} = {b} (bitwise identical)")
        elif p.within_noise_floor is True or p.verdict.startswith("equal within"):
            out.append(f"{a} ≈ {b} (within rounding)")
    return out


def _draw_run(run: Run, ax_loss: Any, ax_acc: Optional[Any], handles: Dict[str, Any]) -> None:
    """One run's curves: its loss per epoch and validation top-1 (on `ax_acc`), or per step where it records no
    epochs (`ax_acc` None)."""
    ls, marker = style_of(run.label)
    style = {"ls": ls, "marker": marker, "ms": 5 if ax_acc is not None else 2, "mfc": "none",
             "color": color_of(run.label), "lw": 1.6 if ax_acc is not None else 1.0}
    if ax_acc is None:
        losses = run.step_losses()
        line, = ax_loss.plot(sorted(losses), [losses[s] for s in sorted(losses)], **style)
        handles.setdefault(run.label, line)
        return
    epochs = run.epochs()
    line, = ax_loss.plot([e["epoch"] + 1 for e in epochs], [e["train_loss"] for e in epochs], **style)
    handles.setdefault(run.label, line)
    evals = [e for e in epochs if e.get("val_top1") is not None]
    ax_acc.plot([e["epoch"] + 1 for e in evals], [100 * e["val_top1"] for e in evals], **style)


def _draw_floor_around(run: Run, spread: Dict[int, Dict[str, float]], ax_loss: Any, ax_acc: Any,
                       handles: Dict[str, Any]) -> None:
    """The noise floor's spread per epoch, shaded around its base run's loss and top-1."""
    epochs = run.epochs()
    xs = [e["epoch"] + 1 for e in epochs]
    lo_hi = [(e["train_loss"], spread.get(e["epoch"], {}).get("loss", 0.0)) for e in epochs]
    band = ax_loss.fill_between(xs, [y - w for y, w in lo_hi], [y + w for y, w in lo_hi], color="gray", alpha=0.3,
                                lw=0)
    handles.setdefault("noise floor's spread (around the first backend)", band)
    top1 = [(e["epoch"] + 1, 100 * e["val_top1"], 100 * spread.get(e["epoch"], {}).get("top1", 0.0))
            for e in epochs if e.get("val_top1") is not None]
    ax_acc.fill_between([x for x, _, _ in top1], [y - w for _, y, w in top1], [y + w for _, y, w in top1],
                        color="gray", alpha=0.3, lw=0)


def curves(runs: List[Run], out: Path, floors: Optional[Dict[int, Dict[str, Any]]] = None,
           pairs: Sequence[ParityResult] = ()) -> str:
    """Learning curves, one column per world size: training loss (top) and validation top-1 (bottom) against
    epoch, a colour, line style and marker per backend so that lines that coincide stay visible over each other,
    and in each panel which runs coincide (bitwise identical or within rounding, from `pairs`); where a noise
    floor was measured, a band of its spread (the disturbed runs' distance from their base) around the base's
    curve. Runs of scripts, which record steps and no epochs, show rank 0's loss per step. The legend sits below
    the panels, outside the data."""
    floors = floors or {}
    shown = [r for r in runs if r.repeat == 0 and not r.identity.is_variant]
    worlds = sorted({r.world_size for r in shown}) or [1]
    by_epoch = any(r.epochs() for r in shown)
    rows = 2 if by_epoch else 1
    fig, axes = plt.subplots(rows, len(worlds), figsize=(max(4.2 * len(worlds), 6), 3.1 * rows + 0.6),
                             squeeze=False, sharex="col")
    handles: Dict[str, Any] = {}
    for col, world in enumerate(worlds):
        ax_loss = axes[0][col]
        here = sorted((r for r in shown if r.world_size == world), key=lambda r: r.label != "ddp")
        for run in here:
            _draw_run(run, axes[0][col], axes[1][col] if by_epoch else None, handles)
            floor_here = floors.get(world)
            if by_epoch and floor_here and run.name == floor_here["base"]:
                _draw_floor_around(run, _floor_spread(runs, floor_here), axes[0][col], axes[1][col], handles)
        said = agreement(pairs, world)
        if said:
            ax_loss.text(0.98, 0.97, "\n".join(said), transform=ax_loss.transAxes, ha="right", va="top",
                         fontsize=8, bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#cccccc"})
        if not here:
            empty(ax_loss, "no run")
        ax_loss.set(title=f"world size {world}")
        values = [y for line in ax_loss.lines for y in line.get_ydata() if y == y]
        if values and min(values) > 0 and max(values) > 10 * min(values):  # a log axis where it spans decades
            ax_loss.set_yscale("log")
        axes[-1][col].set(xlabel="epoch" if by_epoch else "step")
        for ax in (axes[r][col] for r in range(rows)):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss" if by_epoch else "rank 0's training loss")
    if by_epoch:
        axes[1][0].set_ylabel("validation top-1 (%)")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 6),
                   fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1 if rows == 1 else 0.07, 1, 1))
    return save(fig, out / PLOTS["curves"], tight=False)


def parity(pairs: List[ParityResult], floors: Dict[int, Dict[str, Any]], out: Path,
           margin: Optional[float] = None) -> str:
    """Draw parity_figure into `out` (parity.png); the file's name."""
    return save(parity_figure(pairs, floors, margin), out / PLOTS["parity"], tight=False)


def _draw_floor_band(ax: Any, band: Dict[str, float], margin: Optional[float], bottom: float,
                     legend: Dict[str, Any]) -> None:
    """A world size's noise-floor band per step, shaded, and `margin` times it dashed."""
    steps = sorted(band, key=int)
    if not steps:
        return
    xs = [int(s) for s in steps]
    shade = ax.fill_between(xs, [bottom] * len(steps), [band[s] for s in steps], color="gray", alpha=0.3, lw=0,
                            step="post")
    legend.setdefault("noise floor's band (rounding alone)", shade)
    if margin:
        dashed, = ax.step(xs, [margin * band[s] for s in steps], where="post", color="gray", ls="--", lw=0.8)
        legend.setdefault(f"{margin:g}x the band: beyond it, trains differently", dashed)


def _draw_gap(ax: Any, p: ParityResult, quantity: str, key: str, margin: Optional[float],
              legend: Dict[str, Any]) -> None:
    """A pair's relative gap per step, the step where it trains differently, and `margin` times the floor's branches
    it is judged against after a branch of its own."""
    series = getattr(p, key)
    steps = sorted(series, key=int)
    if not steps:
        return
    # a zero gap (the same bits) has no place on a log axis: the line breaks there
    line, = ax.plot([int(s) for s in steps], [series[s] if series[s] > 0 else float("nan") for s in steps],
                    lw=1.2, marker=".", ms=3, color=color_of(p.b), ls=style_of(p.a)[0])
    legend.setdefault(f"{p.a.split('@')[0]} vs {p.b.split('@')[0]}", line)
    if p.trains_differently_from is not None:
        ax.axvline(int(p.trains_differently_from), color=line.get_color(), ls=":", lw=1.2)
    judged = p.branch_levels.get(quantity) or {}
    if judged and margin:
        at = sorted(judged, key=int)
        ax.step([int(s) for s in at], [margin * judged[s] for s in at], where="post", color=line.get_color(),
                ls="--", lw=0.8, label=f"{margin:g}x rounding's branches, judging {p.a} vs {p.b}")


def parity_figure(pairs: List[ParityResult], floors: Dict[int, Dict[str, Any]],
                  margin: Optional[float] = None) -> Figure:
    """Per-step gaps of every pair that is not a repeat, one column per world size: the loss (top) and the weights'
    fingerprint (bottom), each with its world size's noise-floor band shaded, `margin` times the band dashed,
    `margin` times the floor's branches dashed in a pair's colour where the pair is judged against those
    (common.compare.branches), and the step where a pair trains differently marked. A pair that is bitwise identical
    has no gap to draw: its panel says so. The legend sits below the panels."""
    pairs = [p for p in pairs if p.kind != "repeat"]
    worlds = sorted({p.world_size for p in pairs if p.world_size is not None}) or [0]
    fig, axes = plt.subplots(2, len(worlds), figsize=(max(4.6 * len(worlds), 7), 6.4), squeeze=False)
    bottom = 1e-9  # two orders of magnitude below a float32 number's last bit
    legend: Dict[str, Any] = {}
    for col, world in enumerate(worlds):
        here = [p for p in pairs if p.world_size == world]
        for row, (quantity, key) in enumerate((("loss", "rel_loss_diff"), ("weights", "rel_weight_diff"))):
            ax = axes[row][col]
            if floors.get(world):
                _draw_floor_band(ax, floors[world]["band"][quantity], margin, bottom, legend)
            for p in here:
                if not p.bitwise_identical:
                    _draw_gap(ax, p, quantity, key, margin, legend)
            identical = [f"{p.a.split('@')[0]} = {p.b.split('@')[0]}" for p in here if p.bitwise_identical]
            if identical:
                ax.text(0.5, 0.5, "bitwise identical, no gap:\n" + "\n".join(identical), transform=ax.transAxes,
                        ha="center", va="center", fontsize=9, color="#2e7d32")
            what = "rank 0's loss" if quantity == "loss" else "the weights' fingerprint"
            ax.set(yscale="log", ylabel=f"relative gap of {what}" if col == 0 else None,
                   title=f"world size {world}" if row == 0 else None, xlabel="step" if row == 1 else None)
            ax.set_ylim(bottom=bottom)
            ax.grid(alpha=0.3)
    if not pairs:
        for ax in axes.flat:
            empty(ax, "needs two runs at one world size")
    if legend:  # one legend for every panel, below them: none covers a line
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 3), fontsize=8,
                   frameon=False)
    rows = -(-len(legend) // 3) if legend else 0
    fig.tight_layout(rect=(0, min(0.045 * rows, 0.35), 1, 1))
    return fig
