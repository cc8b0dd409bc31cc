"""Each run of a user's script starts in a working directory of its own: a 2-file project (a Horovod script that
resumes from the newest ckpt-EPOCH.pt in its folder and writes one per epoch, and the data.json it reads relatively),
compared with itself on the Horovod API (`--scripts train.py --horovod-api`, 2 ranks). Every run trains from epoch 0,
`{run_dir}` in the arguments is each run's directory, and the user's folder is left as it was; a `--checkpoint
/abs/path` every run is given is named in one line as the clash it is, not as the probe's refusal it causes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from common.rundir.names import CONFIG_FILE, LAUNCH_LOG, LAUNCH_RECORD, SUMMARY_FILE, WORKING_DIR
from launched import compare_backends

pytestmark = pytest.mark.timeout(600)

SCRIPT = '''"""A small Horovod script: resumes from the newest ckpt-EPOCH.pt in its folder (or --checkpoint)."""
import argparse
import glob
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--checkpoint", default=None, help="one file to resume from and save to")
parser.add_argument("--record", default=None, help="a file rank 0 writes the epochs it trained to")
args = parser.parse_args()

with open("data.json") as config_file:  # relative: from the folder the script runs in
    config = json.load(config_file)
hvd.init()
torch.manual_seed(config["seed"])
torch.set_num_threads(1)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size())
if args.checkpoint:
    found = [args.checkpoint] if os.path.exists(args.checkpoint) else []
else:
    found = sorted(glob.glob("ckpt-*.pt"), key=lambda path: int(path[5:-3]))
start = 0
if found:
    state = torch.load(found[-1], weights_only=True)
    model.load_state_dict(state["model"])
    start = int(state["epoch"]) + 1
print(f"rank {hvd.rank()}: training from epoch {start}", flush=True)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
inputs = torch.randn(64, 4, generator=torch.Generator().manual_seed(config["seed"]))
labels = (inputs.sum(1) > 0).long()
trained = []
for epoch in range(start, args.epochs):
    for first in range(0, 64, 8 * hvd.size()):
        batch = slice(first + 8 * hvd.rank(), first + 8 * hvd.rank() + 8)
        optimizer.zero_grad()
        F.cross_entropy(model(inputs[batch]), labels[batch]).backward()
        optimizer.step()
    trained.append(epoch)
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "epoch": epoch}, args.checkpoint or f"ckpt-{epoch}.pt")
if args.record and hvd.rank() == 0:
    with open(args.record, "w") as out:
        json.dump(trained, out)
'''
#: the comparison: the script on the Horovod API and on Horovod's Gloo controller, at 2 ranks, once each
OPTIONS = ["--scripts", "train.py", "--horovod-api", "--np", "2", "--hvd-controllers", "gloo", "--repeats", "1",
           "--noise-floor", "off"]
RUNS = ["horovod-api-np2-r1", "horovod-gloo-np2-r1"]


def files(folder: Path, leave_out: Path) -> dict:
    """Every file under `folder` but under `leave_out`, with its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file() and not p.is_relative_to(leave_out)}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    here = tmp_path_factory.mktemp("project")
    (here / "train.py").write_text(SCRIPT)
    (here / "data.json").write_text(json.dumps({"seed": 3, "lr": 0.05}))
    return here


@pytest.fixture(scope="module")
def isolated(project):
    """The comparison, its output where the user's own runs go (runs/compare in the folder): (result, out, the
    folder's files before)."""
    out = project / "runs" / "compare"
    before = files(project, out)
    result = compare_backends(*OPTIONS, "--out", out, "--", "--epochs", "2", "--record", "{run_dir}/trained.json",
                              cwd=project)
    return result, out, before


def test_no_run_failed_and_every_run_trained_from_epoch_0(isolated):
    result, out, _ = isolated
    assert result.returncode == 0, result.output[-4000:]
    assert json.loads((out / SUMMARY_FILE).read_text())["failures"] == []
    for name in RUNS:
        run_dir = out / "runs" / name
        assert json.loads((run_dir / "trained.json").read_text()) == [0, 1], name  # {run_dir}: its own directory
        log = (run_dir / LAUNCH_LOG).read_text()
        assert log.count("training from epoch 0") == 2 and "training from epoch 1" not in log, log[-3000:]
        # what the run wrote stayed in its own working directory, where it ran
        cwd = run_dir / WORKING_DIR
        assert sorted(p.name for p in cwd.glob("ckpt-*.pt")) == ["ckpt-0.pt", "ckpt-1.pt"], name
        assert (cwd / "train.py").is_symlink() and (cwd / "data.json").is_symlink()
        assert json.loads((run_dir / LAUNCH_RECORD).read_text())["cwd"] == str(cwd)
        assert json.loads((run_dir / CONFIG_FILE).read_text())["script"]["cwd"] == str(cwd)


def test_the_users_folder_is_left_as_it_was(isolated, project):
    _, out, before = isolated
    assert files(project, out) == before
    assert sorted(p.name for p in project.iterdir()) == ["data.json", "runs", "train.py"]


@pytest.fixture(scope="module")
def clashing(project, tmp_path_factory):
    """The same comparison with `--checkpoint /abs/ck.pt`, one file for every run: (result, summary, the path)."""
    checkpoint = tmp_path_factory.mktemp("shared") / "ck.pt"
    out = tmp_path_factory.mktemp("clash")
    result = compare_backends(*OPTIONS, "--out", out, "--", "--epochs", "2", "--checkpoint", checkpoint, cwd=project)
    return result, json.loads((out / SUMMARY_FILE).read_text()), checkpoint, out


def test_one_absolute_path_for_every_run_is_named_as_the_clash_it_is(clashing):
    result, summary, checkpoint, out = clashing
    assert result.returncode == 1, result.output[-4000:]
    (failure,) = summary["failures"]
    line = (f"horovod-gloo@2#1 started with {checkpoint}, which horovod-api@2#1 wrote before it: every run is given "
            f"`--checkpoint {checkpoint}`; give each run its own with {{run_dir}}, which the comparison fills with the "
            "run's directory: `--checkpoint {run_dir}/ck.pt`")
    assert failure["name"] == "horovod-gloo@2#1" and failure["error"] == line, failure
    assert f"FAILED horovod-gloo@2#1: {line}" in result.output
    # it resumed past its last epoch, so the probe saw no step: that refusal is not what the run is reported with
    assert "made no optimizer step" in (out / "runs" / "horovod-gloo-np2-r1" / LAUNCH_LOG).read_text()
    assert "made no optimizer step" not in result.output.split("compare-backends: report")[1]
    # one run ended: nothing at world size 2 was compared, and the report says so rather than "every run"
    assert any(note.startswith("At world size 2 only 1 of the 2 runs ended") for note in summary["notes"])
