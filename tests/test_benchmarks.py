"""The benchmark scripts: every step of benchmarks/run_all.sh run once at its tiniest (QUICK=1), through
the real launchers, and the arithmetic behind their tables.

They assert on the structure of the JSON the scripts wrote and that every number is a positive
measurement, never on speed (speed is what the scripts report, on a quiet machine)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from launched import PY, REPO, compare_in_process, run_cmd
from benchmarks.machine import BUSY_LIMIT
from benchmarks.stale import run_all_steps
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

# The first test's setup is the QUICK run of every step, which takes minutes while another worker runs too.
pytestmark = pytest.mark.timeout(900)

RESULTS = REPO / "benchmarks" / "results"
RUN_ALL = REPO / "benchmarks" / "run_all.sh"
#: benchmark module -> the file it writes into its --out folder
WRITES = {"allreduce": "allreduce.json", "throughput": "throughput.json", "loop_overhead": "loop_overhead.json",
          "horovod_cycle": "horovod_cycle.json", "ddp_comm_hook": "ddp_comm_hook.json",
          "stop_latency": "stop_latency.json", "exact_cost": "exact_cost.json", "verdicts": "verdicts.json",
          "probe_cost": "probe_cost.json"}
#: set in the QUICK run's environment: an `auto` sweep value must take it away from the job
EXPORTED_CYCLE_TIME = "3"


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
    assert "Open MPI" in m["versions"]["mpi"]
    assert set(data["load_before"]) == {"1m", "5m", "15m"} and isinstance(data["under_load"], bool)
    assert 0 <= data["cpu_busy_before"] <= 1 and data["under_load"] == (data["cpu_busy_before"] > BUSY_LIMIT)
    assert data["command"].startswith("python -m benchmarks.") and positive(data["started"])


def run_all_writes(mode: str) -> set:
    """The result files (relative to OUT) that the steps of one mode of run_all.sh write."""
    return set(run_all_steps(mode))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One QUICK run of run_all.sh into a temporary folder: (OUT, its printed output)."""
    out = tmp_path_factory.mktemp("bench")
    result = run_cmd(["bash", str(RUN_ALL)], timeout=900,
                     env={"QUICK": "1", "OUT": str(out), "WORK": str(out / "work"), "REPORT": "0", "PYTHON": PY,
                          "HOROVOD_CYCLE_TIME": EXPORTED_CYCLE_TIME})
    assert result.returncode == 0, result.output[-4000:]
    return out, result.output


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


# ---- run_all.sh and the committed results ----

def test_every_committed_result_is_written_by_a_step_of_run_all():
    committed = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json")}
    full = run_all_writes("full")
    assert committed <= full, f"no step of run_all.sh writes {sorted(committed - full)}"
    assert run_all_writes("quick") == full, "QUICK=1 and the full run must write the same files"
    # No figure is left behind without the result it belongs to.
    for png in RESULTS.rglob("*.png"):
        assert any(png.parent == (RESULTS / name).parent for name in committed), f"{png} has no result beside it"
    # Each committed result records the command that wrote it.
    for name in committed:
        assert read(RESULTS, name)["command"].split()[:3] == ["python", "-m", f"benchmarks.{Path(name).stem}"]


def test_quick_run_writes_every_result(quick):
    out, _ = quick
    written = {str(p.relative_to(out)) for p in out.rglob("*.json") if "work" not in p.relative_to(out).parts}
    assert written == run_all_writes("quick")
    for name in written:
        data = read(out, name)
        assert data["benchmark"] == Path(name).stem and data.get("failures", []) == []
        assert_machine(data)
        if "plot" in data:
            assert_real_image((out / name).parent / data["plot"])


# ---- allreduce ----

def test_allreduce_measures_against_the_copy_limit_and_the_copy_add_floor(quick):
    out, output = quick
    data = read(out, "allreduce.json")
    assert positive(data["memcpy"]["cpu_1thread_GBps"]) and positive(data["memcpy"]["limit_GBps"])
    floor = data["floor"]
    assert floor["threads"] == 1 and floor["bytes"] == 2**19
    assert floor["busbw_GBps"] == pytest.approx(2 / (2 / floor["copy_GBps"] + 1 / floor["add_GBps"]))
    assert floor["of_limit"] == pytest.approx(floor["busbw_GBps"] / data["memcpy"]["limit_GBps"])
    (series,) = data["series"]
    assert (series["name"], series["launcher"], series["world_size"]) == ("torch-gloo", "torchrun", 2)
    assert [r["bytes"] for r in series["results"]] == [4, 16, 64, 256, 1024, 4096]
    for r in series["results"]:
        assert r["iterations"] == 2
        assert all(positive(r[k]) for k in ("time_s", "algbw_GBps", "busbw_GBps", "busbw_of_limit", "floor_time_s"))
        # nccl-tests' definitions, at world size 2: busbw = algbw x 2(n-1)/n = algbw.
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
        assert r["busbw_of_limit"] == pytest.approx(r["busbw_GBps"] / data["memcpy"]["limit_GBps"])
        assert r["floor_time_s"] == pytest.approx(r["bytes"] / floor["busbw_GBps"] / 1e9)
    assert "torch-gloox2 busbw" in output and "copy/add floor" in output


