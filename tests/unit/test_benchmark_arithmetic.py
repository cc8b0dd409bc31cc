"""The benchmarks' arithmetic on made-up measurements: known inputs, known outputs (no process launched)."""

from __future__ import annotations

import argparse
import os
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks import allreduce, allreduce_worker, exact_cost, horovod_cycle, loop_overhead, probe_cost, throughput
from benchmarks.jobs import job_env
from benchmarks.machine import BUSY_LIMIT, REPO, under_load
from benchmarks.settle import quiet, settle
from benchmarks.throughput import Bench, Case, Cell


def test_allreduce_rows_against_the_limit_the_floor_and_the_link():
    rows = allreduce.against_bounds([{"bytes": 1024, "busbw_GBps": 2.0}, {"bytes": 2**20, "busbw_GBps": 4.0}],
                                    world_size=4, limit_GBps=8.0, floor_busbw_GBps=5.0, link_GBps=1.25)
    # busbw / limit; the floor's time: bytes x 2(n-1)/n / floor busbw; busbw / link
    assert [r["busbw_of_limit"] for r in rows] == [0.25, 0.5]
    assert [r["floor_time_s"] for r in rows] == pytest.approx([1024 * 1.5 / 5e9, 2**20 * 1.5 / 5e9])
    assert [r["busbw_of_link"] for r in rows] == [1.6, 3.2]
    assert "busbw_of_link" not in allreduce.against_bounds([{"bytes": 4, "busbw_GBps": 1.0}], 2, 8.0, 5.0)[0]


def test_the_copy_add_floor_is_two_copies_and_one_add_per_byte():
    floor = allreduce.copy_add_floor(2**20, limit_GBps=100.0, repeats=2)
    copy, add = 2**20 / floor["copy_s"] / 1e9, 2**20 / floor["add_s"] / 1e9
    assert (floor["copy_GBps"], floor["add_GBps"]) == pytest.approx((copy, add))
    assert floor["busbw_GBps"] == pytest.approx(2 / (2 / copy + 1 / add))
    assert floor["of_limit"] == pytest.approx(floor["busbw_GBps"] / 100.0) and floor["threads"] == 1


def test_message_sizes_and_iterations_by_size():
    assert allreduce_worker.message_sizes(4, 4096, 4) == [4, 16, 64, 256, 1024, 4096]
    assert allreduce_worker.message_sizes(5, 100, 2) == [4, 8, 20, 40, 80]  # whole float32 elements
    budget = 512 * 2**20
    assert [allreduce_worker.iterations_for(n, budget) for n in (4, 2**20, 2**23, 2**28)] == [200, 200, 64, 5]


def test_schedule_runs_every_cell_in_every_repeat_and_every_other_repeat_backwards():
    a, b, c = Cell(0, "ddp", 2), Cell(1, "ddp", 2), Cell(1, "independent", 2)
    assert throughput.schedule([a, b, c], 3) == [(0, a), (0, b), (0, c), (1, c), (1, b), (1, a), (2, a), (2, b), (2, c)]


def test_the_bare_loops_run_only_in_the_reference_case_and_independent_processes_only_from_two_ranks():
    reference = Case("convnet", 8, 3, "HOROVOD_CYCLE_TIME", "auto", env={"HOROVOD_CYCLE_TIME": None})
    swept = Case("convnet", 8, 3, "HOROVOD_CYCLE_TIME", "5", env={"HOROVOD_CYCLE_TIME": "5"})
    assert reference.is_reference and not swept.is_reference
    bench = Bench(Namespace(world_sizes=[1, 2]), [])
    assert bench.cells([reference, swept], ["ddp"], ["bare-batched", "independent"]) == [
        Cell(0, "ddp", 1), Cell(0, "bare-ddp-batched", 1), Cell(0, "ddp", 2), Cell(0, "bare-ddp-batched", 2),
        Cell(0, "independent", 2), Cell(1, "ddp", 1), Cell(1, "ddp", 2), Cell(1, "independent", 2)]


