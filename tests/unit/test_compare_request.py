"""The comparison's check of a request before anything runs (common.compare.request): each bad combination is
refused with one line naming the fix, and good requests come through with what they resolved to."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.compare.request import Refused, check_request

HOROVOD_SCRIPT = "import horovod.torch as hvd\nhvd.init()\n"
DDP_SCRIPT = "import torch.distributed as dist\ndist.init_process_group()\n"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A folder with a Horovod script and its DDP port, as the working directory."""
    (tmp_path / "train_hvd.py").write_text(HOROVOD_SCRIPT)
    (tmp_path / "train_ddp.py").write_text(DDP_SCRIPT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["--port", "29500"], "the rendezvous port is --rdzv-port"),
    (["--port", "nowhere.py"], "--port nowhere.py: no such file"),
    (["--port", "train_ddp.py"], "it does not import horovod"),
    (["--port", "train_hvd.py", "--scripts", "train_hvd.py"], "drop --scripts/--runs"),
    (["--port", "train_hvd.py", "--horovod-api"], "give one of them"),
    (["--port", "train_hvd.py", "--epochs", "2"], "your script's arguments go after --"),
    (["--horovod-api"], "give it with --scripts TRAIN_HOROVOD.py"),
    (["--", "--lr", "1"], "they go with --scripts"),
    (["--steps", "3"], "the project's own loop takes --max-steps 3"),
    (["--scripts", "train_hvd.py", "train_ddp.py", "--epochs", "2"], "your scripts' arguments go after --"),
    (["--scripts", "train_hvd.py", "--runs", "x"], "give one of them"),
    (["--scripts", "train_ddp.py", "train_hvd.py"], "give the Horovod script first"),
    (["--scripts", "train_ddp.py", "--horovod-api"], "give --scripts TRAIN_HOROVOD.py alone"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--run-dir", "x"], "use --out for the output folder"),
    (["--bench", "."], "no allreduce.json or throughput.json there"),
    (["--runs", "a", "--epochs", "2"], "do nothing with --runs"),
    (["--runs", "a", "--slurm"], "--slurm says where to launch runs"),
    (["--runs", "a", "--hosts", "node0:1"], "--hosts says where to launch runs"),
])
def test_a_bad_combination_is_refused_naming_the_fix(here, argv, message):
    with pytest.raises(Refused) as refused:
        check_request(argv)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_scripts_resolve_to_their_program_with_their_own_arguments(here):
    request = check_request(["--scripts", "train_hvd.py", "train_ddp.py", "--steps", "4", "--", "--lr", "0.1"])
    assert request.program is not None and request.ported is None
    assert [backend for backend, _ in request.program.scripts] == ["horovod", "ddp"]
    assert request.script_args == ["--lr", "0.1"] and request.args.steps == 4


def test_training_options_are_the_project_loops_and_checked_by_its_parser(here):
    request = check_request(["--np", "2", "--epochs", "2", "--model", "mlp"])
    assert request.program is None and request.args.world_sizes == [2]
    assert request.train_args == ["--epochs", "2", "--model", "mlp"]
    assert request.given.get("epochs") == 2 and request.given.get("model") == "mlp"


def test_given_runs_are_checked_without_reading_them(here):
    request = check_request(["--runs", "a", "b", "--out", str(here / "out")])
    assert request.args.runs == [Path("a"), Path("b")] and request.bench is None
