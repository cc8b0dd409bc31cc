"""BENCHMARKS.md's sections, targets and template on made-up results: known inputs, the exact markdown they give
(no process launched)."""

from __future__ import annotations

import json

import pytest

from benchmarks import sections, targets
from benchmarks.render import render
from benchmarks.sections import Results, framed, section


def header(benchmark, **fields):
    return {"benchmark": benchmark, "command": f"python -m benchmarks.{benchmark} --out benchmarks/results",
            "started": 1796000000.0, "cpu_busy_before": 0.02, "load_before": {"1m": 0.5}, "under_load": False,
            "failures": [], "machine": {"cpu_model": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "gpus": [],
                                        "versions": {"project_git": "a" * 40, "python": "3.11.7", "torch": "2.14.1",
                                                     "torchvision": "0.29.1", "horovod": "0.28.1"}}, **fields}


def lines(text):
    return text.splitlines()


def test_cells_round_to_significant_digits_without_exponents():
    assert [sections.rounded(v) for v in (2162.8, 15.43, 0.1362, 0, None, float("nan"))] == [
        "2163", "15.4", "0.136", "0", "–", "–"]
    assert [sections.ms(s) for s in (0.000138, 0.0153, 0.2181, None)] == ["0.14 ms", "15 ms", "218 ms", "–"]
    assert sections.spread_cell({"median": 1361.2, "min": 1227.0, "max": 1632.4}) == "1361 (1227–1632)"
    assert sections.spread_cell({"median": 7.03, "min": 7.03, "max": 7.03}) == "7.03"


def test_a_long_command_wraps_between_options_keeping_each_with_its_values():
    command = "python -m benchmarks.throughput --np 1,2 " + " ".join(f"--option-{i} value-{i}" for i in range(8))
    block = sections.command_block(command, width=60)
    assert lines(block) == ["```bash", "python -m benchmarks.throughput --np 1,2 --option-0 value-0 \\",
                            "    --option-1 value-1 --option-2 value-2 --option-3 value-3 \\",
                            "    --option-4 value-4 --option-5 value-5 --option-6 value-6 \\",
                            "    --option-7 value-7", "```"]


def allreduce_result(algorithms=(None,)):
    def series(name, np, algorithm):
        rows = [{"bytes": 4, "time_s": 1.2e-3, "busbw_GBps": 3e-6, "busbw_of_limit": 2e-7},
                {"bytes": 2**20, "time_s": 2.0e-3, "busbw_GBps": 0.524, "busbw_of_limit": 0.0524}]
        return {"name": name, "world_size": np, "mpi_algorithm": algorithm, "results": rows}

    return header("allreduce", memcpy={"limit_GBps": 10.0, "limit": "CPU memory copy", "cpu_1thread_GBps": 8.0,
                                       "cpu_all_cores_GBps": 10.0},
                  floor={"bytes": 2**19, "copy_GBps": 12.0, "add_GBps": 6.0, "busbw_GBps": 4.0, "of_limit": 0.4},
                  series=[series(n, 2, a) for a in algorithms for n in ("mpi", "horovod-mpi")])


def test_allreduce_gives_the_bounds_then_time_and_busbw_by_size_or_by_algorithm():
    text = sections.allreduce(allreduce_result(), "4,1M")
    assert lines(text) == [
        "Memory-copy limit: 10.0 GB/s (CPU memory copy; one thread 8.0 GB/s, all cores 10.0 GB/s). Copy/add floor: one "
        "thread copies 12.0 GB/s and adds 6.0 GB/s on 512 KB buffers, so a copy-based ring allreduce reaches at most "
        "4.0 GB/s busbw, 40% of the limit (at least 0.26 ms for 1 MB at world size 2).", "",
        "| size | Open MPI alone x2 | Horovod/MPI x2 |", "|---|---|---|",
        "| 4 B | 1.2 ms | 1.2 ms |", "| 1 MB | 2.0 ms, 0.52 GB/s (5%) | 2.0 ms, 0.52 GB/s (5%) |"]
    assert lines(sections.allreduce(allreduce_result(["default", "ring"])))[2:] == [
        "At 1 MB:", "", "| algorithm | Open MPI alone x2 | Horovod/MPI x2 |", "|---|---|---|",
        "| default | 2.0 ms, 0.52 GB/s (5%) | 2.0 ms, 0.52 GB/s (5%) |",
        "| ring | 2.0 ms, 0.52 GB/s (5%) | 2.0 ms, 0.52 GB/s (5%) |"]