def test_allreduce_runs_open_mpi_alone_and_each_chosen_algorithm(quick):
    out, _ = quick
    (alone,) = read(out, "allreduce-64m/allreduce.json")["series"]
    # Open MPI alone keeps its own waiting; Horovod's ranks get it as hvd_train sets it.
    assert (alone["name"], alone["launcher"], alone["mpi_yield_when_idle"]) == ("mpi", "mpirun", None)
    (chosen,) = read(out, "allreduce-mpi-algorithms/allreduce.json")["series"]
    assert (chosen["name"], chosen["launcher"], chosen["mpi_yield_when_idle"]) == ("horovod-mpi", "horovodrun-mpi", "1")
    # The algorithm reached the ranks through horovodrun and mpirun.
    assert (chosen["mpi_algorithm"], chosen["mpi_algorithm_env"]) == ("ring", "4")
    assert positive(chosen["results"][0]["time_s"])


def test_allreduce_refuses_an_algorithm_for_a_backend_without_open_mpi(capsys, tmp_path):
    from benchmarks import allreduce

    assert allreduce.main(["--backends", "torch,mpi", "--mpi-algorithms", "ring", "--out", str(tmp_path)]) == 2
    assert "torch do not use Open MPI" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        allreduce.main(["--mpi-algorithms", "fastest", "--out", str(tmp_path)])
    assert "unknown fastest; choose from default" in capsys.readouterr().err
    assert not (tmp_path / "allreduce.json").exists()


# ---- throughput ----

def test_throughput_reports_overhead_and_both_loop_ratios(quick):
    out, output = quick
    data = read(out, "throughput.json")
    (case,) = data["cases"]
    assert case["model"] == "convnet" and case["image_size"] == 8
    assert data["settings"]["steps"] == {"convnet": 3} and case["steps"] == 3  # given per model: convnet=3
    cells = case["throughput"]
    assert set(cells) == {"ddp@2", "bare-ddp@2", "bare-ddp-batched@2", "independent@2"}
    for cell in cells.values():
        assert cell["n"] == 1 and all(positive(cell[k]) for k in ("median", "min", "max", "job_cpu_s"))
    assert case["loop_ratio"]["2"] == pytest.approx(cells["bare-ddp@2"]["median"] / cells["ddp@2"]["median"])
    assert case["loop_ratio_batched"]["2"] == pytest.approx(
        cells["bare-ddp-batched@2"]["median"] / cells["ddp@2"]["median"])
    for label in ("ddp", "bare-ddp", "bare-ddp-batched"):
        assert case["exchange_overhead"][label]["2"] == pytest.approx(
            1 - cells[f"{label}@2"]["median"] / cells["independent@2"]["median"])
    runs = {r["label"]: r for r in case["runs"]}
    assert "torchrun" in runs["ddp"]["command"] and "-m ddp_train" in runs["ddp"]["command"]
    assert runs["ddp"]["steps"] == 3 and runs["ddp"]["time_split"]["step_ms"] > 0
    # Both bare loops are benchmarks.bare_ddp under torchrun; they differ only in how they fetch data.
    for label, data_path in (("bare-ddp", "seed"), ("bare-ddp-batched", "batched")):
        assert "torchrun" in runs[label]["command"] and f"benchmarks.bare_ddp --data-path {data_path}" in \
            runs[label]["command"]
        summary = json.loads((Path(runs[label]["run_dirs"][0]) / SUMMARY_FILE).read_text())
        assert summary["data_path"] == data_path and summary["steps"] == 3
    assert len(runs["independent"]["run_dirs"]) == 2
    each = []
    for run_dir in runs["independent"]["run_dirs"]:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
        assert summary["world_size"] == 1
        each.append(summary["samples_per_s"])
    # Each process's own figure is kept beside their sum (ranks in step would go at the slowest one's pace).
    assert runs["independent"]["process_samples_per_s"] == each
    assert runs["independent"]["samples_per_s"] == pytest.approx(sum(each))
    assert "process_samples_per_s" not in runs["ddp"]
    assert "loop/seed" in output and "loop/batched" in output
    # Every baseline ran with the options after -- (--threads 2, not the 1 per rank each would choose at 2 ranks
    # on 2 cores), as the loop it is compared with did.
    assert {r["label"]: r["threads"] for r in case["runs"]} == {label: 2 for label in runs}


def test_sweep_auto_leaves_the_variable_to_the_program(quick):
    out, _ = quick
    data = read(out, "scaling-1thread/throughput.json")
    # auto takes the place of the run with no knob set.
    assert [(c["knob"], c["value"]) for c in data["cases"]] == [("HOROVOD_CYCLE_TIME", "auto"),
                                                                ("HOROVOD_CYCLE_TIME", "5")]
    assert data["cases"][0]["env"] == {"HOROVOD_CYCLE_TIME": None}
    assert data["settings"]["extra_train_args"] == ["--threads", "1"]
    chosen = []
    for case in data["cases"]:
        (run,) = case["runs"]
        assert json.loads((Path(run["run_dirs"][0]) / CONFIG_FILE).read_text())["config"]["threads"] == 1
        options = run["backend_options"]
        chosen.append((options["cycle_time_ms"], options["cycle_time_source"]))
    # The exported value did not reach the auto run: hvd_train chose (convnet is small: Horovod's 1 ms).
    assert float(EXPORTED_CYCLE_TIME) not in [ms for ms, _ in chosen]
    assert chosen == [(1.0, "Horovod's default"), (5.0, "environment")]


