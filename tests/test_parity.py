"""Every launcher trains and writes a complete run directory; DDP and Horovod train identically at
world size 2, and at 3 differ only by the order of the sum."""

from __future__ import annotations

import hashlib

import pytest

from launched import backend_of, max_abs_diff, read_run, share_apart, step_losses
from settings import ADAM_LR, LAUNCHERS, TWO_RANK, convnet_run, mlp_run, processes
from common.rundir.names import MODEL_FILE


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_launcher_writes_complete_run_dir(runs, launcher):
    np = processes(launcher)
    launched = mlp_run(runs, launcher)
    run, run_dir = launched.run, launched.dir
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

    assert config["config"]["model"] == "mlp" and config["reduction"] == "allreduce"
    assert config["hosts"] and len(config["rank_hosts"]) == np
    assert {"python", "torch", "torchvision", "horovod", "project_git"} <= set(config["versions"])
    expected_launcher = {"none-ddp": "none", "none-hvd": "none", "horovodrun-gloo": "horovodrun",
                         "horovodrun-mpi": "mpirun"}.get(launcher, launcher)
    assert config["launcher"] == expected_launcher
    if launcher.startswith("horovodrun"):
        assert config["backend"]["controller"] == launcher.split("-")[1]

    kinds = {e["event"] for e in run["events"]}
    assert kinds == {"start", "step", "epoch", "eval", "checkpoint", "summary"}
    # The weights' fingerprint: the initial weights' at start, every logged step's after its update.
    start = next(e for e in run["events"] if e["event"] == "start")
    names = config["parameters"]
    assert names and set(names) <= set(run["model"])
    assert start["step"] == 0 and len(start["wnorm"]) == len(names)
    assert all(len(e["wnorm"]) == len(names) for e in run["events"] if e["event"] == "step")
    assert len(step_losses(run)) == 30

    # model.pt is a plain state_dict (no DDP "module." prefix) that matches the summary's checksum.
    assert not any(k.startswith("module.") for k in run["model"])
    from common.rundir.writer import weights_sha256
    assert weights_sha256(run["model"]) == summary["weights_sha256"]
    assert (run_dir / "model.pt.sha256").read_text().split()[0] == hashlib.sha256(
        (run_dir / MODEL_FILE).read_bytes()).hexdigest()

    # One banner per rank: backend, rank/size, host, device, threads.
    for rank in range(np):
        assert f"rank {rank}/{np} local_rank" in launched.result.output
    assert "threads 1" in launched.result.output


def test_world_size_2_bitwise_identical_across_backends(runs):
    """At 2 ranks any two correct implementations agree (a + b = b + a, halving is exact): this proves
    the same weights, samples, order and schedule reach both backends, not how they sum. Every launcher on the
    shared mlp / SGD runs; convnet under Adam with every knob is test_knobs' pair."""
    reference = mlp_run(runs, "torchrun").run
    for launcher in TWO_RANK[1:]:
        other = mlp_run(runs, launcher).run
        assert step_losses(other) == step_losses(reference), f"{launcher} per-step losses differ from torchrun"
        assert other["summary"]["weights_sha256"] == reference["summary"]["weights_sha256"], launcher
        assert max_abs_diff(other["model"], reference["model"]) == 0.0
        assert other["summary"]["val_top1"] == reference["summary"]["val_top1"]


def test_single_process_backends_identical(runs):
    assert mlp_run(runs, "none-ddp").run["summary"]["weights_sha256"] == \
        mlp_run(runs, "none-hvd").run["summary"]["weights_sha256"]


def test_world_size_3_differs_only_by_the_order_of_the_sum(runs):
    """At 3 ranks DDP divides each gradient by 3 before the allreduce and Horovod after it, and they
    group the sum differently: the weights differ by rounding, not by training. Adam carries a last-bit
    difference further than SGD: where a gradient is near zero, rounding can flip the sign of a whole Adam step
    (about lr), so a few weights may end apart by that much (how many changes from run to run: Horovod's fusion
    follows timing). Training differently moves most weights by more than a tenth of a step; rounding, fewer
    than one in a thousand."""
    ddp, hvd = convnet_run(runs, "torchrun", np=3).run, convnet_run(runs, "horovodrun-gloo", np=3).run
    assert ddp["summary"]["world_size"] == hvd["summary"]["world_size"] == 3
    assert ddp["summary"]["weights_sha256"] != hvd["summary"]["weights_sha256"]
    assert max_abs_diff(ddp["model"], hvd["model"]) > 0
    assert share_apart(ddp["model"], hvd["model"], by=ADAM_LR / 10) < 1e-3
    assert step_losses(hvd) == pytest.approx(step_losses(ddp), rel=1e-4)
    # Where each divides by the world size, from what each built: the hook DDP registered and DDP's own
    # record of it, the op and predivide factor of Horovod's DistributedOptimizer.
    built = ddp["config"]["backend"]["ddp_built"]
    assert built["hook_averages_with"] == "allreduce_hook"
    assert ddp["config"]["backend"]["divide_by_world_size"] == "before_sum"
    assert built["comm_hook"].endswith("timed_allreduce")  # DDP runs the backend's timing wrapper of that hook
    hvd_backend = hvd["config"]["backend"]
    assert hvd_backend["allreduce_op"] == "Average" and hvd_backend["gradient_predivide_factor"] == 1.0
    assert hvd_backend["divide_by_world_size"] == "after_sum"


@pytest.mark.timeout(900)  # it can be the test that makes the comparison
def test_convnet_reaches_95_percent_with_defaults(demo):
    """make demo's DDP run at 2 ranks (conftest.demo): torchrun and the default training."""
    _, output, summary = demo
    (run,) = [r for r in summary["runs"] if r["name"] == "ddp@2#1"]
    assert " --nproc-per-node=2 -m ddp_train --threads 1 --run-dir " in run["command"]  # no other option
    result = read_run(run["path"])["summary"]
    assert result["model"] == "convnet" and result["dataset"] == "digits"
    assert result["val_top1"] >= 0.95, output[-2000:]
