"""examples/migrating: the Horovod script and its DDP translation, each launched as a user would
(horovodrun --gloo, torchrun), train the digits above chance and, at 2 ranks, print the same bits.
The Horovod run is the session's one (userscripts.example_under_horovodrun: the script run unchanged, then
test_horovod_api_parity's Adam steps). The factories they share (net.build, data.build) keep the contract of
--model/--dataset plugins."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from launched import Result, command, run_cmd
from userscripts import EXAMPLE_ARGS, EXAMPLES as EXAMPLE, example_under_horovodrun

TEST_LINE = re.compile(r"Epoch (\d+) test set: Average loss: (\S+), Accuracy: (\S+)%")
DIGEST_LINE = re.compile(r"Final weights sha256: ([0-9a-f]{64})")
CHANCE = 10.0  # percent: ten classes


def script_command(launcher: str, script: Path, args: List[str]) -> List[str]:
    """The registered launcher's command for 2 processes, running `script` instead of the project's module."""
    cmd = command(launcher, 2, args)
    at = cmd.index("-m")
    return cmd[:at] + [str(script)] + cmd[at + 2:]


def printed(result: Result) -> Dict:
    """What rank 0 printed: [(epoch, loss text, accuracy text)] and the final weights' digest."""
    tests = TEST_LINE.findall(result.output)
    digests = DIGEST_LINE.findall(result.output)
    assert tests and len(digests) == 1, f"{' '.join(result.cmd)} printed no result:\n{result.output[-4000:]}"
    return {"tests": tests, "digest": digests[0]}


@pytest.fixture(scope="module")
def horovod_run(runs) -> Result:
    return example_under_horovodrun(runs)


@pytest.fixture(scope="module")
def ddp_run() -> Result:
    return run_cmd(script_command("torchrun", EXAMPLE / "train_ddp.py", EXAMPLE_ARGS), timeout=120).check()


@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_script_trains_above_chance_on_two_ranks(backend, request):
    result = request.getfixturevalue(f"{backend}_run")
    for rank in (0, 1):
        assert f"rank {rank} of 2, local rank {rank}" in result.output
    epoch, loss, accuracy = printed(result)["tests"][-1]
    assert epoch == "1"
    assert float(accuracy) > 3 * CHANCE, f"{backend}: accuracy {accuracy}% after one epoch"
    assert float(loss) < 2.3  # below ln(10), the loss of a uniform guess


def test_ddp_translation_prints_what_horovod_prints(horovod_run, ddp_run):
    """At 2 ranks the two average gradients to the same bits (a/2 + b/2 = (a + b)/2), so a faithful
    translation prints the same loss (all 9 digits of its float32), accuracy and weights."""
    horovod, ddp = printed(horovod_run), printed(ddp_run)
    assert ddp["tests"] == horovod["tests"]
    assert ddp["digest"] == horovod["digest"]


def _import_example(name: str):
    """examples/migrating/NAME.py, loaded by path (the tests may run from any directory)."""
    spec = importlib.util.spec_from_file_location(f"migrating_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dataset_factory_keeps_the_plugin_contract():
    data = _import_example("data")
    train, val = data.build(data_dir=None, seed=42)
    assert (len(train), len(val)) == (1438, 359)
    image, label = train[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32 and label.dtype == torch.int64
    labels = torch.cat([train.tensors[1], val.tensors[1]])
    assert sorted(labels.unique().tolist()) == list(range(10))
    again, _ = data.build(seed=42)
    other, _ = data.build(seed=7)
    assert torch.equal(again.tensors[0], train.tensors[0])
    assert not torch.equal(other.tensors[1], train.tensors[1])


@pytest.mark.parametrize("size", [4, 8, 28, 32])
def test_model_factory_takes_any_image_size(size):
    net = _import_example("net")
    model = net.build(num_classes=10, channels=3, image_size=size)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(2))  # log-probabilities
