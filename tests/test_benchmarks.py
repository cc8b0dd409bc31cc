"""The benchmark scripts where only running them shows something: one launch under each launcher kind (torchrun,
horovodrun --gloo and --mpi, mpirun), the workers and loops run in this process at world size 1, the comparison
report reading their results, run_all.sh's steps and which results benchmarks.stale calls current. The arithmetic and
the rendering are in tests/unit/test_benchmark_*.py, on made-up inputs.

Timings are never asserted: a figure is checked against what it is computed from (a run's summary.json, the
definitions), so that a figure computed wrongly fails."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from launched import PY, REPO, compare_in_process, run_cmd
from benchmarks.machine import BUSY_LIMIT
from benchmarks.stale import run_all_steps
from common import launch
from common.rundir.names import CONFIG_FILE, SUMMARY_FILE

RESULTS = REPO / "benchmarks" / "results"
RUN_ALL = REPO / "benchmarks" / "run_all.sh"
#: exported to the benchmarks: an `auto` sweep value must take it away from the job
EXPORTED_CYCLE_TIME = "3"


def assert_real_image(path: Path) -> None:
    with Image.open(path) as img:
        assert img.width > 300 and img.height > 200, path
        lo, hi = img.convert("L").getextrema()
        assert lo < hi, f"{path} is one flat colour"


def assert_header(data: dict, benchmark: str, argv: list) -> None:
    """The fields every result records: the machine, the exact command, the load."""
    m = data["machine"]
    assert data["benchmark"] == benchmark and data["command"] == " ".join(["python", "-m", f"benchmarks.{benchmark}",
                                                                           *argv])
    assert m["cpu_model"] and m["cores"] == os.cpu_count() and m["versions"]["torch"] and m["versions"]["horovod"]
    assert "Open MPI" in m["versions"]["mpi"] and data["failures"] == []
    assert 0 <= data["cpu_busy_before"] <= 1 and data["under_load"] == (data["cpu_busy_before"] > BUSY_LIMIT)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One allreduce run (mpirun and horovodrun --mpi) and one throughput run (horovodrun --gloo and torchrun),
    started together: {name: (folder, argv, printed output)}."""
    out = tmp_path_factory.mktemp("bench")
    commands = {
        "allreduce": ["--np", "2", "--backends", "mpi,horovod-mpi", "--mpi-algorithms", "ring", "--min-bytes", "4K",
                      "--max-bytes", "16K", "--iters", "2", "--warmup", "1", "--copy-bytes", "1M", "--out",
                      str(out / "ar")],
        "throughput": ["--np", "1", "--backends", "horovod-gloo", "--baselines", "bare-batched", "--models", "convnet",
                       "--image-size", "8", "--batch-size", "4", "--steps", "3", "--repeats", "1", "--sweep",
                       "HOROVOD_CYCLE_TIME=auto", "--out", str(out / "tp"), "--work", str(out / "tp" / "runs"), "--",
                       "--threads", "1"]}
    env = {**launch.job_env(), "PYTHONPATH": str(REPO), "HOROVOD_CYCLE_TIME": EXPORTED_CYCLE_TIME}
    jobs = {name: launch.Job([PY, "-m", f"benchmarks.{name}", *argv], env=env, cwd=REPO, log=out / f"{name}.log")
            for name, argv in commands.items()}
    found = {}
    for name, job in jobs.items():
        try:
            assert job.wait(timeout=600) == 0, job.output[-4000:]
        finally:
            job.stop()
        found[name] = (out / ("ar" if name == "allreduce" else "tp"), commands[name], job.output)
    return found