def test_sweep_of_a_flag_measures_its_off_once_as_the_reference(quick):
    out, _ = quick
    data = read(out, "deterministic/throughput.json")
    # off sets nothing: it is the run with no knob set, not a second one.
    assert [(c["knob"], c["value"], c["train_args"]) for c in data["cases"]] == [
        ("deterministic", "off", []), ("deterministic", "on", ["--deterministic"])]
    fusion = [case["runs"][0]["backend_options"]["fusion_threshold_bytes"] for case in data["cases"]]
    assert fusion[0] > 0 and fusion[1] == 0  # on: Horovod without tensor fusion
    assert len(list((out / "work" / "deterministic").iterdir())) == 2
    # The two values alternate, the second repeat backwards: off, on, then on, off.
    order = sorted((run["order"], case["value"], run["repeat"]) for case in data["cases"] for run in case["runs"])
    assert order == [(1, "off", 1), (2, "on", 1), (3, "on", 2), (4, "off", 2)]


def test_horovod_wait_sweep_spins_when_told_and_polls_on_cpu_by_itself(quick):
    out, _ = quick
    data = read(out, "horovod-wait/throughput.json")
    assert [(c["knob"], c["value"]) for c in data["cases"]] == [("HVD_TRAIN_WAIT", "spin"), ("HVD_TRAIN_WAIT", "auto")]
    waits = [(case["runs"][0]["backend_options"]["wait"], case["runs"][0]["backend_options"]["wait_source"])
             for case in data["cases"]]
    assert waits == [("spin", "environment"), ("poll", "hvd_train: training on CPU")]


def test_the_other_throughput_steps(quick):
    out, output = quick
    digits = read(out, "data-wait-digits/throughput.json")
    assert digits["settings"]["dataset"] == "digits" and digits["cases"][0]["image_size"] == 8
    split = digits["cases"][0]["time_split"]["ddp@1"]
    assert 0 < split["data_frac"] < 1 and positive(split["data_ms"])
    assert "(digits, image 8," in output and "data %" in output
    yielding = read(out, "mpi-yield/throughput.json")["cases"][0]["runs"][0]["backend_options"]
    assert (yielding["mpi_yield_when_idle"], yielding["mpi_yield_source"]) == ("1", "hvd_train: training on CPU")
    for name in ("horovod_cycle_scaling", "horovod_cycle_scaling_32", "data-wait-synthetic"):
        (case,) = read(out, f"{name}/throughput.json")["cases"]
        assert all(positive(cell["median"]) for cell in case["throughput"].values())


def test_the_exchange_overhead_target_holds_each_backend_to_its_limit_at_one_thread_per_rank():
    from benchmarks.targets import _overhead_target

    def result(threads):
        runs = [{"world_size": 2, "threads": threads}, {"world_size": 1, "threads": 2}]
        overhead = {"ddp": {"2": 0.02}, "horovod-mpi": {"2": 0.031}, "horovod-gloo": {"2": 0.059}}
        return {"cases": [{"model": "resnet18", "image_size": 224, "runs": runs, "exchange_overhead": overhead}]}

    shown, verdict = _overhead_target(result(1))
    assert shown == "DDP 2.0%, Horovod/MPI 3.1%, Horovod/Gloo 5.9%"
    assert verdict == "DDP (≤ 3%) yes, Horovod/MPI (≤ 3%) no, Horovod/Gloo (≤ 6%) yes"
    # Runs of two threads per rank are not the target's setting, whatever the command line said.
    assert _overhead_target(result(2)) == ("resnet18 224x224 at one thread per rank not measured", "not measured")


def test_the_overhead_target_says_how_much_of_it_the_independent_processes_unequal_pace_explains():
    """Ranks in step go at the slowest rank's pace, which the sum of independent processes does not pay: the row
    says how far 2 x the slower process falls below their sum, per repeat, beside the overhead it judges."""
    from benchmarks.targets import OVERHEAD_TARGET, _overhead_target

    def run(label, repeat, sps, each=None):
        found = {"label": label, "world_size": 2, "repeat": repeat, "samples_per_s": sps, "threads": 1}
        return {**found, "process_samples_per_s": each} if each else found

    runs = [run("independent", 1, 10.0, [6.0, 4.0]), run("independent", 2, 10.0, [5.0, 5.0]),
            run("independent", 3, 12.0, [6.6, 5.4]), *(run(label, r, 8.0) for label in OVERHEAD_TARGET for r in (1, 2, 3))]
    case = {"model": "resnet18", "image_size": 224, "runs": runs,
            "exchange_overhead": {label: {"2": 0.2} for label in OVERHEAD_TARGET}}
    shown, verdict = _overhead_target({"cases": [case]})
    # 1 - 2 x 4 / 10 = 20%, 0% for equal processes, 1 - 2 x 5.4 / 12 = 10%: the median is 10%
    assert shown.endswith("; the independent processes' unequal pace (2 x the slower against their sum) costs 10.0% "
                          "(per repeat 0.0%–20.0%)")
    # The verdict still judges the overhead against the sum, as the target is written.
    assert verdict == "DDP (≤ 3%) no, Horovod/MPI (≤ 3%) no, Horovod/Gloo (≤ 6%) no"


