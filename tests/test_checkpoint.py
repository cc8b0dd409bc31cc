"""Checkpoints: exact resume (mid-epoch, across backends, with accumulation and the other knobs), world-size changes,
--resume PATH, refusals, and non-finite values that never reach a checkpoint or model.pt."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from launched import launch, read_run, step_losses, tensorboard_scalars
from settings import KNOBS
from common.rundir.names import MODEL_FILE, SUMMARY_FILE

# The first halves are test_knobs' runs (one launch serves both modules): convnet, Adam with weight decay,
# --accumulate 2 and every other knob that keeps world-size-2 parity, a checkpoint every 5 steps, 16 steps.
# World size 2, batch 32, --accumulate 2: 11 steps per epoch (22 micro-batches), so 16 stops in the middle
# of the second epoch (at micro-batch 10) and 30 in the third.
HALF, FULL = 16, 30
FIRST_HALF = KNOBS


def settings(max_steps):
    """The first halves' settings, up to step `max_steps`."""
    return FIRST_HALF + ["--max-steps", str(max_steps)]


@pytest.fixture(scope="module")
def uninterrupted(runs):
    return runs("torchrun", 2, settings(FULL)).run


def _last_epoch(run):
    return [e for e in run["events"] if e["event"] == "epoch"][-1]


@pytest.mark.parametrize("first,second", [("torchrun", "horovodrun-mpi"), ("horovodrun-gloo", "torchrun")])
def test_stop_and_resume_mid_epoch_is_bitwise_exact(runs, tmp_path, uninterrupted, first, second):
    half = runs(first, 2, FIRST_HALF)
    kept = sorted(p.name for p in (half.dir / "checkpoints").glob("ckpt-*.pt"))
    # Every 5 steps, the epoch end at 11 and the stop at 16; the newest three remain.
    assert kept == ["ckpt-000000011.pt", "ckpt-000000015.pt", "ckpt-000000016.pt"]
    ckpt = torch.load(half.dir / "checkpoints" / "ckpt-000000016.pt", weights_only=True)
    assert (ckpt["step"], ckpt["batch"], ckpt["epoch"]) == (16, 10, 1)  # batch counts micro-batches
    run_dir = tmp_path / "run"
    shutil.copytree(half.dir, run_dir)
    result = launch(second, 2, settings(FULL) + ["--resume", "auto", "--run-dir", str(run_dir)]).check()
    assert "resuming from" in result.output and "ckpt-000000016.pt" in result.output
    resumed = read_run(run_dir)
    assert resumed["summary"]["weights_sha256"] == uninterrupted["summary"]["weights_sha256"]
    assert step_losses(resumed) == step_losses(uninterrupted)
    # The resumed epoch's metrics cover all its steps, as in one go; TensorBoard holds each step once.
    assert _last_epoch(resumed)["train_loss"] == _last_epoch(uninterrupted)["train_loss"]
    assert [s for s, _ in tensorboard_scalars(run_dir)["train/batch_loss"]] == list(range(1, FULL + 1))


def test_resume_from_a_named_checkpoint_at_another_world_size(runs, tmp_path):
    """--resume PATH, from an epoch-end checkpoint of a 2-rank run, on one process: accepted, with the
    new global batch and learning rate named."""
    path = runs("torchrun", 2, FIRST_HALF).dir / "checkpoints" / "ckpt-000000011.pt"
    result = launch("none-hvd", 1, settings(14) + ["--resume", str(path), "--run-dir", str(tmp_path)]).check()
    assert f"resuming from {path}: epoch 2, batch 0, step 11" in result.output
    assert "world size changed 2 -> 1 at the start of epoch 2: global batch 128 -> 64, lr 0.002 -> 0.002" \
        in result.output
    run = read_run(tmp_path)
    assert run["summary"]["resumed_from"] == str(path) and run["summary"]["steps"] == 14
    notes = [e for e in run["events"] if e["event"] == "note"]
    assert notes and "world size changed 2 -> 1" in notes[0]["message"]


def test_world_size_change_mid_epoch_is_refused(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs("horovodrun-gloo", 2, FIRST_HALF).dir, run_dir)
    result = launch("none-ddp", 1, settings(FULL) + ["--resume", "auto", "--run-dir", str(run_dir)], timeout=60)
    assert result.returncode == 2
    assert "written mid-epoch (epoch 2, batch 10) at world size 2" in result.output


