"""A Horovod script trains the same bits on the API as on Horovod itself: at 2 ranks, the project's
examples/migrating/train_horovod.py run unchanged (its printed test results and final weights' digest), then Adam with
weight decay after broadcast_optimizer_state on a fresh optimizer (Horovod's zero-gradient step moves the weights),
each launched once under real horovodrun --gloo and once under torchrun with the API."""

from __future__ import annotations

import re
import textwrap
from typing import Dict

import pytest

from common import launch as launch_layer
from launched import PY, REPO, Result, command, run_cmd

EXAMPLE = REPO / "examples" / "migrating" / "train_horovod.py"
ARGS = ["--epochs", "1", "--batch-size", "32", "--lr", "0.05", "--momentum", "0.9", "--seed", "42"]

#: the example unchanged, as `python train_horovod.py ARGS` runs it, then Adam's zero step and five steps
PAIR = textwrap.dedent('''
    import hashlib, runpy, sys
    import torch
    import torch.nn.functional as F
    import horovod.torch as hvd

    def digest(model):
        sha = hashlib.sha256()
        for tensor in model.state_dict().values():
            sha.update(tensor.detach().contiguous().numpy().tobytes())
        return sha.hexdigest()

    example = sys.argv[1]
    sys.argv = [example, *sys.argv[2:]]
    runpy.run_path(example, run_name="__main__")

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = digest(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    zero_step = digest(model)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    torch.manual_seed(10 + hvd.rank())
    for _ in range(5):
        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    if hvd.rank() == 0:
        print(f"adam before {before} zero step {zero_step} final {digest(model)}", flush=True)
''')
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
def runs(tmp_path_factory) -> Dict[str, Dict]:
    folder = tmp_path_factory.mktemp("horovod_api_parity")
    script = folder / "pair.py"
    script.write_text(PAIR)
    horovod = command("horovodrun-gloo", 2, ARGS)
    at = horovod.index("-m")
    real = run_cmd(horovod[:at] + [str(script), str(EXAMPLE)] + horovod[at + 2:], timeout=180, cwd=folder).check()
    api = run_cmd(launch_layer.get("torchrun").command(2, [str(script), str(EXAMPLE), *ARGS],
                                                       module="ddp_train.horovod_api", python=PY),
                  timeout=180, cwd=folder).check()
    return {"horovod": printed(real), "api": printed(api)}


def test_train_horovod_prints_the_same_bits_as_on_horovod(runs):
    """Every printed test result (loss with all 9 digits of its float32, accuracy) and the final weights."""
    assert runs["api"]["tests"] and runs["api"]["tests"] == runs["horovod"]["tests"]
    assert runs["api"]["digest"] == runs["horovod"]["digest"]


def test_broadcast_optimizer_state_moves_the_weights_as_horovod_does(runs):
    before, zero_step, final = runs["api"]["adam"]
    assert zero_step != before  # Adam's weight decay on zero gradients: the weights moved before any data
    assert runs["api"]["adam"] == runs["horovod"]["adam"]  # the same move, and the same five steps after it
