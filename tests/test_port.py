"""python -m ddp_train.port on Horovod scripts written here, one idiom each (those that cannot change training
together): each port imports no horovod, passes ruff, runs under torchrun, and compares with its Horovod script
(`compare-backends --scripts`, 2 ranks) as its report predicts: bitwise identical where no rewrite can change
training, apart by rounding only where one rounds differently (fp16 compression), and apart from the step the
report names, for the cause it names (Adam after broadcast_optimizer_state's zero step)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Dict

import pytest
import torch

from ddp_train.port.__main__ import main as port_main
from ddp_train.port.report import PortReport, from_json
from launched import PY, compare, run_cmd
from common.rundir.names import SUMMARY_FILE, WORKING_DIR

pytestmark = pytest.mark.timeout(900)

#: a Horovod script in the style of Horovod's examples/pytorch: its own data, model and loop; the metrics it
#: averages and sums, what it gathers and broadcasts, and its rank-0 checkpoint go to STEM.json and STEM.ckpt
TEMPLATE = '''"""A small Horovod training script (tests/test_port.py)."""

import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

parser = argparse.ArgumentParser(description='a small Horovod script')
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--lr', type=float, default=0.02)

ACCUMULATE = {accumulate}
STEM = os.path.splitext(os.path.basename(__file__))[0]


def main(args):
    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    inputs = torch.randn(256, 12)
    labels = (inputs[:, :3].sum(1) > 0).long()
    dataset = torch.utils.data.TensorDataset(inputs, labels)
    # Horovod: use DistributedSampler to partition the training data.
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = {optimizer}
{wrap_before}
    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
{wrap_after}
    record = {{'loss': [], 'seen': []}}
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total, seen = 0.0, 0
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y) / ACCUMULATE
            loss.backward()
            if (i + 1) % ACCUMULATE == 0:
                optimizer.step()
                optimizer.zero_grad()
            total += loss.item() * len(y)
            seen += len(y)
        # Horovod: average metric values across workers, and sum the counts.
        record['loss'].append(hvd.allreduce(torch.tensor(total / seen), name='avg_loss').item())
        record['seen'].append(int(hvd.allreduce(torch.tensor(seen), op=hvd.Sum).item()))

    # every rank's rows (rank r gives r + 1 of them) and its place; rank 0's settings on every rank
    record['rows'] = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())), name='rows').tolist()
    record['places'] = hvd.allgather_object((hvd.rank(), hvd.local_rank(), hvd.local_size()))
    record['settings'] = hvd.broadcast_object({{'seed': 42, 'from': hvd.rank()}}, root_rank=0)

    # Horovod: save checkpoints only on the first worker.
    if hvd.rank() == 0:
        torch.save({{'model': model.state_dict(), 'optimizer': optimizer.state_dict()}}, STEM + '.ckpt')
        with open(STEM + '.json', 'w') as out:
            json.dump(record, out)
    hvd.join()
    hvd.barrier()


if __name__ == '__main__':
    main(parser.parse_args())
'''

WRAP = '''
    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(){options})
'''
SGD = "optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)"
#: name -> (optimizer, DistributedOptimizer's options, backward passes per step, wrapped before the broadcasts)
SCRIPTS = {
    # what cannot change training: metrics averaged (op=hvd.Average) and summed (op=hvd.Sum), allgather,
    # allgather_object, broadcast_object, the rank-0 checkpoint, join, barrier, backward_passes_per_step=2
    "idioms": (SGD, ", backward_passes_per_step=ACCUMULATE, op=hvd.Average", 2, False),
    "fp16": (SGD, ", compression=hvd.Compression.fp16", 1, False),
    # wrapped first, as Horovod's synthetic benchmark and ImageNet example do: the zero step's state stays (the
    # other order hands the optimizer's param groups to a new one, without it)
    "adam": ("optim.Adam(model.parameters(), lr=args.lr * hvd.size())", "", 1, True),
}
ARGS = ["--epochs", "2", "--batch-size", "16"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The Horovod scripts and their ports (horovod_NAME.py -> ddp_NAME.py, report ddp_NAME.json)."""
    here = tmp_path_factory.mktemp("port")
    for name, (optimizer, options, accumulate, wrapped_first) in SCRIPTS.items():
        wrap = WRAP.format(options=options)
        (here / f"horovod_{name}.py").write_text(TEMPLATE.format(
            optimizer=optimizer, accumulate=accumulate, wrap_before=wrap if wrapped_first else "",
            wrap_after="" if wrapped_first else wrap))
        code = port_main([str(here / f"horovod_{name}.py"), "-o", str(here / f"ddp_{name}.py"),
                          "--report-json", str(here / f"ddp_{name}.json")])
        assert code == 0, name
    return here


