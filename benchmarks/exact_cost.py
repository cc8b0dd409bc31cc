"""What --reduction exact costs against --reduction allreduce: samples/s of both modes on the same micro-batches
and threads (allreduce mode accumulates per-rank batches of --micro-batch into the same global batch), the ratio of
their step times (from the medians, and per repeat from the two runs side by side), bytes per step, the fixed-point
error of real gradients against float64 (beside float32's own, summed in order), and the weights' distance after the
default training at 3 ranks in both modes.

    python -m benchmarks.exact_cost --np 2,3 --image-size resnet18=224 --steps 6 --repeats 4 --out benchmarks/results
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from common import launch
from common.compare import stats
from common.config import is_exact
from common.rundir.names import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE

from .jobs import JobFailed, add_np, add_places, add_timeout, parser, refuse, run_cli, run_job, schedule
from .machine import Record

MODELS = {"convnet": 32, "resnet18": 64}
MODES = ("allreduce", "exact")


def mode_args(mode: str, np: int, global_batch: int, micro_batch: int) -> list[str]:
    """The same global batch in micro-batches: exact mode's fixed-point sum of them, or allreduce mode accumulating
    each rank's share of them."""
    if is_exact({"reduction": mode}):
        return ["--reduction", "exact", "--global-batch", str(global_batch), "--micro-batch", str(micro_batch)]
    return ["--batch-size", str(micro_batch), "--accumulate", str(global_batch // (micro_batch * np))]


def step_time_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and world size, exact mode's step time over allreduce mode's: from their samples/s medians
    (inverted), and per repeat from the two runs of one repeat."""
    found = {(r["model"], r["world_size"], r["mode"]): r for r in rows}
    out = []
    for model, np, mode in sorted(found):
        if mode != "exact" or (model, np, "allreduce") not in found:
            continue
        fast, exact = found[model, np, "allreduce"], found[model, np, "exact"]
        by_repeat = dict(zip(exact["repeats"], exact["samples_per_s"]["values"], strict=True))
        paired = [value / by_repeat[repeat] for repeat, value
                  in zip(fast["repeats"], fast["samples_per_s"]["values"], strict=True) if repeat in by_repeat]
        out.append({"model": model, "world_size": np, "per_repeat": stats.spread(paired) if paired else None,
                    "step_time_ratio": fast["samples_per_s"]["median"] / exact["samples_per_s"]["median"]})
    return out


def speed(args: Namespace, failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """samples/s, exposed communication and bytes per step of both modes, per model and world size, median over
    repeats; the schedule puts both modes of a setting side by side, every other repeat backwards."""
    cells = [(model, mode, np) for model in MODELS if model in args.models for np in args.np for mode in MODES]
    measured: dict[tuple, list[dict[str, Any]]] = {}
    for repeat, (model, mode, np) in schedule(cells, args.repeats):
        size = args.image_sizes[model]
        run_dir = args.work / f"{model}-{size}-{mode}-{np}-t{args.threads}-r{repeat + 1}"
        train = ["--model", model, "--dataset", "synthetic", "--image-size", str(size), "--synthetic-samples",
                 str((args.steps + 2) * args.global_batch * 2), "--epochs", "1", "--max-steps", str(args.steps),
                 "--threads", str(args.threads), *mode_args(mode, np, args.global_batch, args.micro_batch),
                 "--run-dir", str(run_dir)]
        print(f"exact_cost: {model} {mode} x{np} #{repeat + 1} ...", flush=True)
        try:
            run_job(launch.get("torchrun").command(np, train), run_dir.with_suffix(".log"), args.timeout)
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            config = json.loads((run_dir / CONFIG_FILE).read_text())
        except (JobFailed, OSError, ValueError) as exc:
            failures.append({"model": model, "mode": mode, "world_size": np, "repeat": repeat + 1,
                             "error": str(exc)[-2000:]})
            continue
        c = config["config"]
        measured.setdefault((model, mode, np), []).append(
            {"repeat": repeat + 1, "samples_per_s": summary["samples_per_s"],
             "bytes": summary["reduced_bytes_per_step"],
             "comm_ms": (summary.get("time_split") or {}).get("comm_ms"), "threads": config["threads"],
             "per_rank_batch": c["batch_size"], "accumulate": c["accumulate"],
             "micro_batch": c["micro_batch" if is_exact(c) else "batch_size"]})
    rows = []
    for (model, mode, np), runs in sorted(measured.items()):
        runs.sort(key=lambda r: r["repeat"])
        comm = [r["comm_ms"] for r in runs if r["comm_ms"] is not None]
        rows.append({"model": model, "mode": mode, "world_size": np, "repeats": [r["repeat"] for r in runs],
                     "samples_per_s": stats.spread([r["samples_per_s"] for r in runs]),
                     "comm_ms": stats.spread(comm) if comm else None, "bytes_per_step": runs[0]["bytes"],
                     **{k: runs[0][k] for k in ("threads", "per_rank_batch", "accumulate", "micro_batch")}})
    return rows


def fixed_point_error(model_name: str, size: int, global_batch: int, micro_batch: int, seed: int = 0) -> dict[str, Any]:
    """The largest relative error of the fixed-point mean of real micro-batch gradients, and of float32's sequential
    sum, against the float64 mean."""
    from common.exact.fixedpoint import FixedPoint, tensor_maxima
    from common.inputs.models import build_model

    torch.manual_seed(seed)
    model = build_model(model_name, 3, size, 10, seed)
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(global_batch, 3, size, size, generator=gen)
    labels = torch.randint(10, (global_batch,), generator=gen)
    params = [p for p in model.parameters() if p.requires_grad]
    numels = [p.numel() for p in params]
    grads = []
    for x, y in zip(images.split(micro_batch), labels.split(micro_batch), strict=True):
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]).clone())  # type: ignore[union-attr]
    fixed = FixedPoint(numels, len(grads))
    fixed.rescale(torch.stack([tensor_maxima(list(g.split(numels))) for g in grads]).max(dim=0).values)
    reference = torch.stack(grads).double().mean(dim=0)
    in_fixed = fixed.to_floats(torch.stack([fixed.to_integers(g) for g in grads]).sum(dim=0), len(grads)).double()
    in_float32 = grads[0].clone()
    for g in grads[1:]:
        in_float32 += g
    in_float32 = (in_float32 / len(grads)).double()
    worst = {"fixed_point": 0.0, "float32_sum": 0.0}
    for part in (slice(end - n, end) for n, end in zip(numels, torch.tensor(numels).cumsum(0).tolist(), strict=True)):
        scale = reference[part].abs().max().item() or 1.0
        for key, got in (("fixed_point", in_fixed), ("float32_sum", in_float32)):
            worst[key] = max(worst[key], (got[part] - reference[part]).abs().max().item() / scale)
    return {"model": model_name, "image_size": size, "micro_batches": len(grads), **worst}


def distance(args: Namespace, failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The default training at 3 ranks in both modes (both with a global batch of 96): the final weights' largest
    difference."""
    dirs = {mode: args.work / f"default-{mode}" for mode in MODES}
    for mode, run_dir in dirs.items():
        print(f"exact_cost: default training, {mode}, 3 ranks ...", flush=True)
        train = (["--reduction", mode] if is_exact({"reduction": mode}) else []) + ["--run-dir", str(run_dir)]
        try:
            run_job(launch.get("torchrun").command(3, train), run_dir.with_suffix(".log"), args.timeout)
        except JobFailed as exc:
            failures.append({"mode": mode, "world_size": 3, "error": str(exc)[-2000:]})
            return None
    a, b = (torch.load(dirs[m] / MODEL_FILE, weights_only=True) for m in MODES)
    floats = [k for k in a if a[k].is_floating_point()]
    return {"world_size": 3, "settings": "defaults (convnet, digits, 10 epochs, global batch 96)",
            "max_abs_weight_diff": max(float((a[k].double() - b[k].double()).abs().max()) for k in floats),
            "largest_weight": max(float(a[k].double().abs().max()) for k in floats),
            "val_top1": {m: json.loads((dirs[m] / SUMMARY_FILE).read_text())["val_top1"] for m in MODES}}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; exit 1 when some runs failed (the rest is written), 2 on bad input."""
    p = parser("exact_cost", __doc__)
    add_np(p, [1, 2, 3], "world sizes, e.g. 1,2,3")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--global-batch", type=int, default=48, help="samples per step, in both modes")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="samples per micro-batch in both modes (allreduce mode: the per-rank batch, accumulated)")
    p.add_argument("--image-size", default="", metavar="MODEL=SIZE,...",
                   help=f"image sizes (default: {', '.join(f'{m}={s}' for m, s in MODELS.items())})")
    p.add_argument("--threads", type=int, default=1, help="threads per rank, in both modes")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode and setting, both modes side by side")
    p.add_argument("--no-distance", dest="distance", action="store_false",
                   help="skip the two default trainings (minutes)")
    add_timeout(p, 1800)
    add_places(p, "runs/bench-exact")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    if not args.models or set(args.models) - set(MODELS):
        return refuse("exact_cost", f"--models: choose from {', '.join(MODELS)}")
    try:
        args.image_sizes = {**MODELS, **{k: int(v) for k, v in (pair.split("=", 1) for pair in
                                                                 args.image_size.split(",") if pair)}}
    except ValueError:
        return refuse("exact_cost", f"--image-size {args.image_size!r}: give MODEL=SIZE pairs, e.g. resnet18=224")
    if args.global_batch % args.micro_batch or any((args.global_batch // args.micro_batch) % n for n in args.np):
        return refuse("exact_cost", f"--global-batch {args.global_batch} must be a multiple of --micro-batch "
                                    f"{args.micro_batch} whose micro-batches every world size in --np shares")
    record = Record("exact_cost", argv)
    failures: list[dict[str, Any]] = []
    rows = speed(args, failures)
    errors = [fixed_point_error(m, args.image_sizes[m], args.global_batch, args.micro_batch) for m in args.models]
    settings = {"global_batch": args.global_batch, "micro_batch": args.micro_batch, "steps": args.steps,
                "repeats": args.repeats, "launcher": "torchrun", "threads": args.threads,
                "image_sizes": {m: args.image_sizes[m] for m in args.models}}
    return record.publish(args.out, settings=settings, speed=rows, cost=step_time_ratios(rows),
                          fixed_point_error=errors, distance=distance(args, failures) if args.distance else None,
                          failures=failures)


if __name__ == "__main__":
    sys.exit(run_cli(main, "exact_cost"))
