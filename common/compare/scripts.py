"""--scripts: which backend each of a user's training scripts is written for, read from its text (the
comparison never imports, copies or changes a script: the probe runs it in each rank), and what each run's working
directory links to: the folder the comparison was started in (common.compare.workdir)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from .matrix import Scripts
from .workdir import LinkedFolder, absolute_climbs, as_run_gives_it


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


def linked(scripts: Sequence[Tuple[str, str]], args: Sequence[str], max_steps: Optional[int], here: Path,
           out: Path, folders: Optional[Dict[str, LinkedFolder]] = None) -> Scripts:
    """The scripts (backend, path from `here`) as their runs give them to python, each run in a working directory
    linked to `here` (the folder the comparison started in), less `out`; `folders` replaces that for a backend."""
    here, out = here.resolve(), out.resolve()
    folders = folders or {}
    plain = LinkedFolder(here, left_out=(out,))
    return Scripts(tuple((backend, as_run_gives_it(path, here)) for backend, path in scripts),
                   absolute_climbs(args, here), max_steps,
                   tuple((backend, folders.get(backend, plain)) for backend, _ in scripts))


def on_the_api(paths: Sequence[str], args: Sequence[str], max_steps: Optional[int] = None, *, here: Path,
               out: Path) -> Scripts:
    """--horovod-api: one Horovod script, run under horovodrun (the real Horovod) and under torchrun on the
    project's Horovod API (the probe's --api horovod), each ended after `max_steps` steps (None: where it ends), each
    run in a working directory of its own linked to `here`."""
    if len(paths) != 1 or backend_of(Path(paths[0])) != "horovod":
        shown = " ".join(paths)
        raise ValueError(f"--horovod-api runs one Horovod script on the API and on Horovod: give --scripts "
                         f"TRAIN_HOROVOD.py alone (not {shown})")
    return linked((("horovod-api", paths[0]), ("horovod", paths[0])), args, max_steps, here, out)


def program(paths: Sequence[str], args: Sequence[str], max_steps: Optional[int] = None, *, here: Path,
            out: Path) -> Scripts:
    """The scripts to run: HOROVOD_SCRIPT DDP_SCRIPT, or one alone (under its own backend's launcher), each ended
    after `max_steps` steps (None: where it ends), each run in a working directory of its own linked to `here`."""
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
    return linked(tuple(zip(kinds, paths, strict=True)), args, max_steps, here, out)