def test_allreduce_under_mpirun_and_horovodrun_with_the_algorithm_chosen(measured):
    folder, argv, output = measured["allreduce"]
    data = json.loads((folder / "allreduce.json").read_text())
    assert_header(data, "allreduce", argv)
    floor, limit = data["floor"], data["memcpy"]["limit_GBps"]
    assert floor["bytes"] == 2**19 and floor["busbw_GBps"] == pytest.approx(2 / (2 / floor["copy_GBps"] +
                                                                                1 / floor["add_GBps"]))
    alone, horovod = data["series"]
    # Open MPI alone keeps its own waiting; Horovod's ranks wait as hvd_train makes them; the algorithm reached both.
    assert (alone["name"], alone["launcher"], alone["mpi_yield_when_idle"]) == ("mpi", "mpirun", None)
    assert (horovod["name"], horovod["launcher"], horovod["mpi_yield_when_idle"]) == (
        "horovod-mpi", "horovodrun-mpi", "1")
    for series in (alone, horovod):
        assert (series["world_size"], series["mpi_algorithm"], series["mpi_algorithm_env"]) == (2, "ring", "4")
        assert [r["bytes"] for r in series["results"]] == [4096, 16384]
        for r in series["results"]:
            # nccl-tests' definitions at world size 2: busbw = algbw x 2(n-1)/n = algbw = bytes / time
            assert r["iterations"] == 2 and r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
            assert r["busbw_of_limit"] == pytest.approx(r["busbw_GBps"] / limit)
            assert r["floor_time_s"] == pytest.approx(r["bytes"] / floor["busbw_GBps"] / 1e9)
    assert_real_image(folder / data["plot"])
    assert "| ring | " in output and f"wrote {folder / 'allreduce.json'}" in output  # it printed its section


def test_throughput_under_horovodrun_and_torchrun_leaves_auto_to_the_program(measured):
    folder, argv, output = measured["throughput"]
    data = json.loads((folder / "throughput.json").read_text())
    assert_header(data, "throughput", argv)
    (case,) = data["cases"]
    assert (case["knob"], case["value"], case["env"]) == ("HOROVOD_CYCLE_TIME", "auto", {"HOROVOD_CYCLE_TIME": None})
    runs = {r["label"]: r for r in case["runs"]}
    assert set(runs) == {"horovod-gloo", "bare-ddp-batched"}  # auto sets nothing: the bare loop runs in it
    hvd, bare = runs["horovod-gloo"], runs["bare-ddp-batched"]
    assert "horovodrun" in hvd["command"] and "-m hvd_train" in hvd["command"]
    assert "torchrun" in bare["command"] and "benchmarks.bare_ddp --data-path batched" in bare["command"]
    # The exported cycle time did not reach the auto run: hvd_train chose (convnet is small: Horovod's 1 ms).
    assert (hvd["backend_options"]["cycle_time_ms"], hvd["backend_options"]["cycle_time_source"]) == (
        1.0, "Horovod's default")
    for run in runs.values():
        summary = json.loads((Path(run["run_dirs"][0]) / SUMMARY_FILE).read_text())
        # Each figure is its run's own; the options after -- reached the bare loop as well.
        assert (run["samples_per_s"], run["time_split"], run["steps"], run["threads"]) == (
            summary["samples_per_s"], summary.get("time_split"), 3, 1)
        assert case["throughput"][f"{run['label']}@1"]["median"] == run["samples_per_s"]
    assert json.loads((Path(hvd["run_dirs"][0]) / CONFIG_FILE).read_text())["config"]["threads"] == 1
    assert case["scaling_efficiency"] == {"horovod-gloo": {"1": 1.0}, "bare-ddp-batched": {"1": 1.0}}
    assert (case["loop_ratio"], case["loop_ratio_batched"], case["exchange_overhead"]) == ({}, {}, {})
    assert case["time_split"]["horovod-gloo@1"] == hvd["time_split"]
    assert_real_image(folder / data["plot"])
    assert "| 1 ms (Horovod's default) |" in output