def run(label, np, sps, repeat=1, split=None):
    return {"label": label, "world_size": np, "repeat": repeat, "samples_per_s": sps, "job_cpu_s": float(repeat),
            "time_split": split}


def test_summarise_computes_scaling_overhead_loop_ratios_and_the_median_repeats_split():
    runs = [run("ddp", 2, sps, i, {"step_ms": sps / 10}) for i, sps in enumerate([300.0, 100.0, 200.0], 1)] + [
        run("ddp", 1, 125.0), run("bare-ddp", 2, 220.0), run("bare-ddp", 1, 100.0), run("bare-ddp-batched", 2, 210.0),
        run("independent", 2, 250.0)]
    case = throughput.summarise(Case("convnet", 8, 3), runs, ["ddp"])
    assert case["throughput"]["ddp@2"] == {"median": 200.0, "min": 100.0, "max": 300.0, "n": 3,
                                           "values": [300.0, 100.0, 200.0], "job_cpu_s": 2.0}
    assert case["time_split"] == {"ddp@2": {"step_ms": 20.0}}  # the repeat at the median, not the first
    assert case["scaling_efficiency"]["ddp"] == {"1": 1.0, "2": 0.8}  # 200 / (2 x 125)
    assert case["scaling_efficiency"]["bare-ddp"] == {"1": 1.0, "2": 1.1}
    assert case["exchange_overhead"] == {"ddp": {"2": pytest.approx(0.2)}, "bare-ddp": {"2": pytest.approx(0.12)},
                                         "bare-ddp-batched": {"2": pytest.approx(0.16)}}
    assert case["loop_ratio"] == {"1": 0.8, "2": 1.1} and case["loop_ratio_batched"] == {"2": 1.05}


