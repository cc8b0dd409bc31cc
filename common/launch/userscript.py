"""A user's own code run from inside one of the project's programs (the probe, the Horovod API) as python runs it.

`python SCRIPT ARGS` runs SCRIPT as `__main__` with its folder first on sys.path; `python -m MODULE ARGS` runs
MODULE as `__main__` with the current folder first. A program of this project that hosts a user's code must give
the code exactly that, while its own packages keep working. Two things stand in the way, and both are met here:

- The project's top-level package is called `common`, a name users' folders often hold too (`common.py`, a
  `common/` package; Horovod's test utilities are one). Started with `-m` from such a folder, python finds the
  user's `common` before the project's and the program cannot even start. The comparison therefore starts its
  programs with PYTHONSAFEPATH=1 (`safe_path_env`: python does not put the folder first), and so can a user who
  starts the probe by hand from such a folder (or `python -P -m common.probe`); a program of a backend's package
  (the Horovod API's) drops that first entry itself before it imports anything of `common`.
- Once the program runs, the project's modules are in sys.modules, where the user's `import common` would find
  them instead of the user's own. While the user's code runs, every module of the project's packages is set aside
  (`project_set_aside`): the user's imports resolve as under plain python, and the program's code, imported
  before, keeps its module objects. The program therefore imports everything it needs before the user's code
  starts, and nothing of the project while it runs.

A user's code that ends (returns, or exits with code 0) ends its process through `leave`: its atexit handlers run,
then the process exits without the interpreter's teardown, where torch's C++ threads (a DDP reducer freed after
its process group, gloo work of a destroyed group) can abort a process whose work is complete.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, NoReturn, Optional, Sequence, Tuple

#: the project's top-level packages: set aside while a user's code runs
PROJECT_PACKAGES = ("common", "ddp_train", "hvd_train", "benchmarks")
#: set beside PYTHONSAFEPATH=1 by the program that launched this one, so that it is removed again before the
#: user's code starts (its own children then see python's usual sys.path); a PYTHONSAFEPATH of the user's stays
SAFE_PATH_MARK = "HVD_DDP_COMPARE_SAFE_PATH"
#: in a script's arguments, the run directory of the run it is given to (the probe fills it in: `--checkpoint
#: {run_dir}/ck.pt` gives each run of a comparison a path of its own)
RUN_DIR_PLACEHOLDER = "{run_dir}"


def safe_path_env(env: Dict[str, str]) -> Dict[str, str]:
    """The variables a launcher of a program that hosts user code adds to the job's environment `env`: PYTHONSAFEPATH
    and its mark (torchrun's hosts get them over ssh; horovodrun passes every variable to its ranks with Open MPI's
    `-x`, which Open MPI refuses beside a mca_base_env_list, so none is set here)."""
    return {"PYTHONSAFEPATH": "1", SAFE_PATH_MARK: "1"}


@dataclass(frozen=True)
class UserCode:
    """What to run: a script's path (`module` False) or a module's name (`module` True), and its arguments."""

    target: str
    args: Tuple[str, ...] = ()
    module: bool = False

    @property
    def shown(self) -> str:
        """How a user would type it after python."""
        return " ".join(["-m" if self.module else "", self.target, *self.args]).strip()


def fill_run_dir(args: Sequence[str], run_dir: str) -> Tuple[str, ...]:
    """`args` with every RUN_DIR_PLACEHOLDER replaced by `run_dir`."""
    return tuple(arg.replace(RUN_DIR_PLACEHOLDER, run_dir) for arg in args)


def parse_target(words: Sequence[str]) -> UserCode:
    """`SCRIPT ARGS...` or `-m MODULE ARGS...` as python takes them; ValueError naming what is missing."""
    words = list(words)
    if not words:
        raise ValueError("no script given: name the training script (or -m MODULE) and its arguments")
    if words[0] == "-m":
        if len(words) < 2:
            raise ValueError("-m needs a module name, as python -m takes it")
        return UserCode(words[1], tuple(words[2:]), module=True)
    if words[0].startswith("-m") and len(words[0]) > 2:  # python -mpytest
        return UserCode(words[0][2:], tuple(words[1:]), module=True)
    return UserCode(words[0], tuple(words[1:]))


def forget_safe_path() -> None:
    """PYTHONSAFEPATH, when the program that launched this one set it only for the project's sake, leaves the
    environment before the user's code starts."""
    if os.environ.pop(SAFE_PATH_MARK, None) is not None:
        os.environ.pop("PYTHONSAFEPATH", None)


def is_project_module(name: str) -> bool:
    """A module of one of the project's packages."""
    return name.split(".", 1)[0] in PROJECT_PACKAGES


@contextlib.contextmanager
def project_set_aside() -> Iterator[None]:
    """Within: none of the project's modules is in sys.modules (the user's code imports its own, or a fresh copy of
    the project's); after: the user's modules of those names leave and the project's come back."""
    kept = {name: module for name, module in sys.modules.items() if is_project_module(name)}
    for name in kept:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [name for name in sys.modules if is_project_module(name)]:
            del sys.modules[name]
        sys.modules.update(kept)


def check(code: UserCode) -> Optional[str]:
    """Why `code` cannot be run (a one-line reason with the fix), or None."""
    if not code.module and not os.path.isfile(code.target):
        return f"{code.target}: no such file; give the script's path from this folder"
    return None


def run(code: UserCode) -> None:
    """Run `code` as python would, here, as `__main__`: sys.argv, sys.path's first entry (the script's folder, or
    the current folder for a module), the project's packages set aside. Returns when the code returns; its
    exceptions (SystemExit included) propagate."""
    folder = os.getcwd() if code.module else os.path.dirname(os.path.abspath(code.target))
    forget_safe_path()
    sys.path.insert(0, folder)
    sys.argv = [code.target, *code.args]
    with project_set_aside():
        if code.module:
            runpy.run_module(code.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(code.target, run_name="__main__")


def exit_code(leaving: SystemExit) -> int:
    """The exit code python gives a SystemExit: None is 0, an int itself, anything else (a message) 1."""
    if leaving.code is None:
        return 0
    return leaving.code if isinstance(leaving.code, int) else 1


def leave(code: int, run_atexit: bool = True) -> NoReturn:
    """End this process with `code` without the interpreter's teardown: the atexit handlers first (the user's and
    the program's, newest first, as at a normal exit), buffered output flushed."""
    if run_atexit:
        atexit._run_exitfuncs()
    gc.collect()  # data loader workers are shut down with their loader
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

