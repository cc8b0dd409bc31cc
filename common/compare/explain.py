"""Why two runs' weights differ, from what was measured, and whether world sizes agree (exact mode).

For a pair of backends whose weights are not bitwise equal, the comparison has measured (when the
matrix ran them): each backend against its own repeat (is the gap larger than a backend's run-to-run
spread?), Horovod with the division by the world size moved before the sum as DDP does it (--predivide:
how much of the gap is the order of division), and Horovod without tensor fusion, twice
(--deterministic: is Horovod reproducible then?). The explanation states those numbers, and only them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from common.config import is_exact
from common.rundir.reader import Run
from .analysis import SAME_WITHIN, parity, relation
from .results import ParityResult


def is_variant(run: Run) -> bool:
    """A run of an explaining variant (horovod-gloo+predivide, ...), not a backend of its own."""
    return run.identity.is_variant


def _find(runs: List[Run], label: str, world_size: int, repeat: int) -> Optional[Run]:
    return next((r for r in runs if r.label == label and r.world_size == world_size and r.repeat == repeat), None)


def _variant(runs: List[Run], variant: str, world_size: int, repeat: int) -> Optional[Run]:
    """A Horovod run of an explaining variant, whichever controller ran it (Gloo here; MPI under Slurm)."""
    label = next((r.label for r in runs if r.identity.backend.startswith("horovod-")
                  and r.identity.variants == (variant,) and r.world_size == world_size), None)
    return _find(runs, label, world_size, repeat) if label else None


def _gap(a: Optional[Run], b: Optional[Run]) -> Optional[ParityResult]:
    return parity(a, b, tolerance=0.0) if a is not None and b is not None else None


def _spread_text(label: str, gap: ParityResult) -> str:
    if gap.bitwise_identical:
        return f"{label} repeats are bitwise identical"
    return f"{label} repeats differ by {gap.max_abs_weight_diff:.1e}"


def explain_pair(pair: ParityResult, runs: List[Run]) -> Optional[Dict[str, Any]]:
    """The measured facts about a backend pair whose weights differ: a sentence and the numbers."""
    if pair.bitwise_identical or pair.world_size is None:
        return None
    world = pair.world_size
    by_name = {r.name: r for r in runs}
    a, b = by_name[pair.a], by_name[pair.b]
    facts: Dict[str, float] = {"gap": pair.max_abs_weight_diff}
    sentences: List[str] = []
    for run in (a, b):
        gap = _gap(run, _find(runs, run.label, world, 1))
        if gap is not None:
            facts[f"{run.label} repeat"] = gap.max_abs_weight_diff
            sentences.append(_spread_text(run.label, gap))
    spreads = [facts[k] for k in facts if k.endswith(" repeat")]
    if spreads:
        sentences.append(f"the gap between the backends ({pair.max_abs_weight_diff:.1e}) is "
                         f"{relation(pair.max_abs_weight_diff, max(spreads))} their run-to-run spread "
                         f"({max(spreads):.1e}; gaps are called larger or smaller only beyond {SAME_WITHIN:g}x)")
    ddp = next((r for r in (a, b) if r.label == "ddp"), None)
    predivide = _variant(runs, "predivide", world, 0)
    if ddp is not None and predivide is not None and "horovod" in (a.label + b.label):
        gap = parity(ddp, predivide, tolerance=0.0)
        facts[f"ddp vs {predivide.label}"] = gap.max_abs_weight_diff
        sentences.append(f"with Horovod dividing before the sum as DDP does ({predivide.label}) the gap is "
                         + ("gone (bitwise identical)" if gap.bitwise_identical
                            else f"{gap.max_abs_weight_diff:.1e}"))
    first = _variant(runs, "deterministic", world, 0)
    deterministic = _gap(first, _variant(runs, "deterministic", world, 1))
    if first is not None and deterministic is not None and "horovod" in (a.label + b.label):
        facts[f"{first.label} repeat"] = deterministic.max_abs_weight_diff
        sentences.append(f"without tensor fusion ({first.label}) "
                         + _spread_text("Horovod's", deterministic))
    if len(sentences) == 0:
        return None
    return {"a": pair.a, "b": pair.b, "world_size": world, "facts": facts,
            "text": "; ".join(sentences) + "."}


def explanations(pairs: List[ParityResult], runs: List[Run]) -> List[Dict[str, Any]]:
    """explain_pair for every backend pair whose weights differ."""
    found = [explain_pair(p, runs) for p in pairs if p.kind == "backends"]
    return [e for e in found if e is not None]


def world_size_verdicts(runs: List[Run]) -> List[Dict[str, Any]]:
    """--reduction exact: whether every world size (and backend) ended with the same weights, or the first
    world size that differs from the smallest."""
    exact = [r for r in runs if r.repeat == 0 and not is_variant(r) and is_exact(r.settings)]
    sizes = sorted({r.world_size for r in exact})
    if len(sizes) < 2:
        return []
    reference = min(exact, key=lambda r: (r.world_size, r.name))
    differing = sorted((r for r in exact if r.summary.get("weights_sha256") != reference.summary.get("weights_sha256")),
                       key=lambda r: (r.world_size, r.name))
    shown = ", ".join(str(s) for s in sizes)
    labels = ", ".join(sorted({r.label for r in exact}))
    if not differing:
        verdict = f"world sizes {shown}: bitwise identical ({labels})"
    else:
        first = differing[0]
        gap = parity(reference, first, tolerance=0.0)
        verdict = (f"world sizes {shown}: {first.name} is the first that differs from {reference.name} "
                   f"(max |Δw| {gap.max_abs_weight_diff:.1e})")
    return [{"world_sizes": sizes, "labels": sorted({r.label for r in exact}), "identical": not differing,
             "verdict": verdict}]
