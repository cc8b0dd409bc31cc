"""The answer first: the report's summary, short enough to read in ten seconds.

A table with a row per world size and a column per compared pair, each cell a word and a reason (*same: bitwise
identical*, *same: within rounding, at most 1.9x the noise floor*, *differs from step 12: learning rate x2*,
*cannot judge: train.py does not reproduce itself*); then one line for speed and one for scaling, each with what
limits it where the runs cannot show the backends' exchange (steps of a few milliseconds, more busy threads than
cores); then one line saying what the runs were. The full verdicts and every number follow in the report.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.rundir.reader import Run, RunId
from . import analysis
from .results import ParityResult
from .trajectory import WORDS

#: a cell of the summary is at most this long (word, colon, reason)
CELL_LIMIT = 200
#: where a step computes for less than this, its time is mostly per-step overheads (Python, the loop, the
#: processes' scheduling), not the gradients' exchange: a speed difference there says little about the backends
SHORT_STEP_MS = 20.0
#: what a cell's word says
SAME, DIFFERS, APART, CANNOT_JUDGE = "same", "differs", "apart", "cannot judge"
#: a difference the port announced (one of its rewrites explains it): not a failure of the port
ANNOUNCED = "announced"


@dataclass(frozen=True)
class Cell:
    """One pair at one world size: a word (same, differs from step S, apart, cannot judge) and a short reason."""

    word: str
    reason: str
    #: the pair's verdict in full (the report's verdicts), which the cell stands for
    verdict: str = ""
    #: the difference is one the port announced in its report
    announced: bool = False

    @property
    def text(self) -> str:
        """The word and reason, cut at a word to fit the cell (the verdict in full is one click away)."""
        text = f"{self.word}: {self.reason}"
        if len(text) <= CELL_LIMIT:
            return text
        cut = text[:CELL_LIMIT - 1]
        return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:(") + "…"

    @property
    def kind(self) -> str:
        """same, differs, announced, apart or cannot judge (the word without its step)."""
        if self.announced:
            return ANNOUNCED
        return DIFFERS if self.word.startswith(DIFFERS) else self.word


@dataclass(frozen=True)
class Summary:
    """The summary: `columns` (the compared pairs), `rows` (world size -> a cell per column, None where the pair did
    not run at that size), and the speed, scaling and runs lines."""

    columns: List[str]
    rows: List[Tuple[int, List[Optional[Cell]]]]
    speed: str
    scaling: str
    runs: str
    notes: List[str] = field(default_factory=list)


def pair_column(pair: ParityResult) -> str:
    """A pair's column: its two runs without world size and repeat ("ddp vs horovod-gloo")."""
    a, b = RunId.parse(pair.a), RunId.parse(pair.b)
    return f"{a.label}{a.tag} vs {b.label}{b.tag}"


def _times(a: float, b: float) -> str:
    """How many times `b` is `a`: "x2", "x1.1", "x0.5"."""
    return f"x{b / a:.3g}" if a else f"{a:g} vs {b:g}"


def _why_apart(pair: ParityResult) -> str:
    """The shortest true reason a pair trains differently: the cause a script comparison found, a setting that
    differs, the initial weights, or how far beyond rounding the gap went."""
    if pair.cause is not None:
        return pair.cause.text.split(":")[0] if len(pair.cause.text) > 120 else pair.cause.text
    if pair.start_gap:
        return f"initial weights {pair.start_gap:.1e} apart"
    lr, setting = pair.lr_difference, pair.setting_difference
    if lr is not None and (pair.departure is None or lr.step + 1 <= pair.departure.step):
        return f"learning rate {_times(lr.a, lr.b)} ({lr.a:.4g} vs {lr.b:.4g})"
    if setting is not None and (pair.departure is None or setting.acts <= pair.departure.step):
        return f"{setting.setting.replace('_', ' ')} {setting.a} vs {setting.b}"
    if pair.departure is not None:
        return f"{WORDS[pair.departure.quantity]} {pair.departure.ratio:.3g}x what rounding gives"
    return "trains differently"