def test_steps_and_image_sizes_are_one_for_every_model_or_one_per_model():
    steps = throughput.parse_steps("convnet=150,resnet18=12")
    assert [throughput.for_model(steps, m) for m in ("convnet", "resnet18", "mlp")] == [150, 12, None]
    assert throughput.for_model(throughput.parse_steps("12"), "mlp") == 12
    assert throughput.parse_image_sizes("64") == {"*": 64}
    for bad, message in (("1", "a step count must be >= 2"), ("convnet=x", "write a step count for every model")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            throughput.parse_steps(bad)


def test_a_run_has_data_for_every_rank_at_the_largest_world_size_within_one_epoch():
    args = Namespace(dataset="synthetic", batch_size=16, world_sizes=[1, 2])
    train = throughput.base_args(Case("convnet", 32, 150), args, 2, Path("x"))
    # (150 + 1) steps x 16 x 2 ranks / (1 - the validation fifth), plus one
    assert train == ["--model", "convnet", "--dataset", "synthetic", "--image-size", "32", "--synthetic-samples",
                     "6041", "--batch-size", "16", "--epochs", "1", "--max-steps", "150", "--run-dir", "x"]


def test_knob_values_set_options_and_environment_or_leave_them_unset():
    assert throughput.knob_args("HOROVOD_CYCLE_TIME", "5") == ([], {"HOROVOD_CYCLE_TIME": "5"})
    assert throughput.knob_args("HOROVOD_CYCLE_TIME", "auto") == ([], {"HOROVOD_CYCLE_TIME": None})
    assert throughput.knob_args("bucket-mb", "4") == (["--bucket-mb", "4"], {})
    assert throughput.knob_args("bucket-mb", "auto") == ([], {})
    assert throughput.knob_args("channels-last", "on") == (["--channels-last"], {})
    assert throughput.knob_args("channels-last", "off") == ([], {})
    with pytest.raises(ValueError, match="is a flag; sweep it as channels-last=off,on"):
        throughput.knob_args("channels-last", "maybe")


@pytest.mark.parametrize("args,message", [
    (["--sweep", "no-such-knob=1,2"], "the training options have no --no-such-knob"),
    (["--dataset", "digits", "--models", "resnet18"], "--models resnet18 needs larger images than the digits' 8x8"),
    (["--dataset", "digits", "--models", "convnet", "--image-size", "8"], "--image-size is for synthetic data"),
    (["--dataset", "digits", "--models", "convnet", "--steps", "500"], "is more than the 45 steps of one digits epoch"),
    (["--baselines", "bare,fastest"], "--baselines 'bare,fastest': choose from bare, bare-batched, independent"),
    (["--models", "convnet,resnet18", "--steps", "convnet=150"], "no --steps for resnet18; add resnet18=N"),
    (["--models", "convnet", "--", "--model", "mlp"], "--model after -- is set by the benchmark"),
])
def test_throughput_refuses_what_it_cannot_run_before_starting(capsys, tmp_path, args, message):
    assert throughput.main(["--np", "2", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_allreduce_refuses_an_algorithm_for_a_backend_without_open_mpi(capsys, tmp_path):
    assert allreduce.main(["--backends", "torch,mpi", "--mpi-algorithms", "ring", "--out", str(tmp_path)]) == 2
    assert "torch do not use Open MPI" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        allreduce.main(["--mpi-algorithms", "fastest", "--out", str(tmp_path)])
    assert "unknown fastest; choose from default" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_exact_modes_share_the_micro_batches_and_its_cost_pairs_the_runs_of_each_repeat():
    assert exact_cost.mode_args("exact", 2, 48, 8) == ["--reduction", "exact", "--global-batch", "48",
                                                      "--micro-batch", "8"]
    assert exact_cost.mode_args("allreduce", 2, 48, 8) == ["--batch-size", "8", "--accumulate", "3"]  # 48 / (8 x 2)

    def row(mode, repeats, values, median):
        return {"model": "convnet", "world_size": 2, "mode": mode, "repeats": repeats,
                "samples_per_s": {"values": values, "median": median}}

    (cost,) = exact_cost.step_time_ratios([row("allreduce", [1, 2, 3], [100.0, 90.0, 80.0], 90.0),
                                           row("exact", [1, 3], [50.0, 40.0], 45.0)])
    assert cost["step_time_ratio"] == 2.0  # 90 / 45
    assert cost["per_repeat"]["values"] == [2.0, 2.0]  # repeats 1 and 3 have both modes: 100/50, 80/40
    assert exact_cost.step_time_ratios([row("allreduce", [1], [1.0], 1.0)]) == []


def test_the_stop_check_is_the_smallest_torch_message_shared_by_the_steps_between_checks():
    assert [loop_overhead.steps_between_checks(s) for s in (2.0, 0.125, 2**-10, 1e-5)] == [1, 4, 512, 1000]
    found = {"series": [{"name": "mpi", "results": [{"time_s": 1e-6}]},
                        {"name": "torch-gloo", "results": [{"time_s": 3e-4}, {"time_s": 1.0}]},
                        {"name": "torch-gloo", "results": [{"time_s": 2e-4}]}]}
    assert loop_overhead.stop_check_seconds(found) == 2e-4
    assert loop_overhead.stop_check_seconds(None) is None
    assert loop_overhead.stop_check_seconds({"series": [{"name": "mpi", "results": [{"time_s": 1.0}]}]}) is None


def test_horovod_cycle_mean_idle_cpu_and_the_slowdown_of_the_summed_compute():
    row = horovod_cycle.summarised({"idle_cpu_per_s": [0.1, 0.3], "compute_s_without": [1.0, 1.5],
                                    "compute_s_with": [1.2, 1.8]})
    assert row["idle_cpu_mean"] == pytest.approx(0.2) and row["compute_slowdown"] == pytest.approx(0.2)  # 3 / 2.5 - 1


def test_the_probe_cost_is_from_the_medians():
    assert probe_cost.cost([10.0, 12.0, 11.0], [9.0, 9.9]) == pytest.approx(1 - 9.45 / 11.0)
    assert probe_cost.cost([], [1.0]) is None
    assert probe_cost.parse_cases("resnet18=224,convnet=32") == [("resnet18", 224), ("convnet", 32)]
    with pytest.raises(ValueError, match="--cases convnet=4: give MODEL=IMAGE_SIZE with a size of at least 8"):
        probe_cost.parse_cases("convnet=4")


def test_the_verdict_grid_counts_exactly_the_wrong_verdicts():
    from benchmarks.verdicts import summarise

    def case(name, kind, right):
        return {"name": name, "kind": kind, "judged": {f"{k}@{m:g}": {"correct": right[(k, m)]} for k, m in right}}

    right = {(1, 3.0): True, (2, 3.0): True, (1, 30.0): True, (2, 30.0): True}
    cases = [case("a", "same", {**right, (1, 3.0): False}), case("b", "real", {**right, (2, 30.0): False}),
             case("c", "real", right)]
    assert summarise(cases) == [
        {"floor_runs": 1, "margin": 3.0, "same": 1, "real": 2, "false_alarms": ["a"], "misses": []},
        {"floor_runs": 1, "margin": 30.0, "same": 1, "real": 2, "false_alarms": [], "misses": []},
        {"floor_runs": 2, "margin": 3.0, "same": 1, "real": 2, "false_alarms": [], "misses": []},
        {"floor_runs": 2, "margin": 30.0, "same": 1, "real": 2, "false_alarms": [], "misses": ["b"]}]


def test_a_result_is_under_load_by_the_cpu_others_used_and_the_load_average_only_without_it():
    left_behind = {"1m": 8.0, "5m": 1.0, "15m": 1.0}  # a finished run's load average, on 2 cores
    assert not under_load(left_behind, 2, busy_before=0.02)
    assert under_load({"1m": 0.0}, 2, busy_before=BUSY_LIMIT + 0.01) and not under_load({"1m": 0.0}, 2, BUSY_LIMIT)
    assert under_load(left_behind, 2) and not under_load({"1m": 0.5}, 2)  # no CPU share recorded: a quarter of cores


def test_settle_waits_for_half_the_under_load_limit_and_gives_up_at_its_limit():
    assert not quiet(BUSY_LIMIT) and not quiet(0.6 * BUSY_LIMIT) and quiet(0.5 * BUSY_LIMIT)
    busy = iter([0.9, 0.9, 0.0])
    waited, last = settle(5.0, poll_s=0.01, read_busy=lambda: next(busy))
    assert waited < 1.0 and last == 0.0 and next(busy, None) is None
    waited, last = settle(0.2, poll_s=0.01, read_busy=lambda: 0.9)
    assert 0.2 <= waited < 2.0 and last == 0.9


def test_a_job_gets_the_repository_importable_and_loses_a_variable_given_as_none(monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3")
    env = job_env({"HOROVOD_CYCLE_TIME": None, "OMP_NUM_THREADS": "1"})
    assert "HOROVOD_CYCLE_TIME" not in env and env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert job_env()["HOROVOD_CYCLE_TIME"] == "3"


@pytest.mark.parametrize("module, bad", [(allreduce, ["--backends", "nope"]), (throughput, ["--bogus"]),
                                         (exact_cost, ["--np", "two"]), (allreduce_worker, ["--backend", "nope"])])
def test_a_bad_option_is_one_line_and_exit_code_2(capsys, module, bad):
    with pytest.raises(SystemExit) as stopped:
        module.main(bad)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1, lines
    prog = f"python -m benchmarks.{module.__name__.split('.')[-1]}"
    assert lines[0].startswith(f"{prog}: error: ") and lines[0].endswith("(see --help)"), lines
