"""Every launcher trains and writes a complete run directory; DDP and Horovod train identically."""

from __future__ import annotations

import hashlib
import json

import pytest

from launch import LAUNCHERS, backend_of, launch, max_abs_diff, read_run, step_losses

SETTINGS = {
    "mlp-sgd": ["--model", "mlp", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
    "convnet-adam": ["--model", "convnet", "--optimizer", "adam", "--lr", "0.002", "--weight-decay", "0.01"],
    "convnet-sgd": ["--model", "convnet", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                    "--weight-decay", "0.0005"],
    "mlp-adam": ["--model", "mlp", "--optimizer", "adam", "--lr", "0.002", "--weight-decay", "0.01"],
}
# Two epochs' worth of steps at world size 2 with --batch-size 32 is 46; 30 crosses an epoch boundary.
COMMON = ["--dataset", "digits", "--batch-size", "32", "--epochs", "2", "--max-steps", "30", "--threads", "1"]
TWO_RANK = ("torchrun", "horovodrun-gloo", "horovodrun-mpi", "mpirun")


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Lazily launched runs, shared by the tests: runs(launcher, np, setting) -> parsed run dir."""
    cache = {}

    def get(launcher: str, np: int, setting: str):
        key = (launcher, np, setting)
        if key not in cache:
            run_dir = tmp_path_factory.mktemp(f"{launcher}-{np}-{setting}")
            result = launch(launcher, np, COMMON + SETTINGS[setting] + ["--run-dir", str(run_dir)]).check()
            cache[key] = (read_run(run_dir), result, run_dir)
        return cache[key]

    return get


@pytest.mark.parametrize("setting", ["mlp-sgd", "convnet-adam"])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_launcher_writes_complete_run_dir(runs, launcher, setting):
    np = 1 if launcher.startswith("none") else 2
    run, result, run_dir = runs(launcher, np, setting)
    summary, config = run["summary"], run["config"]

    for key in ("backend", "world_size", "steps", "samples_per_s", "wall_s", "val_loss", "val_top1",
                "val_top5", "time_split", "weights_sha256"):
        assert summary[key] is not None, key
    assert summary["backend"] == backend_of(launcher)
    assert summary["world_size"] == np == config["world_size"]
    assert summary["steps"] == 30
    assert set(summary["time_split"]) >= {"data_ms", "compute_ms", "comm_ms", "step_ms"}
    # Like samples_per_s, the run's time split leaves out the first (warm-up) step.
    assert summary["time_split"]["steps"] == 29
    assert 0 <= summary["val_top1"] <= summary["val_top5"] <= 1

    assert config["config"]["model"] == setting.split("-")[0]
    assert config["hosts"] and len(config["rank_hosts"]) == np
    assert {"python", "torch", "torchvision", "horovod", "project_git"} <= set(config["versions"])
    expected_launcher = {"none-ddp": "none", "none-hvd": "none", "horovodrun-gloo": "horovodrun",
                         "horovodrun-mpi": "mpirun"}.get(launcher, launcher)
    assert config["launcher"] == expected_launcher
    if launcher.startswith("horovodrun"):
        assert config["backend"]["controller"] == launcher.split("-")[1]

    kinds = {e["event"] for e in run["events"]}
    assert kinds == {"step", "epoch", "eval", "checkpoint", "summary"}
    assert len(step_losses(run)) == 30

    # model.pt is a plain state_dict (no DDP "module." prefix) that matches the summary's checksum.
    assert not any(k.startswith("module.") for k in run["model"])
    from common.rundir import weights_sha256
    assert weights_sha256(run["model"]) == summary["weights_sha256"]
    assert (run_dir / "model.pt.sha256").read_text().split()[0] == hashlib.sha256(
        (run_dir / "model.pt").read_bytes()).hexdigest()

    # One banner per rank: backend, rank/size, host, device, threads.
    for rank in range(np):
        assert f"rank {rank}/{np} local_rank" in result.output
    assert "threads 1" in result.output


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_world_size_2_bitwise_identical_across_backends(runs, setting):
    reference, _, _ = runs("torchrun", 2, setting)
    for launcher in TWO_RANK[1:]:
        other, _, _ = runs(launcher, 2, setting)
        assert step_losses(other) == step_losses(reference), f"{launcher} per-step losses differ from torchrun"
        assert other["summary"]["weights_sha256"] == reference["summary"]["weights_sha256"], launcher
        assert max_abs_diff(other["model"], reference["model"]) == 0.0
        assert other["summary"]["val_top1"] == reference["summary"]["val_top1"]


def test_single_process_backends_identical(runs):
    ddp, _, _ = runs("none-ddp", 1, "convnet-adam")
    hvd, _, _ = runs("none-hvd", 1, "convnet-adam")
    assert ddp["summary"]["weights_sha256"] == hvd["summary"]["weights_sha256"]


def test_world_size_4_within_1e_6(tmp_path):
    args = COMMON + SETTINGS["convnet-sgd"] + ["--max-steps", "12"]
    models = {}
    for launcher in ("torchrun", "horovodrun-gloo", "mpirun"):
        run_dir = tmp_path / launcher
        launch(launcher, 4, args + ["--run-dir", str(run_dir)]).check()
        run = read_run(run_dir)
        assert run["summary"]["world_size"] == 4
        models[launcher] = run["model"]
    for launcher in ("horovodrun-gloo", "mpirun"):
        assert max_abs_diff(models["torchrun"], models[launcher]) <= 1e-6


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun-gloo"])
def test_convnet_reaches_95_percent_with_defaults(tmp_path, launcher):
    result = launch(launcher, 2, ["--run-dir", str(tmp_path)]).check()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["model"] == "convnet" and summary["dataset"] == "digits"
    assert summary["val_top1"] >= 0.95, result.output[-2000:]
