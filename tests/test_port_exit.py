"""A ported script ends as it means to, every time: benchmarks/port_exit.py's count, small. The port of a Horovod
script whose model is a global (code at module level) and of one whose main() fails after training, each run twice
at 3 ranks under torchrun: every run of the first exits 0, every run of the second exits 1 with its own traceback, and
no rank aborts at Python's teardown (ddp_train/port/ending.py; `python -m benchmarks.port_exit --runs 50` is the full
count, in BENCHMARKS.md). And the end at work in a process of one rank: on return and on an exception the DDP model is
gone and the process group destroyed before Python's teardown, and the traceback and the exit code of a script that
fails are Python's own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.port_exit import main as port_exit
from ddp_train.port import port
from ddp_train.port.ending import HELPER

CALL = f"{HELPER}()"

pytestmark = pytest.mark.timeout(900)


def test_every_run_of_a_port_at_3_ranks_exits_as_the_script_means_without_an_abort(tmp_path):
    assert port_exit(["--runs", "2", "--np", "3", "--variants", "module,fails", "--out", str(tmp_path)]) == 0
    rows = {row["variant"]: row for row in json.loads((tmp_path / "port_exit.json").read_text())["rows"]}
    assert rows["module"]["exits"] == {"0": 2} and rows["fails"]["exits"] == {"1": 2}
    assert [(row["aborts"], row["as_expected"]) for row in rows.values()] == [(0, 2), (0, 2)]


# ---- the helper at work: a port of one rank in a process of its own ----

WATCHED = """\
import atexit
import sys
import weakref

import torch
import horovod.torch as hvd

held = []


@atexit.register  # registered first, so it runs last: after the port's end
def after():
    import torch.distributed as dist
    print('after the end: model alive', held[0]() is not None, 'group', dist.is_initialized(), flush=True)


def main(fail):
    hvd.init()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    torch.nn.functional.mse_loss(model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    optimizer.step()
    held.append(weakref.ref(model))
    print('trained', flush=True)
    if fail:
        raise RuntimeError('failed after training')


main('--fail' in sys.argv)
"""


def run_one_rank(script: Path, *args: str) -> subprocess.CompletedProcess:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port_number = free.getsockname()[1]
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port_number), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=script.parent)


def test_on_return_and_on_an_exception_the_model_is_gone_and_the_group_destroyed_before_the_teardown(tmp_path):
    code = port(textwrap.dedent(WATCHED), "train.py", "train_ddp.py").code
    script = tmp_path / "train_ddp.py"
    script.write_text(code)
    done = run_one_rank(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\nafter the end: model alive False group False\n"
    failed = run_one_rank(script, "--fail")
    assert failed.returncode == 1
    assert failed.stdout == "trained\nafter the end: model alive False group False\n"
    # the same port without the end (a line of its own, so that every line keeps its number): the same traceback
    script.with_name("bare.py").write_text(code.replace(f"\n    {CALL}\n", "\n    pass\n"))
    bare = run_one_rank(script.with_name("bare.py"), "--fail")
    assert bare.returncode == 1 and "after the end: model alive True group True" in bare.stdout
    assert failed.stderr.replace("train_ddp.py", "bare.py") == bare.stderr
    assert failed.stderr.rstrip().endswith("RuntimeError: failed after training")