def test_a_target_is_judged_per_repeat_and_undecided_when_the_repeats_fall_on_both_sides():
    """Identical runs on a shared machine differ by more than some targets' margins: a target is met when every
    repeat meets it, missed when none does, and undecided otherwise, each repeat pairing runs made minutes apart."""
    from benchmarks.targets import _exact_target, _loop_target, _overhead_target, _probe_target

    def run(label, world, repeat, sps):
        return {"label": label, "world_size": world, "repeat": repeat, "samples_per_s": sps, "threads": 1}

    # Repeat 1 is a slow stretch for every run: DDP's overhead is 2% in repeat 1 and 4% in repeat 2, Gloo's 10% in
    # both, Open MPI's 1% and 2%; the median-based figures alone would hide which way each repeat fell.
    runs = [run("independent", 2, 1, 10.0), run("independent", 2, 2, 20.0),
            run("ddp", 2, 1, 9.8), run("ddp", 2, 2, 19.2), run("horovod-gloo", 2, 1, 9.0), run("horovod-gloo", 2, 2, 18.0),
            run("horovod-mpi", 2, 1, 9.9), run("horovod-mpi", 2, 2, 19.6),
            run("ddp", 1, 1, 5.0), run("ddp", 1, 2, 10.0), run("bare-ddp-batched", 1, 1, 5.05),
            run("bare-ddp-batched", 1, 2, 10.4), run("bare-ddp", 1, 1, 5.0), run("bare-ddp", 1, 2, 10.0)]
    case = {"name": "resnet18", "model": "resnet18", "image_size": 224, "runs": runs,
            "exchange_overhead": {"ddp": {"2": 0.03}, "horovod-gloo": {"2": 0.1}, "horovod-mpi": {"2": 0.015}},
            "loop_ratio": {"1": 1.0}, "loop_ratio_batched": {"1": 1.03}}
    shown, verdict = _overhead_target({"cases": [case]})
    assert "DDP 3.0% (per repeat 2.0%–4.0%)" in shown and "unequal pace" not in shown
    assert verdict == "DDP (≤ 3%) undecided, Horovod/MPI (≤ 3%) yes, Horovod/Gloo (≤ 6%) no"
    shown, verdict = _loop_target({"cases": [case]})
    assert "x1 batched: 1.03 (per repeat 1.01–1.04)" in shown and verdict == "seed: yes, batched: undecided"
    exact = {"settings": {"image_sizes": {"resnet18": 224}},
             "cost": [{"model": "resnet18", "world_size": 2, "step_time_ratio": 1.12,
                       "per_repeat": {"values": [1.12, 1.15, 1.13]}},
                      {"model": "resnet18", "world_size": 3, "step_time_ratio": 1.05,
                       "per_repeat": {"values": [1.05, 1.2]}}]}
    assert _exact_target(exact) == ("x2 1.12x (per repeat 1.12–1.15), x3 1.05x (per repeat 1.05–1.20)", "no")
    probe = {"rows": [{"model": "resnet18", "image_size": 224, "cost": 0.021, "bare_samples_per_s": [10.0, 10.0],
                       "probed_samples_per_s": [9.9, 9.7]}]}
    assert _probe_target(probe) == ("+2.1% (per repeat +1.0% to +3.0%)", "undecided")


def test_schedule_runs_every_case_in_every_repeat_and_every_other_repeat_backwards():
    """A sweep's values are interleaved like its backends, so the machine's drift over minutes cannot favour one."""
    from benchmarks.throughput import Cell, schedule

    a, b, c = Cell(0, "ddp", 2), Cell(1, "ddp", 2), Cell(1, "independent", 2)
    assert schedule([a, b, c], 3) == [(0, a), (0, b), (0, c), (1, c), (1, b), (1, a), (2, a), (2, b), (2, c)]
    assert schedule([a, b], 1) == [(0, a), (0, b)]


def test_bench_gives_the_bare_loops_only_to_the_reference_case():
    from argparse import Namespace

    from benchmarks.throughput import Bench, Case, Cell

    reference, swept = Case("convnet", 8, 3, "HOROVOD_CYCLE_TIME", "auto", env={"HOROVOD_CYCLE_TIME": None}), \
        Case("convnet", 8, 3, "HOROVOD_CYCLE_TIME", "5", env={"HOROVOD_CYCLE_TIME": "5"})
    bench = Bench(Namespace(world_sizes=[1, 2]), [])
    assert bench.cells([reference, swept], ["ddp"], ["bare-batched", "independent"]) == [
        Cell(0, "ddp", 1), Cell(0, "bare-ddp-batched", 1), Cell(0, "ddp", 2), Cell(0, "bare-ddp-batched", 2),
        Cell(0, "independent", 2), Cell(1, "ddp", 1), Cell(1, "ddp", 2), Cell(1, "independent", 2)]


def test_summarise_computes_scaling_overhead_ratios_and_the_median_split():
    """The comm/step/data columns describe the repeat whose samples/s is the median, not the first."""
    from benchmarks.throughput import Case, summarise

    def run(label, np, sps, repeat=1):
        return {"label": label, "world_size": np, "repeat": repeat, "samples_per_s": sps, "job_cpu_s": 1.0,
                "time_split": {"step_ms": sps / 10}}

    runs = [run("ddp", 2, sps, i) for i, sps in enumerate([300.0, 100.0, 200.0])] + [
        run("ddp", 1, 125.0), run("bare-ddp", 2, 220.0), run("bare-ddp", 1, 100.0),
        run("bare-ddp-batched", 2, 210.0), run("independent", 2, 250.0)]
    case = summarise(Case("convnet", 8, 3), runs, ["ddp"])
    assert case["throughput"]["ddp@2"]["median"] == 200.0 and case["time_split"]["ddp@2"] == {"step_ms": 20.0}
    assert case["scaling_efficiency"]["ddp"] == {"1": 1.0, "2": 0.8}
    assert case["scaling_efficiency"]["bare-ddp"] == {"1": 1.0, "2": 1.1}
    assert case["exchange_overhead"]["ddp"] == {"2": pytest.approx(0.2)}
    assert case["loop_ratio"] == {"1": 0.8, "2": 1.1} and case["loop_ratio_batched"] == {"2": 1.05}


