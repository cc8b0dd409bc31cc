"""Bad input: one line naming the problem and the fix, exit code 2 on every rank, fast, no hang."""

from __future__ import annotations

import re

import pytest

from launch import PY, launch, run_cmd

BAD_INPUTS = {
    "missing-data-dir": (["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "is not a directory"),
    "no-data-dir": (["--dataset", "cifar10"], "needs --data-dir"),
    "unknown-model": (["--model", "transformer9000"], "invalid choice: 'transformer9000'"),
    "unknown-dataset": (["--dataset", "imagenet21k"], "invalid choice: 'imagenet21k'"),
    "zero-batch": (["--batch-size", "0"], "--batch-size: must be a positive integer"),
}


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
@pytest.mark.parametrize("launcher,np", [("none-ddp", 1), ("none-hvd", 1), ("torchrun", 2),
                                         ("horovodrun-gloo", 2), ("horovodrun-mpi", 2), ("mpirun", 2)])
def test_bad_input_fails_fast_on_every_rank(tmp_path, launcher, np, bad):
    args, expected = BAD_INPUTS[bad]
    result = launch(launcher, np, args + ["--run-dir", str(tmp_path / "run")], timeout=60)
    assert result.returncode != 0
    assert result.seconds < 10, f"took {result.seconds:.1f}s"
    error_lines = [line for line in result.output.splitlines() if ": error: " in line and "_train" in line]
    # One line per rank, each naming the problem; no Python traceback from our code.
    for rank in range(np):
        mine = [line for line in error_lines if re.search(rf"\[rank {rank}\]", line) or np == 1]
        assert mine, f"rank {rank} printed no error line:\n{result.output[-3000:]}"
        assert expected in mine[0]
    # Launchers print their own tracebacks; none may come from the project's code.
    assert not re.search(r'File ".*/(common|ddp_train|hvd_train)/', result.output), result.output[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()
    if np == 1:
        assert result.returncode == 2


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_each_rank_exits_with_code_2(tmp_path, launcher):
    result = launch(launcher, 2, ["--batch-size", "0"], timeout=60)
    if launcher == "torchrun":
        # torchrun reports each failed worker with its exit code.
        assert re.search(r"exitcode\s*:\s*2", result.output), result.output[-2000:]
    else:
        # mpirun reports the first failed process with its exit code.
        assert re.search(r"Exit code:\s*2\b", result.output), result.output[-2000:]
        assert result.returncode != 0


def test_unwritable_run_dir_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = launch("none-ddp", 1, ["--run-dir", str(blocker / "run")], timeout=60)
    assert result.returncode == 2
    assert "is not a directory" in result.output and "--run-dir" in result.output


def test_help_is_the_same_for_both_backends():
    ddp = run_cmd([PY, "-m", "ddp_train", "--help"], timeout=60).check().output
    hvd = run_cmd([PY, "-m", "hvd_train", "--help"], timeout=60).check().output

    def options(text):
        return sorted(set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", text, re.M)))

    assert options(ddp) == options(hvd)
    for option in ("--dataset", "--data-dir", "--model", "--epochs", "--max-steps", "--batch-size", "--lr",
                   "--momentum", "--weight-decay", "--optimizer", "--lr-schedule", "--lr-scaling",
                   "--warmup-epochs", "--seed", "--workers", "--threads", "--eval-every", "--run-dir"):
        assert option in options(ddp), option
    for choice in ("digits", "synthetic", "mnist", "cifar10", "imagefolder", "mlp", "convnet", "mnist_net",
                   "resnet18", "resnet50", "sgd", "adam", "adadelta", "constant", "step", "cosine", "linear"):
        assert choice in ddp, choice