def throughput_result(knob=None):
    def case(value):
        runs = [{"label": "horovod-gloo", "backend_options": {"cycle_time_ms": 20.0, "cycle_time_source": "hvd_train"}}]
        cell = {"median": 100.0, "min": 90.0, "max": 110.0, "job_cpu_s": 30.2}
        return {"name": "resnet18", "model": "resnet18", "image_size": 32, "knob": knob, "value": value, "runs": runs,
                "throughput": {"horovod-gloo@2": cell, "ddp@1": {**cell, "median": 60.0, "min": 60.0, "max": 60.0},
                               "ddp@2": cell},
                "scaling_efficiency": {"ddp": {"1": 1.0, "2": 100 / 120}}, "exchange_overhead": {"ddp": {"2": 0.05}},
                "loop_ratio": {"2": 1.0123}, "loop_ratio_batched": {},
                "time_split": {"ddp@2": {"comm_ms": 1.234, "step_ms": 80.05, "data_frac": 0.012}}}

    settings = {"dataset": "synthetic", "batch_size": 16, "steps": {"resnet18": 12}, "repeats": 3,
                "extra_train_args": ["--threads", "1"], "world_sizes": [1, 2], "backends": ["ddp", "horovod-gloo"]}
    return header("throughput", settings=settings, cases=[case("auto"), case("5")] if knob else [case(None)])


def test_throughput_shows_every_cell_and_leaves_out_the_empty_columns():
    assert lines(sections.throughput(throughput_result())) == [
        "Synthetic data, per-rank batch 16, 12 steps per run (the first not timed), median (min–max) of 3 repeat(s), "
        "every run with `--threads 1`.", "",
        "| case | run | world size | samples/s | scaling eff. | exchange overhead | loop / bare (seed) | comm ms/step "
        "| step ms | data % | job CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|",
        "| resnet18 32x32 | DDP | 1 | 60.0 | 1.00 | – | – | – | – | – | 30 |",
        "|  | DDP | 2 | 100 (90–110) | 0.83 | 5.0% | 1.01 | 1.2 | 80.0 | 1.2% | 30 |",
        "|  | Horovod/Gloo | 2 | 100 (90–110) | – | – | – | – | – | – | 30 |"]


def test_a_sweep_names_each_setting_and_the_value_its_runs_used():
    table = lines(sections.throughput(throughput_result("HOROVOD_CYCLE_TIME")))
    assert table[2].startswith("| case | HOROVOD_CYCLE_TIME used | run |")
    assert table[4].startswith("| resnet18 32x32, HOROVOD_CYCLE_TIME unset (auto) | 20 ms (hvd_train) | DDP | 1 |")
    assert table[7].startswith("| resnet18 32x32, HOROVOD_CYCLE_TIME=5 | 20 ms (hvd_train) | DDP | 1 |")
    assert table[5].startswith("|  |  | DDP | 2 |")


