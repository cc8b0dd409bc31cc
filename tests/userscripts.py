"""Users' own training scripts for the tests of `compare-backends --scripts` and the probe: examples/migrating's
Horovod script and its DDP port (their own loop, DistributedSampler, lr x size, broadcast_parameters,
broadcast_optimizer_state, DistributedOptimizer / DDP), written into a test's folder with edits, and the commands
that run them under the probe; and the Horovod script's one run under real horovodrun that two modules read."""

from __future__ import annotations

import hashlib
import os
import textwrap
from pathlib import Path
from typing import Sequence, Tuple

from common import launch as launch_layer
from common.launch.userscript import safe_path_env
from launched import PY, REPO, Result, command, run_cmd

EXAMPLES = REPO / "examples" / "migrating"
#: the scripts' own arguments: 2 epochs of 12 steps at 2 ranks
SCRIPT_ARGS = ["--epochs", "2", "--batch-size", "64"]
#: a line every script writes when it is run: which process ran it (the comparison's own must never)
RUN_BY = 'open("run-by.log", "a").write(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "none")) + "\\n")\n'

Edit = Tuple[str, str]


def edited(name: str, *edits: Edit) -> str:
    """examples/migrating/NAME with each (old, new) replaced once (old must be there) and the run-by line."""
    text = (EXAMPLES / name).read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{name}: {old!r} is not there once"
        text = text.replace(old, new)
    return text.replace("\ndef main(args):\n", "\n" + RUN_BY + "\n\ndef main(args):\n", 1)


def write_folder(here: Path, scripts: dict) -> Path:
    """A user's folder: examples/migrating's data and net modules, and each script NAME: (source, edits)."""
    for name in ("data.py", "net.py"):
        (here / name).write_text((EXAMPLES / name).read_text())
    for name, (source, edits) in scripts.items():
        (here / name).write_text(edited(source, *edits))
    return here


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def probed(launcher: str, np: int, run_dir: Path, script: str, script_args: Sequence[str] = SCRIPT_ARGS,
           probe_args: Sequence[str] = ()) -> list:
    """The command that runs `script` under the probe through `launcher`, as the comparison starts it."""
    return launch_layer.get(launcher).command(np, ["--run-dir", str(run_dir), *probe_args, script, *script_args],
                                              module="common.probe", python=PY)


def probe_run(folder: Path, launcher: str, script: str, np: int = 2, script_args: Sequence[str] = SCRIPT_ARGS,
              name: str = "") -> Path:
    """One script run under the probe through its launcher, from `folder`, as the comparison starts it (with
    PYTHONSAFEPATH, common.launch.userscript): its run directory."""
    run_dir = folder / "probed" / (name or Path(script).stem)
    env = safe_path_env({})
    result = run_cmd(probed(launcher, np, run_dir, script, script_args), timeout=300, cwd=folder, env=env)
    assert result.returncode == 0, result.output[-3000:]
    return run_dir


#: the arguments a user gives examples/migrating's scripts: one epoch of 23 steps per rank at 2 ranks
EXAMPLE_ARGS = ["--epochs", "1", "--batch-size", "32", "--lr", "0.05", "--momentum", "0.9", "--seed", "42"]
#: the Horovod example unchanged, as `python train_horovod.py ARGS` runs it, then Adam's zero step and five steps
EXAMPLE_THEN_ADAM = textwrap.dedent('''
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


def example_then_adam_script(folder: Path) -> Path:
    """EXAMPLE_THEN_ADAM written into `folder` (in one move: another process may be reading it)."""
    script = folder / "example_then_adam.py"
    partial = folder / f".example_then_adam.{os.getpid()}"
    partial.write_text(EXAMPLE_THEN_ADAM)
    os.replace(partial, script)
    return script


def example_under_horovodrun(runs) -> Result:
    """EXAMPLE_THEN_ADAM under real `horovodrun -np 2 --gloo`, launched once per session (Runs.once): what it
    printed. test_migrating reads the example's part, test_horovod_api_parity all of it."""
    script = example_then_adam_script(runs.root)
    horovod = command("horovodrun-gloo", 2, EXAMPLE_ARGS)
    at = horovod.index("-m")
    cmd = horovod[:at] + [str(script), str(EXAMPLES / "train_horovod.py")] + horovod[at + 2:]
    return runs.once("example-then-adam-horovodrun", cmd, timeout=180).check()
