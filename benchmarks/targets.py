"""The project's targets, written down once, and the table that judges the results against them. A target measured
by repeated runs is judged on each repeat's runs (made side by side, so that a slow stretch of the machine falls on
both sides of a ratio): yes when every repeat meets it, no when none does, undecided when they fall on both sides."""

from __future__ import annotations

from typing import Callable, Sequence

from common.compare import stats, tables

from .sections import Result, Results, met, name, row_at, setting

#: name -> (value, how it reads); the exchange overhead at 2 ranks: what DDP and Horovod/MPI reach here, and Gloo's
TARGETS = {"loop_ratio": (1.02, "1.02"), "scaling": (0.90, "0.90"), "busbw_of_limit": (0.50, "50%"),
           "data_frac": (0.05, "5%"), "probe_cost": (0.02, "2%"), "exact_step": (1.10, "1.1x"),
           "overhead": (0.03, "3%"), "overhead_gloo": (0.06, "6%")}
OVERHEAD_TARGET = {"ddp": "overhead", "horovod-mpi": "overhead", "horovod-gloo": "overhead_gloo"}
Judged = tuple[str, str]  # what was measured against a target, and whether it is met


def target(which: str) -> str:
    """A target as the prose reads it."""
    return TARGETS[which][1]


def per_repeat(case: Result, top: tuple, bottom: tuple, of: Callable[[float, float], float]) -> list[float]:
    """`of(samples/s of top, samples/s of bottom)` for each repeat that has both runs, (label, world size) each."""
    found = [{r.get("repeat", 1): r["samples_per_s"] for r in case.get("runs", [])
              if (r.get("label"), r.get("world_size")) == side and r.get("samples_per_s")} for side in (top, bottom)]
    return [of(found[0][repeat], found[1][repeat]) for repeat in sorted(found[0]) if repeat in found[1]]


def judged(values: Sequence[float], limit: float, above: bool = False) -> str:
    """yes when every repeat is within `limit` (at or under it; at or over it when `above`), no when none is,
    undecided otherwise; not measured without repeats."""
    hits = [v >= limit if above else v <= limit for v in values]
    return met(None) if not hits else "yes" if all(hits) else "no" if not any(hits) else "undecided"


def worst(verdicts: Sequence[str]) -> str:
    """One verdict for several: the first of not measured, no, undecided that one of them is, else yes."""
    return next((v for v in (met(None), "no", "undecided") if v in verdicts), "yes" if verdicts else met(None))


def spread_of(values: Sequence[float], show: Callable[[float], str] = "{:.2f}".format, between: str = "–") -> str:
    """' (per repeat a–b)' when there were several repeats."""
    return f" (per repeat {show(min(values))}{between}{show(max(values))})" if len(values) > 1 else ""


def loop_target(tp: Result) -> Judged:
    """Our loop's step time over each bare loop's, every model and world size."""
    shown, verdicts = [], []
    for label, kind, key in (("bare-ddp", "seed", "loop_ratio"), ("bare-ddp-batched", "batched", "loop_ratio_batched")):
        cells = []
        for case in tp["cases"]:
            for n, value in sorted(case[key].items(), key=lambda item: int(item[0])):
                repeats = per_repeat(case, (label, int(n)), ("ddp", int(n)), lambda b, d: b / d) or [value]
                cells.append(judged(repeats, TARGETS["loop_ratio"][0]))
                shown.append(f"{case['name']} {case['image_size']}x{case['image_size']} x{n} {kind}: {value:.2f}"
                             + spread_of(repeats))
        verdicts.append(f"{kind}: {worst(cells)}")
    return "; ".join(shown), ", ".join(verdicts)


def overhead_target(tp: Result) -> Judged:
    """Each backend's exchange overhead at 2 ranks, resnet18 224x224 at one thread per rank, and how much of it the
    independent processes' unequal pace explains (ranks in step go at the slowest one's pace, their sum does not)."""
    case: Result = next((c for c in tp["cases"] if (c["model"], c["image_size"]) == ("resnet18", 224)), {})
    at_2 = [r for r in case.get("runs", []) if r["world_size"] == 2]
    if not at_2 or any(r.get("threads") != 1 for r in at_2):  # the threads each run recorded
        return "resnet18 224x224 at one thread per rank not measured", met(None)
    shown, verdicts = [], []
    for label, which in OVERHEAD_TARGET.items():
        value = case["exchange_overhead"].get(label, {}).get("2")
        repeats = per_repeat(case, (label, 2), ("independent", 2), lambda x, alone: 1 - x / alone)
        repeats = repeats or ([] if value is None else [value])
        shown.append(f"{name(label)} {tables.percent(value)}" + spread_of(repeats, tables.percent))
        verdicts.append(f"{name(label)} (≤ {target(which)}) {judged(repeats, TARGETS[which][0])}")
    losses = [1 - len(each) * min(each) / sum(each) for r in at_2 if r.get("label") == "independent"
              for each in [r.get("process_samples_per_s")] if each]
    pace = (f"; the independent processes' unequal pace (2 x the slower against their sum) costs "
            f"{tables.percent(stats.spread(losses)['median'])}" + spread_of(losses, tables.percent)) if losses else ""
    return ", ".join(shown) + pace, ", ".join(verdicts)


