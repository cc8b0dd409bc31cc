"""Numbers and verdicts from a set of runs: parity of what was learned, speed, scaling, time split."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import Any, Dict, List, Optional, Set

from common.rundir.reader import Run, RunId
from . import branches, forecast, gaps, reproducible, stats, trajectory
from .floor import JUDGED, OUTCOME
from .reproducible import Irreproducible
from .results import Departure, ParityResult

#: max |Δw| at or below which non-identical weights are called equal (summation order only)
DEFAULT_TOLERANCE = 1e-5

#: a pair's gap at a step may be up to this many times the noise floor's band there and be within it (every
#: margin from 3 to 30 gives the same verdicts on the corpus; a same-training pair at 3 ranks has been seen at
#: 12.8x, real differences leave from their first step by thousands of times)
FLOOR_MARGIN = 30.0
#: two measured gaps are "about the same" unless one is more than this many times the other
SAME_WITHIN = 2.0


def relation(x: float, y: float) -> str:
    """How `x` compares with `y` by the stated rule (SAME_WITHIN): "larger than", "smaller than" or "about the
    same as". Gaps of a chaotic process are never called larger for 8.004e-3 against 8.008e-3."""
    if x > SAME_WITHIN * y:
        return "larger than"
    if y > SAME_WITHIN * x:
        return "smaller than"
    return "about the same as"


def weight_difference(a: Run, b: Run) -> float:
    """Largest element-wise |Δw| between two runs' final weights (inf when shapes differ)."""
    wa, wb = a.weights(), b.weights()
    if wa.keys() != wb.keys() or any(wa[k].shape != wb[k].shape for k in wa):
        return float("inf")
    worst = 0.0
    for k in wa:
        if wa[k].numel():
            worst = max(worst, float((wa[k].double() - wb[k].double()).abs().max()))
    return worst