class _Payload:
    """Pickles to a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path, obj):
    torch.save(obj, path)
    from common.checkpoints.format import file_sha256
    path.with_name(path.name + ".sha256").write_text(f"{file_sha256(str(path))}  {path.name}\n")


MLP = ["--model", "mlp", "--epochs", "1", "--threads", "1", "--checkpoint-every", "4"]


@pytest.fixture(scope="module")
def single(runs):
    """One process, 16 steps; the newest three checkpoints remain, at steps 8, 12 and 16."""
    return runs("none-ddp", 1, MLP + ["--max-steps", "16"])


def test_auto_resume_passes_over_bad_checkpoints(single, tmp_path):
    """A checkpoint carrying pickled code is refused and its code never runs; a truncated one is named;
    --resume auto goes back to the newest good one and ends as an undisturbed run."""
    run_dir = tmp_path / "run"
    shutil.copytree(single.dir, run_dir)
    # As if stopped after step 12: its last checkpoint and its results go.
    for late in [*(run_dir / "checkpoints").glob("ckpt-000000016.pt*"), run_dir / SUMMARY_FILE, run_dir / MODEL_FILE]:
        late.unlink()
    marker = tmp_path / "pwned"
    _plant(run_dir / "checkpoints" / "ckpt-000000999.pt", {"format": 1, "model": _Payload(marker)})
    newest = run_dir / "checkpoints" / "ckpt-000000012.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    result = launch("none-ddp", 1, MLP + ["--max-steps", "16", "--resume", "auto", "--run-dir", str(run_dir)]).check()
    assert "skipping checkpoint" in result.output and "ckpt-000000999.pt was refused" in result.output
    assert "ckpt-000000012.pt is corrupt or truncated" in result.output
    assert "resuming from" in result.output and "ckpt-000000008.pt" in result.output
    assert not marker.exists()
    assert read_run(run_dir)["summary"]["weights_sha256"] == single.run["summary"]["weights_sha256"]


def test_checkpoint_of_another_run_is_refused_naming_every_difference(single, tmp_path):
    path = single.dir / "checkpoints" / "ckpt-000000008.pt"
    result = launch("none-ddp", 1, MLP + ["--model", "convnet", "--dataset", "synthetic", "--resume", str(path),
                                          "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 2 and "belongs to another run: " in result.output, result.output[-2000:]
    for expected in ("model 'mlp' in the checkpoint, 'convnet' now",
                     "dataset 'digits' in the checkpoint, 'synthetic' now"):
        assert expected in result.output, result.output[-2000:]


def test_checkpoint_with_pickled_code_named_explicitly_is_refused(single, tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    _plant(evil, {"format": 1, "model": _Payload(marker)})
    result = launch("none-hvd", 1, MLP + ["--resume", str(evil), "--run-dir", str(tmp_path / "run")], timeout=60)
    assert result.returncode == 2 and "was refused" in result.output and "nothing in it was run" in result.output
    assert not marker.exists()


def test_checkpoint_loads_with_weights_only(single):
    ckpt = torch.load(single.dir / "checkpoints" / "ckpt-000000016.pt", weights_only=True)
    assert {"model", "optimizer", "epoch", "batch", "step", "rng", "meter", "settings"} <= set(ckpt)
    assert single.run["summary"]["steps"] == ckpt["step"] == 16


def _all_finite(state):
    return all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def test_non_finite_weights_never_reach_a_checkpoint(tmp_path):
    """With a huge learning rate the loss stays finite while BatchNorm's running variance overflows: the
    weights are checked before anything is written, every rank stops with the same line, and the last
    good checkpoint is kept."""
    result = launch("torchrun", 2, ["--model", "convnet", "--lr", "1e9", "--log-every", "50", "--checkpoint-every", "2",
                                    "--threads", "1", "--run-dir", str(tmp_path)])
    assert result.returncode != 0
    for rank in range(2):
        assert f"[rank {rank}] ddp_train: error: non-finite values in " in result.output, result.output[-3000:]
    assert "checkpoint not written (the last good checkpoint is kept)" in result.output
    assert not (tmp_path / SUMMARY_FILE).exists() and not (tmp_path / MODEL_FILE).exists()
    from common.checkpoints.format import find_newest_valid
    good, _, problems = find_newest_valid(str(tmp_path))
    assert good is not None and not problems and _all_finite(good["model"])


def test_non_finite_loss_stops_at_once(tmp_path):
    result = launch("none-ddp", 1, ["--model", "mlp", "--lr", "1e6", "--checkpoint-every", "1", "--max-steps", "40",
                                    "--threads", "1", "--run-dir", str(tmp_path)])
    assert result.returncode == 1
    assert "ddp_train: error: loss is nan" in result.output or "ddp_train: error: loss is inf" in result.output
    assert not (tmp_path / SUMMARY_FILE).exists()
    from common.checkpoints.format import find_newest_valid
    good, _, problems = find_newest_valid(str(tmp_path))
    assert good is not None and not problems and _all_finite(good["model"])
