"""What each piece of bookkeeping in the training loop costs per step, against the step itself.

The loop in common/loop/trainer.py does, besides forward, backward and the optimizer step: the lr
schedule, the train meters (a few small tensor ops), `loss.item()` and a JSON line in
metrics.jsonl every --log-every steps with, on rank 0, the weight fingerprint (the float64 norm of every
parameter, where the comparison finds a divergence start; the other ranks wait for rank 0 at the next
allreduce), notes of what the rank is doing (common.faults.liveness), and
about every CHECK_PERIOD_S of training (common.faults.stopping) a tiny allreduce that lets the ranks agree
to stop on a signal. This times each piece alone, in one process, with the real objects (SumMeter, RunDir,
Activity, lr_at), at the model's real batch, and the stop check from the allreduce benchmark's smallest torch message
(when DIR/allreduce.json exists), shared by the steps between two checks at the measured step time.

    python -m benchmarks.loop_overhead --models convnet,resnet18 --out benchmarks/results

Writes DIR/loop_overhead.json and prints a table (µs per step and share of the step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from common.config import Config
from common.faults.liveness import Activity
from common.inputs.models import build_model
from common.loop.fingerprint import weight_norms
from common.loop.metrics import SumMeter
from common.loop.optim import lr_at, make_optimizer, set_lr
from common.rundir.writer import RunDir

from common.compare import tables
from common.faults.stopping import CHECK_PERIOD_S, MAX_CHECK_EVERY

from .jobs import add_out
from .machine import Record, write_json


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of one call."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


#: the piece that is the ranks' stop check, one small allreduce shared by the steps between two checks
STOP_CHECK = "stop check (allreduce / steps between checks)"
#: the piece that is rank 0's float64 norm of every parameter in each metrics.jsonl step line
WEIGHT_FINGERPRINT = "weight fingerprint (rank 0)"


def steps_between_checks(step_s: float) -> int:
    """Steps between two stop checks at this step time, as StopControl.agreed paces them: as many as
    take CHECK_PERIOD_S, at least one and at most MAX_CHECK_EVERY."""
    return min(max(int(CHECK_PERIOD_S // step_s), 1), MAX_CHECK_EVERY)


def measure(model_name: str, image_size: int, batch: int, threads: int, repeats: int, stop_check_s) -> Dict:
    torch.set_num_threads(threads)
    config = Config(model=model_name, dataset="synthetic", image_size=image_size, batch_size=batch)
    model = build_model(model_name, 3, image_size, 10, 0)
    optimizer = make_optimizer(config, model.parameters())
    images, labels = torch.randn(batch, 3, image_size, image_size), torch.randint(10, (batch,))
    state = {}

    def step():
        optimizer.zero_grad()
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        state.update(logits=logits, loss=loss)

    step_s = timed(step, max(3, repeats // 50))
    logits, loss = state["logits"], state["loss"]
    meter = SumMeter(["loss", "correct"], torch.device("cpu"))
    activity = Activity()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = RunDir(tmp, True)
        run_dir.open()
        parts = {
            "lr schedule": lambda: set_lr(optimizer, lr_at(config, 10, 100, 1000, 2)),
            "train meters": lambda: meter.add(batch, loss=loss.detach() * batch,
                                              correct=(logits.detach().argmax(dim=1) == labels).sum()),
            "loss.item()": lambda: loss.item(),
            WEIGHT_FINGERPRINT: lambda: weight_norms(model),
            "metrics.jsonl step line": lambda: run_dir.log("step", epoch=0, step=1, loss=0.5, lr=0.1, batch=batch,
                                                            data_s=0.001, step_s=0.1, comm_s=0.01),
            # the loop's notes of a step: its batch loaded, computing, the step done, loading the next
            "activity notes": lambda: (activity.set("forward, backward and the optimizer step"),
                                       setattr(activity, "step", 1), activity.set("loading data")),
        }
        costs = {name: timed(fn, repeats) for name, fn in parts.items()}
        run_dir.close()
    every = steps_between_checks(step_s)
    if stop_check_s is not None:
        costs[STOP_CHECK] = stop_check_s / every
    total = sum(costs.values())
    return {"model": model_name, "image_size": image_size, "batch_size": batch, "threads": threads,
            "step_s": step_s, "costs_s": costs, "total_s": total, "share_of_step": total / step_s,
            "stop_check_every": every}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="convnet,resnet18")
    p.add_argument("--image-size", default="convnet=32,resnet18=224", help="per model, as in benchmarks.throughput")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (one rank of two on two cores: 1)")
    p.add_argument("--repeats", type=int, default=500, help="timings of each piece (median)")
    add_out(p)
    args = p.parse_args(argv)
    from .throughput import parse_image_sizes

    sizes = parse_image_sizes(args.image_size)
    stop_check_s = None
    ar_file = args.out / "allreduce.json"
    if ar_file.is_file():
        ar = json.loads(ar_file.read_text())
        smallest = [s["results"][0]["time_s"] for s in ar["series"] if s["name"].startswith("torch")]
        stop_check_s = min(smallest) if smallest else None
    record = Record("loop_overhead", argv)
    rows = [measure(m, sizes.get(m, sizes.get("*", 32)), args.batch_size, args.threads, args.repeats, stop_check_s)
            for m in args.models.split(",") if m]
    report = {**record.header(), "stop_check_source": str(ar_file) if stop_check_s is not None else None,
              "rows": rows}
    write_json(args.out / "loop_overhead.json", report)
    for r in rows:
        print(f"\n{r['model']} {r['image_size']}x{r['image_size']} batch {r['batch_size']}, {r['threads']} thread(s): "
              f"step {r['step_s'] * 1e3:.2f} ms")
        table = [[name, f"{s * 1e6:.1f}", f"{100 * s / r['step_s']:.3f}%"] for name, s in r["costs_s"].items()]
        table.append(["total", f"{r['total_s'] * 1e6:.1f}", f"{100 * r['share_of_step']:.3f}%"])
        print(tables.text(["piece", "µs/step", "of step"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
