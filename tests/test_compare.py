"""The comparison layer: launches the matrix, reads run directories, reports with plots and verdicts.
What the report says is checked against what the run directories hold, computed here."""

from __future__ import annotations

import json
import os
import re
import statistics
import stat

import pytest
from PIL import Image

from launched import assert_summary_leads, compare, compare_in_process, max_abs_diff, read_run, share_apart
from settings import ADAM_LR, convnet_run, mlp_run
from common.compare.floor import DEFAULT_FLOOR_RUNS
from common.rundir.names import SUMMARY_FILE

PLOTS = ("curves.png", "throughput.png", "scaling_efficiency.png", "time_split.png", "parity.png")
SHORT = ["--model", "mlp", "--epochs", "2", "--max-steps", "12", "--threads", "1"]


def assert_real_image(path):
    with Image.open(path) as img:
        assert img.width > 200 and img.height > 200, path
        extrema = img.convert("L").getextrema()
        assert extrema[0] < extrema[1], f"{path} is one flat colour"


@pytest.fixture(scope="module")
def default_matrix(demo):
    """make demo's comparison: world sizes 1 to 3, the default training."""
    out, output, _ = demo
    return out, output


@pytest.mark.timeout(900)  # its setup can be make demo's comparison, minutes while another worker runs too
def test_default_matrix_runs_world_sizes_1_to_3_and_explains(default_matrix):
    out, output = default_matrix
    # The noise floor costs its disturbed runs at 3 ranks only: at 1 and 2 the backends are bitwise identical.
    floor = [f"ddp+perturbed{k}@3#1" for k in range(1, DEFAULT_FLOOR_RUNS + 1)]
    expected = ["ddp@1#1", "horovod-gloo@1#1", "ddp@2#1", "horovod-gloo@2#1", "ddp@3#1", "horovod-gloo@3#1",
                "horovod-mpi@3#1", "horovod-gloo+predivide@3#1", *floor]
    # One line per run started and finished, epoch progress with an ETA.
    assert output.count("starting ") == len(expected) and output.count("finished ") == len(expected)
    assert "ETA" in output and "epoch 1 step" in output
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert sorted(r["name"] for r in summary["runs"]) == sorted(expected)
    assert list(summary["noise_floors"]) == ["3"]
    for run in summary["runs"]:
        assert os.path.isfile(os.path.join(run["path"], "launch.log"))
        assert run["command"] and run["versions"]["torch"] and run["hosts"]
    report = (out / "report.md").read_text()
    for name in PLOTS:
        assert_real_image(out / name)
        assert f"]({name})" in report


def _runs_by_name(summary):
    return {r["name"]: read_run(r["path"]) for r in summary["runs"]}


@pytest.mark.timeout(900)  # as above
def test_report_verdicts_match_the_run_directories(default_matrix):
    out, _ = default_matrix
    summary = json.loads((out / SUMMARY_FILE).read_text())
    report = (out / "report.md").read_text()
    assert_summary_leads(out)
    runs = _runs_by_name(summary)
    for world in (1, 2):  # bitwise at 1 and 2 ranks, as the weights themselves say
        a, b = runs[f"ddp@{world}#1"], runs[f"horovod-gloo@{world}#1"]
        assert max_abs_diff(a["model"], b["model"]) == 0.0
        assert f"world size {world}**, ddp@{world}#1 vs horovod-gloo@{world}#1: **bitwise identical**" in report
    gap = max_abs_diff(runs["ddp@3#1"]["model"], runs["horovod-gloo@3#1"]["model"])
    assert gap > 0
    line = next(line for line in report.splitlines() if "ddp@3#1 vs horovod-gloo@3#1" in line and "**Weights" in line)
    (pair,) = [p for p in summary["parity"] if (p["a"], p["b"]) == ("ddp@3#1", "horovod-gloo@3#1")]
    assert pair["max_abs_weight_diff"] == pytest.approx(gap) and f"**{pair['verdict']}**" in line, line
    if pair["verdict"].startswith(("equal within", "differs")):  # the verdicts that state the largest |Δw|
        assert f"{gap:.1e}" in line or f"{gap:.3g}" in line, line
    # The measured explanation: the gap with Horovod dividing before the sum, as DDP does.
    closer = max_abs_diff(runs["ddp@3#1"]["model"], runs["horovod-gloo+predivide@3#1"]["model"])
    why = report.splitlines()[report.splitlines().index(line) + 1]
    assert why.startswith("  Why, measured:") and "horovod-gloo+predivide" in why
    assert ("gone (bitwise identical)" if closer == 0 else f"the gap is {closer:.1e}") in why
    # Throughput: the median of each cell, from each run's summary.json, with the host it ran on.
    host = runs["ddp@2#1"]["config"]["hosts"][0]
    assert "**On one host**" in report and "**Across hosts**" not in report
    for key in ("ddp@2", "horovod-gloo@2"):
        value = statistics.median([r["summary"]["samples_per_s"] for name, r in runs.items() if name.startswith(key)])
        assert f"| {key} | {host} | {value:.1f} |" in report
    for name, run in runs.items():
        assert f"| {name} | {run['summary']['steps']} |" in report


