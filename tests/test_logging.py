"""TensorBoard event files and the tqdm progress bar: rank 0 only, the same numbers as metrics.jsonl."""

from __future__ import annotations

import re

import pytest

from launched import tensorboard_scalars
from settings import convnet_run, mlp_run


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_tensorboard_scalars_match_metrics(runs, launcher):
    launched = mlp_run(runs, launcher)
    # One event file: only rank 0 writes.
    assert len(list((launched.dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    scalars = tensorboard_scalars(launched.dir)
    assert {"train/batch_loss", "train/lr", "train/loss", "train/top1", "speed/samples_per_s", "val/loss",
            "val/top1", "val/top5"} <= set(scalars)
    events = launched.run["events"]
    steps = [e for e in events if e["event"] == "step"]
    assert [s for s, _ in scalars["train/batch_loss"]] == [e["step"] for e in steps]
    assert [v for _, v in scalars["train/batch_loss"]] == pytest.approx([e["loss"] for e in steps], rel=1e-6)
    evals = [e for e in events if e["event"] == "eval"]
    assert [v for _, v in scalars["val/top1"]] == pytest.approx([e["val_top1"] for e in evals], rel=1e-6)


def test_progress_bar_on_rank_0_only(runs):
    # horovodrun prefixes every line with the rank that wrote it: [0]<stderr>:
    output = mlp_run(runs, "horovodrun-gloo").result.output  # --progress on
    assert re.search(r"\[0\]<stderr>:epoch 1: +\d+%.*?step/s", output), output[-2000:]
    assert not re.search(r"\[1\]<stderr>:epoch \d+: ", output)
    # auto: the launcher's output is not a terminal, so no bar (the 3-rank run test_compare and test_parity read).
    assert "step/s" not in convnet_run(runs, "horovodrun-gloo", np=3).result.output
