"""Checkpoints: exact resume (also mid-epoch and across backends), world-size changes, refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch

from launch import launch, read_run, step_losses

ARGS = ["--model", "convnet", "--optimizer", "adam", "--lr", "0.002", "--weight-decay", "0.01",
        "--epochs", "3", "--threads", "1"]
# World size 2, batch 32: 23 steps per epoch, so 30 stops mid-way through the second epoch.
HALF, FULL = 30, 60


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full")
    launch("torchrun", 2, ARGS + ["--max-steps", str(FULL), "--run-dir", str(run_dir)]).check()
    return read_run(run_dir)


@pytest.mark.parametrize("first,second", [("torchrun", "torchrun"), ("horovodrun-gloo", "horovodrun-gloo"),
                                          ("torchrun", "horovodrun-mpi"), ("mpirun", "torchrun")])
def test_stop_and_resume_mid_epoch_is_bitwise_exact(tmp_path, uninterrupted, first, second):
    launch(first, 2, ARGS + ["--max-steps", str(HALF), "--checkpoint-every", "7", "--keep-checkpoints", "2",
                             "--run-dir", str(tmp_path)]).check()
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.pt"))
    # Every 7 steps, the epoch end at 23 and the stop at 30; the newest two remain.
    assert kept == ["ckpt-000000028.pt", "ckpt-000000030.pt"]
    result = launch(second, 2, ARGS + ["--max-steps", str(FULL), "--resume", "auto",
                                       "--run-dir", str(tmp_path)]).check()
    assert "resuming from" in result.output and "ckpt-000000030.pt" in result.output
    resumed = read_run(tmp_path)
    assert resumed["summary"]["weights_sha256"] == uninterrupted["summary"]["weights_sha256"]
    assert step_losses(resumed) == step_losses(uninterrupted)
    # The resumed epoch's metrics cover all its steps, as in one go.
    last_epoch = lambda run: [e for e in run["events"] if e["event"] == "epoch"][-1]  # noqa: E731
    assert last_epoch(resumed)["train_loss"] == last_epoch(uninterrupted)["train_loss"]


def test_world_size_change_is_accepted_at_an_epoch_boundary(tmp_path):
    args = ["--model", "mlp", "--epochs", "3", "--threads", "1", "--lr-scaling", "linear", "--lr", "0.05"]
    launch("torchrun", 2, args + ["--max-steps", "23", "--run-dir", str(tmp_path)]).check()
    result = launch("horovodrun-gloo", 1, args + ["--resume", "auto", "--run-dir", str(tmp_path)]).check()
    assert "world size changed 2 -> 1 at the start of epoch 2: global batch 64 -> 32, lr 0.1 -> 0.05" in result.output
    notes = [e for e in read_run(tmp_path)["events"] if e["event"] == "note"]
    assert notes and "world size changed" in notes[0]["message"]


def test_world_size_change_mid_epoch_is_refused(tmp_path):
    args = ["--model", "mlp", "--epochs", "2", "--threads", "1"]
    launch("torchrun", 2, args + ["--max-steps", "10", "--run-dir", str(tmp_path)]).check()
    result = launch("none-ddp", 1, args + ["--resume", "auto", "--run-dir", str(tmp_path)])
    assert result.returncode == 2
    assert "written mid-epoch (epoch 1, batch 10) at world size 2" in result.output


class _Payload:
    """Pickles to a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path, obj):
    torch.save(obj, path)
    from common.checkpoint import file_sha256
    path.with_name(path.name + ".sha256").write_text(f"{file_sha256(str(path))}  {path.name}\n")


def test_checkpoint_with_pickled_code_is_refused_and_never_runs(tmp_path):
    args = ["--model", "mlp", "--epochs", "1", "--threads", "1"]
    launch("none-ddp", 1, args + ["--max-steps", "5", "--run-dir", str(tmp_path)]).check()
    marker = tmp_path / "pwned"
    evil = tmp_path / "checkpoints" / "ckpt-000000999.pt"
    _plant(evil, {"format": 1, "model": _Payload(marker)})

    explicit = launch("none-hvd", 1, args + ["--max-steps", "8", "--resume", str(evil), "--run-dir", str(tmp_path)])
    assert explicit.returncode == 2 and "was refused" in explicit.output and "nothing in it was run" in explicit.output
    # auto passes over it, says so, and resumes from the good one.
    auto = launch("none-ddp", 1, args + ["--max-steps", "8", "--resume", "auto", "--run-dir", str(tmp_path)]).check()
    assert "skipping checkpoint" in auto.output and "ckpt-000000999.pt was refused" in auto.output
    assert "ckpt-000000005.pt" in auto.output
    assert not marker.exists()


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    args = ["--model", "mlp", "--epochs", "1", "--threads", "1", "--checkpoint-every", "4"]
    full = tmp_path / "full"
    launch("none-ddp", 1, args + ["--max-steps", "16", "--run-dir", str(full)]).check()
    run_dir = tmp_path / "split"
    launch("none-ddp", 1, args + ["--max-steps", "12", "--run-dir", str(run_dir)]).check()
    newest = run_dir / "checkpoints" / "ckpt-000000012.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    result = launch("none-ddp", 1, args + ["--max-steps", "16", "--resume", "auto", "--run-dir", str(run_dir)]).check()
    assert "ckpt-000000012.pt is corrupt or truncated" in result.output
    assert "resuming from" in result.output and "ckpt-000000008.pt" in result.output
    assert read_run(run_dir)["summary"]["weights_sha256"] == read_run(full)["summary"]["weights_sha256"]


def test_checkpoint_of_another_model_is_refused(tmp_path):
    launch("none-ddp", 1, ["--model", "mlp", "--max-steps", "3", "--run-dir", str(tmp_path)]).check()
    result = launch("none-ddp", 1, ["--model", "convnet", "--resume", "auto", "--run-dir", str(tmp_path)])
    assert result.returncode == 2
    assert "belongs to another run: model 'mlp' in the checkpoint, 'convnet' now" in result.output


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    result = launch("torchrun", 2, ["--model", "mlp", "--lr", "1e6", "--checkpoint-every", "1", "--max-steps", "40",
                                    "--threads", "1", "--run-dir", str(tmp_path)])
    assert result.returncode != 0
    assert "loss is nan" in result.output or "loss is inf" in result.output
    assert not (tmp_path / "summary.json").exists()
    from common.checkpoint import find_newest_valid
    good, path, problems = find_newest_valid(str(tmp_path))
    assert good is not None and not problems
    assert all(torch.isfinite(t).all() for t in good["model"].values() if t.is_floating_point())


def test_checkpoint_loads_with_weights_only(tmp_path):
    launch("none-hvd", 1, ["--model", "mlp", "--max-steps", "3", "--run-dir", str(tmp_path)]).check()
    (path,) = (tmp_path / "checkpoints").glob("ckpt-*.pt")
    ckpt = torch.load(path, weights_only=True)
    assert {"model", "optimizer", "epoch", "batch", "step", "rng", "meter", "settings"} <= set(ckpt)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == ckpt["step"] == 3