def scaling_target(result: Result) -> Judged:
    """Scaling efficiency at 2 ranks per setting, judged on the setting that leaves the knob to the program."""
    shown = [f"{setting(case)}: " + (", ".join(f"{name(label)} {points['2']:.2f}" for label, points
                                               in sorted(case["scaling_efficiency"].items()) if "2" in points)
                                     or "no world size 2") for case in result["cases"]]
    reference: Result = next((c for c in result["cases"] if c["knob"] is None or (
        not c.get("train_args") and all(v is None for v in (c.get("env") or {}).values()))),
        {"scaling_efficiency": {}, "knob": None})
    verdicts = []
    for label, points in sorted(reference["scaling_efficiency"].items()):
        repeats = per_repeat(reference, (label, 2), (label, 1), lambda two, one: two / (2 * one))
        repeats = repeats or ([points["2"]] if "2" in points else [])
        verdicts.append(f"{name(label)} {judged(repeats, TARGETS['scaling'][0], above=True)}" + spread_of(repeats))
    return "; ".join(shown), ", ".join(verdicts) + f" with {setting(reference)}"


def busbw_target(ar: Result) -> Judged:
    """Each series' busbw at 64 MB against the memory-copy limit; Horovod/MPI's is judged."""
    rows = [(s["name"], row_at(s, 64 * 2**20)) for s in ar["series"]]
    shown = [f"{name(n)} {r['busbw_GBps']:.1f} GB/s = {100 * r['busbw_of_limit']:.0f}%" for n, r in rows if r]
    shown.append(f"copy/add floor {ar['floor']['busbw_GBps']:.1f} GB/s = {100 * ar['floor']['of_limit']:.0f}%")
    mpi = next((r for n, r in rows if n == "horovod-mpi" and r), None)
    return "; ".join(shown), met(None if mpi is None else mpi["busbw_of_limit"] >= TARGETS["busbw_of_limit"][0])


def data_target(*found: Result) -> Judged:
    """The data wait's share of the step, every run of both data-wait results."""
    cells = [(f"{result['settings']['dataset']} {name(label)} x{world} {tables.percent(split['data_frac'])}",
              split["data_frac"]) for result in found for case in result["cases"]
             for key, split in sorted(case["time_split"].items()) for label, world in [stats.split_key(key)]
             if split.get("data_frac") is not None]
    over = [cell for cell, frac in cells if frac >= TARGETS["data_frac"][0]]
    return "; ".join(cell for cell, _ in cells), "yes" if not over else "no: " + ", ".join(over)


def probe_target(result: Result) -> Judged:
    """The probe's cost at resnet18 224x224; each repeat is one job of each kind, taking turns."""
    row = next((r for r in result["rows"] if (r["model"], r["image_size"]) == ("resnet18", 224)), None)
    if row is None or row["cost"] is None:
        return "resnet18 224x224 not measured", met(None)
    repeats = [1 - probed / bare for bare, probed in zip(row["bare_samples_per_s"], row["probed_samples_per_s"],
                                                         strict=False)] or [row["cost"]]
    signed = "{:+.1%}".format
    return (signed(row["cost"]) + spread_of(repeats, signed, between=" to "),
            judged(repeats, TARGETS["probe_cost"][0]))


def exact_target(result: Result) -> Judged:
    """Exact mode's step time over allreduce mode's, resnet18 224x224 at 2 and 3 ranks."""
    cells = [c for c in result["cost"] if c["model"] == "resnet18" and c["world_size"] in (2, 3)]
    if result["settings"]["image_sizes"].get("resnet18") != 224 or not cells:
        return "resnet18 224x224 at 2 and 3 ranks not measured", met(None)
    repeats = [(c["per_repeat"] or {}).get("values") or [c["step_time_ratio"]] for c in cells]
    return (", ".join(f"x{c['world_size']} {c['step_time_ratio']:.2f}x" + spread_of(values)
                      for c, values in zip(cells, repeats, strict=True)),
            worst([judged(values, TARGETS["exact_step"][0]) for values in repeats]))


#: (what the target asks, the result files it is judged on, the judge)
ROWS: list[tuple[str, list[str], Callable[..., Judged]]] = [
    (f"our loop's step time ≤ {target('loop_ratio')} x the bare DDP loop's, at world sizes 1 and 2",
     ["throughput.json"], loop_target),
    ("exchange overhead at world size 2 (against 2 independent processes), resnet18 224x224, batch 16, one thread "
     f"per rank: DDP and Horovod/MPI ≤ {target('overhead')}, Horovod/Gloo ≤ {target('overhead_gloo')}",
     ["throughput.json"], overhead_target),
    (f"scaling efficiency at world size 2, resnet18, batch 16, 224x224, one thread per rank ≥ {target('scaling')}",
     ["scaling-1thread/throughput.json"], scaling_target),
    (f"Horovod MPI busbw at 64 MB ≥ {target('busbw_of_limit')} of the memory-copy limit", ["allreduce.json"],
     busbw_target),
    (f"data wait < {target('data_frac')} of the step for digits and synthetic",
     ["data-wait-digits/throughput.json", "data-wait-synthetic/throughput.json"], data_target),
    (f"the probe of `--scripts` costs a DDP script ≤ {target('probe_cost')} of its samples/s at resnet18 224x224",
     ["probe_cost.json"], probe_target),
    (f"`--reduction exact`'s step time ≤ {target('exact_step')} allreduce mode's on the same micro-batches, "
     "resnet18 224x224, 2 and 3 ranks, one thread per rank", ["exact_cost.json"], exact_target)]


def targets(results: Results) -> str:
    """The project's targets, what was measured against each (and where), and whether it is met."""
    rows = []
    for asked, files, judge in ROWS:
        found = [results.get(f) for f in files]
        shown, verdict = judge(*found) if None not in found else ("not measured", "not measured")
        sources = " (" + ", ".join(f"`{results.path(f)}`" for f in files) + ")" if None not in found else ""
        rows.append([asked, shown + sources, verdict])
    return tables.markdown(["target", "measured", "met"], rows)
