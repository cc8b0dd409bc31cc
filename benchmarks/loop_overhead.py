"""What each piece of the training loop's bookkeeping (lr schedule, meters, loss.item(), the metrics line, rank 0's
weight fingerprint, liveness notes, the stop check's allreduce shared by the steps between checks) costs per step,
timed alone in one process with the real objects, against the step itself. The stop check's cost is the smallest
torch message of DIR/allreduce.json, when there.

    python -m benchmarks.loop_overhead --models convnet,resnet18 --out benchmarks/results
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from common.config import Config
from common.faults.liveness import Activity
from common.faults.stopping import CHECK_PERIOD_S, MAX_CHECK_EVERY
from common.inputs.models import build_model
from common.rundir.fingerprint import weight_norms
from common.loop.metrics import SumMeter
from common.loop.optim import lr_at, make_optimizer, set_lr
from common.rundir.writer import RunDir

from .jobs import add_out, parser
from .machine import Record
from .throughput import for_model, parse_image_sizes

#: the ranks' stop check: one small allreduce shared by the steps between two checks
STOP_CHECK = "stop check (allreduce / steps between checks)"


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of one call, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def steps_between_checks(step_s: float) -> int:
    """Steps between two stop checks at this step time, as StopControl paces them: as many as take CHECK_PERIOD_S,
    at least one and at most MAX_CHECK_EVERY."""
    return min(max(int(CHECK_PERIOD_S // step_s), 1), MAX_CHECK_EVERY)


def stop_check_seconds(allreduce: dict[str, Any] | None) -> float | None:
    """One stop check: the fastest torch series' smallest message in an allreduce result (None without one)."""
    smallest = [s["results"][0]["time_s"] for s in (allreduce or {}).get("series", []) if s["name"].startswith("torch")]
    return min(smallest) if smallest else None


def measure(model_name: str, image_size: int, batch: int, threads: int, repeats: int,
            stop_check_s: float | None) -> dict[str, Any]:
    """One model's step time and each piece's cost per step."""
    torch.set_num_threads(threads)
    config = Config(model=model_name, dataset="synthetic", image_size=image_size, batch_size=batch)
    model = build_model(model_name, 3, image_size, 10, 0)
    optimizer = make_optimizer(config, model.parameters())
    images, labels = torch.randn(batch, 3, image_size, image_size), torch.randint(10, (batch,))
    state: dict[str, torch.Tensor] = {}

    def step() -> None:
        optimizer.zero_grad()
        state["logits"] = model(images)
        state["loss"] = F.cross_entropy(state["logits"], labels)
        state["loss"].backward()
        optimizer.step()

    step_s = timed(step, max(3, repeats // 50))
    logits, loss = state["logits"], state["loss"]
    meter, activity = SumMeter(["loss", "correct"], torch.device("cpu")), Activity()

    def notes() -> None:  # the loop's notes of a step: its batch loaded, computing, the step done, loading the next
        activity.set("forward, backward and the optimizer step")
        activity.step = 1
        activity.set("loading data")

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = RunDir(tmp, True)
        run_dir.open()
        parts = {
            "lr schedule": lambda: set_lr(optimizer, lr_at(config, 10, 100, 1000, 2)),
            "train meters": lambda: meter.add(batch, loss=loss.detach() * batch,
                                              correct=(logits.detach().argmax(dim=1) == labels).sum()),
            "loss.item()": lambda: loss.item(),
            "weight fingerprint (rank 0)": lambda: weight_norms(model),
            "metrics.jsonl step line": lambda: run_dir.log("step", epoch=0, step=1, loss=0.5, lr=0.1, batch=batch,
                                                            data_s=0.001, step_s=0.1, comm_s=0.01),
            "activity notes": notes,
        }
        costs = {piece: timed(fn, repeats) for piece, fn in parts.items()}
        run_dir.close()
    every = steps_between_checks(step_s)
    if stop_check_s is not None:
        costs[STOP_CHECK] = stop_check_s / every
    total = sum(costs.values())
    return {"model": model_name, "image_size": image_size, "batch_size": batch, "threads": threads, "step_s": step_s,
            "costs_s": costs, "total_s": total, "share_of_step": total / step_s, "stop_check_every": every}


def main(argv: Sequence[str] | None = None) -> int:
    """Time every piece for every model."""
    p = parser("loop_overhead", __doc__)
    p.add_argument("--models", default="convnet,resnet18")
    p.add_argument("--image-size", type=parse_image_sizes, default=parse_image_sizes("convnet=32,resnet18=224"),
                   help="per model, as in benchmarks.throughput")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (one rank of two on two cores: 1)")
    p.add_argument("--repeats", type=int, default=500, help="timings of each piece (median)")
    add_out(p)
    args = p.parse_args(argv)
    source = args.out / "allreduce.json"
    stop_check_s = stop_check_seconds(json.loads(source.read_text()) if source.is_file() else None)
    record = Record("loop_overhead", argv)
    rows = [measure(m, for_model(args.image_size, m) or 32, args.batch_size, args.threads, args.repeats, stop_check_s)
            for m in args.models.split(",") if m]
    return record.publish(args.out, stop_check_source=str(source) if stop_check_s is not None else None, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
