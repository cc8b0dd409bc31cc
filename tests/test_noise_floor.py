"""Verdicts against the noise floor: a gap that rounding alone explains is called so, a real difference is
called beyond it, and every number the verdict gives is what the run directories hold, computed here."""

from __future__ import annotations

import json

import pytest
import torch

from launch import read_run
from test_compare import assert_real_image, compare

#: the setting where Adam amplifies rounding (ResNet-18 with BatchNorm, small batches), shortened
RESNET_ADAM = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32", "--optimizer", "adam",
               "--lr", "0.001", "--weight-decay", "0.01", "--max-steps", "8", "--batch-size", "8", "--threads", "1"]
#: a short SGD run at 3 ranks, where rounding stays at the level of rounding
MLP = ["--model", "mlp", "--dataset", "digits", "--batch-size", "32", "--epochs", "1", "--max-steps", "20",
       "--threads", "1"]


def parameter_gap(a: dict, b: dict, buffers: set) -> float:
    """The largest per-tensor ‖Δ‖/‖w‖ over the parameters of two state dicts."""
    worst = 0.0
    for name, tensor in a.items():
        if name in buffers or not tensor.is_floating_point():
            continue
        x, y = tensor.double(), b[name].double()
        worst = max(worst, float((x - y).norm()) / max(float(x.norm()), float(y.norm())))
    return worst


@pytest.fixture(scope="module")
def resnet_adam(tmp_path_factory):
    out = tmp_path_factory.mktemp("floor")
    result = compare("--out", out, "--np", "3", "--backends", "ddp,horovod", "--hvd-controllers", "gloo",
                     "--repeats", "1", "--explain", "none", *RESNET_ADAM, timeout=900)
    assert result.returncode == 0, result.output[-3000:]
    return out, result.output, json.loads((out / "summary.json").read_text())


def test_rounding_amplified_by_adam_is_within_the_noise_floor(resnet_adam):
    out, output, summary = resnet_adam
    runs = {r["name"]: r for r in summary["runs"]}
    assert sorted(runs) == ["ddp+perturbed@3#1", "ddp@3#1", "horovod-gloo@3#1"]  # one extra run
    disturbed = read_run(runs["ddp+perturbed@3#1"]["path"])
    assert disturbed["config"]["config"]["perturb_ulp"] == 1
    ddp, hvd = read_run(runs["ddp@3#1"]["path"]), read_run(runs["horovod-gloo@3#1"]["path"])
    buffers = set(ddp["config"]["buffers"])
    assert any(name.endswith("running_var") for name in buffers)
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    floor = summary["noise_floors"]["3"]
    gap = parameter_gap(ddp["model"], hvd["model"], buffers)
    rounding = parameter_gap(ddp["model"], disturbed["model"], buffers)
    assert pair["gap"] == pytest.approx(gap) and floor["gap"] == pytest.approx(rounding)
    assert pair["noise_floor"] == pytest.approx(rounding) and pair["floor_ratio"] == pytest.approx(gap / rounding)
    assert pair["within_noise_floor"] is True
    verdict = f"within the noise floor: parameters differ by {gap:.2g}"
    assert pair["verdict"].startswith(verdict) and f"a disturbance of one ulp gives {rounding:.2g}" in pair["verdict"]
    assert f"weights @3: ddp@3#1 vs horovod-gloo@3#1: {verdict}" in output
    # Parameters and buffers apart, the tensors that dominate named, from the weights themselves.
    largest = pair["gaps"]["parameters"]["largest"][0]["tensor"]
    assert largest not in buffers and largest in pair["verdict"]
    assert {t["tensor"] for t in pair["gaps"]["buffers"]["largest"]} <= buffers
    worst_buffer = max(float((ddp["model"][k].double() - hvd["model"][k].double()).abs().max())
                       for k in buffers if ddp["model"][k].is_floating_point())
    assert pair["gaps"]["buffers"]["max_abs"] == pytest.approx(worst_buffer)
    # The largest loss gap relative to the loss, over the steps (not the gap at the largest absolute gap).
    losses = {name: {e["step"]: e["loss"] for e in run["events"] if e["event"] == "step"}
              for name, run in (("ddp", ddp), ("hvd", hvd))}
    assert losses["ddp"].keys() == losses["hvd"].keys()
    relative = [abs(a - losses["hvd"][step]) / max(abs(a), abs(losses["hvd"][step]))
                for step, a in losses["ddp"].items()]
    assert pair["max_rel_loss_diff"] == pytest.approx(max(relative))
    assert floor["max_rel_loss_diff"] > 0
    report = (out / "report.md").read_text()
    assert f"**{pair['verdict']}**" in report and "### Noise floor" in report
    assert f"World size 3: ddp@3#1 vs ddp+perturbed@3#1 (initial weights moved by 1 ulp)" in report
    for name in ("parity.png", "curves.png"):
        assert_real_image(out / name)


