"""The comparison's outputs: summary.json (every number), report.md and report.html (the same document: the answer
first, then the verdicts, the figures, the speed, and the reference folded), and the figures.

`analyse` turns the runs into a typed `Comparison`; `build` also writes the files. The document's sections are made
once (`sections`) and rendered twice (common.compare.document)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from common.config import is_exact
from common.rundir.names import SUMMARY_FILE
from common.rundir.reader import Run, setting_differences
from common.rundir.writer import json_safe
from . import analysis, benchmarks, causes, explain, floor, forecast, plots, reproducible, speed_plots, summary
from .document import (Block, Bullets, Code, Figure, Paragraph, Quote, Section, Table, from_markdown, markdown,
                       render_html)
from .reproducible import Irreproducible
from .results import ParityResult, as_json
from .tables import number as _fmt

TITLE = "Horovod vs DDP: comparison report"
REPORT_MD, REPORT_HTML = "report.md", "report.html"


@dataclass
class Comparison:
    """Everything a comparison found, typed: the runs, the failed runs, each pair's parity, the noise floors, the
    programs that did not reproduce themselves, the explanations, speed and scaling, and the summary."""

    runs: List[Run]
    failures: List[Dict[str, Any]]
    pairs: List[ParityResult]
    floors: Dict[int, Dict[str, Any]]
    irreproducible: Dict[int, Irreproducible]
    explanations: List[Dict[str, Any]]
    world_sizes: List[Dict[str, Any]]
    throughput: Dict[str, Dict[str, Any]]
    speed: List[Dict[str, Any]]
    scaling: Dict[str, Dict[int, float]]
    time_split: List[Dict[str, Any]]
    accuracy: List[Dict[str, Any]]
    summary: summary.Summary
    tolerance: float
    margin: float
    notes: List[str] = field(default_factory=list)
    bench: Optional[Dict[str, Any]] = None
    figures: Dict[str, str] = field(default_factory=dict)
    #: sections a caller adds after the verdicts (the port's rewrite report)
    extra: List[Section] = field(default_factory=list)


def analyse(runs: List[Run], failures: List[Dict[str, Any]], tolerance: float, notes: Sequence[str],
            bench: Optional[Dict[str, Any]] = None, unknown_floors: Optional[Dict[int, str]] = None,
            margin: float = analysis.FLOOR_MARGIN,
            relate: Optional[Callable[[List[ParityResult]], None]] = None) -> Comparison:
    """Judge every pair, explain what differs, and measure speed and scaling. `unknown_floors` says why a world
    size has no noise floor; `margin` is how many floors a gap may be and be within it; `relate` adds to the pairs'
    verdicts what explains their causes (the port's rewrites), before the summary is made."""
    floors = floor.floors(runs)
    judged = {**{world: {"unknown": why} for world, why in (unknown_floors or {}).items()}, **floors}
    irreproducible = reproducible.check(runs)
    pairs = analysis.parity_table(runs, tolerance, judged, margin, irreproducible)
    by_name = {run.name: run for run in runs}
    for p in pairs:  # scripts the probe followed: why they part, where they do
        parts = p.trains_differently_from if p.trains_differently_from is not None else (
            p.first_differing_step if p.within_noise_floor is None and not p.bitwise_identical
            and not p.cannot_judge else None)
        p.cause = causes.explain(by_name[p.a], by_name[p.b], parts)
        if p.cause:
            p.verdict += f"; cause: {p.cause.text} (see {p.cause.guide})"
    if relate is not None:
        relate(pairs)
    throughput = analysis.throughput_table(runs)
    scaling = analysis.scaling_table(throughput)
    split = analysis.time_split_table(runs)
    plain = {r.name for r in runs if not r.identity.is_variant}
    compute = sorted(r["compute_ms"] for r in split if r.get("compute_ms") and r["run"] in plain)
    return Comparison(
        runs, failures, pairs, floors, irreproducible, explain.explanations(pairs, runs),
        explain.world_size_verdicts(runs), throughput, analysis.speed_verdicts(runs, throughput), scaling, split,
        analysis.accuracy_table(runs),
        summary.build(pairs, runs, throughput, scaling, compute[len(compute) // 2] if compute else None, notes,
                      [str(f.get("name", "?")) for f in failures]),
        tolerance, margin, list(notes), bench)


def build(runs: List[Run], failures: List[Dict[str, Any]], out: Path, tolerance: float, notes: Sequence[str],
          bench: Optional[Dict[str, Any]] = None, unknown_floors: Optional[Dict[int, str]] = None,
          margin: float = analysis.FLOOR_MARGIN, extra: Sequence[Section] = (),
          relate: Optional[Callable[[List[ParityResult]], None]] = None) -> Comparison:
    """Analyse `runs`, draw the figures into `out`, write summary.json, report.md and report.html; return the
    comparison. `bench` (from benchmarks.load) adds the benchmark section; `extra` sections follow the
    verdicts; `relate` as for `analyse`."""
    out.mkdir(parents=True, exist_ok=True)
    found = analyse(runs, failures, tolerance, notes, bench, unknown_floors, margin, relate)
    found.extra = list(extra)
    found.figures = {
        "curves": plots.curves(runs, out, found.floors, found.pairs),
        "parity": plots.parity(found.pairs, found.floors, out, margin),
        "throughput": speed_plots.throughput(found.throughput, out),
        "scaling": speed_plots.scaling(found.scaling, out),
        "time_split": speed_plots.time_split(found.time_split, out),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(json_safe(summary_json(found)), indent=2, sort_keys=True) + "\n")
    parts = sections(found)
    (out / REPORT_MD).write_text(markdown(TITLE, parts))
    (out / REPORT_HTML).write_text(render_html(TITLE, parts, out))
    return found


def summary_json(c: Comparison) -> Dict[str, Any]:
    """summary.json: every number of the comparison."""
    runs = c.runs
    return {
        "summary": {"columns": c.summary.columns,
                    "rows": [{"world_size": world, "cells": {column: as_json(cell) | {"text": cell.text,
                                                                                       "kind": cell.kind}
                                                             for column, cell in zip(c.summary.columns, cells,
                                                                                     strict=True) if cell}}
                             for world, cells in c.summary.rows],
                    "speed": c.summary.speed, "scaling": c.summary.scaling, "runs": c.summary.runs},
        "runs": [{"name": r.name, "path": str(r.path), "backend": r.label, "world_size": r.world_size,
                  "repeat": r.repeat + 1, "summary": r.summary, "launch": r.launch,
                  "command": r.launch.get("command") or r.config.get("command"),
                  "hosts": r.config.get("hosts"), "launcher": r.config.get("launcher"),
                  "versions": r.config.get("versions"), "settings": r.settings,
                  "threads": r.config.get("threads"), "cores": r.config.get("cores"),
                  "ranks_per_host": r.config.get("ranks_per_host")} for r in runs],
        "failures": c.failures,
        "parity": as_json(c.pairs),
        "noise_floors": c.floors,
        "irreproducible": as_json(c.irreproducible),
        "floor_margin": c.margin,
        "explanations": c.explanations,
        "world_sizes": c.world_sizes,
        "throughput": c.throughput,
        "speed": c.speed,
        "conditions": {key: analysis.conditions_text(analysis.conditions([r for r in runs if r.key == key]))
                       for key in c.throughput if analysis.conditions([r for r in runs if r.key == key])},
        "scaling_efficiency": {k: {str(w): e for w, e in v.items()} for k, v in c.scaling.items()},
        "time_split": c.time_split,
        "accuracy": c.accuracy,
        "setting_differences": setting_differences(runs) if runs else {},
        "tolerance": c.tolerance,
        "notes": c.notes,
        "plots": c.figures,
        "benchmarks": benchmarks.summary(c.bench),
    }


# --- the document -------------------------------------------------------------------------------------------------
def sections(c: Comparison) -> List[Section]:
    """The report, in order: the answer, the verdicts in full, the learning curves and the figure of gaps, the speed,
    then the reference (folded in HTML)."""
    parts = [_summary(c), _verdicts(c), *c.extra,
             Section("Learning curves", [Figure(c.figures["curves"], "training loss and validation top-1 per world "
                                                                      "size")]),
             _parity(c), *_parity_reference(c), *_speed(c)]
    bench = benchmarks.markdown(c.bench)
    if bench:
        parts += [Section(s.title, s.blocks, folded=True) for s in from_markdown(bench)]
    if c.failures:
        parts.append(_failed(c))
    parts += [_accuracy(c), _reproduce(c)]
    return parts


def _summary(c: Comparison) -> Section:
    s = c.summary
    blocks: List[Block] = []
    if s.rows:
        blocks.append(Table(["world size", *s.columns],
                            [[str(world), *(cell.text if cell else "–" for cell in cells)] for world, cells in s.rows],
                            kinds=[["", *(cell.kind if cell else "" for cell in cells)] for _, cells in s.rows],
                            css_class="summary"))
    else:
        blocks.append(Paragraph("No two runs at one world size to compare."))
    blocks += [Paragraph(s.speed), Paragraph(s.scaling), Paragraph(s.runs)]
    blocks += [Quote(note) for note in s.notes]
    return Section("Summary", blocks, anchor="summary")


def _verdicts(c: Comparison) -> Section:
    why = {(e["a"], e["b"]): e["text"] for e in c.explanations}
    items, notes = [], []
    for p in c.pairs:
        if p.kind != "repeat":
            items.append(f"**Weights, world size {p.world_size}**, {p.a} vs {p.b}: **{p.verdict}**.")
            notes.append(f"Why, measured: {why[p.a, p.b]}" if (p.a, p.b) in why else "")
    for w in c.world_sizes:
        items.append(f"**World sizes** (--reduction exact): **{w['verdict']}**.")
        notes.append("")
    repeats = [p for p in c.pairs if p.kind == "repeat"]
    if repeats:
        same = sum(p.bitwise_identical for p in repeats)
        items.append(f"**Reproducibility**: repeats of the same run are "
                     f"{'bitwise identical' if same == len(repeats) else 'not all bitwise identical'} "
                     f"({same}/{len(repeats)}).")
        notes.append("")
    for f in c.failures:
        items.append(f"**FAILED** {f['name']}: {f['error']}")
        notes.append("")
    blocks: List[Block] = [Bullets(items, notes) if items else Paragraph("Nothing to compare.")]
    return Section("Verdicts", blocks, anchor="verdicts")  # the notes: once, in the summary above


def _parity(c: Comparison) -> Section:
    return Section("Do they learn the same?", [
        Paragraph("Per step, how far apart each pair's loss and weights are (relative gaps), against the noise floor: "
                  "how far rounding alone carries a run (the shaded band; its runs start one unit in the last place "
                  f"away). A pair more than {c.margin:g}x the band at a step trains differently from there; the "
                  "right panel gives the final weight gaps."),
        Figure(c.figures["parity"], "per-step gaps of each pair against the noise floor")], anchor="parity")


def _parity_reference(c: Comparison) -> List[Section]:
    rows = [[f"{p.a} vs {p.b}", p.kind, str(p.first_differing_step or "none"), str(p.trains_differently_from
                                                                                    if p.trains_differently_from
                                                                                    is not None else "–"),
             _ratio_cell(p), _fmt(p.max_rel_loss_diff, ".2g"), _group_cell((p.gaps or {}).get("parameters")),
             _group_cell((p.gaps or {}).get("buffers")), _fmt(p.max_abs_weight_diff, ".3g"),
             " / ".join(_fmt(v) for v in p.val_top1), p.verdict] for p in c.pairs]
    out = [Section("The gaps, pair by pair", [Table(
        ["pair", "kind", "first differing step", "trains differently from", "largest gap / floor", "max Δloss / loss",
         "parameters ‖Δ‖/‖w‖", "buffers ‖Δ‖/‖w‖", "final max Δw", "val top-1", "verdict"], rows)], folded=True)]
    if c.floors:
        items, notes = [], []
        for world, f in sorted(c.floors.items()):
            top1 = (f.get("outcome") or {}).get("val_top1")
            items.append(f"World size {world}: {f['base']} against {f['runs']} disturbed run"
                         f"{'s' if f['runs'] != 1 else ''} ({', '.join(f['disturbed'])}): the parameters end up to "
                         f"{_fmt(f['gap'], '.2g')} ‖Δ‖/‖w‖ apart" + (f" (most in {f['tensor']})" if f["tensor"] else "")
                         + f", the loss by at most {_fmt(f['max_rel_loss_diff'], '.2g')} of itself"
                         + (f"; val top-1 {top1[0]:.4f}–{top1[1]:.4f} over the floor's runs" if top1 else "") + ".")
            notes.append("; ".join(f"{p['disturbed']}: final ‖Δ‖/‖w‖ {_fmt(p['gap'], '.2g')}, largest loss gap "
                                   f"{_fmt(p['max_rel_loss_diff'], '.2g')}" for p in f["pairs"]))
        out.append(Section("The noise floor", [Bullets(items, notes)], folded=True))
    out.append(Section("How pairs are judged", [Paragraph(_method(c))], folded=True))
    return out


def _method(c: Comparison) -> str:
    return ("Two quantities are compared at every logged step, both describing the weights the step's forward pass "
            "sees: rank 0's loss and a fingerprint of the weights (every parameter tensor's norm); a pair's gap at a "
            "step is their relative difference. The noise floor is how far rounding alone carries a run: the first "
            "backend again with its initial weights moved by one unit in the last place, in several patterns (and, "
            "where the gradients are exchanged at float16, each reduced gradient moved by one float16 unit at every "
            "step), each compared with its undisturbed run; its band at a step is the largest gap any of them has "
            f"reached by then. A pair whose gap stays within {c.margin:g}x the band at every step, with the same "
            "learning rate and optimizer settings at every step, is within the noise floor: it rounds differently "
            "and trains the same, however far apart it ends. A pair that branches later than it first differs is "
            "judged from its branch against how far the floor's runs reach as many steps after theirs. A pair that "
            "leaves what it is judged against, or whose settings differ, trains differently from that step. Weights "
            f"are equal within X when they do not leave the band and differ by at most {c.tolerance:.0e} "
            "element-wise. Before anything is judged, runs of one program with the same arguments must start alike "
            "(else: cannot judge). docs/comparing.md has the method and its calibration.")


def _speed(c: Comparison) -> List[Section]:
    blocks: List[Block] = [Paragraph(c.summary.speed), Paragraph(c.summary.scaling)]
    if c.speed:
        blocks.append(Bullets([f"{v['verdict']}." for v in c.speed]))  # a backend's label keeps its case
    blocks.append(Paragraph("Training samples/s over all ranks, first step excluded; median (min–max) over repeats. "
                            "Runs on one host communicate through loopback and shared memory, runs across hosts over "
                            "the network between them: compare rows of the same placement."))
    conditions = {key: analysis.conditions_text(analysis.conditions([r for r in c.runs if r.key == key]))
                  for key in c.throughput if analysis.conditions([r for r in c.runs if r.key == key])}
    if conditions:
        blocks.append(Paragraph("Threads and cores (the busiest host of each run: ranks x threads per rank on its "
                                "cores; more busy threads than cores makes a speed figure the machine's contention): "
                                + "; ".join(f"{key}: {text}" for key, text in conditions.items()) + "."))
    blocks += [Figure(c.figures["throughput"], "throughput against world size"),
               Figure(c.figures["scaling"], "scaling efficiency against world size")]
    tables: List[Block] = []
    for title, rows in _by_placement(c.throughput):
        tables += [Paragraph(f"**{title}**"), Table(
            ["backend@world", "hosts", "median samples/s", "min", "max", "repeats"],
            [[k, ", ".join(v["hosts"]) or "?", _fmt(v["median"], ".1f"), _fmt(v["min"], ".1f"), _fmt(v["max"], ".1f"),
              str(v["n"])] for k, v in rows])]
    split: List[Block] = [Paragraph(
        "Mean per step: waiting for data, computing (forward, backward, optimizer), and gradient communication that "
        "backward did not hide (DDP: from the last bucket's allreduce launch to the end of backward; Horovod: time in "
        "synchronize() before the step)."),
             Table(["run", "data ms", "compute ms", "comm ms", "step ms", "comm share"],
                   [[r["run"], _fmt(r["data_ms"], ".2f"), _fmt(r["compute_ms"], ".2f"), _fmt(r["comm_ms"], ".2f"),
                     _fmt(r["step_ms"], ".2f"), _fmt(100 * (r["comm_frac"] or 0), ".1f") + "%"]
                    for r in c.time_split]),
             Figure(c.figures["time_split"], "where a step's time goes"), *_forecast(c)]
    return [Section("Speed", blocks, anchor="speed"),
            Section("Throughput, run by run", tables, folded=True),
            Section("Where the time goes", split, folded=True)]


def _forecast(c: Comparison) -> List[Block]:
    """Each run's step time forecast on other links, from its own time split and reduced bytes."""
    links = [link.describe() for link in forecast.REPORT_LINKS]
    rows = [r for r in c.time_split if any(v is not None for v in (r.get("forecast_ms") or {}).values())]
    if not rows:
        return []
    return [Paragraph("The step time each run would take on a link between hosts of another bandwidth, forecast from "
                      "its own compute and exposed communication and the bytes it reduced per step: backward (two "
                      "thirds of the compute) hides the ring allreduces it overlaps; DDP's last bucket, which starts "
                      "when backward ends, and what Horovod's link has left then are exposed "
                      "(docs/comparing.md#a-forecast-for-another-link)."),
            Table(["run", "step ms", *(f"at {link}" for link in links)],
                  [[r["run"], _fmt(r["step_ms"], ".1f"), *(_fmt(r["forecast_ms"][link], ".1f") for link in links)]
                   for r in rows])]


def _failed(c: Comparison) -> Section:
    blocks: List[Block] = []
    for f in c.failures:
        blocks += [Paragraph(f"**{f['name']}**: exit code {f['returncode']}: {f['error']}"),
                   Code(f"{f['command']}\n# full output: {f['log']}")]
    return Section("Failed runs", blocks, anchor="failed")


def _accuracy(c: Comparison) -> Section:
    return Section("Accuracy", [Table(
        ["run", "steps", "epochs", "train loss", "val loss", "val top-1", "val top-5", "wall s"],
        [[a["run"], str(a["steps"]), "–" if a["epochs"] is None else str(a["epochs"]), _fmt(a["train_loss"]),
          _fmt(a["val_loss"]), _fmt(a["val_top1"]), _fmt(a["val_top5"]), _fmt(a["wall_s"], ".1f")]
         for a in c.accuracy])], folded=True)


def _reproduce(c: Comparison) -> Section:
    blocks: List[Block] = []
    differences = setting_differences(c.runs) if c.runs else {}
    if differences:
        blocks.append(Paragraph("Settings that differ between runs:"))
        blocks.append(Bullets([f"`{key}`: " + ", ".join(f"{n}={v}" for n, v in values.items())
                               for key, values in differences.items()]))
    rows = []
    for r in c.runs:
        versions = r.config.get("versions") or {}
        rows.append([r.name, str(r.config.get("launcher")), ",".join(r.config.get("hosts") or []),
                     str(versions.get("torch")), str(versions.get("horovod")),
                     (versions.get("project_git") or "")[:12], _command_cell(r)])
    blocks.append(Table(["run", "launcher", "hosts", "torch", "horovod", "git", "command"], rows))
    if c.runs:
        blocks += [Paragraph("Settings of the runs (first run; differences listed above):"),
                   Code(json.dumps(c.runs[0].settings, indent=2, sort_keys=True), "json")]
        if not c.runs[0].config.get("script"):
            blocks.insert(0, Paragraph(_settings_line(c.runs[0].settings)))
    return Section("Reproduce", blocks, folded=True)


def _settings_line(first: Dict[str, Any]) -> str:
    batch = (f"--reduction exact, global batch {first.get('global_batch') or 'default'} in micro-batches of "
             f"{first.get('micro_batch')}" if is_exact(first) else
             f"global batch {first['global_batch']}" if first.get("global_batch") else
             f"per-process batch {first.get('batch_size')}")
    return (f"Model **{first.get('model')}** on **{first.get('dataset')}**, {batch}, seed {first.get('seed')}, "
            f"optimizer {first.get('optimizer')} (lr {first.get('lr')}).")


def _by_placement(throughput: Dict[str, Dict[str, Any]]) -> List[Any]:
    """The throughput rows in two groups, runs on one host and runs across hosts (only those present)."""
    groups = [("On one host", [(k, v) for k, v in throughput.items() if len(v["hosts"]) <= 1]),
              ("Across hosts", [(k, v) for k, v in throughput.items() if len(v["hosts"]) > 1])]
    return [(title, rows) for title, rows in groups if rows] or [("On one host", [])]


def _command_cell(run: Run) -> str:
    """A run's command for the reproduce table; a run started on several hosts shows each host's line."""
    commands = (run.launch or {}).get("commands") or {}
    if len(commands) > 1:
        return "<br>".join(f"`{host}$ {cmd}`" for host, cmd in commands.items())
    return f"`{run.launch.get('command') or run.config.get('command')}`"


def _group_cell(group: Optional[Dict[str, Any]]) -> str:
    if not group:
        return ""
    top = group["largest"][0]["tensor"] if group["largest"] else None
    return _fmt(group["max_rel"], ".2g") + (f" ({top})" if top else "")


def _ratio_cell(p: ParityResult) -> str:
    largest = p.largest_band_ratio
    if not largest:
        return ""
    return f"{_fmt(largest.ratio, '.3g')} ({largest.quantity}, step {largest.step})"