def report_of(folder: Path, name: str) -> PortReport:
    return from_json((folder / f"ddp_{name}.json").read_text())


def predicted(report: PortReport) -> str:
    """What the report says the comparison finds: "beyond" a rewrite changes training, "floor" one rounds
    differently, else "bitwise"."""
    if report.changes_training:
        return "beyond"
    return "floor" if any(c.effect for c in report.changes) else "bitwise"


def compared(folder: Path, name: str, *options) -> Dict:
    """horovod_NAME.py against its port at 2 ranks: the pair's record in summary.json."""
    out = folder / f"compare-{name}"
    result = compare("--scripts", f"horovod_{name}.py", f"ddp_{name}.py", "--np", "2", "--hvd-controllers", "gloo",
                     "--repeats", "1", *options, "--out", out, "--", *ARGS, cwd=folder)
    assert result.returncode == 0, result.output[-4000:]
    (pair,) = [p for p in json.loads((out / SUMMARY_FILE).read_text())["parity"]
               if "+perturbed" not in p["a"] + p["b"]]
    return pair


def test_every_port_imports_no_horovod_and_passes_ruff(folder):
    for name in SCRIPTS:
        tree = ast.parse((folder / f"ddp_{name}.py").read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
            [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] == "horovod"], (name, imported)
    result = run_cmd([str(Path(PY).parent / "ruff"), "check", *[f"ddp_{n}.py" for n in SCRIPTS]], cwd=folder)
    assert result.returncode == 0, result.output


def test_the_reports_predict_what_each_rewrite_does(folder):
    assert [predicted(report_of(folder, name)) for name in SCRIPTS] == ["bitwise", "floor", "beyond"]
    idioms = report_of(folder, "idioms")
    assert {"hvd.allreduce", "hvd.allgather", "hvd.allgather_object", "hvd.broadcast_object", "hvd.join",
            "hvd.barrier", "backward_passes_per_step", "the model after the DDP wrap"} <= {c.rule for c in
                                                                                           idioms.changes}
    (compression,) = [c for c in report_of(folder, "fp16").changes if c.rule == "compression"]
    assert compression.cause == "gradients" and "float16" in compression.effect
    assert "with contextlib.nullcontext() if (i + 1) % ACCUMULATE == 0 else model.no_sync():\n" \
        "                loss = F.cross_entropy(model(x), y) / ACCUMULATE\n" in \
        (folder / "ddp_idioms.py").read_text()


@pytest.fixture(scope="module")
def idioms(folder) -> Dict:
    return compared(folder, "idioms")


def test_the_idioms_that_cannot_change_training_port_bitwise_identical(idioms):
    assert idioms["bitwise_identical"] and idioms.get("cause") is None, idioms


def written(folder: Path, side: str, suffix: str) -> Path:
    """What a script of the idioms' comparison wrote into its run's own working directory."""
    run = "horovod-gloo-np2-r1" if side == "horovod" else "ddp-np2-r1"
    return folder / "compare-idioms" / "runs" / run / WORKING_DIR / f"{side}_idioms{suffix}"


