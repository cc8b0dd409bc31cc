"""report.md and summary.json: every number, the verdicts in words, and how to reproduce."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List, Optional

from common.config import is_exact
from common.rundir.names import SUMMARY_FILE
from common.rundir.reader import Run, RunId, setting_differences
from common.rundir.writer import json_safe
from . import analysis, benchmarks, causes, explain, floor, plots, reproducible, speed_plots
from .results import as_json
from .tables import markdown as _table, number as _fmt


def build(runs: List[Run], failures: List[Dict], out: Path, tolerance: float, notes: List[str],
          bench: Optional[Dict] = None, unknown_floors: Optional[Dict[int, str]] = None,
          margin: float = analysis.FLOOR_MARGIN) -> Dict:
    """Analyse `runs`, draw the plots into `out`, write report.md and summary.json; return the summary.
    `bench` (from benchmarks.load) adds the allreduce and throughput benchmark section; `unknown_floors`
    says why a world size has no noise floor; `margin` is how many floors a gap may be and be within it."""
    out.mkdir(parents=True, exist_ok=True)
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
    throughput = analysis.throughput_table(runs)
    speed = analysis.speed_verdicts(runs, throughput)
    scaling = analysis.scaling_table(throughput)
    split = analysis.time_split_table(runs)
    accuracy = analysis.accuracy_table(runs)
    explanations = explain.explanations(pairs, runs)
    world_sizes = explain.world_size_verdicts(runs)
    figures = {
        "curves": plots.curves(runs, out, floors),
        "throughput": speed_plots.throughput(throughput, out),
        "scaling": speed_plots.scaling(scaling, out),
        "time_split": speed_plots.time_split(split, out),
        "parity": plots.parity(pairs, floors, out, margin),
    }
    summary = {
        "runs": [{"name": r.name, "path": str(r.path), "backend": r.label, "world_size": r.world_size,
                  "repeat": r.repeat + 1, "summary": r.summary, "launch": r.launch,
                  "command": r.launch.get("command") or r.config.get("command"),
                  "hosts": r.config.get("hosts"), "launcher": r.config.get("launcher"),
                  "versions": r.config.get("versions"), "settings": r.settings} for r in runs],
        "failures": failures,
        "parity": as_json(pairs),
        "noise_floors": floors,
        "irreproducible": {world: dataclasses.asdict(found) for world, found in irreproducible.items()},
        "floor_margin": margin,
        "explanations": explanations,
        "world_sizes": world_sizes,
        "throughput": throughput,
        "speed": speed,
        "conditions": {key: analysis.conditions_text(analysis.conditions([r for r in runs if r.key == key]))
                       for key in throughput if analysis.conditions([r for r in runs if r.key == key])},
        "scaling_efficiency": {k: {str(w): e for w, e in v.items()} for k, v in scaling.items()},
        "time_split": split,
        "accuracy": accuracy,
        "setting_differences": setting_differences(runs) if runs else {},
        "tolerance": tolerance,
        "notes": notes,
        "plots": figures,
        "benchmarks": benchmarks.summary(bench),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(json_safe(summary), indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(_markdown(summary, runs, benchmarks.markdown(bench)))
    return summary


def _by_placement(throughput: Dict[str, Dict]) -> List:
    """The throughput rows in two groups, runs on one host and runs across hosts (only those present)."""
    groups = [("On one host", [(k, v) for k, v in throughput.items() if len(v["hosts"]) <= 1]),
              ("Across hosts", [(k, v) for k, v in throughput.items() if len(v["hosts"]) > 1])]
    return [(title, rows) for title, rows in groups if rows] or [("On one host", [])]


def _command_cell(run: Dict) -> str:
    """A run's command for the reproduce table; a run started on several hosts shows each host's line."""
    commands = (run["launch"] or {}).get("commands") or {}
    if len(commands) > 1:
        return "<br>".join(f"`{host}$ {cmd}`" for host, cmd in commands.items())
    return f"`{run['command']}`"


def _markdown(s: Dict, runs: List[Run], bench_section: List[str]) -> str:
    md = ["# Horovod vs DDP: comparison report", ""]
    first = runs[0].settings if runs else {}
    if first:
        batch = (f"--reduction exact, global batch {first.get('global_batch') or 'default'} in micro-batches of "
                 f"{first.get('micro_batch')}" if is_exact(first) else
                 f"global batch {first['global_batch']}" if first.get("global_batch") else
                 f"per-process batch {first.get('batch_size')}")
        md.append(f"Model **{first.get('model')}** on **{first.get('dataset')}**, {batch}, seed {first.get('seed')}, "
                  f"optimizer {first.get('optimizer')} (lr {first.get('lr')}), {len(runs)} run(s).")
        md.append("")

    md += ["## Verdicts", ""]
    verdicts_start = len(md)
    why = {(e["a"], e["b"]): e["text"] for e in s["explanations"]}
    for p in s["parity"]:
        if p["kind"] != "repeat":
            md.append(f"- **Weights, world size {p['world_size']}**, {p['a']} vs {p['b']}: **{p['verdict']}**.")
            if (p["a"], p["b"]) in why:
                md.append(f"  Why, measured: {why[p['a'], p['b']]}")
    for w in s["world_sizes"]:
        md.append(f"- **World sizes** (--reduction exact): **{w['verdict']}**.")
    for v in s["speed"]:
        md.append(f"- **Speed**: {v['verdict']}.")
    for label, points in sorted(s["scaling_efficiency"].items()):
        if RunId.parse(f"{label}@1").is_variant:  # an explaining variant, run at one world size only
            continue
        shown = ", ".join(f"{_fmt(e, '.2f')} at {w}" for w, e in sorted(points.items(), key=lambda x: int(x[0]))
                          if w != "1")
        if shown:
            md.append(f"- **Scaling efficiency** of {label}: {shown}.")
    repeats = [p for p in s["parity"] if p["kind"] == "repeat"]
    if repeats:
        same = all(p["bitwise_identical"] for p in repeats)
        md.append(f"- **Reproducibility**: repeats of the same run are "
                  f"{'bitwise identical' if same else 'not all bitwise identical'} "
                  f"({sum(p['bitwise_identical'] for p in repeats)}/{len(repeats)}).")
    for f in s["failures"]:
        md.append(f"- **FAILED** {f['name']}: {f['error']}")
    if len(md) == verdicts_start:
        md.append("- nothing to compare")
    md.append("")
    for note in s["notes"]:
        md.append(f"> {note}")
    if s["notes"]:
        md.append("")

    md += ["## Accuracy", "", _table(
        ["run", "steps", "epochs", "train loss", "val loss", "val top-1", "val top-5", "wall s"],
        [[a["run"], a["steps"], a["epochs"], _fmt(a["train_loss"]), _fmt(a["val_loss"]),
          _fmt(a["val_top1"]), _fmt(a["val_top5"]), _fmt(a["wall_s"], ".1f")] for a in s["accuracy"]]),
        "", f"![training and validation curves]({s['plots']['curves']})", ""]

    md += _parity_section(s)

    md += ["## Speed", "", "Training samples/s over all ranks, first step excluded; median (min–max) "
           "over repeats. Runs on one host communicate through loopback and shared memory, runs across hosts "
           "over the network between them: compare rows of the same placement.", ""]
    if s["conditions"]:
        md += ["Threads and cores (the busiest host of each run: ranks x threads per rank on its cores; more busy "
               "threads than cores makes a speed figure the machine's contention): "
               + "; ".join(f"{key}: {text}" for key, text in s["conditions"].items()) + ".", ""]
    for title, rows in _by_placement(s["throughput"]):
        md += [f"### {title}", "", _table(
            ["backend@world", "hosts", "median samples/s", "min", "max", "repeats"],
            [[k, ", ".join(v["hosts"]) or "?", _fmt(v["median"], ".1f"), _fmt(v["min"], ".1f"),
              _fmt(v["max"], ".1f"), v["n"]] for k, v in rows]), ""]
    md += ["Scaling efficiency is throughput(N) / (N x throughput(1)) with each backend's own "
           "single-process run; a Horovod controller with no world-size-1 run uses the other controller's "
           "(one process does not communicate).", "",
           f"![throughput]({s['plots']['throughput']})", "",
           f"![scaling efficiency]({s['plots']['scaling']})", ""]

    md += ["## Where the time goes", "",
           "Mean per step: waiting for data, computing (forward, backward, optimizer), and gradient "
           "communication that backward did not hide (DDP: from the last bucket's allreduce launch to the "
           "end of backward; Horovod: time in synchronize() before the step).", "", _table(
               ["run", "data ms", "compute ms", "comm ms", "step ms", "comm share"],
               [[r["run"], _fmt(r["data_ms"], ".2f"), _fmt(r["compute_ms"], ".2f"), _fmt(r["comm_ms"], ".2f"),
                 _fmt(r["step_ms"], ".2f"), _fmt(100 * (r["comm_frac"] or 0), ".1f") + "%"]
                for r in s["time_split"]]),
           "", f"![time split]({s['plots']['time_split']})", ""]

    md += bench_section

    if s["failures"]:
        md += ["## Failed runs", ""]
        for f in s["failures"]:
            md += [f"### {f['name']}", "", f"Exit code {f['returncode']}: {f['error']}", "",
                   f"Command: `{f['command']}`", "", f"Full output: `{f['log']}`", ""]

    md += ["## Reproduce", ""]
    if s["setting_differences"]:
        md += ["Settings that differ between runs:", ""]
        for key, values in s["setting_differences"].items():
            md.append(f"- `{key}`: " + ", ".join(f"{n}={v}" for n, v in values.items()))
        md.append("")
    md += [_table(["run", "launcher", "hosts", "torch", "horovod", "git", "command"],
                  [[r["name"], r["launcher"], ",".join(r["hosts"] or []), (r["versions"] or {}).get("torch"),
                    (r["versions"] or {}).get("horovod"), ((r["versions"] or {}).get("project_git") or "")[:12],
                    _command_cell(r)] for r in s["runs"]]), ""]
    if runs:
        md += ["Settings of the runs (first run; differences listed above):", "", "```json",
               json.dumps(runs[0].settings, indent=2, sort_keys=True), "```", ""]
    return "\n".join(md)


def _group_cell(group: Optional[Dict]) -> str:
    if not group:
        return ""
    top = group["largest"][0]["tensor"] if group["largest"] else None
    return _fmt(group["max_rel"], ".2g") + (f" ({top})" if top else "")


def _parity_section(s: Dict) -> List[str]:
    """Do they learn the same: the verdicts' meaning, the per-pair gaps, the noise floor, the plot."""
    md = ["## Do they learn the same?", "",
          "Two quantities are compared at every logged step, both describing the weights the step's forward pass "
          "sees: rank 0's loss and a fingerprint of the weights (every parameter tensor's norm); a pair's gap at a "
          "step is their relative difference. The noise floor is how far rounding alone carries a run: the first "
          "backend again with its initial weights moved by one unit in the last place, in several patterns, each "
          "compared with its undisturbed run; its band at a step is the largest gap any of them has reached by then. "
          f"A pair whose gap stays within {s['floor_margin']:g}x the band at every step, with the same learning "
          "rate at every step, is **within the noise floor** (it rounds differently and trains the same, however far "
          "apart it ends: training branches, and the floor's runs show how far). When a branch starts is chance, how "
          "it grows is not: a pair that differs at rounding's size first and branches later (its gap passes "
          f"{s['floor_margin']:g}x float32's last bit) is judged from there against the larger of the band and how far "
          "the floor's runs reach as many steps after their own branches. A pair that leaves what it is judged "
          "against, or whose learning rate differs, is **beyond** the noise floor from that step: it trains "
          "differently. Weights are *equal "
          f"within X* when they do not leave the band and differ by at most {s['tolerance']:.0e} element-wise. The "
          "final loss and accuracy are shown against the range of the floor's runs.", "", _table(
              ["pair", "kind", "first differing step", "trains differently from", "largest gap / floor",
               "max Δloss / loss", "parameters ‖Δ‖/‖w‖", "buffers ‖Δ‖/‖w‖", "final max Δw", "val top-1",
               "verdict"],
              [[f"{p['a']} vs {p['b']}", p["kind"], p["first_differing_step"] or "none",
                p["trains_differently_from"] or "–", _ratio_cell(p.get("largest_band_ratio")),
                _fmt(p["max_rel_loss_diff"], ".2g"), _group_cell((p["gaps"] or {}).get("parameters")),
                _group_cell((p["gaps"] or {}).get("buffers")), _fmt(p["max_abs_weight_diff"], ".3g"),
                " / ".join(_fmt(v) for v in p["val_top1"]), p["verdict"]]
               for p in s["parity"]]), ""]
    if s["noise_floors"]:
        md += ["### Noise floor", ""]
        for world, f in sorted(s["noise_floors"].items(), key=lambda item: int(item[0])):
            top1 = (f.get("outcome") or {}).get("val_top1")
            md.append(f"- World size {world}: {f['base']} against {f['runs']} disturbed run"
                      f"{'s' if f['runs'] != 1 else ''} ({', '.join(f['disturbed'])}; initial weights moved by one ulp, "
                      f"each in its own pattern): the parameters end up to {_fmt(f['gap'], '.2g')} ‖Δ‖/‖w‖ apart"
                      + (f" (most in {f['tensor']})" if f["tensor"] else "")
                      + f", the loss by at most {_fmt(f['max_rel_loss_diff'], '.2g')} of itself"
                      + (f"; val top-1 {top1[0]:.4f}–{top1[1]:.4f} over the floor's runs" if top1 else "") + ".")
            for p in f["pairs"]:
                md.append(f"  - {p['disturbed']}: final ‖Δ‖/‖w‖ {_fmt(p['gap'], '.2g')}, largest loss gap "
                          f"{_fmt(p['max_rel_loss_diff'], '.2g')}, largest fingerprint gap "
                          f"{_fmt(max(p['steps']['weights'].values(), default=None), '.2g')}")
        md.append("")
    return md + [f"![parity]({s['plots']['parity']})", ""]


def _ratio_cell(largest: Optional[Dict]) -> str:
    if not largest:
        return ""
    return f"{_fmt(largest['ratio'], '.3g')} ({largest['quantity']}, step {largest['step']})"