def test_the_other_sections_on_known_results():
    loop = header("loop_overhead", rows=[{"model": "convnet", "image_size": 32, "batch_size": 16, "step_s": 0.01,
                                          "costs_s": {"lr schedule": 1e-6, "train meters": 2.5e-5},
                                          "total_s": 2.6e-5, "share_of_step": 0.0026}])
    assert lines(section(loop))[2:] == [
        "| piece | convnet 32x32: µs per step | share of its step (10 ms) |", "|---|---|---|",
        "| lr schedule | 1.0 | 0.010% |", "| train meters | 25 | 0.250% |", "| **total** | **26.0** | **0.260%** |"]
    hook = header("ddp_comm_hook", settings={"model": "convnet", "image_size": 32, "batch_size": 16, "world_size": 2},
                  rows=[{"run": 1, "builtin_ms": 10.0, "python_hook_ms": 10.5, "hook_cost": 0.05}])
    assert lines(section(hook))[-1] == "| 1 | 10.00 | 10.50 | +5.0% |"
    probe = header("probe_cost", settings={"world_size": 2, "launcher": "torchrun", "batch_size": 16, "threads": 1,
                                           "steps": 12, "repeats": 2},
                   rows=[{"model": "resnet18", "image_size": 224, "bare_samples_per_s": [10.0, 12.0],
                          "probed_samples_per_s": [9.8, 11.0], "cost": 0.0509}])
    assert lines(section(probe))[-1] == "| resnet18 224x224 | 10.0 12.0 | 9.8 11.0 | +5.1% |"
    cycle = header("horovod_cycle", rows=[
        {"controller": "mpi", "cycle_time_ms": 5.0, "idle_cpu_mean": 0.25, "idle_cpu_per_s": [0.2, 0.3],
         "compute_slowdown": -0.02, "mpi_yield_when_idle": "1"},
        {"controller": "gloo", "cycle_time_ms": 1.0, "idle_cpu_mean": 0.08, "idle_cpu_per_s": [0.08, 0.08],
         "compute_slowdown": 0.1}])
    assert lines(section(cycle))[2:] == ["| mpi | 5 ms | 25 (20 / 30) | -2% | yields |",
                                         "| gloo | 1 ms | 8 (8 / 8) | +10% |  |"]
    stop = header("stop_latency", settings={"np": 2, "train_args": ["--model", "mlp"], "steps_before": 2,
                                            "bound": "15 s + one step"},
                  rows=[{"launcher": "torchrun", "step_s": 2.04, "ranks_exit_s": None, "launcher_exit_s": 30.0,
                         "bound_s": 17.04, "within_bound": False, "checkpoint_written": False, "exit_code": None}])
    assert lines(section(stop))[-1] == "| torchrun | 2.0 | – | 30.0 | 17.0 | no | **none** | None |"
    port = header("port_speed", settings={"repeats": 5}, target_s=1.0,
                  rows=[{"lines": 300, "rewrite_median_s": 0.4321, "command_median_s": 1.2}])
    assert lines(section(port))[-1] == "| 300 | 0.432 | 1.200 | < 1 | no |"
    ended = header("port_exit", settings={"runs": 50, "np": 2}, target_aborts=0, rows=[
        {"variant": "module", "ending": "port", "runs": 50, "exits": {"0": 50}, "aborts": 0, "as_expected": 50,
         "expected_exit": 0},
        {"variant": "module", "ending": "no-end", "runs": 50, "exits": {"0": 47, "1": 3}, "aborts": 3,
         "as_expected": 47, "expected_exit": 0}])
    assert lines(section(ended)) == [
        "50 runs of each at 2 ranks under torchrun, one after another:", "",
        "| script | the port | runs | exit codes (runs) | aborted | ended as meant | no abort |",
        "|---|---|---|---|---|---|---|",
        "| module | as written | 50 | 0 (50) | 0 | 50 (exit 0) | yes |",
        "| module | without its end | 50 | 0 (47), 1 (3) | 3 | 47 (exit 0) |  |"]


def test_exact_cost_pairs_the_modes_and_gives_the_error_and_the_distance():
    speed = [{"model": "convnet", "world_size": 2, "mode": mode, "samples_per_s": {"median": m, "min": m, "max": m},
              "comm_ms": None, "bytes_per_step": b}
             for mode, m, b in (("allreduce", 200.0, 2**20), ("exact", 100.0, 2**21))]
    result = header("exact_cost", settings={"launcher": "torchrun", "global_batch": 48, "micro_batch": 8, "threads": 1,
                                            "steps": 6, "repeats": 2, "image_sizes": {"convnet": 32}},
                    speed=speed, cost=[{"model": "convnet", "world_size": 2, "step_time_ratio": 2.0,
                                        "per_repeat": {"min": 1.9, "max": 2.1}}],
                    fixed_point_error=[{"model": "convnet", "micro_batches": 6, "fixed_point": 1.2e-9,
                                        "float32_sum": 3.4e-7}],
                    distance={"world_size": 3, "settings": "defaults", "max_abs_weight_diff": 0.0123,
                              "largest_weight": 1.5, "val_top1": {"allreduce": 0.98, "exact": 0.975}})
    text = lines(section(result))
    assert "| convnet 32x32 | 2 | 200 | 100 | 2.00x | 1.90–2.10x | – | – | 1 MB | 2 MB |" in text
    assert "| convnet | 6 | 1.2e-09 | 3.4e-07 |" in text
    assert text[-1].endswith("differ by at most 1.23e-02 (largest weight 1.50); val top-1: allreduce 0.9800, "
                             "exact 0.9750.")