def from_step(step: Optional[int]) -> str:
    """"from step 12", or "from the start" where the two differ before the first step (their initial weights)."""
    return "from the start" if step == 0 else f"from step {step}"


def cell(pair: ParityResult) -> Cell:
    """A pair's summary cell (common.compare.analysis.parity's verdict, in short)."""
    if pair.cannot_judge:
        reason = pair.cannot_judge.split(":")[1].strip() if ":" in pair.cannot_judge else pair.cannot_judge
        return Cell(CANNOT_JUDGE, reason, pair.verdict)
    if pair.bitwise_identical:
        return Cell(SAME, "bitwise identical", pair.verdict)
    if pair.explained_by and pair.within_noise_floor is not True:  # the port said so, and how to avoid it
        step = pair.trains_differently_from if pair.trains_differently_from is not None else \
            pair.first_differing_step
        return Cell(f"{DIFFERS} {from_step(step)}", pair.explained_by, pair.verdict, announced=True)
    if pair.within_noise_floor is False or (pair.within_noise_floor is None and pair.trains_differently_from
                                            is not None):
        return Cell(f"{DIFFERS} {from_step(pair.trains_differently_from)}", _why_apart(pair), pair.verdict)
    if pair.verdict.startswith("equal within"):
        return Cell(SAME, pair.verdict, pair.verdict)
    if pair.within_noise_floor is True:
        largest = pair.largest_band_ratio
        reason = "within rounding" + (f", at most {largest.ratio:.2g}x the noise floor" if largest else "")
        return Cell(SAME, reason, pair.verdict)
    return Cell(APART, f"parameters {pair.gap:.2g} apart (‖Δ‖/‖w‖); no noise floor to judge against", pair.verdict)


def table(pairs: Sequence[ParityResult]) -> Tuple[List[str], List[Tuple[int, List[Optional[Cell]]]]]:
    """The columns (compared pairs, in order of first appearance) and a row per world size; repeats are left out
    (the report's reproducibility line has them)."""
    judged = [p for p in pairs if p.kind != "repeat" and p.world_size is not None]
    columns: List[str] = []
    for p in judged:
        if pair_column(p) not in columns:
            columns.append(pair_column(p))
    by_world: Dict[int, Dict[str, Cell]] = defaultdict(dict)
    for p in judged:
        assert p.world_size is not None
        by_world[p.world_size][pair_column(p)] = cell(p)
    rows = [(world, [by_world[world].get(c) for c in columns]) for world in sorted(by_world)]
    return columns, rows


def limits(runs: Sequence[Run], compute_ms: Optional[float]) -> List[str]:
    """What keeps the runs' speed from showing the backends' exchange: steps of a few milliseconds of compute, more
    busy threads than cores."""
    found = []
    if compute_ms is not None and compute_ms < SHORT_STEP_MS:
        found.append(f"steps of {compute_ms:.2g} ms of compute: per-step overheads, not the gradients' exchange, "
                     "decide these speeds")
    busiest = analysis.conditions(list(runs))
    if busiest and busiest["ranks"] * busiest["threads"] > busiest["cores"]:
        found.append(f"{busiest['ranks']} ranks x {busiest['threads']} thread{'s' if busiest['threads'] > 1 else ''} "
                     f"on {busiest['cores']} cores: the ranks share cores")
    return found


