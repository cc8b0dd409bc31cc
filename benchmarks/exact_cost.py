"""What --reduction exact costs against --reduction allreduce, measured.

- speed: samples/s of both modes at each world size for each model, through torchrun, on the same
  micro-batches: exact mode sums --micro-batch gradients into --global-batch; allreduce mode takes per-rank
  batches of --micro-batch and accumulates as many as make the same global batch (`--accumulate`), so both
  normalise BatchNorm over the same samples and the difference is the exact sum alone; --threads per rank in
  both (1: the CPU analogue of one GPU per rank), median over repeats; exact mode's step time over allreduce
  mode's is its cost;
- bytes moved per step: what each rank hands to its allreduces per step (summary.json), float32
  gradients against int64 fixed-point sums plus the exchanged per-micro-batch values;
- the fixed-point error: on real gradients of the model at its initial weights, the largest element
  error of the fixed-point mean over the micro-batches against the float64 mean, beside float32's own
  error summing the same gradients in order, each relative to the tensor's largest gradient;
- the distance after a full run: the default training (the digits, 10 epochs) at 3 ranks in both modes,
  the largest element-wise weight difference. It is more than the rounding of the sums: exact mode
  normalises BatchNorm over micro-batches and groups the global batch's samples differently.

    python -m benchmarks.exact_cost --np 2,3 --image-size resnet18=224 --steps 6 --repeats 4 --out benchmarks/results

Writes DIR/exact_cost.json and prints its tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F

from common.compare import stats, tables
from common.config import is_exact
from common.errors import print_error
from common.rundir.names import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE

from .jobs import add_np, add_places, add_timeout, JobFailed, run_cli, run_job, worker_command
from .machine import Record, publish
from .throughput import schedule

MODELS = {"convnet": 32, "resnet18": 64}
MODES = ("allreduce", "exact")


class ModeCell(NamedTuple):
    """One run to make in every repeat: a model in one reduction mode at one world size."""

    model: str
    mode: str
    world_size: int


def _mode_args(mode: str, np: int, global_batch: int, micro_batch: int) -> List[str]:
    """The same global batch in micro-batches of `micro_batch` samples: exact mode's fixed-point sum of them, or
    allreduce mode accumulating each rank's share of them."""
    if is_exact({"reduction": mode}):
        return ["--reduction", "exact", "--global-batch", str(global_batch), "--micro-batch", str(micro_batch)]
    return ["--batch-size", str(micro_batch), "--accumulate", str(global_batch // (micro_batch * np))]


def step_time_ratios(rows: List[Dict]) -> List[Dict]:
    """Per model and world size, exact mode's step time over allreduce mode's: from their samples/s medians
    (inverted), and per repeat from the two runs that ran next to each other (their spread)."""
    found = {(r["model"], r["world_size"], r["mode"]): r for r in rows}
    out = []
    for model, np, mode in sorted(found):
        if mode != "exact" or (model, np, "allreduce") not in found:
            continue
        fast, exact = found[model, np, "allreduce"], found[model, np, "exact"]
        by_repeat = dict(zip(exact["repeats"], exact["samples_per_s"]["values"]))
        paired = [value / by_repeat[repeat] for repeat, value in zip(fast["repeats"], fast["samples_per_s"]["values"])
                  if repeat in by_repeat]
        out.append({"model": model, "world_size": np,
                    "step_time_ratio": fast["samples_per_s"]["median"] / exact["samples_per_s"]["median"],
                    "per_repeat": stats.spread(paired) if paired else None})
    return out


def speed(args, work: Path, failures: List[Dict]) -> List[Dict]:
    """samples/s, exposed communication and bytes per step of both modes, per model and world size (median over
    repeats). The runs follow throughput's schedule: both modes of a setting next to each other, every other
    repeat backwards, so that the machine's drift falls on both alike."""
    cells = [ModeCell(model, mode, np) for model in MODELS if model in args.models for np in args.np for mode in MODES]
    measured: Dict[tuple, List[Dict]] = {}
    for repeat, (model, mode, np) in schedule(cells, args.repeats):
        size = args.image_sizes[model]
        run_dir = work / f"{model}-{size}-{mode}-{np}-t{args.threads}-r{repeat + 1}"
        samples = (args.steps + 2) * args.global_batch * 2
        train = ["--model", model, "--dataset", "synthetic", "--image-size", str(size),
                 "--synthetic-samples", str(samples), "--epochs", "1", "--max-steps", str(args.steps),
                 "--threads", str(args.threads), *_mode_args(mode, np, args.global_batch, args.micro_batch),
                 "--run-dir", str(run_dir)]
        cmd = worker_command("torchrun", np, "ddp_train", train)
        print(f"exact_cost: {model} {mode} x{np} #{repeat + 1} ...", flush=True)
        try:
            run_job(cmd, run_dir.with_suffix(".log"), args.timeout)
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            config = json.loads((run_dir / CONFIG_FILE).read_text())
        except (JobFailed, OSError, ValueError) as exc:
            failures.append({"model": model, "mode": mode, "world_size": np, "repeat": repeat + 1,
                             "error": str(exc)[-2000:]})
            continue
        measured.setdefault((model, mode, np), []).append(
            {"repeat": repeat + 1, "samples_per_s": summary["samples_per_s"],
             "comm_ms": (summary.get("time_split") or {}).get("comm_ms"),
             "bytes": summary["reduced_bytes_per_step"], "threads": config["threads"],
             "per_rank_batch": config["config"]["batch_size"], "accumulate": config["config"]["accumulate"],
             "micro_batch": config["config"]["micro_batch" if is_exact(config["config"]) else "batch_size"]})
    rows = []
    for (model, mode, np), runs in sorted(measured.items()):
        runs.sort(key=lambda r: r["repeat"])
        comm = [r["comm_ms"] for r in runs if r["comm_ms"] is not None]
        rows.append({"model": model, "mode": mode, "world_size": np,
                     "samples_per_s": stats.spread([r["samples_per_s"] for r in runs]),
                     "repeats": [r["repeat"] for r in runs],
                     "comm_ms": stats.spread(comm) if comm else None,
                     "bytes_per_step": runs[0]["bytes"], "threads": runs[0]["threads"],
                     **{k: runs[0][k] for k in ("per_rank_batch", "accumulate", "micro_batch")}})
    return rows


def fixed_point_error(model_name: str, size: int, global_batch: int, micro_batch: int, seed: int = 0) -> Dict:
    """The largest relative error of the fixed-point mean of real micro-batch gradients, and of float32's
    sequential sum, against the float64 mean."""
    from common.exact.fixedpoint import FixedPoint, tensor_maxima
    from common.inputs.models import build_model

    torch.manual_seed(seed)
    model = build_model(model_name, 3, size, 10, seed)
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(global_batch, 3, size, size, generator=gen)
    labels = torch.randint(10, (global_batch,), generator=gen)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for x, y in zip(images.split(micro_batch), labels.split(micro_batch)):
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]).clone())
    count = len(grads)
    fixed = FixedPoint([p.numel() for p in params], count)
    per_tensor = [list(g.split([p.numel() for p in params])) for g in grads]
    fixed.rescale(torch.stack([tensor_maxima(t) for t in per_tensor]).max(dim=0).values)
    reference = torch.stack(grads).double().mean(dim=0)
    in_fixed = fixed.to_floats(sum(fixed.to_integers(g) for g in grads), count).double()
    in_float32 = grads[0].clone()
    for g in grads[1:]:
        in_float32 += g
    in_float32 = (in_float32 / count).double()
    worst = {"fixed_point": 0.0, "float32_sum": 0.0}
    offset = 0
    for p in params:
        part = slice(offset, offset + p.numel())
        scale = reference[part].abs().max().item() or 1.0
        worst["fixed_point"] = max(worst["fixed_point"], (in_fixed[part] - reference[part]).abs().max().item() / scale)
        worst["float32_sum"] = max(worst["float32_sum"], (in_float32[part] - reference[part]).abs().max().item() / scale)
        offset += p.numel()
    return {"model": model_name, "image_size": size, "micro_batches": count, **worst}