def test_metrics_gathers_broadcasts_and_the_checkpoint_are_what_horovod_wrote(folder, idioms):
    horovod, ddp = (json.loads(written(folder, side, ".json").read_text()) for side in ("horovod", "ddp"))
    assert ddp == horovod
    assert horovod["seen"] == [256, 256] and horovod["settings"] == {"seed": 42, "from": 0}
    assert horovod["rows"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    assert horovod["places"] == [[0, 0, 2], [1, 1, 2]]
    saved = {side: torch.load(written(folder, side, ".ckpt"), weights_only=True) for side in ("horovod", "ddp")}
    assert list(saved["ddp"]["model"]) == list(saved["horovod"]["model"]) == ["0.weight", "0.bias", "2.weight",
                                                                              "2.bias"]
    assert all(torch.equal(saved["ddp"]["model"][k], v) for k, v in saved["horovod"]["model"].items())
    momentum = [s["momentum_buffer"] for s in saved["horovod"]["optimizer"]["state"].values()]
    assert all(torch.equal(a, s["momentum_buffer"])
               for a, s in zip(momentum, saved["ddp"]["optimizer"]["state"].values(), strict=True))


def test_fp16_compression_ports_apart_by_rounding_only(folder):
    """Not bitwise (float16 rounds where each divides), and no further apart than the comparison's tolerance
    after two epochs: the two runs a floor would need cost more than this claim (the floor judges the same pair
    within it)."""
    pair = compared(folder, "fp16", "--noise-floor", "off")
    assert not pair["bitwise_identical"] and pair["verdict"].startswith("equal within"), pair
    # where they first differ, nothing before the gradients does (inputs, settings, state all equal)
    assert pair["trains_differently_from"] is None, pair
    assert pair.get("cause") is None or pair["cause"]["quantity"] in ("gradients", "weights and loss"), pair


def test_the_dropped_zero_step_parts_the_port_where_and_why_the_report_says(folder):
    """compare-backends --port at 2 ranks, as a user runs it (every Horovod controller, no --hvd-controllers):
    the port made and compared in one command, every run complete; where the two part, the verdict names the
    rewrite that explains it, and the report shows the port's rewrites. (--port at 3 ranks is
    test_compare_port_project's and test_port_exit's.)"""
    (zero,) = [c for c in report_of(folder, "adam").changes if c.rule == "hvd.broadcast_optimizer_state"]
    assert zero.changes_training and "Adam's step count" in zero.effect
    out = folder / "compare-port-adam"
    result = compare("--port", "horovod_adam.py", "--np", "2", "--repeats", "1", "--noise-floor", "off", "--out",
                     out, "--", *ARGS, cwd=folder)
    assert result.returncode == 0, result.output[-4000:]
    assert "ported horovod_adam.py to " in result.output and (out / "port" / "horovod_adam.py").is_file()
    assert not (folder / "horovod_adam_ported.py").exists()  # the user's folder gets no file
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert not summary["failures"], summary["failures"]
    # Gloo at every world size and Open MPI at the largest (the default controllers), here both at 2; the port
    assert sorted(path.name for path in (out / "runs").iterdir() if (path / SUMMARY_FILE).is_file()) == [
        "ddp-np2-r1", "horovod-gloo-np2-r1", "horovod-mpi-np2-r1"]
    pairs = [p for p in summary["parity"] if p["kind"] == "backends"]
    assert {label.split("@")[0] for p in pairs for label in (p["a"], p["b"])} == {"ddp", "horovod-gloo",
                                                                                  "horovod-mpi"}, pairs
    (pair,) = [p for p in pairs if p["world_size"] == 2
               and {p["a"].split("@")[0], p["b"].split("@")[0]} == {"ddp", "horovod-gloo"}]
    # the zero step moves no weight under Adam: the first step's loss is the same, the second is not
    assert pair["first_differing_step"] == 2, pair
    assert pair["cause"]["quantity"] == zero.cause and pair["cause"]["step"] == 1, pair["cause"]
    assert "broadcast_optimizer_state" in pair["cause"]["text"], pair["cause"]
    # the verdict names the rewrite and what makes the port train the same; the cell is an announced difference
    assert pair["explained_by"].startswith(f"the port's rewrite at line {zero.line} (hvd.broadcast_optimizer_state); "
                                           "to train the same, port with --zero-step keep"), pair["explained_by"]
    assert pair["explained_by"] in pair["verdict"]
    row = next(row for row in summary["summary"]["rows"] if row["world_size"] == 2)
    assert [cell["kind"] for column, cell in row["cells"].items()
            if "ddp" in column and "horovod-gloo" in column] == ["announced"], row
    report = (out / "report.md").read_text()
    assert "## The port" in report and f"| horovod_adam.py:{zero.line} | hvd.broadcast_optimizer_state |" in report