def test_steps_and_image_sizes_are_one_for_every_model_or_one_per_model():
    """A fast model gets more steps than a slow one, so that both runs time seconds, not one scheduler hiccup."""
    import argparse

    from benchmarks.throughput import Case, base_args, for_model, parse_image_sizes, parse_steps

    steps = parse_steps("convnet=150,resnet18=12")
    assert (for_model(steps, "convnet"), for_model(steps, "resnet18"), for_model(steps, "mlp")) == (150, 12, None)
    assert for_model(parse_steps("12"), "mlp") == 12 and parse_image_sizes("64") == {"*": 64}
    args = argparse.Namespace(dataset="synthetic", batch_size=16, world_sizes=[1, 2])
    train = base_args(Case("convnet", 32, 150), args, 2, Path("x"))
    assert train[train.index("--max-steps") + 1] == "150"
    for bad, message in (("1", "a step count must be >= 2"), ("convnet=x", "write a step count for every model")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_steps(bad)


def test_knob_values_set_options_and_environment_or_leave_them_unset():
    from benchmarks.throughput import knob_args

    assert knob_args("HOROVOD_CYCLE_TIME", "5") == ([], {"HOROVOD_CYCLE_TIME": "5"})
    assert knob_args("HOROVOD_CYCLE_TIME", "auto") == ([], {"HOROVOD_CYCLE_TIME": None})
    assert knob_args("bucket-mb", "4") == (["--bucket-mb", "4"], {})
    assert knob_args("bucket-mb", "auto") == ([], {})
    assert knob_args("channels-last", "on") == (["--channels-last"], {})


@pytest.mark.parametrize("args,message", [
    (["--np", "2", "--sweep", "no-such-knob=1,2"], "the training options have no --no-such-knob"),
    (["--np", "2", "--dataset", "digits", "--models", "resnet18"],
     "--models resnet18 needs larger images than the digits' 8x8"),
    (["--np", "2", "--dataset", "digits", "--models", "convnet", "--image-size", "8"],
     "--image-size is for synthetic data"),
    (["--np", "2", "--dataset", "digits", "--models", "convnet", "--steps", "500"],
     "is more than the 45 steps of one digits epoch"),
    (["--np", "2", "--baselines", "bare,fastest"], "--baselines 'bare,fastest': choose from bare, bare-batched"),
    (["--np", "2", "--models", "convnet,resnet18", "--steps", "convnet=150"],
     "no --steps for resnet18; add resnet18=N or give one step count for all"),
])
def test_throughput_refuses_what_it_cannot_run_before_starting(capsys, tmp_path, args, message):
    from benchmarks import throughput

    assert throughput.main([*args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "throughput.json").exists()


# ---- the other scripts ----

def test_loop_overhead_times_each_piece_of_bookkeeping(quick):
    out, _ = quick
    (row,) = read(out, "loop_overhead.json")["rows"]
    assert row["model"] == "convnet" and positive(row["step_s"]) and row["stop_check_every"] >= 1
    # The stop check's cost comes from the allreduce benchmark's smallest torch message, shared by the
    # steps between two checks.
    torch_small = read(out, "allreduce.json")["series"][0]["results"][0]["time_s"]
    assert row["costs_s"]["stop check (allreduce / steps between checks)"] == pytest.approx(
        torch_small / row["stop_check_every"])
    assert set(row["costs_s"]) >= {"train meters", "loss.item()", "metrics.jsonl step line", "lr schedule",
                                   "weight fingerprint (rank 0)"}
    assert all(positive(v) for v in row["costs_s"].values())
    assert row["total_s"] == pytest.approx(sum(row["costs_s"].values()))


def test_horovod_cycle_and_comm_hook(quick):
    out, _ = quick
    (cycle,) = read(out, "horovod_cycle.json")["rows"]
    assert (cycle["controller"], cycle["cycle_time_ms"], cycle["world_size"]) == ("gloo", 5.0, 1)
    assert all(positive(x) for x in cycle["idle_cpu_per_s"] + cycle["compute_s_with"] + cycle["compute_s_without"])
    hook = read(out, "ddp_comm_hook.json")
    (row,) = hook["rows"]
    assert positive(row["builtin_ms"]) and positive(row["python_hook_ms"])
    assert row["hook_cost"] == pytest.approx(row["python_hook_ms"] / row["builtin_ms"] - 1)
    assert hook["settings"]["world_size"] == 1


def test_probe_cost_runs_the_script_bare_and_under_the_probe(quick):
    out, _ = quick
    data = read(out, "probe_cost.json")
    assert_machine(data)
    (row,) = data["rows"]
    assert (row["model"], row["image_size"]) == ("convnet", 8) and not data["failures"]
    bare, probed = row["bare_samples_per_s"], row["probed_samples_per_s"]
    assert len(bare) == len(probed) == 1 and all(positive(v) for v in bare + probed)
    assert row["cost"] == pytest.approx(1 - probed[0] / bare[0])
    # the probed job wrote a run directory of the script, as --scripts reads it
    (run_dir,) = (out / "work" / "probe_cost").iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["backend"]["script"] and config["script"]["path"].endswith("benchmarks/probe_cost.py")
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


# ---- the comparison report's benchmark section ----

def test_report_shows_the_benchmarks(quick, tmp_path):
    out, _ = quick
    run = out / "work" / "throughput" / "convnet" / "ddp-2-r1"
    report_dir = tmp_path / "report"
    assert compare_in_process("--runs", run, "--bench", out, "--out", report_dir).returncode == 0
    report = (report_dir / "report.md").read_text()
    summary = json.loads((report_dir / SUMMARY_FILE).read_text())
    assert "## Benchmarks" in report and "### Allreduce bandwidth" in report and "### Training throughput" in report
    for s in read(out, "allreduce.json")["series"]:
        assert f"{s['results'][-1]['busbw_GBps']:.2f} GB/s" in report
    case = read(out, "throughput.json")["cases"][0]
    assert f"| ddp | 2 | {case['throughput']['ddp@2']['median']:.1f}" in report
    assert f"| {case['loop_ratio']['2']:.3f} | {case['loop_ratio_batched']['2']:.3f} |" in report
    kept = summary["benchmarks"]["throughput"]["cases"][0]
    assert (kept["loop_ratio"], kept["loop_ratio_batched"]) == (case["loop_ratio"], case["loop_ratio_batched"])
    for name in ("bench_allreduce.png", "bench_throughput.png", "throughput.png"):
        assert f"]({name})" in report
        assert_real_image(report_dir / name)
    # The benchmark's figure did not replace the report's own throughput plot.
    assert (report_dir / "bench_throughput.png").read_bytes() == (out / "throughput.png").read_bytes()
    assert (report_dir / "throughput.png").read_bytes() != (out / "throughput.png").read_bytes()

    # Without --bench, results already in the output folder are picked up.
    again = tmp_path / "again"
    again.mkdir()
    for name in ("throughput.json", "throughput.png"):
        (again / name).write_bytes((out / name).read_bytes())
    assert compare_in_process("--runs", run, "--out", again).returncode == 0
    text = (again / "report.md").read_text()
    assert "### Training throughput" in text and "### Allreduce bandwidth" not in text

    # A --bench folder with no results is a clear error.
    refused = compare_in_process("--runs", run, "--bench", tmp_path / "report" / "nothing", "--out", tmp_path / "x")
    assert refused.returncode == 2 and "no allreduce.json or throughput.json" in refused.output


def test_csv_values_are_checked_with_a_message_naming_the_fix():
    import argparse

    from common.compare.arguments import byte_size, csv_list, world_sizes

    assert world_sizes("1, 2,4") == [1, 2, 4]
    assert byte_size("64K") == 65536 and byte_size("1M") == 2**20
    for parse, text, message in ((world_sizes, "1,x", "is not a comma-separated list of integers"),
                                 (world_sizes, "0,2", "every value must be >= 1"),
                                 (world_sizes, ",", "give at least one value"),
                                 (csv_list(str, ("gloo", "mpi")), "gloo,nccl", "unknown nccl; choose from gloo, mpi"),
                                 (byte_size, "lots", "is not a size")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)


def test_writing_results_leaves_the_recorded_revision_clean_and_a_code_change_does_not(tmp_path):
    # A benchmark run writes its results into the checkout; its later steps must record the same revision,
    # and an edited document or test changes no code.
    clone = tmp_path / "clone"
    assert run_cmd(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)]).returncode == 0
    head = run_cmd(["git", "-C", str(clone), "rev-parse", "HEAD"]).output.strip()
    script = """if True:
        from common.rundir.records import git_revision
        print(git_revision())
        for written in ("benchmarks/results/allreduce.json", "BENCHMARKS.md", "docs/training.md", "README.md",
                        "tests/test_docs.py", "benchmarks/BENCHMARKS.template.md"):
            open(written, "a").write("\\n")
        print(git_revision())
        open("common/loop/trainer.py", "a").write("\\n")
        print(git_revision())
    """
    result = run_cmd([PY, "-c", script], cwd=clone)  # one process: the module imports torch
    assert result.output.split()[-3:] == [head, head, head + "-dirty"], result.output


