"""Step 3: --reduction exact twice at the GPU count, and at world size 1 where there are 2 or more, with the same
weights bit for bit."""

from __future__ import annotations

from ..context import Context
from ..record import StepFailed, StepRecord, TimedOut
from .base import Step
from .training import options, train

#: --reduction exact: samples per micro-batch and steps (the global batch is 2 micro-batches per rank)
EXACT = {"cuda": {"micro_batch": 8, "max_steps": 20}, "cpu": {"micro_batch": 4, "max_steps": 4}}


class Exact(Step):
    """The same bits twice, and at another world size."""

    def run(self, ctx: Context, record: StepRecord, until: float) -> None:
        """--reduction exact twice at the GPU count (the same bits), and at 1 where there are 2 or more."""
        nproc = ctx.found.nproc
        micro, steps = EXACT[ctx.settings.device]["micro_batch"], EXACT[ctx.settings.device]["max_steps"]
        exact_options = options(ctx, reduction="exact", micro_batch=str(micro), global_batch=str(2 * micro * nproc),
                                max_steps=str(steps), batch_size=None)
        plan = [("a", nproc), ("b", nproc)] + ([("one", 1)] if nproc >= 2 else [])
        runs = {name: train(ctx, record, until, exact_options, ctx.settings.work / "exact" / name, nproc=n, key=name)
                for name, n in plan}
        sha = {name: run.weights_sha256 for name, run in runs.items()}
        record.result.update({"weights_sha256": sha, "repeat_identical": sha["a"] == sha["b"],
                              "world_sizes_identical": sha["a"] == sha["one"] if "one" in sha else None})
        if sha["a"] != sha["b"]:
            diagnose(ctx, record, until, exact_options)
            raise StepFailed(f"two --reduction exact runs at world size {nproc} end with different weights "
                             f"({(sha['a'] or '')[:12]} and {(sha['b'] or '')[:12]})")
        if "one" in sha and sha["one"] != sha["a"]:
            raise StepFailed(f"--reduction exact at world size 1 and {nproc} end with different weights "
                             f"({(sha['one'] or '')[:12]} and {(sha['a'] or '')[:12]})")


def diagnose(ctx: Context, record: StepRecord, until: float, exact_options: list[str]) -> None:
    """Where two exact runs differ: the same twice more with torch's deterministic algorithms (--deterministic),
    within the step's box; recorded under `deterministic`, whatever it finds."""
    try:
        runs = [train(ctx, record, until, [*exact_options, "--deterministic"], ctx.settings.work / "exact" / name,
                      key=name)
                for name in ("deterministic_a", "deterministic_b")]
        record.result["deterministic"] = {"identical": runs[0].weights_sha256 == runs[1].weights_sha256}
    except (StepFailed, TimedOut) as exc:
        record.result["deterministic"] = {"error": str(exc)}