def test_the_horovod_api_and_suite_sections_read_their_json():
    api = header("horovod_api", model="resnet18", image_size=224, batch_size=32, np=2, threads_per_rank=1, repeats=3,
                 backends={"api": {"img_s": [10.0, 11.0, 12.0], "median": 11.0, "spread": 0.2},
                           "horovod-gloo": {"img_s": [10.0], "median": 10.0, "spread": 0.0}},
                 ratios={"api/horovod-gloo": 1.1})
    assert lines(section(api))[-2:] == ["| the Horovod API (torchrun) | 11.00 | 20.0% | 10.00 11.00 12.00 | – |",
                                        "| Horovod/Gloo | 10.00 | 0.0% | 10.00 | 1.100 |"]
    passed = {"outcome": "passed", "message": ""}
    suite = header("horovod_suite", test_file="test/parallel/test_torch.py", horovod_revision="b" * 40, tests=3,
                   test_timeout_s=60.0, runs=[{"label": "api", "np": 2, "counts": {"passed": 2, "hung": 1},
                                               "seconds": 95.4, "launches": 2}],
                   results={"test_torch.py::TorchTests::test_a": {"api@2": passed, "horovod-mpi@2": passed},
                            "test_torch.py::TorchTests::test_b": {
                                "api@2": {"outcome": "failed", "message": "/x/y/torch/optim/_muon.py:134: ValueError"},
                                "horovod-mpi@2": {"outcome": "hung", "message": ""}}},
                   examples={"pytorch_mnist": {"2": {"horovod-gloo": {"returncode": 0, "seconds": 6.3},
                                                     "api": {"returncode": 1, "seconds": 2.0},
                                                     "weights": {"compared": False}}}})
    text = lines(section(suite))
    assert "| the Horovod API (torchrun) | 2 | 2 | 0 | 0 | 0 | 1 | 0 | 0 | 95 | 2 |" in text
    assert [line for line in text if line.startswith("- ")] == [
        "- `test_b`: 2 ranks: failed (_muon.py:134: ValueError); real Horovod: Horovod/MPI at 2: hung"]
    assert text[-1] == "| pytorch_mnist.py, 2 ranks | ran (6 s) | **exit code 1** | – |"


def verdicts_result():
    def case(name, kind, ratio, right, step=None):
        judged = {"largest_band_ratio": {"ratio": ratio}, "branches": {"weights": 40} if step else {},
                  "trains_differently_from": step, "correct": right, "departure_ratio": 50.0}
        return {"name": name, "kind": kind, "what": f"the {name} pair", "setting": "convnet, 3 ranks",
                "expected_step": step, "judged": {"3@30": judged, "1@30": judged}}

    grid = [{"floor_runs": k, "margin": 30.0, "same": 2, "real": 1, "false_alarms": ["adam"] if k == 1 else [],
             "misses": []} for k in (1, 3)]
    return header("verdicts", settings={"max_floor": 3, "margins": [30.0]}, grid=grid,
                  cases=[case("ddp-gloo", "same", 1.8, True), case("adam", "same", 3.1, True),
                         case("lr+5%", "real", 63.0, True, step=2)])