def test_named_steps_run_alone_and_an_unknown_name_is_refused(tmp_path):
    env = {"QUICK": "1", "OUT": str(tmp_path), "WORK": str(tmp_path / "work"), "PYTHON": PY}
    refused = run_cmd(["bash", str(RUN_ALL), "loop_overhead.json", "nothing.json"], env=env, timeout=60)
    assert refused.returncode == 2 and not any(tmp_path.iterdir()), refused.output
    (line,) = refused.output.strip().splitlines()
    assert "error: no step writes nothing.json" in line and "scaling-1thread/throughput.json" in line, line
    result = run_cmd(["bash", str(RUN_ALL), "loop_overhead.json"], env=env, timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json")] == ["loop_overhead.json"]
    assert "report in" not in result.output  # named steps skip the comparison report unless REPORT=1


def test_stale_says_which_results_to_measure_again_and_why(tmp_path):
    clone = tmp_path / "clone"
    assert run_cmd(["git", "clone", "-q", str(REPO), str(clone)]).returncode == 0
    head = run_cmd(["git", "-C", str(clone), "rev-parse", "HEAD"]).output.strip()
    steps, results = run_all_steps(), tmp_path / "results"
    for name, revision, command in (("throughput.json", head, steps["throughput.json"]),
                                    ("stop_latency.json", head, steps["stop_latency.json"]),
                                    ("exact_cost.json", head, steps["exact_cost.json"] + " --steps 1"),
                                    ("verdicts.json", head + "-dirty", steps["verdicts.json"])):
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(json.dumps({"benchmark": Path(name).stem, "command": command,
                                                "machine": {"versions": {"project_git": revision}}}))
    stale = [PY, "-m", "benchmarks.stale", "--results", str(results)]

    def said() -> dict:
        out = run_cmd(stale, cwd=clone)
        assert out.returncode == 0, out.output
        return dict(line.split(": ", 1) for line in out.output.splitlines() if ".json: " in line)

    now = said()
    assert now["throughput.json"].startswith("current") and now["stop_latency.json"].startswith("current")
    assert now["exact_cost.json"].startswith("stale, its step in run_all.sh runs another command now")
    assert now["verdicts.json"].startswith("stale, it was measured on uncommitted code")
    assert now["probe_cost.json"] == "stale, not measured yet"
    # Prose changes nothing; a benchmark's script makes its results stale; the training makes every one stale.
    (clone / "README.md").write_text("changed\n")
    assert said()["throughput.json"].startswith("current")
    for changed in ("benchmarks/throughput.py", "common/loop/trainer.py"):
        with open(clone / changed, "a") as f:
            f.write("\n")
        now = said()
        assert now["throughput.json"].startswith("stale, changed since: benchmarks/throughput.py"), now
        assert now["stop_latency.json"].startswith("current" if changed.startswith("benchmarks") else
                                                   f"stale, changed since: {changed}"), now
    names = run_cmd([*stale, "--names"], cwd=clone).output.split()
    assert {"throughput.json", "stop_latency.json", "probe_cost.json"} <= set(names)


def test_settle_waits_for_the_cpu_to_fall_quiet_and_gives_up_at_its_limit():
    from benchmarks.machine import BUSY_LIMIT
    from benchmarks.settle import quiet, settle

    # Quiet leaves room below the under-load limit for the step's own start-up.
    assert not quiet(BUSY_LIMIT) and not quiet(0.6 * BUSY_LIMIT) and quiet(0.1 * BUSY_LIMIT)
    busy = iter([0.9, 0.9, 0.0])
    waited, last = settle(5.0, poll_s=0.01, read_busy=lambda: next(busy))
    assert waited < 1.0 and last == 0.0 and next(busy, None) is None
    waited, last = settle(0.2, poll_s=0.01, read_busy=lambda: 0.9)
    assert 0.2 <= waited < 2.0 and last == 0.9


def test_a_result_is_under_load_by_the_cpu_other_programs_use_as_it_starts_not_by_the_load_average():
    from benchmarks.machine import BUSY_LIMIT, cores, cpu_busy, under_load

    # A core kept busy by another process shows in the share of all cores' time, whatever else runs beside it.
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        busy = cpu_busy(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.8 / cores() <= busy <= 1.0
    # The load average a finished run left behind does not make the next result under load; the CPU's use does.
    left_behind = {"1m": 4.0 * cores(), "5m": 1.0, "15m": 1.0}
    assert not under_load(left_behind, cores(), busy_before=0.02)
    assert under_load({"1m": 0.0, "5m": 0.0, "15m": 0.0}, cores(), busy_before=BUSY_LIMIT + 0.1)
    assert under_load(left_behind, cores())  # a result that did not measure the CPU: the load average decides


def test_run_all_is_executable_and_honours_its_variables():
    text = RUN_ALL.read_text()
    assert os.access(RUN_ALL, os.X_OK)
    for variable in ("QUICK", "OUT", "WORK", "REPORT", "PYTHON", "SETTLE_S"):
        assert "${" + variable in text


# ---- stop latency and exact mode's cost ----

def test_stop_latency_stops_every_launcher_with_a_checkpoint(quick):
    out, _ = quick
    data = read(out, "stop_latency.json")
    assert [r["launcher"] for r in data["rows"]] == ["torchrun"]
    for r in data["rows"]:
        assert r["checkpoint_written"], r
        assert positive(r["step_s"]) and positive(r["ranks_exit_s"]) and r["ranks_exit_s"] <= r["launcher_exit_s"]
        assert r["bound_s"] == pytest.approx(15.0 + r["step_s"]) and isinstance(r["within_bound"], bool)


def test_exact_cost_compares_both_modes_on_the_same_micro_batches_at_each_world_size(quick):
    out, _ = quick
    data = read(out, "exact_cost.json")
    cells = {(r["model"], r["mode"], r["world_size"]): r for r in data["speed"]}
    assert set(cells) == {("convnet", mode, np) for mode in ("allreduce", "exact") for np in (1, 2)}
    for r in cells.values():
        assert positive(r["samples_per_s"]["median"]) and positive(r["bytes_per_step"])
        # The same threads and the same micro-batches (BatchNorm over the same samples) in both modes.
        assert r["threads"] == data["settings"]["threads"] == 1 and r["micro_batch"] == 4
    for np in (1, 2):  # allreduce mode: per-rank batches of the micro-batch, accumulated up to the global batch
        a = cells["convnet", "allreduce", np]
        assert (a["per_rank_batch"], a["accumulate"]) == (4, 8 // (4 * np))
    # Its cost: exact mode's step time over allreduce mode's, from the medians, and per repeat from the two
    # runs made side by side (allreduce then exact, then exact then allreduce).
    for c in data["cost"]:
        a, e = (cells["convnet", mode, c["world_size"]]["samples_per_s"] for mode in ("allreduce", "exact"))
        assert c["step_time_ratio"] == pytest.approx(a["median"] / e["median"])
        assert c["per_repeat"]["values"] == pytest.approx([x / y for x, y in zip(a["values"], e["values"])])
        assert c["per_repeat"]["n"] == 2
    for r in cells.values():
        assert r["repeats"] == [1, 2] and r["comm_ms"]["n"] == 2
    assert [c["world_size"] for c in data["cost"]] == [1, 2]
    # int64 sums of every gradient plus the exchanged values: more than twice float32 gradients.
    for np in (1, 2):
        assert cells["convnet", "exact", np]["bytes_per_step"] > 2 * cells["convnet", "allreduce", np]["bytes_per_step"]
    (error,) = data["fixed_point_error"]
    assert error["micro_batches"] == 2 and 0 <= error["fixed_point"] < 1e-6 and 0 <= error["float32_sum"] < 1e-3
    assert data["distance"] is None  # --no-distance



def last_training_change() -> str:
    """The last commit that changed a file the training depends on, and the one before it."""
    from benchmarks import stale
    out = subprocess.run(["git", "-C", str(REPO), "log", "-2", "--format=%H", "--", *stale.training_inputs()],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1]


def test_verdicts_reuse_a_run_only_when_a_clean_revision_of_the_same_training_made_it(tmp_path):
    """A run left in --work by a revision whose training is this checkout's is reused (a change to how pairs are
    judged re-judges it); one made by other training code, by changes not committed or by a revision this clone
    does not know is launched again. (The suite runs on a committed checkout: CI's clean clone.)"""
    from benchmarks.verdicts import reusable

    same, before = last_training_change()
    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_FILE).write_text(json.dumps({"versions": {"project_git": same}}))
    assert not reusable(run)  # no summary: cut short
    (run / SUMMARY_FILE).write_text("{}")
    assert reusable(run)
    for other in (before, same + "-dirty", "b" * 40, None):
        (run / CONFIG_FILE).write_text(json.dumps({"versions": {"project_git": other}}))
        assert not reusable(run), other


def test_verdicts_runner_launches_again_what_another_revision_left(tmp_path):
    """The corpus's Runner returns a run the same training made without launching it; a run other training left
    is deleted and launched again (here a launch that fails at once: an unknown model)."""
    from benchmarks.verdicts import Runner

    same, before = last_training_change()
    runner = Runner(tmp_path, timeout_s=60)
    args = ["--model", "no-such-model", "--threads", "1"]
    assert runner.run("none-ddp", 1, args) is None and len(runner.failures) == 1
    (run,) = tmp_path.iterdir()  # the run's directory, kept in --work
    (run / SUMMARY_FILE).write_text("{}")
    (run / CONFIG_FILE).write_text(json.dumps({"versions": {"project_git": same}}))
    assert runner.run("none-ddp", 1, args) == run and len(runner.failures) == 1  # reused: nothing launched

    (run / CONFIG_FILE).write_text(json.dumps({"versions": {"project_git": before}}))
    assert runner.run("none-ddp", 1, args) is None  # launched again: the unknown model fails
    assert len(runner.failures) == 2 and "no-such-model" in runner.failures[1]["error"]
    assert not (run / SUMMARY_FILE).exists() and not (run / CONFIG_FILE).exists()  # the old run is gone


def test_verdicts_runner_reuses_its_own_runs_in_a_checkout_with_changes(tmp_path):
    """A run this Runner made trained with this code, committed or not: the floor's base that is also a case's
    side is launched once."""
    from benchmarks.verdicts import Runner, reusable

    runner = Runner(tmp_path, timeout_s=120)
    args = ["--model", "mlp", "--max-steps", "1", "--threads", "1"]
    run = runner.run("none-ddp", 1, args)
    assert run is not None and (run / SUMMARY_FILE).is_file() and runner.launched == 1
    # As if made by changes not committed: no other Runner would reuse it, this one does.
    config = json.loads((run / CONFIG_FILE).read_text())
    config["versions"]["project_git"] += "-dirty"
    (run / CONFIG_FILE).write_text(json.dumps(config))
    assert runner.run("none-ddp", 1, args) == run and runner.launched == 1
    assert not reusable(run)  # what another Runner would decide


def test_verdicts_judge_every_pair_of_the_corpus_at_every_floor_size(quick):
    out, _ = quick
    data = read(out, "verdicts.json")
    st = data["settings"]
    assert st["quick"] is True and st["max_floor"] == 2 and st["default_margin"] in st["margins"]
    assert {c["name"]: c["kind"] for c in data["cases"]} == {"ddp-gloo": "same", "lr+5%": "real"}
    real = next(c for c in data["cases"] if c["kind"] == "real")
    # The twin (the change on DDP alone) puts the learning rate's first effect at step 2.
    assert real["expected_step"] == 2
    # The real difference runs on DDP, so its run is its twin: the floor's three runs, Horovod's and that one.
    assert real["b"].startswith("torchrun ") and data["runs_launched"] == 5
    for case in data["cases"]:
        assert set(case["judged"]) == {f"{k}@{m:g}" for k in (1, 2) for m in st["margins"]}
    # The grid counts exactly the wrong verdicts of the cases.
    for g in data["grid"]:
        key = f"{g['floor_runs']}@{g['margin']:g}"
        wrong = sorted(c["name"] for c in data["cases"] if not c["judged"][key]["correct"])
        assert sorted(g["false_alarms"] + g["misses"]) == wrong
    assert real["judged"]["2@10"]["trains_differently_from"] == 2 and real["judged"]["2@10"]["correct"]


def test_a_result_records_the_revision_its_measurement_started_at(monkeypatch):
    """A commit while a benchmark runs must not stamp its result with code it did not measure."""
    from benchmarks.machine import Record
    from common.rundir import records

    monkeypatch.setattr(records, "git_revision", lambda: "a" * 40)
    record = Record("throughput", [])
    monkeypatch.setattr(records, "git_revision", lambda: "b" * 40)
    assert record.header()["machine"]["versions"]["project_git"] == "a" * 40
