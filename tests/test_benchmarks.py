"""Smoke runs of the benchmark scripts at their tiniest sizes, through the real launchers.

They assert on the structure of the JSON the scripts wrote and that every number is a positive
measurement, never on speed (speed is what the scripts report, on a quiet machine)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from PIL import Image

from launch import BIN, PY, run_cmd

AR_SIZES = [4, 16, 64, 256, 1024, 4096]
TINY_TRAIN = ["--models", "convnet", "--image-size", "8", "--batch-size", "4", "--steps", "3", "--repeats", "1"]


def bench(script, *args, timeout=600):
    return run_cmd([PY, "-m", f"benchmarks.{script}", *map(str, args)], timeout=timeout)


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def assert_real_image(path):
    with Image.open(path) as img:
        assert img.width > 300 and img.height > 200, path
        lo, hi = img.convert("L").getextrema()
        assert lo < hi, f"{path} is one flat colour"


def assert_machine(data):
    m = data["machine"]
    assert m["cpu_model"] and m["cores"] >= 1 and m["versions"]["torch"] and m["versions"]["horovod"]
    assert set(data["load_before"]) == {"1m", "5m", "15m"} and isinstance(data["under_load"], bool)
    assert data["command"].startswith("python -m benchmarks.")


@pytest.fixture(scope="module")
def allreduce_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("allreduce")
    result = bench("allreduce", "--np", "2", "--min-bytes", "4", "--max-bytes", "4K", "--iters", "2",
                   "--warmup", "1", "--copy-bytes", "1M", "--out", out)
    assert result.returncode == 0, result.output[-4000:]
    return out, result.output


@pytest.fixture(scope="module")
def throughput_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    result = bench("throughput", "--np", "1,2", "--backends", "ddp,horovod-gloo", *TINY_TRAIN,
                   "--out", out, "--work", out / "runs")
    assert result.returncode == 0, result.output[-4000:]
    return out, result.output


def test_allreduce_measures_every_backend_at_every_size(allreduce_out):
    out, output = allreduce_out
    data = json.loads((out / "allreduce.json").read_text())
    assert data["benchmark"] == "allreduce" and data["failures"] == []
    assert_machine(data)
    assert positive(data["memcpy"]["cpu_1thread_GBps"]) and positive(data["memcpy"]["limit_GBps"])
    # One series per backend, each launched through its real launcher.
    assert sorted((s["name"], s["launcher"], s["world_size"]) for s in data["series"]) == [
        ("horovod-gloo", "horovodrun-gloo", 2), ("horovod-mpi", "horovodrun-mpi", 2), ("mpi", "mpirun", 2),
        ("torch-gloo", "torchrun", 2)]
    # Horovod's ranks get Open MPI's waiting as hvd_train sets it; Open MPI alone keeps its default.
    yield_setting = {s["name"]: s["mpi_yield_when_idle"] for s in data["series"]}
    assert (yield_setting["horovod-mpi"], yield_setting["mpi"]) == ("1", None)
    for s in data["series"]:
        assert [r["bytes"] for r in s["results"]] == AR_SIZES
        for r in s["results"]:
            assert r["iterations"] == 2
            assert all(positive(r[k]) for k in ("time_s", "algbw_GBps", "busbw_GBps", "busbw_of_limit"))
            # nccl-tests' definitions, at world size 2: busbw = algbw x 2(n-1)/n = algbw.
            assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
            assert r["busbw_of_limit"] == pytest.approx(r["busbw_GBps"] / data["memcpy"]["limit_GBps"])
    assert_real_image(out / data["plot"])
    # The printed table has one row per size.
    assert "torch-gloox2 busbw" in output and output.count("\n4K ") + output.count(" 4K ") >= 1


def test_throughput_reports_scaling_overhead_and_loop_ratio(throughput_out):
    out, output = throughput_out
    data = json.loads((out / "throughput.json").read_text())
    assert data["benchmark"] == "throughput" and data["failures"] == []
    assert_machine(data)
    (case,) = data["cases"]
    assert case["model"] == "convnet" and case["image_size"] == 8
    expected = {"ddp@1", "ddp@2", "horovod-gloo@1", "horovod-gloo@2", "bare-ddp@1", "bare-ddp@2", "independent@2"}
    assert set(case["throughput"]) == expected
    for cell in case["throughput"].values():
        assert cell["n"] == 1 and all(positive(cell[k]) for k in ("median", "min", "max", "job_cpu_s"))
    for label in ("ddp", "horovod-gloo", "bare-ddp"):
        assert case["scaling_efficiency"][label]["1"] == pytest.approx(1.0)
        assert positive(case["scaling_efficiency"][label]["2"])
        assert case["exchange_overhead"][label]["2"] < 1
    assert positive(case["loop_ratio"]["1"]) and positive(case["loop_ratio"]["2"])
    for run in case["runs"]:
        assert positive(run["samples_per_s"]) and run["command"]
        if run["label"] in ("ddp", "horovod-gloo"):
            assert run["steps"] == 3 and run["time_split"]["step_ms"] > 0
    # Each cell went through its real launcher; the independent runs are N plain processes.
    commands = {(r["label"], r["world_size"]): r["command"] for r in case["runs"]}
    assert "torchrun" in commands[("ddp", 2)] and "-m ddp_train" in commands[("ddp", 2)]
    assert "horovodrun" in commands[("horovod-gloo", 2)] and "--gloo" in commands[("horovod-gloo", 2)]
    assert "torchrun" in commands[("bare-ddp", 2)] and "benchmarks.bare_ddp" in commands[("bare-ddp", 2)]
    indep = next(r for r in case["runs"] if r["label"] == "independent")
    assert len(indep["run_dirs"]) == 2
    for run_dir in indep["run_dirs"]:
        assert json.loads((Path(run_dir) / "summary.json").read_text())["world_size"] == 1
    assert_real_image(out / data["plot"])
    assert "loop/bare" in output and "samples/s" in output


def test_throughput_sweep_sets_the_knob_in_every_run(tmp_path):
    # An environment knob (Horovod's cycle time) and a training option passed after --.
    result = bench("throughput", "--np", "2", "--backends", "horovod-gloo", "--baselines", "none", *TINY_TRAIN,
                   "--sweep", "HOROVOD_CYCLE_TIME=2,7", "--out", tmp_path, "--work", tmp_path / "runs",
                   "--", "--log-every", "2")
    assert result.returncode == 0, result.output[-4000:]
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert [(c["knob"], c["value"]) for c in data["cases"]] == [(None, None), ("HOROVOD_CYCLE_TIME", "2"),
                                                                 ("HOROVOD_CYCLE_TIME", "7")]
    assert data["settings"]["extra_train_args"] == ["--log-every", "2"]
    for case in data["cases"]:
        (run,) = case["runs"]
        config = json.loads((Path(run["run_dirs"][0]) / "config.json").read_text())
        assert config["config"]["log_every"] == 2
    cycle = [c["runs"][0]["backend_options"]["cycle_time_ms"] for c in data["cases"][1:]]
    assert cycle == [2.0, 7.0]


def test_throughput_refuses_an_unknown_knob_at_once(tmp_path):
    result = bench("throughput", "--np", "2", "--sweep", "no-such-knob=1,2", "--out", tmp_path, timeout=60)
    assert result.returncode == 2
    assert "the training options have no --no-such-knob" in result.output
    assert not (tmp_path / "throughput.json").exists()


def test_report_shows_the_benchmarks(allreduce_out, throughput_out, tmp_path):
    ar_dir, _ = allreduce_out
    tp_dir, _ = throughput_out
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    for name in ("allreduce.json", "allreduce.png", "throughput.json", "throughput.png"):
        shutil.copy((ar_dir if name.startswith("allreduce") else tp_dir) / name, bench_dir / name)
    runs = tp_dir / "runs" / "convnet"
    out = tmp_path / "report"
    result = run_cmd([PY, "-m", "common.compare", "--runs", runs / "ddp-2-r1", runs / "horovod-gloo-2-r1",
                      "--bench", bench_dir, "--out", out])
    assert result.returncode == 0, result.output[-3000:]
    report = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "## Benchmarks" in report and "### Allreduce bandwidth" in report and "### Training throughput" in report
    ar = json.loads((bench_dir / "allreduce.json").read_text())
    for s in ar["series"]:
        r = s["results"][-1]
        assert f"{r['busbw_GBps']:.2f} GB/s" in report
    tp = json.loads((bench_dir / "throughput.json").read_text())
    case = tp["cases"][0]
    assert f"| ddp | 2 | {case['throughput']['ddp@2']['median']:.1f}" in report
    assert f"{case['loop_ratio']['2']:.3f}" in report
    assert summary["benchmarks"]["throughput"]["cases"][0]["loop_ratio"] == case["loop_ratio"]
    for name in ("bench_allreduce.png", "bench_throughput.png", "throughput.png"):
        assert f"]({name})" in report
        assert_real_image(out / name)
    # The benchmark's figure did not replace the report's own throughput plot.
    assert (out / "bench_throughput.png").read_bytes() == (bench_dir / "throughput.png").read_bytes()
    assert (out / "throughput.png").read_bytes() != (bench_dir / "throughput.png").read_bytes()

    # Without --bench, results already in the output folder are picked up.
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(bench_dir / "throughput.json", again / "throughput.json")
    shutil.copy(bench_dir / "throughput.png", again / "throughput.png")
    result = run_cmd([PY, "-m", "common.compare", "--runs", runs / "ddp-2-r1", runs / "horovod-gloo-2-r1",
                      "--out", again])
    assert result.returncode == 0, result.output[-3000:]
    text = (again / "report.md").read_text()
    assert "### Training throughput" in text and "### Allreduce bandwidth" not in text

    # A --bench folder with no results is a clear error.
    empty = run_cmd([PY, "-m", "common.compare", "--runs", runs / "ddp-2-r1", "--bench", tmp_path / "report",
                     "--out", tmp_path / "x"])
    assert empty.returncode == 2 and "no allreduce.json or throughput.json" in empty.output


def test_loop_overhead_times_each_piece_of_bookkeeping(allreduce_out, tmp_path):
    ar_dir, _ = allreduce_out
    shutil.copy(ar_dir / "allreduce.json", tmp_path / "allreduce.json")
    result = bench("loop_overhead", "--models", "convnet", "--image-size", "8", "--batch-size", "4",
                   "--repeats", "5", "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    data = json.loads((tmp_path / "loop_overhead.json").read_text())
    assert_machine(data)
    (row,) = data["rows"]
    assert row["model"] == "convnet" and positive(row["step_s"])
    # The stop check's cost comes from the allreduce benchmark's smallest torch message.
    torch_small = next(s for s in json.loads((ar_dir / "allreduce.json").read_text())["series"]
                       if s["name"] == "torch-gloo")["results"][0]["time_s"]
    assert row["costs_s"]["stop check (allreduce / 5)"] == pytest.approx(torch_small / 5)
    assert set(row["costs_s"]) >= {"train meters", "loss.item()", "metrics.jsonl step line", "lr schedule"}
    assert all(positive(v) for v in row["costs_s"].values())
    assert row["total_s"] == pytest.approx(sum(row["costs_s"].values()))


def test_horovod_cycle_measures_the_background_thread(tmp_path):
    result = bench("horovod_cycle", "--np", "2", "--cycle-ms", "1,20", "--controllers", "gloo", "--idle-s", "1",
                   "--matmuls", "5", "--out", tmp_path)
    assert result.returncode == 0, result.output[-3000:]
    data = json.loads((tmp_path / "horovod_cycle.json").read_text())
    assert_machine(data)
    assert [(r["controller"], r["cycle_time_ms"], r["world_size"]) for r in data["rows"]] == [
        ("gloo", 1.0, 2), ("gloo", 20.0, 2)]
    for r in data["rows"]:
        assert len(r["idle_cpu_per_s"]) == 2 and all(positive(x) for x in r["idle_cpu_per_s"])
        assert all(positive(x) for x in r["compute_s_with"] + r["compute_s_without"])


def test_ddp_comm_hook_ab_times_both_variants():
    result = run_cmd([str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "benchmarks.ddp_comm_hook",
                      "--image-size", "8", "--batch-size", "4", "--blocks", "1", "--steps", "4"], timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    line = next(x for x in result.output.splitlines() if x.startswith("{"))
    ms = json.loads(line)
    assert positive(ms["builtin"]) and positive(ms["python_hook"])
    assert ms["hook_cost"] == pytest.approx(ms["python_hook"] / ms["builtin"] - 1, abs=1e-3)


def test_throughput_on_digits_reports_the_data_wait(tmp_path):
    result = bench("throughput", "--np", "2", "--models", "convnet", "--dataset", "digits", "--batch-size", "8",
                   "--steps", "3", "--repeats", "1", "--backends", "ddp", "--baselines", "none",
                   "--out", tmp_path, "--work", tmp_path / "runs")
    assert result.returncode == 0, result.output[-4000:]
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data["settings"]["dataset"] == "digits"
    (case,) = data["cases"]
    assert case["image_size"] == 8
    (run,) = case["runs"]
    assert json.loads((Path(run["run_dirs"][0]) / "config.json").read_text())["config"]["dataset"] == "digits"
    split = case["time_split"]["ddp@2"]
    assert 0 < split["data_frac"] < 1 and positive(split["data_ms"])
    assert "(digits, image 8," in result.output and "data %" in result.output


def test_time_split_is_the_median_repeats():
    """The comm/step/data columns describe the repeat whose samples/s is the median, not the first."""
    from benchmarks.throughput import Case, summarise

    runs = [{"label": "ddp", "world_size": 2, "repeat": i + 1, "samples_per_s": sps, "job_cpu_s": 1.0,
             "time_split": {"step_ms": sps / 10}} for i, sps in enumerate([300.0, 100.0, 200.0])]
    case = summarise(Case("convnet", 8), runs, ["ddp"])
    assert case["throughput"]["ddp@2"]["median"] == 200.0
    assert case["time_split"]["ddp@2"] == {"step_ms": 20.0}


@pytest.mark.parametrize("args,message", [
    (["--models", "resnet18"], "--models resnet18 needs larger images than the digits' 8x8"),
    (["--models", "convnet", "--image-size", "8"], "--image-size is for synthetic data"),
    (["--models", "convnet", "--steps", "500"], "is more than the 45 steps of one digits epoch"),
])
def test_throughput_refuses_digits_settings_it_cannot_run(tmp_path, args, message):
    result = bench("throughput", "--np", "2", "--dataset", "digits", *args, "--out", tmp_path, timeout=60)
    assert result.returncode == 2 and message in result.output
    assert not (tmp_path / "throughput.json").exists()
