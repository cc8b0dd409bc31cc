"""Numbers and verdicts from a set of runs: parity of what was learned, speed, scaling, time split."""

from __future__ import annotations

from itertools import combinations
from typing import Dict, List, Optional

from . import gaps, stats
from .rundirs import Run

#: max |Δw| at or below which non-identical weights are called equal (summation order only)
DEFAULT_TOLERANCE = 1e-5


#: a gap up to this many times the noise floor is within it: the floor is one sample of how far rounding
#: carries a run, and rounding's effect grows by orders of magnitude over a chaotic run
FLOOR_MARGIN = 10.0


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


def parity(a: Run, b: Run, tolerance: float = DEFAULT_TOLERANCE, floor: Optional[Dict] = None,
           margin: float = FLOOR_MARGIN) -> Dict:
    """How closely two runs learned the same thing: per-step loss differences (absolute and relative to the
    loss), the first differing step, the final weights' gaps per tensor, and a verdict in words, judged
    against the noise floor `floor` (common.compare.floor; {"unknown": why} when there is none)."""
    la, lb = a.step_losses(), b.step_losses()
    steps = sorted(set(la) & set(lb))
    diffs = [abs(la[s] - lb[s]) for s in steps]
    first_diff = next((s for s, d in zip(steps, diffs) if d != 0.0), None)
    identical = a.summary.get("weights_sha256") == b.summary.get("weights_sha256")
    max_dw = 0.0 if identical else weight_difference(a, b)
    tensors = None if identical else gaps.tensor_gaps(a, b)
    gap = 0.0 if identical else gaps.headline(tensors)
    rel_loss = gaps.relative_loss_gaps(a, b)
    out = {
        "a": a.name, "b": b.name, "world_size": a.world_size if a.world_size == b.world_size else None,
        "steps_compared": len(steps), "loss_diff": dict(zip(steps, diffs)), "rel_loss_diff": rel_loss,
        "max_loss_diff": max(diffs) if diffs else None, "max_rel_loss_diff": max(rel_loss.values(), default=None),
        "first_differing_step": first_diff, "max_abs_weight_diff": max_dw, "bitwise_identical": identical,
        "gap": gap, "gaps": tensors, "val_top1": [a.summary.get("val_top1"), b.summary.get("val_top1")],
        "noise_floor": None, "floor_ratio": None, "within_noise_floor": None,
    }
    if not identical and floor is not None and "gap" in floor:
        out.update(noise_floor=floor["gap"], floor_run=floor["disturbed"],
                   floor_ratio=gap / floor["gap"] if floor["gap"] > 0 else float("inf"))
        out["within_noise_floor"] = out["floor_ratio"] <= margin
    out["verdict"] = _verdict(out, tolerance, gaps.dominant(tensors), floor)
    return out


def _verdict(p: Dict, tolerance: float, tensor: Optional[str], floor: Optional[Dict]) -> str:
    if p["bitwise_identical"]:
        return "bitwise identical"
    if p["max_abs_weight_diff"] <= tolerance:
        return f"equal within {p['max_abs_weight_diff']:.1e}"
    where = f", most in {tensor}" if tensor else ""
    if p["within_noise_floor"] is True:
        return (f"within the noise floor: parameters differ by {p['gap']:.2g} (‖Δ‖/‖w‖{where}), a disturbance of "
                f"one ulp gives {p['noise_floor']:.2g}")
    if p["within_noise_floor"] is False:
        return (f"beyond the noise floor: parameters differ by {p['gap']:.2g} (‖Δ‖/‖w‖{where}), rounding alone "
                f"gives {p['noise_floor']:.2g} ({p['floor_ratio']:.3g}x)")
    step = p["first_differing_step"]
    why = (floor or {}).get("unknown") or f"no disturbed run at world size {p['world_size']}"
    return (f"differs: parameters by {p['gap']:.2g} (‖Δ‖/‖w‖{where}), final max |Δw| {p['max_abs_weight_diff']:.3g}"
            f"{f', first differing step {step}' if step is not None else ''}; noise floor unknown ({why})")