def outcome(a: Run, b: Run, floor: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The two runs' final metrics beside the range of the floor's runs, and the runs whose accuracy ends beyond
    rounding's reach: further outside that range than the range is wide, and by more than one validation sample.
    A few disturbed runs sample rounding's outcomes; a run just outside their range is one more sample."""
    outside: List[Dict[str, Any]] = []
    found: Dict[str, Any] = {"metrics": {m: [a.summary.get(m), b.summary.get(m)] for m in OUTCOME}, "range": None,
                             "outside": outside}
    ranges = (floor or {}).get("outcome")
    if not ranges:
        return found
    found["range"] = ranges
    for run in (a, b):
        for metric in JUDGED:
            value, bounds = run.summary.get(metric), ranges.get(metric)
            if value is None or bounds is None:
                continue
            lo, hi = bounds
            one_sample = 1.0 / max((run.config.get("dataset") or {}).get("val_samples") or 1, 1)
            slack = max(hi - lo, one_sample)
            if value < lo - slack or value > hi + slack:
                outside.append({"run": run.name, "metric": metric, "value": value, "range": bounds,
                                "by": value - lo if value < lo else value - hi})
    return found


def parity(a: Run, b: Run, tolerance: float = DEFAULT_TOLERANCE, floor: Optional[Dict[str, Any]] = None,
           margin: float = FLOOR_MARGIN, irreproducible: Optional[Irreproducible] = None,
           kind: str = "backends") -> ParityResult:
    """How closely two runs learned the same thing, judged where their divergence starts: per-step gaps of the
    loss and the weights' fingerprint against the noise floor's band (common.compare.trajectory), the first step
    at which they differ and the first at which they leave the band, the learning rate and the optimizer's other
    settings, the final weights' gaps per tensor, the final loss and accuracy against the floor's range, and a
    verdict in words. `floor` is common.compare.floor's measure ({"unknown": why} when there is none). Where a
    program did not reproduce itself at this world size (`irreproducible`, common.compare.reproducible) nothing is
    judged; two runs that start from different weights train differently from step 0."""
    sa, sb = a.step_states(), b.step_states()
    steps = trajectory.step_gaps(sa, sb)
    la, lb = a.step_losses(), b.step_losses()
    common_steps = sorted(set(la) & set(lb))
    diffs = [abs(la[s] - lb[s]) for s in common_steps]
    identical = a.summary.get("weights_sha256") == b.summary.get("weights_sha256")
    tensors = None if identical else gaps.tensor_gaps(a, b)
    judged = floor is not None and "band" in floor
    out = ParityResult(
        a.name, b.name, a.world_size if a.world_size == b.world_size else None, kind,
        steps_compared=len(common_steps), loss_diff=dict(zip(common_steps, diffs, strict=True)),
        rel_loss_diff=steps["loss"], rel_weight_diff=steps["weights"], max_loss_diff=max(diffs) if diffs else None,
        max_rel_loss_diff=max(steps["loss"].values(), default=None),
        first_differing_step=trajectory.first_differing(steps), lr_difference=trajectory.lr_difference(sa, sb),
        setting_difference=trajectory.setting_difference(sa, sb),
        max_abs_weight_diff=0.0 if identical else weight_difference(a, b), bitwise_identical=identical,
        gap=0.0 if tensors is None else gaps.headline(tensors), gaps=tensors,
        val_top1=[a.summary.get("val_top1"), b.summary.get("val_top1")],
        outcome=outcome(a, b, floor if judged else None), start_gap=reproducible.start_gap(a, b),
        cannot_judge=irreproducible.verdict if irreproducible is not None else None)
    if irreproducible is not None:
        out.verdict = irreproducible.verdict
        return out
    if judged and not identical:
        assert floor is not None
        against = branches.judged_band(steps, floor, margin)
        levels = branches.levels(against)
        departure = trajectory.departure(steps, levels, margin)
        out.noise_floor, out.floor_runs = floor["gap"], floor["runs"]
        out.floor_ratio = out.gap / floor["gap"] if floor["gap"] > 0 else float("inf")
        out.departure = departure and replace(departure, branch=branches.branch_of(departure, against))
        out.largest_band_ratio = trajectory.largest_ratio(steps, levels)
        out.branches = {q: j["branch"] for q, j in against.items() if j["needed"]}
        out.branch_levels = branches.branch_levels(against)
    starts = [d for d in (out.departure and out.departure.step, out.lr_difference and out.lr_difference.step + 1,
                          out.setting_difference and out.setting_difference.acts) if d]
    if out.start_gap:  # apart before the first step, whatever the floor says
        starts.append(0)
    if not identical and starts:
        out.trains_differently_from = min(starts)
    if judged and not identical:
        out.within_noise_floor = out.trains_differently_from is None
    elif out.start_gap and not identical:
        out.within_noise_floor = False
    out.verdict = _verdict(out, tolerance, gaps.dominant(tensors), floor)
    return out


def _outcome_text(o: Dict[str, Any]) -> str:
    """'; same outcome: ...' or '; X ends with val top-1 ..., N points lower than rounding explains' (empty
    without a floor's range)."""
    if o["range"] is None:
        return ""
    top1, rng = o["metrics"]["val_top1"], o["range"].get("val_top1")
    if not o["outside"]:
        if top1[0] is None or top1[1] is None or rng is None:
            return ""
        return (f"; same outcome: val top-1 {top1[0]:.4f} and {top1[1]:.4f}, rounding gives "
                f"{rng[0]:.4f}–{rng[1]:.4f}")
    parts = [f"{out['run']} ends with val top-1 {out['value']:.4f}, {abs(out['by']) * 100:.1f} points "
             f"{'lower' if out['by'] < 0 else 'higher'} than rounding explains ({out['range'][0]:.4f}–"
             f"{out['range'][1]:.4f})" for out in o["outside"]]
    return "; " + "; ".join(parts)


def _reached(d: Departure) -> str:
    """What a departure's gap was judged against, in words: the band by its step, or the floor's branches as many
    steps after theirs started as the pair's is after its own."""
    if d.branch is None:
        return f"rounding gives by then ({d.band:.1e})"
    after = d.step - d.branch
    if after == 0:
        return f"a branch of rounding starts from ({d.band:.1e})"
    return (f"rounding's branches reach {after} step{'s' if after != 1 else ''} after they start ({d.band:.1e}; "
            f"this one started at step {d.branch})")


def _verdict(p: ParityResult, tolerance: float, tensor: Optional[str], floor: Optional[Dict[str, Any]]) -> str:
    if p.bitwise_identical:
        return "bitwise identical"
    where = f", most in {tensor}" if tensor else ""
    lr = p.lr_difference
    lr_text = f"the learning rate differs from step {lr.step} ({lr.a:.4g} vs {lr.b:.4g})" if lr else ""
    setting = p.setting_difference
    setting_text = (f"the optimizer's {setting.setting.replace('_', ' ')} differs from step {setting.step} "
                    f"({setting.a} vs {setting.b})") if setting else ""
    if p.within_noise_floor is False:
        d = p.departure
        why = [f"the initial weights {p.start_gap:.1e} apart (the largest relative gap of a tensor's norm)"] \
            if p.start_gap else []
        why += [f"{trajectory.WORDS[d.quantity]} {d.gap:.1e} apart at step {d.step}, {d.ratio:.3g}x what "
                f"{_reached(d)}"] if d and not p.start_gap else []
        why += [text for text in (lr_text, setting_text) if text]
        judged = "beyond the noise floor: trains" if p.noise_floor is not None else "trains"
        start = "from the start" if p.trains_differently_from == 0 else f"from step {p.trains_differently_from}"
        return f"{judged} differently {start} ({'; '.join(why)}){_outcome_text(p.outcome)}"
    if p.max_abs_weight_diff <= tolerance:
        return f"equal within {p.max_abs_weight_diff:.1e}"
    if p.within_noise_floor is True:
        largest = p.largest_band_ratio
        most = (f", at most {largest.ratio:.2g}x what rounding gives ({trajectory.WORDS[largest.quantity]}, step "
                f"{largest.step})") if largest else ""
        branched = "".join(f", {trajectory.WORDS[q]} branching at step {step} and growing as the floor's runs do "
                           f"after they branch"
                           for q, step in sorted(p.branches.items(), key=lambda item: item[1]))
        return (f"within the noise floor: rounding apart from step {p.first_differing_step}{branched}{most} over "
                f"{p.floor_runs} disturbed run{'s' if p.floor_runs != 1 else ''}; parameters end {p.gap:.2g} "
                f"apart (‖Δ‖/‖w‖{where}), rounding alone up to {p.noise_floor:.2g}{_outcome_text(p.outcome)}")
    step = p.first_differing_step
    unknown = str((floor or {}).get("unknown") or f"no disturbed run at world size {p.world_size}")
    return (f"differs: parameters by {p.gap:.2g} (‖Δ‖/‖w‖{where}), final max |Δw| {p.max_abs_weight_diff:.3g}"
            f"{f', first differing step {step}' if step is not None else ''}"
            f"{''.join('; ' + text for text in (lr_text, setting_text) if text)}; noise floor unknown ({unknown})")


def parity_table(runs: List[Run], tolerance: float = DEFAULT_TOLERANCE,
                 floors: Optional[Dict[int, Dict[str, Any]]] = None,
                 margin: float = FLOOR_MARGIN, irreproducible: Optional[Dict[int, Irreproducible]] = None,
                 ) -> List[ParityResult]:
    """Parity of every pair of first runs at each world size: of two backends (kind "backends"), or of one
    backend with different settings (kind "settings"); the explaining variants, labelled backend+variant, are
    left to common.compare.explain. Then repeats of a run against its first (kind "repeat", reproducibility).
    Each is judged against the noise floor of its world size (`floors`: world size -> common.compare.floor's
    measure, or {"unknown": why}); at a world size where a program did not reproduce itself (`irreproducible`)
    none is judged."""
    floors, irreproducible = floors or {}, irreproducible or {}
    out: List[ParityResult] = []
    firsts = [r for r in runs if r.repeat == 0]
    for a, b in combinations([r for r in firsts if not r.identity.is_variant], 2):
        if a.world_size == b.world_size:
            kind = "backends" if a.label != b.label else "settings"
            out.append(parity(a, b, tolerance, floors.get(a.world_size), margin, irreproducible.get(a.world_size),
                              kind))
    for run in runs:
        if run.repeat > 0:
            base = next(r for r in firsts if r.key == run.key)
            out.append(parity(base, run, tolerance, floors.get(run.world_size), margin,
                              irreproducible.get(run.world_size), "repeat"))
    return out


def hosts_of(run: Run) -> List[str]:
    """The hosts a run's ranks ran on (config.json's rank_hosts)."""
    return sorted(set(run.config.get("rank_hosts") or run.config.get("hosts") or []))


def throughput_table(runs: List[Run]) -> Dict[str, Dict[str, Any]]:
    """samples/s per backend@world: median, min, max over repeats, and the hosts the ranks ran on."""
    groups: Dict[str, List[float]] = {}
    hosts: Dict[str, Set[str]] = {}
    for run in runs:
        if run.summary.get("samples_per_s"):
            groups.setdefault(run.key, []).append(float(run.summary["samples_per_s"]))
            hosts.setdefault(run.key, set()).update(hosts_of(run))
    return {key: {**stats.spread(values), "hosts": sorted(hosts[key])} for key, values in sorted(groups.items())}


def span(hosts: List[str]) -> str:
    """'on one host' or 'across 2 hosts (node0, node1)'."""
    return "on one host" if len(hosts) <= 1 else f"across {len(hosts)} hosts ({', '.join(hosts)})"


def busy_threads(run: Run) -> Optional[Dict[str, int]]:
    """How busy a run kept its busiest host: its ranks there, each one's threads, and the host's cores (None when
    the run did not record them)."""
    ranks, threads, cores = (run.config.get(k) for k in ("ranks_per_host", "threads", "cores"))
    if not (ranks and threads and cores):
        return None
    return {"ranks": int(ranks), "threads": int(threads), "cores": int(cores)}


def conditions(runs: List[Run]) -> Optional[Dict[str, int]]:
    """The busiest conditions among `runs` (the most busy threads per core), None when none recorded them."""
    found = [c for c in (busy_threads(r) for r in runs) if c is not None]
    return max(found, key=lambda c: c["ranks"] * c["threads"] / c["cores"]) if found else None


def contended(found: Optional[Dict[str, int]]) -> bool:
    """More busy threads (ranks x threads per rank) than the host has cores."""
    return found is not None and found["ranks"] * found["threads"] > found["cores"]


def conditions_text(found: Optional[Dict[str, int]]) -> str:
    """'2 ranks x 1 thread on 2 cores' ('' when unknown)."""
    if found is None:
        return ""
    return (f"{found['ranks']} rank{'s' if found['ranks'] != 1 else ''} x {found['threads']} "
            f"thread{'s' if found['threads'] != 1 else ''} on {found['cores']} "
            f"core{'s' if found['cores'] != 1 else ''}")


def speed_verdicts(runs: List[Run], throughput: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """At each world size, which backend is faster, by how much, and whether that exceeds the
    spread across repeats (the ranges of the two do not overlap). Runs that had more busy threads than their host
    has cores measured the contention for cores, not the backends: said so, and never called significant."""
    by_world: Dict[int, List[str]] = {}
    for key in throughput:
        identity = RunId.parse(key)
        if not identity.is_variant:  # the explaining variants are no backend of their own
            by_world.setdefault(identity.world_size, []).append(key)
    out = []
    for world, keys in sorted(by_world.items()):
        for ka, kb in combinations(sorted(keys), 2):
            a, b = throughput[ka], throughput[kb]
            fast, slow = (ka, kb) if a["median"] >= b["median"] else (kb, ka)
            f, s = throughput[fast], throughput[slow]
            ratio = f["median"] / s["median"] if s["median"] else float("inf")
            busiest = conditions([r for r in runs if r.key in (ka, kb)])
            if contended(busiest):
                noise = (f"measured with {conditions_text(busiest)}: the ranks compete for cores, so this is the "
                         "machine's contention, not a difference between the backends")
                significant = None
            elif min(f["n"], s["n"]) < 2:
                noise = "unknown (one repeat; use --repeats 3)"
                significant = None
            else:
                significant = f["min"] > s["max"]
                noise = "larger than the spread across repeats" if significant else \
                    "within the spread across repeats (not significant)"
            where = span(sorted(set(f["hosts"]) | set(s["hosts"])))
            shown = f", {conditions_text(busiest)}" if busiest and not contended(busiest) else ""
            out.append({
                "world_size": world, "faster": RunId.parse(fast).label, "slower": RunId.parse(slow).label,
                "ratio": ratio, "percent": 100 * (ratio - 1), "significant": significant,
                "hosts": sorted(set(f["hosts"]) | set(s["hosts"])), "conditions": busiest,
                "contended": contended(busiest),
                "verdict": f"{RunId.parse(fast).label} is {100 * (ratio - 1):.1f}% faster than "
                           f"{RunId.parse(slow).label} "
                           f"at world size {world} {where}{shown} ({f['median']:.0f} vs {s['median']:.0f} "
                           f"samples/s); difference {noise}",
            })
    return out


def scaling_table(throughput: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[int, float]]:
    """Scaling efficiency throughput(N) / (N x throughput(1)) per backend (common.compare.stats)."""
    return stats.scaling_efficiency(throughput)


def time_split_table(runs: List[Run]) -> List[Dict[str, Any]]:
    """Per run: mean ms per step spent on data, compute and exposed communication."""
    rows = []
    for run in runs:
        split = run.summary.get("time_split") or {}
        rows.append({"run": run.name, **{k: split.get(k) for k in
                                          ("data_ms", "compute_ms", "comm_ms", "step_ms", "comm_frac")},
                     "forecast_ms": forecast.forecasts_ms(run.summary)})
    return rows


def accuracy_table(runs: List[Run]) -> List[Dict[str, Any]]:
    """Final training and validation metrics of every run."""
    return [{"run": run.name, **{k: run.summary.get(k) for k in
                                 ("steps", "epochs", "train_loss", "val_loss", "val_top1", "val_top5", "wall_s")}}
            for run in runs]