def test_verdicts_count_the_grid_and_judge_every_pair_at_the_defaults():
    text = lines(section(verdicts_result()))
    assert text[0].startswith("3 pairs (2 same-training, 1 with one real difference)")
    assert "| 1 | 30 | 1 of 2 | 0 of 1 | adam |" in text and "| 3 | 30 | 0 of 2 | 0 of 1 | – |" in text
    assert "| lr+5% | the lr+5% pair | convnet, 3 ranks | differs from step 2 | 63 | weights at 40 | 2 | yes |" in text


def test_a_section_lists_its_failed_runs_and_framing_names_the_source_and_its_revision(tmp_path):
    result = {**verdicts_result(), "under_load": True,
              "failures": [{"launcher": "torchrun", "world_size": 3, "error": "exited 1\nTraceback"}]}
    assert section(result).endswith("\n\n- **FAILED** torchrun x3: exited 1")
    (tmp_path / "verdicts.json").write_text(json.dumps(result))
    text = lines(framed(Results(tmp_path), "verdicts.json"))
    assert text[:3] == ["```bash", "python -m benchmarks.verdicts --out benchmarks/results", "```"]
    assert text[-1] == ("Source: `benchmarks/results/verdicts.json` (measured 2026-11-30 at aaaaaaaaaaaa, 2% of the "
                        "CPU busy in the second before starting, 1-minute load 0.5, **under load**).")
    assert framed(Results(tmp_path), "none.json") == \
        "_Not measured yet: `benchmarks/run_all.sh` writes `benchmarks/results/none.json`._"


def test_the_template_is_filled_keeping_a_list_items_indentation_and_a_bad_placeholder_is_named(tmp_path):
    (tmp_path / "verdicts.json").write_text(json.dumps(verdicts_result()))
    results = Results(tmp_path)
    text = render("1. A list item:\n\n   {{verdicts.json}}\n\nTarget {{target loop_ratio}}.\n", results)
    assert "\n   | 1 | 30 | 1 of 2 | 0 of 1 | adam |\n" in text and text.endswith("\n\nTarget 1.02.\n")
    assert "\n\n   Source: `benchmarks/results/verdicts.json`" in text
    assert render("{{machines}}", results) == (
        "- AMD EPYC (model name in `/proc/cpuinfo`), 2 cores, 23.5 GiB, no GPU; Python 3.11.7, torch 2.14.1, "
        "torchvision 0.29.1, Horovod 0.28.1 (every result below).")
    with pytest.raises(ValueError, match=r"\{\{verdicts.json 3\}\}"):
        render("{{verdicts.json 3}}", results)  # the verdicts section takes no option


def test_the_exchange_overhead_target_holds_each_backend_to_its_limit_at_one_thread_per_rank():
    def result(threads):
        runs = [{"world_size": 2, "threads": threads}, {"world_size": 1, "threads": 2}]
        overhead = {"ddp": {"2": 0.02}, "horovod-mpi": {"2": 0.031}, "horovod-gloo": {"2": 0.059}}
        return {"cases": [{"model": "resnet18", "image_size": 224, "runs": runs, "exchange_overhead": overhead}]}

    assert targets.overhead_target(result(1)) == ("DDP 2.0%, Horovod/MPI 3.1%, Horovod/Gloo 5.9%",
                                                  "DDP (≤ 3%) yes, Horovod/MPI (≤ 3%) no, Horovod/Gloo (≤ 6%) yes")
    assert targets.overhead_target(result(2)) == ("resnet18 224x224 at one thread per rank not measured",
                                                  "not measured")


def repeat_run(label, world, repeat, sps, each=None):
    found = {"label": label, "world_size": world, "repeat": repeat, "samples_per_s": sps, "threads": 1}
    return {**found, "process_samples_per_s": each} if each else found