def parity_table(runs: List[Run], tolerance: float = DEFAULT_TOLERANCE, floors: Optional[Dict[int, Dict]] = None,
                 margin: float = FLOOR_MARGIN) -> List[Dict]:
    """Parity of every pair of backends at each world size (first repeat of each; the explaining variants,
    labelled backend+variant, are left to common.compare.explain), and of repeats of one backend against
    its first run (reproducibility), each judged against the noise floor of its world size (`floors`:
    world size -> common.compare.floor's measure, or {"unknown": why})."""
    floors = floors or {}
    out = []
    firsts = [r for r in runs if r.repeat == 0]
    for a, b in combinations([r for r in firsts if "+" not in r.label], 2):
        if a.world_size == b.world_size:
            out.append({"kind": "backends", **parity(a, b, tolerance, floors.get(a.world_size), margin)})
    for run in runs:
        if run.repeat > 0:
            base = next(r for r in firsts if r.key == run.key)
            out.append({"kind": "repeat", **parity(base, run, tolerance, floors.get(run.world_size), margin)})
    return out


def hosts_of(run: Run) -> List[str]:
    """The hosts a run's ranks ran on (config.json's rank_hosts)."""
    return sorted(set(run.config.get("rank_hosts") or run.config.get("hosts") or []))


def throughput_table(runs: List[Run]) -> Dict[str, Dict]:
    """samples/s per backend@world: median, min, max over repeats, and the hosts the ranks ran on."""
    groups: Dict[str, List[float]] = {}
    hosts: Dict[str, set] = {}
    for run in runs:
        if run.summary.get("samples_per_s"):
            groups.setdefault(run.key, []).append(float(run.summary["samples_per_s"]))
            hosts.setdefault(run.key, set()).update(hosts_of(run))
    return {key: {**stats.spread(values), "hosts": sorted(hosts[key])} for key, values in sorted(groups.items())}


def span(hosts: List[str]) -> str:
    """'on one host' or 'across 2 hosts (node0, node1)'."""
    return "on one host" if len(hosts) <= 1 else f"across {len(hosts)} hosts ({', '.join(hosts)})"


def speed_verdicts(runs: List[Run], throughput: Dict[str, Dict]) -> List[Dict]:
    """At each world size, which backend is faster, by how much, and whether that exceeds the
    spread across repeats (the ranges of the two do not overlap)."""
    by_world: Dict[int, List[str]] = {}
    for key in throughput:
        if "+" not in key:  # the explaining variants are no backend of their own
            by_world.setdefault(int(key.split("@")[1]), []).append(key)
    out = []
    for world, keys in sorted(by_world.items()):
        for ka, kb in combinations(sorted(keys), 2):
            a, b = throughput[ka], throughput[kb]
            fast, slow = (ka, kb) if a["median"] >= b["median"] else (kb, ka)
            f, s = throughput[fast], throughput[slow]
            ratio = f["median"] / s["median"] if s["median"] else float("inf")
            if min(f["n"], s["n"]) < 2:
                noise = "unknown (one repeat; use --repeats 3)"
                significant = None
            else:
                significant = f["min"] > s["max"]
                noise = "larger than the spread across repeats" if significant else \
                    "within the spread across repeats (not significant)"
            where = span(sorted(set(f["hosts"]) | set(s["hosts"])))
            out.append({
                "world_size": world, "faster": fast.split("@")[0], "slower": slow.split("@")[0],
                "ratio": ratio, "percent": 100 * (ratio - 1), "significant": significant,
                "hosts": sorted(set(f["hosts"]) | set(s["hosts"])),
                "verdict": f"{fast.split('@')[0]} is {100 * (ratio - 1):.1f}% faster than {slow.split('@')[0]} "
                           f"at world size {world} {where} ({f['median']:.0f} vs {s['median']:.0f} samples/s); "
                           f"difference {noise}",
            })
    return out


def scaling_table(throughput: Dict[str, Dict]) -> Dict[str, Dict[int, float]]:
    """Scaling efficiency throughput(N) / (N x throughput(1)) per backend (common.compare.stats)."""
    return stats.scaling_efficiency(throughput)


def time_split_table(runs: List[Run]) -> List[Dict]:
    """Per run: mean ms per step spent on data, compute and exposed communication."""
    rows = []
    for run in runs:
        split = run.summary.get("time_split") or {}
        rows.append({"run": run.name, **{k: split.get(k) for k in
                                          ("data_ms", "compute_ms", "comm_ms", "step_ms", "comm_frac")}})
    return rows


def accuracy_table(runs: List[Run]) -> List[Dict]:
    """Final training and validation metrics of every run."""
    return [{"run": run.name, **{k: run.summary.get(k) for k in
                                 ("steps", "epochs", "train_loss", "val_loss", "val_top1", "val_top5", "wall_s")}}
            for run in runs]
