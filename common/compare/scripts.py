"""--scripts: which backend each of a user's training scripts is written for, read from its text (the
comparison never imports, copies or changes a script: the probe runs it in each rank)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional, Sequence

from .matrix import Scripts


def backend_of(path: Path) -> str:
    """"horovod" for a script that imports horovod, else "ddp"; ValueError when it cannot be read or parsed."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except OSError as exc:
        raise ValueError(f"--scripts {path}: cannot be read ({exc.strerror or exc}); give a training script's path "
                         "from this folder") from None
    except SyntaxError as exc:
        raise ValueError(f"--scripts {path}: not Python (line {exc.lineno}: {exc.msg})") from None
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(name == "horovod" or name.startswith("horovod.") for name in names):
            return "horovod"
    return "ddp"


def on_the_api(paths: Sequence[str], args: Sequence[str], max_steps: Optional[int] = None) -> Scripts:
    """--horovod-api: one Horovod script, run under horovodrun (the real Horovod) and under torchrun on the
    project's Horovod API (the probe's --api horovod), each ended after `max_steps` steps (None: where it ends)."""
    if len(paths) != 1 or backend_of(Path(paths[0])) != "horovod":
        shown = " ".join(paths)
        raise ValueError(f"--horovod-api runs one Horovod script on the API and on Horovod: give --scripts "
                         f"TRAIN_HOROVOD.py alone (not {shown})")
    return Scripts((("horovod-api", paths[0]), ("horovod", paths[0])), tuple(args), max_steps)


def program(paths: Sequence[str], args: Sequence[str], max_steps: Optional[int] = None) -> Scripts:
    """The scripts to run: HOROVOD_SCRIPT DDP_SCRIPT, or one alone (under its own backend's launcher), each ended
    after `max_steps` steps (None: where it ends)."""
    if len(paths) > 2:
        raise ValueError(f"--scripts takes a Horovod script and its DDP port, or one script; got {len(paths)}")
    kinds = [backend_of(Path(p)) for p in paths]
    if len(paths) == 2:
        if kinds[0] != "horovod":
            raise ValueError(f"--scripts {paths[0]} {paths[1]}: {paths[0]} does not import horovod; give the Horovod "
                             "script first, then its DDP port")
        if kinds[1] != "ddp":
            raise ValueError(f"--scripts {paths[0]} {paths[1]}: {paths[1]} imports horovod too; the second script is "
                             "the DDP port")
    return Scripts(tuple(zip(kinds, paths, strict=True)), tuple(args), max_steps)
