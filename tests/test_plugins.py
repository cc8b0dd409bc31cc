"""Your model, your data: --model package.module:function, --model torchvision:NAME and --dataset
package.module:function, written by the test into a folder of its own and run from there, through the real
launchers and the comparison; bad factories fail on every rank with one line and exit code 2."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from common.launch import Job as LaunchedJob
from launched import assert_every_rank_exited, command, compare, compare_in_process, job_env, read_run, run_cmd
from common.rundir.names import SUMMARY_FILE

TOKENS = '''
    """A token-sequence task: the class is the marker token that fills half of each sequence."""
    import torch
    from torch.utils.data import TensorDataset


    def build(data_dir=None, seed=0, samples=192, length=12, vocab=24, classes=4):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randint(classes, vocab, (samples, length), generator=gen)
        y = torch.randint(classes, (samples,), generator=gen)
        for i in range(samples):
            x[i, torch.randperm(length, generator=gen)[:length // 3]] = y[i]
        n_val = samples // 4
        return TensorDataset(x[n_val:], y[n_val:]), TensorDataset(x[:n_val], y[:n_val])
'''
TRANSFORMER = '''
    """A small transformer-style classifier over token sequences: embedding, encoder layers (attention,
    LayerNorm, dropout), mean pooling, a linear head."""
    import torch
    from torch import nn


    class Classifier(nn.Module):
        def __init__(self, num_classes, length, vocab=24, width=32, heads=4, depth=1, dropout=0.1):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.zeros(length, width))
            layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=dropout, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, num_classes)

        def forward(self, tokens):
            return self.head(self.norm(self.encoder(self.embed(tokens) + self.position).mean(dim=1)))


    def build(num_classes, channels, image_size, **model_args):
        return Classifier(num_classes, length=image_size, **model_args)
'''
BAD = '''
    import torch
    from torch import nn


    def raises(**kwargs):
        raise ValueError("depth must be positive")


    def not_a_module(**kwargs):
        return 3


    def one_set(data_dir=None, seed=0):
        return [torch.zeros(3)]


    def float_labels(data_dir=None, seed=0):
        data = [(torch.zeros(4), 0.5)] * 8
        return data, data


    class Sparse(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.embed = nn.Embedding(10, 8, sparse=True)
            self.head = nn.Linear(8, num_classes)

        def forward(self, x):
            return self.head(self.embed(x.flatten(1).long().clamp(0, 9)).mean(1))


    def sparse(num_classes, channels, image_size):
        return Sparse(num_classes)


    class Spare(nn.Module):
        def __init__(self, num_classes, size):
            super().__init__()
            self.head = nn.Linear(size, num_classes)
            self.spare = nn.Linear(size, num_classes)

        def forward(self, x):
            return self.head(x.flatten(1))


    def unused(num_classes, channels, image_size):
        return Spare(num_classes, channels * image_size * image_size)
'''
#: case -> (arguments, what its one line says)
BAD_FACTORIES = {
    "module-missing": (["--model", "nosuch_module:build"], "cannot import 'nosuch_module': ModuleNotFoundError"),
    "import-fails": (["--model", "broken:build"], "cannot import 'broken': ModuleNotFoundError: No module named "
                                                  "'nonexistent_dependency' (at broken.py:1"),
    "attribute-missing": (["--model", "transformer:biuld"], "has no 'biuld'; did you mean build?"),
    "raises": (["--model", "bad:raises"], "raised ValueError: depth must be positive (at bad.py:6 in raises)"),
    "not-a-module": (["--model", "bad:not_a_module"], "returned an int, not a torch.nn.Module"),
    "not-two-datasets": (["--dataset", "bad:one_set"], "returned a list of 1; return (train, val)"),
    "bad-sample": (["--dataset", "bad:float_labels"], "train[0]'s label is 0.5 (float); make it an int"),
    "sparse-gradients": (["--model", "bad:sparse"], "get sparse gradients"),
    "unused-parameters": (["--model", "bad:unused"], "parameters spare.weight, spare.bias get no gradient"),
}
#: Every bad factory is refused by open_inputs in Trainer.prepare, which each rank runs before any collective, through
#: its one fail_usage. These two show that under torchrun, on every rank at once: the first refusal open_inputs makes
#: (importing the model's factory) and the last (after the model's trial step); each other case runs in one process.
ON_EVERY_RANK = ("module-missing", "unused-parameters")
SHORT = ["--epochs", "2", "--optimizer", "adam", "--lr", "0.01", "--threads", "1"]
PLUGINS = ["--model", "transformer:build", "--dataset", "tokens:build", "--model-arg", "depth=2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder outside the project holding the user's modules; every command here runs from it."""
    path = tmp_path_factory.mktemp("mine")
    for name, text in (("tokens", TOKENS), ("transformer", TRANSFORMER), ("bad", BAD)):
        (path / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    (path / "broken.py").write_text("import nonexistent_dependency\n")
    return path


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
    """Every bad factory, three jobs at a time (they mostly wait for processes that import torch and stop), each
    timed on its own: ON_EVERY_RANK's under torchrun at 2 ranks, the others alone (none-ddp).
    case -> (output, exit code, seconds, run dir)"""
    def launch_case(case):
        run_dir = tmp_path_factory.mktemp(case) / "run"
        args = [*BAD_FACTORIES[case][0], "--run-dir", str(run_dir)]
        if case in ON_EVERY_RANK:
            return (*run_torchrun_timing_ranks(args, folder), run_dir)
        alone = run_cmd(command("none-ddp", 1, args), timeout=60, cwd=folder)
        return alone.output, alone.returncode, alone.seconds, run_dir

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(BAD_FACTORIES, pool.map(launch_case, BAD_FACTORIES), strict=True))


@pytest.mark.parametrize("case", list(BAD_FACTORIES))
def test_bad_factory_exits_2_on_every_rank_at_once_with_one_line(bad_factory_jobs, case):
    """Each rank of ON_EVERY_RANK's torchrun jobs, or the one process of the others, prints one line naming the
    problem and exits 2, within seconds, with no traceback of ours and no run directory."""
    _, expected = BAD_FACTORIES[case]
    output, code, seconds, run_dir = bad_factory_jobs[case]
    # The processes import torch and stop (seconds alone; more beside other tests on 2 cores): not a hang.
    assert seconds < 30, f"it took {seconds:.1f}s"
    errors = [line for line in output.splitlines() if "ddp_train: error: " in line]
    if case in ON_EVERY_RANK:
        assert code != 0
        for rank in range(2):
            mine = [line for line in errors if line.startswith(f"[rank {rank}] ")]
            assert len(mine) == 1 and expected in mine[0], f"rank {rank}:\n{output[-3000:]}"
        assert_every_rank_exited("torchrun", output, 2, 2)
    else:
        assert code == 2 and len(errors) == 1 and expected in errors[0], output[-3000:]
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