def speed_line(throughput: Dict[str, Dict[str, Any]], caveats: List[str]) -> str:
    """Per world size, each backend's median samples/s, the fastest first, the others by how much slower, with the
    spread over repeats, then what limits the figures."""
    by_world: Dict[int, List[Tuple[str, Dict[str, Any]]]] = defaultdict(list)
    for key, spread in throughput.items():
        identity = RunId.parse(key)
        if not identity.is_variant:
            by_world[identity.world_size].append((f"{identity.label}{identity.tag}", spread))
    parts = []
    for world, found in sorted(by_world.items()):
        if len(found) < 2:
            continue
        found.sort(key=lambda item: -item[1]["median"])
        best = found[0][1]["median"]
        shown = [f"{found[0][0]} {best:.0f}"] + [
            f"{label} {spread['median']:.0f} ({100 * (spread['median'] / best - 1):+.0f}%)" for label, spread in
            found[1:]]
        repeats = min(spread["n"] for _, spread in found)
        overlap = repeats >= 2 and any(spread["max"] >= found[0][1]["min"] for _, spread in found[1:])
        spread_text = ("one repeat, spread unknown" if repeats < 2 else
                       "within the spread across repeats" if overlap else "beyond the spread across repeats")
        parts.append(f"at {world} rank{'s' if world != 1 else ''} {', '.join(shown)} samples/s ({spread_text})")
    if not parts:
        return "Speed: no two backends ran at one world size."
    return "Speed: " + "; ".join(parts) + "." + "".join(f" {c[0].upper()}{c[1:]}." for c in caveats)


def scaling_line(scaling: Dict[str, Dict[int, float]], caveats: List[str]) -> str:
    """Each backend's scaling efficiency per world size, then what limits it."""
    parts = []
    for label, points in sorted(scaling.items()):
        if RunId.parse(f"{label}@1").is_variant:
            continue
        shown = ", ".join(f"{e:.2f} at {w}" for w, e in sorted(points.items()) if w != 1)
        if shown:
            parts.append(f"{label} {shown}")
    if not parts:
        return "Scaling: no backend ran at one rank and more."
    return ("Scaling efficiency (throughput(N) / N x throughput(1)): " + "; ".join(parts) + "."
            + "".join(f" {c[0].upper()}{c[1:]}." for c in caveats))


def runs_line(runs: Sequence[Run], failed: Sequence[str] = ()) -> str:
    """What the runs were: the model, data, steps, batch, optimizer (or the scripts), ranks x threads per host on
    how many cores, how many ran, and which failed (named: they are in no pair)."""
    failed_text = f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""
    if not runs:
        return "No run to describe" + (f": {len(failed)} failed: {', '.join(failed)}." if failed else ".")
    first = runs[0]
    settings = first.settings
    script = (first.config.get("script") or {}).get("path")
    scripts = sorted({(r.config.get("script") or {}).get("path", "").rsplit("/", 1)[-1] for r in runs} - {""})
    worlds = sorted({r.world_size for r in runs})
    what = (f"scripts {', '.join(scripts)} ({first.config.get('model') or 'its model'})" if script else
            f"{settings.get('model')} on {settings.get('dataset')}, per-process batch {settings.get('batch_size')}, "
            f"{settings.get('optimizer')} lr {settings.get('lr')}")
    steps = sorted({int(r.summary["steps"]) for r in runs if r.summary.get("steps") is not None})
    steps_text = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}" if steps else "?"
    busiest = analysis.conditions(list(runs))
    hosts = sorted({h for r in runs for h in (r.config.get("rank_hosts") or r.config.get("hosts") or [])})
    where = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}" if hosts else "one host"
    threads = (f", up to {busiest['ranks']} ranks x {busiest['threads']} thread"
               f"{'s' if busiest['threads'] > 1 else ''} per host on {busiest['cores']} cores") if busiest else ""
    return (f"Runs: {what}; {steps_text} steps; world sizes {', '.join(map(str, worlds))} on {where}{threads}; "
            f"{len(runs)} runs{failed_text}.")


def build(pairs: Sequence[ParityResult], runs: Sequence[Run], throughput: Dict[str, Dict[str, Any]],
          scaling: Dict[str, Dict[int, float]], compute_ms: Optional[float], notes: Sequence[str] = (),
          failed: Sequence[str] = ()) -> Summary:
    """The summary of a comparison (`compute_ms`: the median step's compute of the compared runs; `failed`: the
    names of the runs that failed)."""
    columns, rows = table(pairs)
    caveats = limits(runs, compute_ms)
    return Summary(columns, rows, speed_line(throughput, caveats), scaling_line(scaling, caveats),
                   runs_line(runs, failed), list(notes))
