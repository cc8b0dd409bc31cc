"""The launchers a job can be started with, declared by the backend packages and found here by name.

Each backend declares its launchers in its own package (ddp_train/launch.py, hvd_train/launch.py) as
`Launcher` values in a module-level LAUNCHERS list, and names that module under the entry-point group
`hvd_ddp_compare.launchers` (pyproject.toml). Nothing here imports a backend: the modules are found
through their entry points, so a machine without Horovod still lists and runs the DDP launchers.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from importlib.metadata import entry_points
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .hosts import parse_hosts

ENTRY_POINT_GROUP = "hvd_ddp_compare.launchers"



@dataclass(frozen=True)
class Shape:
    """How many processes, on which hosts: `hosts` as horovodrun's -H spells it ("node0:4,node1:4"),
    None for this host alone; `port` is the rendezvous port of launchers that need one across hosts."""

    np: int
    hosts: Optional[str] = None
    port: Optional[int] = None

    def host_slots(self) -> List[Tuple[str, int]]:
        """[("node0", 4), ("node1", 4)] from `hosts` ([] for this host alone)."""
        return parse_hosts(self.hosts) if self.hosts else []


#: build(shape, python, program) -> the command line; program is ["-m", module, *args]
CommandBuilder = Callable[[Shape, str, List[str]], List[str]]


@dataclass(frozen=True)
class Launcher:
    """One way to start `np` processes of a program on this host, as a user would type it."""

    name: str              # how tests, benchmarks and the comparison ask for it: torchrun, horovodrun-gloo, ...
    backend: str           # the backend the training module runs: ddp or horovod
    module: str            # the training entry point it starts: ddp_train or hvd_train
    label: str             # how the comparison names runs made with it: ddp, horovod-gloo, horovod-mpi
    build: CommandBuilder
    controller: Optional[str] = None  # Horovod's controller (gloo, mpi); None for DDP
    single_process: bool = False      # starts the program alone, without a launcher (np is 1)
    per_host: bool = False            # across hosts, the command is started on every host (torchrun)
    slurm: bool = False               # srun: starts the processes inside a Slurm allocation
    #: runs a user's script on this project's implementation of that library's API ("horovod"), under the probe's
    #: --api; no training module of the project's own (so not among host_launchers' training launchers)
    api: Optional[str] = None
    description: str = ""

    def command(self, np: int, args: Sequence[str] = (), module: Optional[str] = None,
                python: str = sys.executable, hosts: Optional[str] = None, port: Optional[int] = None) -> List[str]:
        """The command line that starts `python -m module args` on `np` processes (module: the
        training entry point unless another, e.g. a benchmark worker, is named), on this host or on
        `hosts` ("node0:2,node1:2"). A launcher that is started on every host (torchrun) gives the
        command each host runs."""
        if self.single_process and np != 1:
            raise ValueError(f"{self.name} starts one process, not {np}")
        return self.build(Shape(np, hosts, port), python, ["-m", module or self.module, *map(str, args)])


def srun_shape(shape: Shape) -> List[str]:
    """srun's options for a shape: --ntasks, and with hosts, as many nodes and the tasks on each."""
    hosts = shape.host_slots()
    options = []
    if hosts:
        options.append(f"--nodes={len(hosts)}")
        if len({slots for _, slots in hosts}) == 1:
            options.append(f"--ntasks-per-node={hosts[0][1]}")
    return [*options, f"--ntasks={shape.np}"]


def script(name: str, python: str) -> str:
    """A launcher script installed beside `python` (the venv's torchrun, horovodrun), else the name, for PATH."""
    beside = Path(python).parent / name
    return str(beside) if beside.exists() else name


_registry: Dict[str, Launcher] = {}
_loaded = False
# Jobs are started from several threads at once (hosts, tests): the first use loads the registry for all.
_loading = threading.Lock()


def _load() -> None:
    global _loaded
    with _loading:
        if _loaded:
            return
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            try:
                module = entry.load()
            except ImportError as exc:  # a backend package that cannot be imported here lists nothing
                print(f"launchers of {entry.name} unavailable: {exc}", file=sys.stderr)
                continue
            for launcher in getattr(module, "LAUNCHERS", []):
                if launcher.name in _registry:
                    raise ValueError(f"two launchers are named {launcher.name!r}")
                _registry[launcher.name] = launcher
        _loaded = True


def launchers() -> List[Launcher]:
    """Every registered launcher."""
    _load()
    return list(_registry.values())


def host_launchers(single_process: bool = False) -> List[Launcher]:
    """The launchers that start training on this host's processes without Slurm: those that start several
    processes (torchrun, horovodrun, mpirun), or with `single_process` those that run one alone."""
    return [launcher for launcher in launchers()
            if launcher.single_process == single_process and not launcher.slurm and launcher.api is None]


def get(name: str) -> Launcher:
    """The launcher called `name`; ValueError listing the known ones otherwise."""
    _load()
    if name not in _registry:
        raise ValueError(f"unknown launcher {name!r}; choose from {', '.join(sorted(_registry))}")
    return _registry[name]


def find(backend: str, controller: Optional[str] = None, slurm: bool = False) -> Launcher:
    """The launcher the comparison uses for a backend (and Horovod controller): the first declared
    one that starts that backend's training module on several processes (with `slurm`, through srun)."""
    _load()
    for launcher in _registry.values():
        if (launcher.backend, launcher.controller, launcher.slurm) == (backend, controller, slurm) \
                and not launcher.single_process:
            return launcher
    raise ValueError(f"no launcher{' under Slurm' if slurm else ''} for backend {backend!r}"
                     + (f" with controller {controller!r}" if controller else ""))