def test_failed_run_is_reported_and_the_rest_still_compared(tmp_path):
    # A host whose MPI is broken: horovodrun --mpi fails, torchrun and horovodrun --gloo do not.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    mpirun = fake_bin / "mpirun"
    mpirun.write_text("#!/bin/sh\necho 'mpirun: error: MPI is broken on this host' >&2\nexit 1\n")
    mpirun.chmod(mpirun.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "cmp"
    # One process per run: the largest world size also runs Horovod's MPI controller.
    result = compare("--out", out, "--repeats", "1", "--np", "1", *SHORT,
                     env={"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 1, result.output[-3000:]
    assert "FAILED horovod-mpi@1#1" in result.output
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert [f["name"] for f in summary["failures"]] == ["horovod-mpi@1#1"]
    assert "MPI is broken on this host" in summary["failures"][0]["error"]
    assert sorted(r["name"] for r in summary["runs"]) == ["ddp@1#1", "horovod-gloo@1#1"]
    report = (out / "report.md").read_text()
    assert "## Failed runs" in report and "horovod-mpi@1#1" in report


def test_runs_made_by_hand_with_torchrun_and_horovodrun(runs, tmp_path):
    ddp, hvd = mlp_run(runs, "torchrun"), mlp_run(runs, "horovodrun-gloo")
    result = compare_in_process("--runs", ddp.dir, hvd.dir, "--out", tmp_path)
    assert result.returncode == 0, result.output
    (pair,) = [p for p in json.loads((tmp_path / SUMMARY_FILE).read_text())["parity"] if p["kind"] == "backends"]
    assert ddp.run["summary"]["weights_sha256"] == hvd.run["summary"]["weights_sha256"]
    assert pair["verdict"] == "bitwise identical" and pair["first_differing_step"] is None
    assert "**bitwise identical**" in (tmp_path / "report.md").read_text()


def test_world_size_3_pair_is_equal_within_its_measured_gap(runs, tmp_path):
    """A real pair that differs in the last bits: DDP and Horovod at 3 ranks. How far Adam carries those bits
    in 30 steps changes from run to run (Horovod's fusion follows timing), so the tolerance is set above the
    gap this pair measured; the report must give that gap."""
    ddp, hvd = convnet_run(runs, "torchrun", np=3), convnet_run(runs, "horovodrun-gloo", np=3)
    gap = max_abs_diff(ddp.run["model"], hvd.run["model"])
    assert gap > 0
    # apart by rounding, not trained differently (test_parity says why this is the measure)
    assert share_apart(ddp.run["model"], hvd.run["model"], by=ADAM_LR / 10) < 1e-3
    result = compare_in_process("--runs", ddp.dir, hvd.dir, "--out", tmp_path,
                                "--tolerance", f"{max(1e-5, 2 * gap):.1e}")
    assert result.returncode == 0, result.output
    assert f"weights @3: ddp@3#1 vs horovod-gloo@3#1: equal within {gap:.1e}" in result.output
    assert re.search(rf"\*\*equal within {re.escape(f'{gap:.1e}')}\*\*", (tmp_path / "report.md").read_text())


def test_runs_of_different_models_are_refused(runs, tmp_path):
    result = compare_in_process("--runs", mlp_run(runs, "torchrun").dir, convnet_run(runs, "torchrun").dir, "--out",
                          tmp_path)
    assert result.returncode == 2
    assert "not comparable" in result.output and "model differs" in result.output
    assert not (tmp_path / "report.md").exists()


ALONE = ["--model", "mlp", "--epochs", "1", "--max-steps", "20", "--threads", "1"]


def test_runs_differing_only_in_seed_are_beyond_the_noise_floor_from_the_start(runs, tmp_path):
    seed1, seed2 = runs("none-ddp", 1, ALONE).dir, runs("none-ddp", 1, ALONE + ["--seed", "2"]).dir
    refused = compare_in_process("--runs", seed1, seed2, "--out", tmp_path)
    assert refused.returncode == 2 and "seed differs" in refused.output
    # The noise floor: the first run's settings disturbed, in two patterns (a pair beyond a floor is beyond a wider
    # one too; make demo's comparison uses the default number).
    disturbed = [runs("none-ddp", 1, ALONE + ["--perturb-ulp", "1", "--perturb-pattern", str(k)]).dir
                 for k in (1, 2)]
    result = compare_in_process("--runs", seed1, seed2, *disturbed, "--out", tmp_path, "--force")
    assert result.returncode == 0, result.output
    (pair, *_) = json.loads((tmp_path / SUMMARY_FILE).read_text())["parity"]
    assert (pair["a"], pair["b"], pair["kind"]) == ("ddp[seed=42]@1#1", "ddp[seed=2]@1#1", "settings")
    # They start from other weights: apart at step 0, before the first update.
    assert pair["first_differing_step"] == 1 and pair["trains_differently_from"] == 0
    assert pair["verdict"].startswith("beyond the noise floor: trains differently from the start"), pair["verdict"]
    assert pair["max_abs_weight_diff"] == pytest.approx(max_abs_diff(read_run(seed1)["model"],
                                                                     read_run(seed2)["model"]))


def test_divergence_is_found_at_the_step_it_starts(runs, tmp_path):
    # Same seed; the step schedule cuts the lr at 50% of the 20 steps (the 11th update), so rank 0's
    # loss and the weights first differ at step 12, the first forward pass after that update.
    plain, decay = runs("none-ddp", 1, ALONE), runs("none-hvd", 1, ALONE + ["--lr-schedule", "step"])
    losses_a = [e["loss"] for e in plain.run["events"] if e["event"] == "step"]
    losses_b = [e["loss"] for e in decay.run["events"] if e["event"] == "step"]
    assert next(i + 1 for i, (x, y) in enumerate(zip(losses_a, losses_b, strict=True)) if x != y) == 12
    result = compare_in_process("--runs", plain.dir, decay.dir, "--out", tmp_path, "--noise-floor", "off")
    assert result.returncode == 0, result.output
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    (pair,) = summary["parity"]
    assert pair["first_differing_step"] == 12 and "first differing step 12; the learning rate differs from step 11 " \
        "(0.05 vs 0.005); noise floor unknown" in pair["verdict"]
    assert "lr_schedule" in summary["setting_differences"]
    assert "`lr_schedule`" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("train_args, reduction", [
    ([], "allreduce"), (["--reduction", "allreduce"], "allreduce"), (["--reduction=exact"], "exact"),
    (["--epochs", "1", "--reduction", "exact"], "exact")])
def test_explaining_runs_are_left_out_only_for_exact_mode(train_args, reduction):
    from common.config import given_options, is_exact

    assert is_exact(given_options(train_args, "compare-backends")) == (reduction == "exact")


@pytest.mark.parametrize("driver", ["compare-backends", "benchmark"])
def test_sigterm_to_a_driver_stops_its_running_job_and_leaves_nothing(driver, tmp_path):
    """`kill` or a scheduler ending the driver (not its process group) stops the run it started, as Ctrl-C does."""
    import signal

    from launched import COMPARE, PY
    from processes import Job, assert_nothing_left, job_processes

    out = tmp_path / "out"
    long_run = ["--epochs", "100000", "--threads", "1"]
    if driver == "compare-backends":
        cmd = [*COMPARE, "--np", "1", "--backends", "ddp", "--repeats", "1", "--model", "mlp", *long_run,
               "--out", str(out)]
        name = "compare-backends"
    else:
        cmd = [PY, "-m", "benchmarks.throughput", "--np", "1", "--backends", "ddp", "--models", "resnet18",
               "--image-size", "32", "--batch-size", "2", "--steps", "5000", "--repeats", "1", "--baselines", "none",
               "--out", str(out), "--work", str(out / "runs"), "--", "--threads", "1"]
        name = "throughput"
    with Job(cmd) as job:
        job.wait_until(lambda: any("_train" in " ".join(p.cmdline()) for p in job_processes(str(out))),
                       "the driver never started its run", timeout=120)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == 143, job.output[-3000:]
    assert f"{name}: terminated; the running job was stopped" in job.output
    assert_nothing_left(str(out), within=20)


def test_a_floor_margin_that_is_not_positive_is_refused_in_one_line(tmp_path):
    for margin in ("0", "-3"):
        refused = compare_in_process("--floor-margin", margin, "--out", tmp_path)
        assert refused.returncode == 2 and f"--floor-margin: must be > 0, got {margin}" in refused.output
        assert len(refused.output.strip().splitlines()) == 1, refused.output