@pytest.fixture(scope="module")
def mlp_base(runs):
    """DDP at 3 ranks, the base both real differences are measured from."""
    return runs("torchrun", 3, MLP)


@pytest.fixture(scope="module")
def floor_by_rerun(runs, mlp_base, tmp_path_factory):
    """A comparison of DDP with Horovod at a learning rate 10% higher, given no disturbed run: it makes one.
    (the comparison's output folder, what it printed, the faster run)"""
    faster = runs("horovodrun-gloo", 3, MLP + ["--lr", "0.055"])
    out = tmp_path_factory.mktemp("forced")
    result = compare("--runs", mlp_base.dir, faster.dir, "--out", out, "--force")
    assert result.returncode == 0, result.output[-3000:]
    return out, result.output, faster


def test_a_learning_rate_10_percent_higher_is_beyond_the_floor_made_by_a_rerun(mlp_base, floor_by_rerun):
    out, output, faster = floor_by_rerun
    # No disturbed run among --runs: one is made here from ddp@3#1's recorded settings.
    assert "rerunning ddp@3#1's settings here with --perturb-ulp 1" in output
    made = read_run(out / "runs" / "ddp+perturbed-np3-r1")
    assert made["config"]["config"]["perturb_ulp"] == 1 and made["config"]["config"]["lr"] == 0.05
    summary = json.loads((out / "summary.json").read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    base = read_run(mlp_base.dir)
    gap = parameter_gap(base["model"], faster.run["model"], set())
    rounding = parameter_gap(base["model"], made["model"], set())
    assert pair["within_noise_floor"] is False and pair["floor_ratio"] > summary["floor_margin"]
    assert pair["verdict"].startswith(f"beyond the noise floor: parameters differ by {gap:.2g}")
    assert f"rounding alone gives {rounding:.2g}" in pair["verdict"]


def test_fp16_compression_on_one_side_is_beyond_the_floor_of_a_given_disturbed_run(runs, mlp_base, floor_by_rerun,
                                                                                  tmp_path):
    compressed = runs("horovodrun-gloo", 3, MLP + ["--compression", "fp16"])
    disturbed = floor_by_rerun[0] / "runs" / "ddp+perturbed-np3-r1"  # the one the comparison above made
    result = compare("--runs", mlp_base.dir, compressed.dir, disturbed, "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    assert "rerunning" not in result.output and not (tmp_path / "runs").exists()  # the floor was given
    summary = json.loads((tmp_path / "summary.json").read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert (pair["a"], pair["b"]) == ("ddp@3#1", "horovod-gloo@3#1")
    assert summary["noise_floors"]["3"]["disturbed"] == "ddp+perturbed@3#1"
    assert pair["within_noise_floor"] is False, pair["verdict"]
    assert pair["verdict"].startswith("beyond the noise floor")
    assert "compression" in summary["setting_differences"]


def test_a_floor_that_is_off_is_said_to_be_unknown(runs, mlp_base, tmp_path):
    faster = runs("horovodrun-gloo", 3, MLP + ["--lr", "0.055"])
    result = compare("--runs", mlp_base.dir, faster.dir, "--out", tmp_path, "--noise-floor", "off")
    assert result.returncode == 0, result.output[-3000:]
    (pair,) = [p for p in json.loads((tmp_path / "summary.json").read_text())["parity"] if p["kind"] == "backends"]
    assert pair["verdict"].startswith("differs: parameters by ")
    assert pair["verdict"].endswith("noise floor unknown (--noise-floor off)")
    assert pair["noise_floor"] is None and not (tmp_path / "runs").exists()


def test_perturb_ulp_moves_every_nonzero_initial_weight_one_ulp(tmp_path):
    from common.disturb import perturb_ulp

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    perturb_ulp(model, 1)
    for name, param in model.named_parameters():
        was = before[name]
        moved = param.detach()
        nonzero = was != 0
        assert torch.equal(moved[~nonzero], was[~nonzero])  # zeros stay
        assert torch.equal(moved[nonzero], torch.nextafter(was, was * 2)[nonzero])  # one ulp away from zero
    assert torch.equal(model[1].running_var, before["1.running_var"])  # buffers untouched