def test_the_report_shows_the_benchmarks_beside_the_runs_it_compares(measured, tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    for folder, _, _ in measured.values():
        for file in folder.glob("*.*"):
            (bench / file.name).write_bytes(file.read_bytes())
    tp = json.loads((bench / "throughput.json").read_text())
    run = tp["cases"][0]["runs"][0]["run_dirs"][0]
    assert compare_in_process("--runs", run, "--bench", bench, "--out", tmp_path / "report").returncode == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Allreduce bandwidth\n" in report and "Training throughput\n" in report
    for series in json.loads((bench / "allreduce.json").read_text())["series"]:
        assert f"{series['results'][-1]['busbw_GBps']:.2f} GB/s" in report
    assert f"| horovod-gloo | 1 | {tp['cases'][0]['throughput']['horovod-gloo@1']['median']:.1f}" in report
    for name in ("bench_allreduce.png", "bench_throughput.png"):
        assert f"]({name})" in report
        assert (tmp_path / "report" / name).read_bytes() == (bench / name[len("bench_"):]).read_bytes()
    refused = compare_in_process("--runs", run, "--bench", tmp_path / "nothing", "--out", tmp_path / "x")
    assert refused.returncode == 2 and "no allreduce.json or throughput.json" in refused.output


@pytest.fixture
def one_rank(monkeypatch):
    """This process as the one rank of a torch.distributed job, as torchrun would set it up: call it before each
    process group (each gets a port of its own)."""
    def rank() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
            monkeypatch.setenv(name, value)

    return rank


def test_the_bare_loop_times_every_step_but_the_first(one_rank, tmp_path):
    from benchmarks import bare_ddp

    one_rank()
    assert bare_ddp.main(["--data-path", "seed", "--model", "convnet", "--dataset", "synthetic", "--image-size", "8",
                          "--batch-size", "4", "--max-steps", "3", "--threads", "1", "--run-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert (summary["data_path"], summary["steps"], summary["world_size"], summary["threads"]) == ("seed", 3, 1, 1)
    assert summary["samples_per_s"] == pytest.approx((3 - 1) * 4 / summary["train_s"])


def test_the_allreduce_worker_and_the_ab_workers_in_one_process(one_rank, tmp_path):
    from argparse import Namespace

    from benchmarks import allreduce_worker, ddp_comm_hook, probe_cost

    one_rank()
    comm = allreduce_worker.torch_comm()
    try:
        results = allreduce_worker.measure(comm, [4, 1024], warmup=1, iters=lambda nbytes: 3)
    finally:
        comm.shutdown()
    assert [(r["bytes"], r["iterations"]) for r in results] == [(4, 3), (1024, 3)]
    for r in results:  # one rank: nothing crosses a link
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9) and r["busbw_GBps"] == 0
    hook = Namespace(model="convnet", image_size="8", batch_size=4, blocks=1, steps=3, result=tmp_path / "hook.json")
    one_rank()
    assert ddp_comm_hook.worker(hook) == 0
    assert set(json.loads(hook.result.read_text())) == {"builtin_ms", "python_hook_ms"}
    script = Namespace(model="convnet", image_size="8", batch_size=4, steps=3, threads=1, result=tmp_path / "p.json")
    one_rank()
    assert probe_cost.worker(script) == 0
    assert set(json.loads(script.result.read_text())) == {"samples_per_s"}


def test_loop_overhead_and_the_fixed_point_error_in_one_process():
    from benchmarks import exact_cost, loop_overhead

    row = loop_overhead.measure("convnet", 8, 4, 1, repeats=3, stop_check_s=1e-3)
    assert row["costs_s"][loop_overhead.STOP_CHECK] == pytest.approx(1e-3 / row["stop_check_every"])
    assert row["total_s"] == pytest.approx(sum(row["costs_s"].values()))
    assert row["share_of_step"] == pytest.approx(row["total_s"] / row["step_s"])
    assert set(row["costs_s"]) == {"lr schedule", "train meters", "loss.item()", "weight fingerprint (rank 0)",
                                   "metrics.jsonl step line", "activity notes", loop_overhead.STOP_CHECK}
    error = exact_cost.fixed_point_error("convnet", 8, global_batch=8, micro_batch=4)
    assert error["micro_batches"] == 2 and 0 <= error["fixed_point"] < 1e-6 and 0 <= error["float32_sum"] < 1e-3


# ---- run_all.sh, the committed results, and which are current ----

def test_every_committed_result_is_written_by_a_step_of_run_all_and_quick_writes_the_same():
    committed = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json")}
    full = set(run_all_steps("full"))
    assert committed <= full, f"no step of run_all.sh writes {sorted(committed - full)}"
    assert set(run_all_steps("quick")) == full, "QUICK=1 and the full run must write the same files"
    for png in RESULTS.rglob("*.png"):
        assert any(png.parent == (RESULTS / name).parent for name in committed), f"{png} has no result beside it"
    for name in committed:
        assert json.loads((RESULTS / name).read_text())["command"].split()[:3] == [
            "python", "-m", f"benchmarks.{Path(name).stem}"]
    assert os.access(RUN_ALL, os.X_OK)
    for variable in ("QUICK", "OUT", "WORK", "REPORT", "PYTHON", "SETTLE_S", "HOROVOD_SRC"):
        assert "${" + variable in RUN_ALL.read_text()


def test_named_steps_run_alone_and_an_unknown_name_is_refused(tmp_path):
    """PYTHON=echo prints each step's command instead of running it."""
    env = {"OUT": str(tmp_path), "PYTHON": "echo", "HOROVOD_SRC": str(tmp_path / "no-checkout")}
    refused = run_cmd(["bash", str(RUN_ALL), "loop_overhead.json", "nothing.json"], env=env, timeout=60)
    assert refused.returncode == 2, refused.output
    (line,) = refused.output.strip().splitlines()
    assert "error: no step writes nothing.json" in line and "scaling-1thread/throughput.json" in line, line
    full = run_cmd(["bash", str(RUN_ALL), "loop_overhead.json", "horovod_api.json"], env=env, timeout=60)
    assert full.returncode == 0, full.output
    assert full.output.splitlines() == [
        "-m benchmarks.settle --max-s 300", "benchmarks: loop_overhead.json",
        f"-m benchmarks.loop_overhead --models convnet,resnet18 --repeats 300 --out {tmp_path}",
        f"benchmarks: skipped horovod_api.json: no Horovod checkout at {tmp_path / 'no-checkout'}",
        f"benchmarks: results in {tmp_path}"]  # named steps skip the comparison report unless REPORT=1
    quick = run_cmd(["bash", str(RUN_ALL), "exact_cost.json"], env={**env, "QUICK": "1", "WORK": "W"}, timeout=60)
    assert quick.output.splitlines()[0] == (
        "-m benchmarks.exact_cost --np 1,2 --models convnet --global-batch 8 --micro-batch 4 --steps 2 --repeats 2 "
        f"--no-distance --out {tmp_path} --work W/exact")


#: in a clean clone: a complete run of the last revision that changed the training is reused without a launch; one
#: cut short, or made by other training code, by changes not committed or by a revision unknown here, is not
VERDICTS_REUSE = """if True:
    import hashlib, json, subprocess, sys
    from pathlib import Path
    from benchmarks import stale
    from benchmarks.verdicts import Runner, reusable
    same, before = subprocess.run(["git", "log", "-2", "--format=%H", "--", *stale.training_inputs()],
                                  capture_output=True, text=True, check=True).stdout.split()
    args = ["--model", "mlp", "--threads", "1"]
    digest = hashlib.sha256(json.dumps(["torchrun", 1, args]).encode()).hexdigest()[:12]
    run = Path(sys.argv[1]) / f"torchrun-1-{digest}"  # where the Runner keeps this run
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"versions": {"project_git": same}}))
    assert not reusable(run)
    (run / "summary.json").write_text("{}")
    runner = Runner(run.parent, timeout_s=60)
    assert reusable(run) and runner.run("torchrun", 1, args) == run and runner.launched == 0
    for other in (before, same + "-dirty", "b" * 40, None):
        (run / "config.json").write_text(json.dumps({"versions": {"project_git": other}}))
        assert not reusable(run), other
    print("reused")
"""


def test_stale_says_which_results_to_measure_again_and_why(tmp_path):
    clone = tmp_path / "clone"
    assert run_cmd(["git", "clone", "-q", str(REPO), str(clone)]).returncode == 0
    head = run_cmd(["git", "-C", str(clone), "rev-parse", "HEAD"]).output.strip()
    steps, results = run_all_steps(), tmp_path / "results"
    for name, revision, command in (("throughput.json", head, steps["throughput.json"]),
                                    ("stop_latency.json", head, steps["stop_latency.json"]),
                                    ("exact_cost.json", head, steps["exact_cost.json"] + " --steps 1"),
                                    ("verdicts.json", head + "-dirty", steps["verdicts.json"]),
                                    ("loop_overhead.json", "f" * 40, steps["loop_overhead.json"])):
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(json.dumps({"benchmark": Path(name).stem, "command": command,
                                                "machine": {"versions": {"project_git": revision}}}))

    def said() -> dict:
        out = run_cmd([PY, "-m", "benchmarks.stale", "--results", str(results)], cwd=clone)
        assert out.returncode == 0, out.output
        return dict(line.split(": ", 1) for line in out.output.splitlines() if ".json: " in line)

    now = said()
    assert now["throughput.json"].startswith("current") and now["stop_latency.json"].startswith("current")
    # The verdict corpus reuses a run only when a clean revision of the same training made it (on this clean clone).
    reuse = run_cmd([PY, "-c", VERDICTS_REUSE, str(tmp_path / "work")], cwd=clone)
    assert reuse.output.split()[-1] == "reused" and reuse.returncode == 0, reuse.output
    assert now["exact_cost.json"].startswith("stale, its step in run_all.sh runs another command now")
    assert now["verdicts.json"].startswith("stale, it was measured on uncommitted code")
    assert now["probe_cost.json"] == "stale, not measured yet"
    assert now["loop_overhead.json"].startswith("stale, it was measured at a revision this history does not hold")
    # A document or how results are shown changes nothing; a benchmark's script makes its results stale; the
    # training makes every one stale.
    for shown in ("README.md", "benchmarks/sections.py"):
        with open(clone / shown, "a") as f:
            f.write("\n")
    assert said()["throughput.json"].startswith("current")
    for changed in ("benchmarks/throughput.py", "common/loop/stepping.py"):
        with open(clone / changed, "a") as f:
            f.write("\n")
        now = said()
        assert now["throughput.json"].startswith("stale, changed since: benchmarks/throughput.py"), now
        assert now["stop_latency.json"].startswith("current" if changed.startswith("benchmarks") else
                                                   f"stale, changed since: {changed}"), now


def test_a_result_records_the_revision_its_measurement_started_at_and_results_leave_it_clean(monkeypatch, tmp_path):
    """A commit while a benchmark runs must not stamp its result with code it did not measure; writing results, a
    document or a test into the checkout does not make its revision dirty, code does."""
    from benchmarks.machine import Record
    from common.rundir import records

    monkeypatch.setattr(records, "git_revision", lambda: "a" * 40)
    record = Record("throughput", [])
    monkeypatch.setattr(records, "git_revision", lambda: "b" * 40)
    assert record.header()["machine"]["versions"]["project_git"] == "a" * 40
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
        open("common/loop/stepping.py", "a").write("\\n")
        print(git_revision())
    """
    result = run_cmd([PY, "-c", script], cwd=clone)
    assert result.output.split()[-3:] == [head, head, head + "-dirty"], result.output


def test_the_cpu_another_program_keeps_busy_shows_in_the_share_of_all_cores():
    from benchmarks.machine import cores, cpu_busy

    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: "
                                                      "pass"])
    try:
        time.sleep(0.3)
        busy = cpu_busy(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.8 / cores() <= busy <= 1.0