def distance(args, work: Path, failures: List[Dict]) -> Optional[Dict]:
    """The default training at 3 ranks in both modes (both with a global batch of 96): the final weights'
    largest difference."""
    dirs = {}
    for mode in MODES:
        run_dir = work / f"default-{mode}"
        train = (["--reduction", mode] if is_exact({"reduction": mode}) else []) + ["--run-dir", str(run_dir)]
        print(f"exact_cost: default training, {mode}, 3 ranks ...", flush=True)
        try:
            run_job(worker_command("torchrun", 3, "ddp_train", train), run_dir.with_suffix(".log"), args.timeout)
        except JobFailed as exc:
            failures.append({"mode": mode, "world_size": 3, "error": str(exc)[-2000:]})
            return None
        dirs[mode] = run_dir
    a, b = (torch.load(dirs[m] / MODEL_FILE, weights_only=True) for m in MODES)
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())
    largest = max(float(a[k].double().abs().max()) for k in a if a[k].is_floating_point())
    scores = {m: json.loads((dirs[m] / SUMMARY_FILE).read_text())["val_top1"] for m in MODES}
    return {"world_size": 3, "max_abs_weight_diff": worst, "largest_weight": largest,
            "val_top1": scores, "settings": "defaults (convnet, digits, 10 epochs, global batch 96)"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.exact_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np(p, [1, 2, 3], "world sizes, e.g. 1,2,3")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--global-batch", type=int, default=48, help="samples per step, in both modes")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="samples per micro-batch in both modes (allreduce mode: the per-rank batch, accumulated)")
    p.add_argument("--image-size", default="", metavar="MODEL=SIZE,...",
                   help=f"image sizes (default: {', '.join(f'{m}={s}' for m, s in MODELS.items())})")
    p.add_argument("--threads", type=int, default=1, help="threads per rank, in both modes")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each mode and setting, both modes next to each other, every other repeat backwards")
    p.add_argument("--no-distance", dest="distance", action="store_false",
                   help="skip the two default trainings (minutes)")
    add_timeout(p, 1800)
    add_places(p, "runs/bench-exact")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    if not args.models or any(m not in MODELS for m in args.models):
        print_error("exact_cost", f"--models: choose from {', '.join(MODELS)}", ranked=False)
        return 2
    try:
        args.image_sizes = {**MODELS, **{k: int(v) for k, v in (pair.split("=", 1) for pair in args.image_size.split(",")
                                                                 if pair)}}
    except ValueError:
        print_error("exact_cost", f"--image-size {args.image_size!r}: give MODEL=SIZE pairs, e.g. resnet18=224",
                    ranked=False)
        return 2
    if args.global_batch % args.micro_batch or any((args.global_batch // args.micro_batch) % n for n in args.np):
        print_error("exact_cost", f"--global-batch {args.global_batch} must be a multiple of --micro-batch "
                    f"{args.micro_batch} whose micro-batches every world size in --np shares", ranked=False)
        return 2
    record = Record("exact_cost", argv)
    failures: List[Dict] = []
    rows = speed(args, args.work, failures)
    errors = [fixed_point_error(m, args.image_sizes[m], args.global_batch, args.micro_batch) for m in args.models]
    far = distance(args, args.work, failures) if args.distance else None
    report = {**record.header(), "settings": {"global_batch": args.global_batch, "micro_batch": args.micro_batch,
                                              "steps": args.steps, "repeats": args.repeats, "launcher": "torchrun",
                                              "threads": args.threads,
                                              "image_sizes": {m: args.image_sizes[m] for m in args.models}},
              "speed": rows, "cost": step_time_ratios(rows), "fixed_point_error": errors, "distance": far, "failures": failures}
    table = tables.text(["model", "mode", "np", "samples/s", "threads", "bytes/step"],
                        [[r["model"], r["mode"], r["world_size"],
                          tables.measured(r["samples_per_s"]["median"], r["samples_per_s"]["min"],
                                          r["samples_per_s"]["max"]),
                          r["threads"], tables.size(r["bytes_per_step"])] for r in rows])
    table += "\n" + tables.text(["model", "np", "exact step time / allreduce's"],
                                [[c["model"], c["world_size"], f"{c['step_time_ratio']:.2f}x"] for c in report["cost"]])
    table += "\n" + tables.text(["model", "micro-batches", "fixed-point error", "float32 sum error"],
                                [[e["model"], e["micro_batches"], f"{e['fixed_point']:.1e}", f"{e['float32_sum']:.1e}"]
                                 for e in errors])
    if far:
        table += (f"\ndefault training at 3 ranks, exact vs allreduce: max |Δw| {far['max_abs_weight_diff']:.2e} "
                  f"(largest weight {far['largest_weight']:.2f}); val top-1 {far['val_top1']}")
    return publish(report, args.out / "exact_cost.json", table)


if __name__ == "__main__":
    sys.exit(run_cli(main, "exact_cost"))
