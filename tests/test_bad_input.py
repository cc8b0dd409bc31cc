"""Bad input: one line naming the problem and the fix, on every rank, exit code 2 on every rank, fast,
no hang, under every launcher."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Tuple

import pytest

from launched import PY, Result, assert_every_rank_exited, command, launch, run_cmd
from settings import TWO_RANK
from common.rundir.names import SUMMARY_FILE

BAD_INPUTS = {
    "missing-data-dir": (["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "is not a directory"),
    "no-data-dir": (["--dataset", "cifar10"], "needs --data-dir"),
    "unknown-model": (["--model", "transformer9000"], "unknown model 'transformer9000'"),
    "unknown-dataset": (["--dataset", "imagenet21k"], "unknown dataset 'imagenet21k'"),
    "zero-batch": (["--batch-size", "0"], "--batch-size: must be a positive integer"),
}
PROGRAM = {"none-ddp": "ddp_train", "none-hvd": "hvd_train", "torchrun": "ddp_train", "horovodrun-gloo": "hvd_train",
           "horovodrun-mpi": "hvd_train", "mpirun": "hvd_train"}


def _no_traceback_of_ours(output: str) -> None:
    # Launchers print their own tracebacks; none may come from the project's code.
    assert not re.search(r'File ".*/(common|ddp_train|hvd_train)/', output), output[-3000:]


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
@pytest.mark.parametrize("launcher", ["none-ddp", "none-hvd"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, launcher, bad):
    args, expected = BAD_INPUTS[bad]
    result = launch(launcher, 1, args + ["--run-dir", str(tmp_path / "run")], timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{PROGRAM[launcher]}: error: ") and expected in lines[0], \
        result.output
    assert result.seconds < 5, f"took {result.seconds:.1f}s"  # before torch is imported
    assert not (tmp_path / "run").exists()


def test_unknown_horovod_wait_is_one_line_and_exit_2(tmp_path):
    result = launch("none-hvd", 1, ["--model", "mlp", "--max-steps", "1", "--run-dir", str(tmp_path / "run")],
                    timeout=60, env={"HVD_TRAIN_WAIT": "busy"})
    assert result.returncode == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["hvd_train: error: HVD_TRAIN_WAIT='busy': choose spin or poll, or unset it (poll on CPU, "
                     "spin on a GPU)"], result.output
    assert not (tmp_path / "run" / SUMMARY_FILE).exists()


TWO_RANK_BAD = ("unknown-model", "missing-data-dir")


def _refused_at_two_ranks(launcher: str, bad: str, run_dir) -> Result:
    args, _ = BAD_INPUTS[bad]
    cmd = command(launcher, 2, args + ["--run-dir", str(run_dir)])
    if launcher in ("horovodrun-mpi", "mpirun"):
        # Open MPI reports only the first rank's exit code: a shell around each rank says its own, and
        # mpirun lets every rank finish instead of stopping the others.
        start = cmd.index(PY)
        cmd = cmd[:start] + ["sh", "-c", '"$0" "$@"; code=$?; echo "rank $OMPI_COMM_WORLD_RANK exited $code"; '
                                           'exit $code'] + cmd[start:]
        abort = ["--mca", "orte_abort_on_non_zero_status", "0"]
        cmd = cmd[:1] + abort + cmd[1:] if launcher == "mpirun" else \
            [c + " " + " ".join(abort) if c.startswith("--mpi-args=") else c for c in cmd]
    return run_cmd(cmd, timeout=120)


@pytest.fixture(scope="module")
def refused_at_two_ranks(tmp_path_factory) -> Dict[Tuple[str, str], Tuple[Result, Path]]:
    """Each bad input under each launcher at two ranks, all at once: the launchers mostly wait for their
    ranks to end, and each job is timed on its own. (launcher, bad) -> (result, its run directory)"""
    cases = [(launcher, bad) for launcher in TWO_RANK for bad in TWO_RANK_BAD]
    run_dirs = [tmp_path_factory.mktemp(f"{launcher}-{bad}") / "run" for launcher, bad in cases]
    with ThreadPoolExecutor(len(cases)) as pool:
        results = pool.map(lambda case, run_dir: _refused_at_two_ranks(*case, run_dir), cases, run_dirs)
        return {case: (result, run_dir) for case, result, run_dir in zip(cases, results, run_dirs, strict=True)}


@pytest.mark.parametrize("bad", TWO_RANK_BAD)
@pytest.mark.parametrize("launcher", TWO_RANK)
def test_bad_input_with_two_ranks_every_rank_prints_its_line_and_exits_2(refused_at_two_ranks, launcher, bad):
    _, expected = BAD_INPUTS[bad]
    result, run_dir = refused_at_two_ranks[launcher, bad]
    if launcher in ("torchrun", "horovodrun-gloo"):  # mpirun told not to abort returns 0 whatever its ranks did
        assert result.returncode != 0
    assert result.seconds < 30, f"took {result.seconds:.1f}s"  # the launcher and its ranks start: not a hang
    error_lines = [line for line in result.output.splitlines() if f"{PROGRAM[launcher]}: error: " in line]
    for rank in range(2):
        mine = [line for line in error_lines if re.search(rf"\[rank {rank}\] ", line)]
        assert len(mine) == 1 and expected in mine[0], f"rank {rank}:\n{result.output[-3000:]}"
    assert_every_rank_exited(launcher, result.output, 2, 2)
    _no_traceback_of_ours(result.output)
    assert not (run_dir / SUMMARY_FILE).exists()


def test_unwritable_run_dir_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = launch("none-ddp", 1, ["--run-dir", str(blocker / "run")], timeout=60)
    assert result.returncode == 2
    assert "is not a directory" in result.output and "--run-dir" in result.output
    _no_traceback_of_ours(result.output)


ABBREVIATED = "--batch 16 --reduction exact".split()


@pytest.mark.parametrize("program, args, says", [
    ([PY, "-m", "ddp_train"], ABBREVIATED, "ddp_train: error: unrecognized arguments: --batch 16"),
    ([PY, "-m", "hvd_train"], ABBREVIATED, "hvd_train: error: unrecognized arguments: --batch 16"),
    ([str(Path(PY).parent / "compare-backends")], ABBREVIATED,
     "compare-backends: error: unrecognized arguments: --batch 16"),
    ([PY, "-m", "common.probe"], ["--run", "x", "train.py"],
     "python -m common.probe: error: the following arguments are required: --run-dir"),
])
def test_an_abbreviated_option_is_refused_in_one_line(program, args, says):
    """argparse would take --batch for --batch-size (and the check that --reduction exact refuses --batch-size
    would not see it): every program refuses abbreviations, in one line."""
    result = run_cmd([*program, *args], timeout=60)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(says), result.output
    _no_traceback_of_ours(result.output)


def test_a_run_dir_that_cannot_be_created_is_refused_in_one_line():
    result = launch("none-ddp", 1, ["--run-dir", "/proc/x"], timeout=60)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.output
    assert lines[0] == ("ddp_train: error: --run-dir '/proc/x' cannot be created in /proc (No such file or directory); "
                        "give a folder you can write to")


def test_help_is_the_same_for_both_backends():
    ddp = run_cmd([PY, "-m", "ddp_train", "--help"], timeout=60).check().output
    hvd = run_cmd([PY, "-m", "hvd_train", "--help"], timeout=60).check().output

    def options(text):
        return sorted(set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", text, re.M)))

    assert options(ddp) == options(hvd)
    from common.config import build_parser
    declared = sorted(o for o in build_parser("x", "")._option_string_actions if o.startswith("--") and o != "--help")
    assert options(ddp) == declared
    for choice in ("digits", "synthetic", "mnist", "cifar10", "imagefolder", "mlp", "convnet", "mnist_net",
                   "resnet18", "resnet50", "sgd", "adam", "adadelta", "constant", "step", "cosine", "linear",
                   "allreduce", "exact"):
        assert choice in ddp, choice
