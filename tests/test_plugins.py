"""Your model, your data: --model package.module:function, --model torchvision:NAME and --dataset
package.module:function, written by the test into a folder of its own and run from there, through the real
launchers and the comparison; bad factories fail on every rank with one line and exit code 2 (the line of each
refusal: tests/unit/test_user_factories.py)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from common.launch import Job as LaunchedJob
from launched import assert_every_rank_exited, command, compare, compare_in_process, job_env, read_run, run_cmd
from common.rundir.names import SUMMARY_FILE
from user_modules import BAD_FACTORIES, ON_EVERY_RANK, write_modules

SHORT = ["--epochs", "2", "--optimizer", "adam", "--lr", "0.01", "--threads", "1"]
PLUGINS = ["--model", "transformer:build", "--dataset", "tokens:build", "--model-arg", "depth=2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder outside the project holding the user's modules; every command here runs from it."""
    return write_modules(tmp_path_factory.mktemp("mine"))


def compared(folder: Path, out: Path, *args: str):
    """A comparison at 2 ranks started from `folder` (where the user's modules are): (summary, the runs it read)."""
    result = compare("--out", out, "--np", "2", "--hvd-controllers", "gloo", "--repeats", "1", *args, timeout=400,
                     cwd=folder)
    assert result.returncode == 0, result.output[-4000:]
    summary = json.loads((out / SUMMARY_FILE).read_text())
    return summary, {run["name"]: read_run(run["path"]) for run in summary["runs"]}


@pytest.fixture(scope="module")
def transformer_comparison(folder):
    """compare-backends on the user's transformer and token data: torchrun and horovodrun --gloo at 2 ranks."""
    return compared(folder, folder / "cmp", *PLUGINS, *SHORT)


def test_users_transformer_trains_bitwise_equal_under_torchrun_and_horovodrun(transformer_comparison, folder):
    summary, runs = transformer_comparison
    ddp, hvd = runs["ddp@2#1"], runs["horovod-gloo@2#1"]
    assert ddp["config"]["launcher"] == "torchrun" and hvd["config"]["launcher"] == "horovodrun"
    assert ddp["summary"]["weights_sha256"] == hvd["summary"]["weights_sha256"]
    for key in ddp["model"]:
        assert torch.equal(ddp["model"][key], hvd["model"][key]), key
    assert ddp["summary"]["steps"] == 6 and ddp["summary"]["val_top1"] > 0.5  # learned, from 4 classes
    # The model took what the data gave (sequence length 12, 4 classes) and the extra argument.
    assert ddp["config"]["dataset"]["image_size"] == 12 and ddp["config"]["dataset"]["num_classes"] == 4
    assert any(".layers.1." in key for key in ddp["model"])  # --model-arg depth=2
    [verdict] = summary["parity"]
    assert verdict["verdict"] == "bitwise identical"
    report = (folder / "cmp" / "report.md").read_text()
    assert "bitwise identical" in report and "transformer:build" in report


def test_run_directory_records_each_factory_and_the_hash_of_its_source(transformer_comparison, folder):
    _, runs = transformer_comparison
    for run in runs.values():
        factories = run["config"]["factories"]
        for kind, spec, file in (("model", "transformer:build", "transformer.py"), ("dataset", "tokens:build",
                                                                                   "tokens.py")):
            assert factories[kind] == {"spec": spec, "source": str(folder / file),
                                       "sha256": hashlib.sha256((folder / file).read_bytes()).hexdigest()}


def test_runs_whose_factory_source_differs_are_not_compared(transformer_comparison, folder, tmp_path):
    summary, _ = transformer_comparison
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited, ignore=shutil.ignore_patterns("cmp", "__pycache__"))
    (edited / "transformer.py").write_text((edited / "transformer.py").read_text() + "# tuned\n")
    one = run_cmd(command("none-ddp", 1, [*PLUGINS, *SHORT, "--max-steps", "1", "--run-dir", str(tmp_path / "one")]),
                  timeout=120, cwd=edited).check()
    assert one.returncode == 0
    paths = [run["path"] for run in summary["runs"]] + [str(tmp_path / "one")]
    result = compare_in_process("--runs", *paths, "--out", tmp_path / "out")
    assert result.returncode == 2
    line = result.output.strip().splitlines()[-1]
    assert "model factory differs" in line and str(edited / "transformer.py") in line, line
    assert "dataset factory differs" not in line  # tokens.py is the same file, byte for byte


def test_torchvision_model_on_synthetic_data_takes_its_natural_size_under_both_backends(folder, tmp_path):
    summary, runs = compared(folder, tmp_path / "cmp", "--model", "torchvision:mobilenet_v3_small", "--dataset",
                            "synthetic", "--synthetic-samples", "40", "--batch-size", "4", "--max-steps", "3",
                            "--threads", "1")
    assert set(runs) == {"ddp@2#1", "horovod-gloo@2#1"}
    for run in runs.values():
        assert run["summary"]["steps"] == 3
        assert run["config"]["dataset"]["image_size"] == 224  # torchvision's ImageNet input, not 8x8
        assert run["config"]["factories"]["model"]["source"].endswith("torchvision/models/mobilenetv3.py")
    assert summary["parity"][0]["verdict"] == "bitwise identical"


