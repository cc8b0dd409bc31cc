"""Horovod elastic on the API under torchrun's restarts: a rank dies in the middle of `hvd.elastic.run`; the survivor
writes its last commit and exits, torchrun (--max-restarts 1) starts the job again, and training continues from that
commit to the same weights a run without the failure reaches."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from common import launch as launch_layer
from launched import PY, Result, run_cmd

EPOCHS, LR, BATCH = 4, 0.1, 8

#: a Horovod elastic script; rank 1 dies at epoch 2 of the first attempt
ELASTIC = textwrap.dedent(f'''
    import os
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr={LR}),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @hvd.elastic.run
    def train(state):
        print(f"attempt {{attempt}} rank {{hvd.rank()}} starts at epoch {{state.epoch}}", flush=True)
        while state.epoch < {EPOCHS}:
            if attempt == 0 and state.epoch == 2 and hvd.rank() == 1:
                os._exit(3)  # this rank dies in the middle of training
            optimizer.zero_grad()
            model(torch.ones({BATCH}, 4) * (hvd.rank() + 1)).sum().backward()
            optimizer.step()
            state.epoch += 1
            state.commit()
        return state.epoch

    epochs = train(state)
    if hvd.rank() == 0:
        print(f"attempt {{attempt}} finished after epoch {{epochs}}: weight sum {{model.weight.sum().item():.6f}}",
              flush=True)
''')


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> Result:
    folder = tmp_path_factory.mktemp("horovod_api_elastic")
    script = folder / "elastic.py"
    script.write_text(ELASTIC)
    cmd = launch_layer.get("torchrun").command(2, [str(script)], module="ddp_train.horovod_api", python=PY)
    return run_cmd(cmd[:1] + ["--max-restarts=1"] + cmd[1:], timeout=180, cwd=folder)


def test_the_job_survives_a_lost_rank(restarted):
    assert restarted.returncode == 0, restarted.output[-3000:]
    assert "wrote its last commit and exits for torchrun to restart the job" in restarted.output


def test_training_continues_from_the_last_commit(restarted):
    assert "attempt 0 rank 0 starts at epoch 0" in restarted.output
    assert "continuing from commit 2 of the previous attempt" in restarted.output
    assert "attempt 1 rank 0 starts at epoch 2" in restarted.output
    assert "attempt 1 rank 1 starts at epoch 2" in restarted.output


def test_the_weights_are_those_of_a_run_without_the_failure(restarted):
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 2).weight.detach().double()
    # every epoch: the gradient of sum(W x) over a batch of ones * (rank + 1), averaged over the 2 ranks
    step = LR * BATCH * (1 + 2) / 2
    expected = float((start - EPOCHS * step).sum())
    found = re.search(r"attempt 1 finished after epoch 4: weight sum (-?[0-9.]+)", restarted.output)
    assert found, restarted.output[-3000:]
    assert abs(float(found[1]) - expected) < 1e-4
