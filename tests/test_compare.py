"""The comparison layer: launches the matrix, reads run directories, reports with plots and verdicts."""

from __future__ import annotations

import json
import os
import stat

import pytest
from PIL import Image

from launch import PY, launch, read_run, run_cmd

PLOTS = ("curves.png", "throughput.png", "scaling_efficiency.png", "time_split.png", "parity.png")
SHORT = ["--model", "mlp", "--epochs", "2", "--max-steps", "12", "--threads", "1"]


def compare(*args, timeout=600, env=None):
    return run_cmd([PY, "-m", "common.compare", *map(str, args)], timeout=timeout, env=env)


def assert_real_image(path):
    with Image.open(path) as img:
        assert img.width > 200 and img.height > 200, path
        extrema = img.convert("L").getextrema()
        assert extrema[0] < extrema[1], f"{path} is one flat colour"


def test_default_matrix_makes_report_plots_and_summary(tmp_path):
    out = tmp_path / "cmp"
    result = compare("--out", out, "--repeats", "1", *SHORT)
    assert result.returncode == 0, result.output[-3000:]
    # One line per run started and finished, epoch progress with an ETA.
    assert result.output.count("starting ") == 5 and result.output.count("finished ") == 5
    assert "ETA" in result.output and "epoch 1 step" in result.output

    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    for name in PLOTS:
        assert_real_image(out / name)
        assert f"]({name})" in report
    labels = sorted(r["name"] for r in summary["runs"])
    assert labels == sorted(["ddp@1#1", "horovod-gloo@1#1", "ddp@2#1", "horovod-gloo@2#1", "horovod-mpi@2#1"])
    for run in summary["runs"]:
        assert (out / "runs").exists() and os.path.isfile(os.path.join(run["path"], "launch.log"))
        assert run["command"] and run["versions"]["torch"] and run["hosts"]

    # The report prints the numbers summary.json holds.
    for key, value in summary["throughput"].items():
        assert f"| {key} | {value['median']:.1f} |" in report
    pairs = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert {p["world_size"] for p in pairs} == {1, 2}
    for p in pairs:
        assert p["verdict"] == "bitwise identical"
        assert f"{p['a']} vs {p['b']}: **{p['verdict']}**" in report
    for v in summary["speed"]:
        assert v["verdict"] in report
    for label, points in summary["scaling_efficiency"].items():
        # horovod-mpi has no single-process run: it is measured against horovod-gloo@1.
        assert points.get("1", 1.0) == pytest.approx(1.0)
        assert f"{points['2']:.2f} at 2" in report
    for row in summary["accuracy"]:
        assert f"| {row['run']} | {row['steps']} |" in report


def test_failed_run_is_reported_and_the_rest_still_compared(tmp_path):
    # A host whose MPI is broken: horovodrun --mpi fails, torchrun and horovodrun --gloo do not.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    mpirun = fake_bin / "mpirun"
    mpirun.write_text("#!/bin/sh\necho 'mpirun: error: MPI is broken on this host' >&2\nexit 1\n")
    mpirun.chmod(mpirun.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "cmp"
    result = compare("--out", out, "--repeats", "1", "--np", "2", *SHORT,
                     env={"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 1, result.output[-3000:]
    assert "FAILED horovod-mpi@2#1" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [f["name"] for f in summary["failures"]] == ["horovod-mpi@2#1"]
    assert summary["failures"][0]["error"]
    assert sorted(r["name"] for r in summary["runs"]) == ["ddp@2#1", "horovod-gloo@2#1"]
    report = (out / "report.md").read_text()
    assert "## Failed runs" in report and "horovod-mpi@2#1" in report


@pytest.fixture(scope="module")
def hand_runs(tmp_path_factory):
    """Run directories written by torchrun and horovodrun launched by hand, as on a cluster."""
    root = tmp_path_factory.mktemp("hand")
    specs = {
        "torchrun": ("torchrun", 2, []),
        "horovodrun": ("horovodrun-gloo", 2, []),
        "seed2": ("none-ddp", 1, ["--seed", "2"]),
        "seed1": ("none-ddp", 1, []),
        "stepdecay": ("none-hvd", 1, ["--lr-schedule", "step"]),
        "convnet": ("torchrun", 2, ["--model", "convnet"]),
    }
    base = ["--model", "mlp", "--epochs", "1", "--max-steps", "20", "--threads", "1"]
    for name, (launcher, np, extra) in specs.items():
        launch(launcher, np, base + extra + ["--run-dir", str(root / name)]).check()
    return root


def test_runs_from_hand_launched_torchrun_and_horovodrun(hand_runs, tmp_path):
    result = compare("--runs", hand_runs / "torchrun", hand_runs / "horovodrun", "--out", tmp_path)
    assert result.returncode == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    (pair,) = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert pair["verdict"] == "bitwise identical" and pair["first_differing_step"] is None
    assert "bitwise identical" in (tmp_path / "report.md").read_text()


def test_runs_of_different_models_are_refused(hand_runs, tmp_path):
    result = compare("--runs", hand_runs / "torchrun", hand_runs / "convnet", "--out", tmp_path)
    assert result.returncode == 2
    assert "not comparable" in result.output and "model differs" in result.output
    assert not (tmp_path / "report.md").exists()


def test_runs_differing_only_in_seed_are_diverged_from_the_first_step(hand_runs, tmp_path):
    refused = compare("--runs", hand_runs / "seed1", hand_runs / "seed2", "--out", tmp_path)
    assert refused.returncode == 2 and "seed differs" in refused.output
    result = compare("--runs", hand_runs / "seed1", hand_runs / "seed2", "--out", tmp_path, "--force")
    assert result.returncode == 0, result.output
    (pair,) = json.loads((tmp_path / "summary.json").read_text())["parity"]
    assert pair["verdict"].startswith("diverged: first differing step 1,")
    assert pair["max_abs_weight_diff"] > 1e-3


def test_divergence_is_found_at_the_step_it_starts(hand_runs, tmp_path):
    # Same seed; the step schedule cuts the lr at 50% of the 20 steps (the 11th update), so rank 0's
    # loss first differs at step 12, the first forward pass after that update.
    a, b = read_run(hand_runs / "seed1"), read_run(hand_runs / "stepdecay")
    losses_a = [e["loss"] for e in a["events"] if e["event"] == "step"]
    losses_b = [e["loss"] for e in b["events"] if e["event"] == "step"]
    expected = next(i + 1 for i, (x, y) in enumerate(zip(losses_a, losses_b)) if x != y)
    assert expected == 12
    result = compare("--runs", hand_runs / "seed1", hand_runs / "stepdecay", "--out", tmp_path)
    assert result.returncode == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    (pair,) = summary["parity"]
    assert pair["first_differing_step"] == 12 and pair["verdict"].startswith("diverged: first differing step 12")
    assert "lr_schedule" in summary["setting_differences"]
    assert "`lr_schedule`" in (tmp_path / "report.md").read_text()
