"""Users' own training scripts for the tests of `compare-backends --scripts` and the probe: examples/migrating's
Horovod script and its DDP port (their own loop, DistributedSampler, lr x size, broadcast_parameters,
broadcast_optimizer_state, DistributedOptimizer / DDP), written into a test's folder with edits, and the commands
that run them under the probe."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence, Tuple

from common import launch as launch_layer
from common.launch.userscript import safe_path_env
from launched import PY, REPO, run_cmd

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