def test_unknown_torchvision_model_lists_close_matches(folder):
    result = run_cmd(command("none-ddp", 1, ["--model", "torchvision:mobilenet_v3_smal"]), timeout=60, cwd=folder)
    assert result.returncode == 2
    [line] = [line for line in result.output.splitlines() if line.strip()]
    assert re.search(r"has no classification model 'mobilenet_v3_smal'; close matches: mobilenet_v3_small", line)


def run_torchrun_timing_ranks(args, cwd: Path):
    """Launch under torchrun with 2 ranks; (output, return code, seconds from the moment torchrun has set up
    and starts its workers, after importing torch itself, to the end of the job)."""
    started = []

    def stamp(line: str) -> None:
        if not started and "OMP_NUM_THREADS" in line:  # torchrun's last word before it starts the workers
            started.append(time.monotonic())

    with LaunchedJob(command("torchrun", 2, args), env=job_env(), cwd=cwd, on_line=stamp) as job:
        code = job.wait(timeout=60)
        ended = time.monotonic()
    assert started, job.output[-3000:]
    return job.output, code, ended - started[0]


@pytest.fixture(scope="module")
def bad_factory_jobs(folder, tmp_path_factory):
    """ON_EVERY_RANK's bad factories under torchrun at 2 ranks, at once (they mostly wait for processes that import
    torch and stop), each timed on its own. case -> (output, exit code, seconds, run dir)"""
    def launch_case(case):
        run_dir = tmp_path_factory.mktemp(case) / "run"
        return (*run_torchrun_timing_ranks([*BAD_FACTORIES[case][0], "--run-dir", str(run_dir)], folder), run_dir)

    with ThreadPoolExecutor(len(ON_EVERY_RANK)) as pool:
        return dict(zip(ON_EVERY_RANK, pool.map(launch_case, ON_EVERY_RANK), strict=True))


@pytest.mark.parametrize("case", ON_EVERY_RANK)
def test_bad_factory_exits_2_on_every_rank_at_once_with_one_line(bad_factory_jobs, case):
    """Each rank prints one line naming the problem and exits 2, within seconds, with no traceback of ours and no
    run directory."""
    _, expected = BAD_FACTORIES[case]
    output, code, seconds, run_dir = bad_factory_jobs[case]
    # The processes import torch and stop (seconds alone; more beside other tests on 2 cores): not a hang.
    assert seconds < 30, f"it took {seconds:.1f}s"
    errors = [line for line in output.splitlines() if "ddp_train: error: " in line]
    assert code != 0
    for rank in range(2):
        mine = [line for line in errors if line.startswith(f"[rank {rank}] ")]
        assert len(mine) == 1 and expected in mine[0], f"rank {rank}:\n{output[-3000:]}"
    assert_every_rank_exited("torchrun", output, 2, 2)
    assert not re.search(r'File ".*/(common|ddp_train|hvd_train)/', output)  # no traceback of ours
    assert not run_dir.exists()


def test_bad_factory_under_horovodrun_exits_2_on_every_rank(folder, tmp_path):
    args, expected = BAD_FACTORIES["raises"]
    result = run_cmd(command("horovodrun-gloo", 2, [*args, "--run-dir", str(tmp_path / "run")]), timeout=60,
                     cwd=folder)
    assert result.returncode != 0 and result.seconds < 30, f"{result.seconds:.1f}s\n{result.output[-3000:]}"
    errors = [line for line in result.output.splitlines() if "hvd_train: error: " in line]
    for rank in range(2):
        assert any(f"[rank {rank}] " in line and expected in line for line in errors), result.output[-3000:]
    assert_every_rank_exited("horovodrun-gloo", result.output, 2, 2)


def test_users_transformer_in_exact_mode_is_bitwise_equal_at_1_and_3_ranks_under_mpirun(folder, tmp_path):
    args = [*PLUGINS, "--reduction", "exact", "--global-batch", "48", "--micro-batch", "8", "--max-steps", "3",
            "--optimizer", "adam", "--lr", "0.01"]
    weights = {}
    for launcher, np in (("none-hvd", 1), ("mpirun", 3)):
        run_dir = tmp_path / launcher
        run_cmd(command(launcher, np, [*args, "--run-dir", str(run_dir)]), timeout=180, cwd=folder).check()
        run = read_run(run_dir)
        assert run["summary"]["steps"] == 3 and run["summary"]["world_size"] == np
        weights[np] = run["summary"]["weights_sha256"]
    assert weights[1] == weights[3]  # dropout included: exact mode draws it per micro-batch
