"""TensorBoard event files and the tqdm progress bar: rank 0 only, the same numbers as metrics.jsonl."""

from __future__ import annotations

import re

import pytest

from launch import launch, read_run

ARGS = ["--model", "mlp", "--epochs", "2", "--max-steps", "30", "--threads", "1"]


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_tensorboard_scalars_match_metrics(tmp_path, launcher):
    launch(launcher, 2, ARGS + ["--tensorboard", "--run-dir", str(tmp_path)]).check()
    # One event file: only rank 0 writes.
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
    scalars = _scalars(tmp_path)
    assert {"train/batch_loss", "train/lr", "train/loss", "train/top1", "speed/samples_per_s", "val/loss",
            "val/top1", "val/top5"} <= set(scalars)
    events = read_run(tmp_path)["events"]
    steps = [e for e in events if e["event"] == "step"]
    assert [s for s, _ in scalars["train/batch_loss"]] == [e["step"] for e in steps]
    assert [v for _, v in scalars["train/batch_loss"]] == pytest.approx([e["loss"] for e in steps], rel=1e-6)
    evals = [e for e in events if e["event"] == "eval"]
    assert [v for _, v in scalars["val/top1"]] == pytest.approx([e["val_top1"] for e in evals], rel=1e-6)


def test_tensorboard_resume_does_not_repeat_steps(tmp_path):
    launch("torchrun", 2, ARGS + ["--max-steps", "10", "--tensorboard", "--run-dir", str(tmp_path)]).check()
    launch("torchrun", 2, ARGS + ["--resume", "auto", "--tensorboard", "--run-dir", str(tmp_path)]).check()
    steps = [s for s, _ in _scalars(tmp_path)["train/batch_loss"]]
    assert steps == list(range(1, 31))


def test_progress_bar_on_rank_0_only(tmp_path):
    # horovodrun prefixes every line with the rank that wrote it: [0]<stderr>:
    result = launch("horovodrun-gloo", 2, ARGS + ["--progress", "on", "--run-dir", str(tmp_path / "on")]).check()
    assert re.search(r"\[0\]<stderr>:epoch 1: +\d+%.*?step/s", result.output), result.output[-2000:]
    assert not re.search(r"\[1\]<stderr>:epoch \d+: ", result.output)
    # auto: the launcher's output is not a terminal, so no bar.
    quiet = launch("horovodrun-gloo", 2, ARGS + ["--run-dir", str(tmp_path / "auto")]).check()
    assert "step/s" not in quiet.output