def test_the_overhead_target_says_how_much_the_independent_processes_unequal_pace_explains():
    runs = [repeat_run("independent", 2, 1, 10.0, [6.0, 4.0]), repeat_run("independent", 2, 2, 10.0, [5.0, 5.0]),
            repeat_run("independent", 2, 3, 12.0, [6.6, 5.4]), *(repeat_run(label, 2, r, 9.0) for r in (1, 2, 3)
                                                                  for label in targets.OVERHEAD_TARGET)]
    case = {"model": "resnet18", "image_size": 224, "runs": runs,
            "exchange_overhead": {label: {"2": 0.1} for label in targets.OVERHEAD_TARGET}}
    shown, verdict = targets.overhead_target({"cases": [case]})
    # 1 - 2 x 4 / 10 = 20%, 0% for equal processes, 1 - 2 x 5.4 / 12 = 10%: the median is 10%
    assert shown.endswith("; the independent processes' unequal pace (2 x the slower against their sum) costs 10.0% "
                          "(per repeat 0.0%–20.0%)")
    assert verdict == "DDP (≤ 3%) no, Horovod/MPI (≤ 3%) no, Horovod/Gloo (≤ 6%) no"


def test_a_target_is_judged_per_repeat_and_undecided_when_the_repeats_fall_on_both_sides():
    runs = [repeat_run("independent", 2, 1, 10.0), repeat_run("independent", 2, 2, 20.0),
            repeat_run("ddp", 2, 1, 9.8), repeat_run("ddp", 2, 2, 19.2), repeat_run("horovod-gloo", 2, 1, 9.0),
            repeat_run("horovod-gloo", 2, 2, 18.0), repeat_run("horovod-mpi", 2, 1, 9.9),
            repeat_run("horovod-mpi", 2, 2, 19.6), repeat_run("ddp", 1, 1, 5.0), repeat_run("ddp", 1, 2, 10.0),
            repeat_run("bare-ddp-batched", 1, 1, 5.05), repeat_run("bare-ddp-batched", 1, 2, 10.4),
            repeat_run("bare-ddp", 1, 1, 5.0), repeat_run("bare-ddp", 1, 2, 10.0)]
    case = {"name": "resnet18", "model": "resnet18", "image_size": 224, "runs": runs,
            "exchange_overhead": {"ddp": {"2": 0.03}, "horovod-gloo": {"2": 0.1}, "horovod-mpi": {"2": 0.015}},
            "loop_ratio": {"1": 1.0}, "loop_ratio_batched": {"1": 1.03}}
    shown, verdict = targets.overhead_target({"cases": [case]})
    assert "DDP 3.0% (per repeat 2.0%–4.0%)" in shown and "unequal pace" not in shown
    assert verdict == "DDP (≤ 3%) undecided, Horovod/MPI (≤ 3%) yes, Horovod/Gloo (≤ 6%) no"
    shown, verdict = targets.loop_target({"cases": [case]})
    assert "x1 batched: 1.03 (per repeat 1.01–1.04)" in shown and verdict == "seed: yes, batched: undecided"
    exact = {"settings": {"image_sizes": {"resnet18": 224}},
             "cost": [{"model": "resnet18", "world_size": 2, "step_time_ratio": 1.12,
                       "per_repeat": {"values": [1.12, 1.15, 1.13]}},
                      {"model": "resnet18", "world_size": 3, "step_time_ratio": 1.05,
                       "per_repeat": {"values": [1.05, 1.2]}}]}
    assert targets.exact_target(exact) == ("x2 1.12x (per repeat 1.12–1.15), x3 1.05x (per repeat 1.05–1.20)", "no")
    probe = {"rows": [{"model": "resnet18", "image_size": 224, "cost": 0.021, "bare_samples_per_s": [10.0, 10.0],
                       "probed_samples_per_s": [9.9, 9.7]}]}
    assert targets.probe_target(probe) == ("+2.1% (per repeat +1.0% to +3.0%)", "undecided")


def test_the_targets_table_says_not_measured_while_a_result_is_missing(tmp_path):
    (tmp_path / "allreduce.json").write_text(json.dumps(allreduce_result()))
    rows = lines(targets.targets(Results(tmp_path)))
    assert len(rows) == 2 + len(targets.ROWS)
    assert rows[2].endswith("| not measured | not measured |")
    # no series measured 64 MB: the floor alone, and Horovod/MPI's busbw not judged
    assert rows[5].endswith("| copy/add floor 4.0 GB/s = 40% (`benchmarks/results/allreduce.json`) | not measured |")
