"""A Horovod script trains the same bits on the API as on Horovod itself: at 2 ranks, the project's
examples/migrating/train_horovod.py run unchanged (its printed test results and final weights' digest), then Adam with
weight decay after broadcast_optimizer_state on a fresh optimizer (Horovod's zero-gradient step moves the weights),
each launched once under real horovodrun --gloo and once under torchrun with the API."""

from __future__ import annotations

import re
from typing import Dict

import pytest

from common import launch as launch_layer
from launched import PY, Result, run_cmd
from userscripts import EXAMPLE_ARGS, EXAMPLES, example_then_adam_script, example_under_horovodrun

TEST_LINE = re.compile(r"Epoch (\d+) test set: Average loss: (\S+), Accuracy: (\S+)%")
DIGEST_LINE = re.compile(r"Final weights sha256: ([0-9a-f]{64})")
ADAM_LINE = re.compile(r"adam before ([0-9a-f]{64}) zero step ([0-9a-f]{64}) final ([0-9a-f]{64})")


def printed(result: Result) -> Dict:
    adam = ADAM_LINE.findall(result.output)
    assert adam and DIGEST_LINE.search(result.output), f"{' '.join(result.cmd)} printed no result:\n" \
                                                       f"{result.output[-4000:]}"
    return {"tests": TEST_LINE.findall(result.output), "digest": DIGEST_LINE.findall(result.output),
            "adam": adam[0]}


@pytest.fixture(scope="module")
def outputs(runs, tmp_path_factory) -> Dict[str, Dict]:
    """The example then Adam under real horovodrun (the session's one launch, which test_migrating reads too) and
    under torchrun with the API."""
    folder = tmp_path_factory.mktemp("horovod_api_parity")
    script = example_then_adam_script(folder)
    api = run_cmd(launch_layer.get("torchrun").command(2, [str(script), str(EXAMPLES / "train_horovod.py"),
                                                           *EXAMPLE_ARGS], module="ddp_train.horovod_api", python=PY),
                  timeout=180, cwd=folder).check()
    return {"horovod": printed(example_under_horovodrun(runs)), "api": printed(api)}


def test_train_horovod_prints_the_same_bits_as_on_horovod(outputs):
    """Every printed test result (loss with all 9 digits of its float32, accuracy) and the final weights."""
    assert outputs["api"]["tests"] and outputs["api"]["tests"] == outputs["horovod"]["tests"]
    assert outputs["api"]["digest"] == outputs["horovod"]["digest"]


def test_broadcast_optimizer_state_moves_the_weights_as_horovod_does(outputs):
    before, zero_step, final = outputs["api"]["adam"]
    assert zero_step != before  # Adam's weight decay on zero gradients: the weights moved before any data
    assert outputs["api"]["adam"] == outputs["horovod"]["adam"]  # the same move, and the same five steps after it
