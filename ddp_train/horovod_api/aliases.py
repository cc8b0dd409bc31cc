"""`import horovod` and `import horovod.torch` in this process get the API: its modules under Horovod's names in
sys.modules, and a finder first on sys.meta_path that answers every other `horovod.*` with a one-line ImportError
naming what the API offers, so that Horovod itself (installed or not) is never imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Dict, Optional, Sequence

from . import (compression, elastic, exceptions, functions, optimizer, process_sets, ray_executor, spark,
               sync_batch_norm, threads, torch_api)

#: the version of Horovod whose API this is
HOROVOD_VERSION = "0.28.1"


def _namespace(name: str, doc: str, **attributes: object) -> types.ModuleType:
    """A package of Horovod's name that holds the API's modules (its name says whose it is)."""
    module = types.ModuleType(f"ddp_train.horovod_api[{name}]", doc)
    module.__path__ = []  # a package: its submodules come from sys.modules
    module.__dict__.update(attributes)
    return module


def _run(*args: object, **kwargs: object) -> None:
    raise RuntimeError("horovod.run is not offered by the Horovod API on torch.distributed: launch the script with "
                       "torchrun --nproc-per-node N -m ddp_train.horovod_api SCRIPT")


def _modules() -> Dict[str, types.ModuleType]:
    root = _namespace("horovod", "Horovod's API on torch.distributed (hvd-ddp-compare).", __version__=HOROVOD_VERSION,
                      run=_run)
    common = _namespace("horovod.common", "Horovod's exceptions and process sets.",
                        HorovodInternalError=exceptions.HorovodInternalError,
                        HostsUpdatedInterrupt=exceptions.HostsUpdatedInterrupt)
    runner = _namespace("horovod.runner", "Horovod's runner: its thread helper only.")
    runner_util = _namespace("horovod.runner.util", "Horovod's runner utilities: its thread helper only.")
    on_spark = _namespace("horovod.spark", "horovod.spark.run on PySpark's TorchDistributor, each rank on the API.",
                          run=spark.run, run_elastic=spark.run_elastic)
    on_ray = _namespace("horovod.ray", "horovod.ray.RayExecutor on Ray actors holding one torch.distributed group.",
                        RayExecutor=ray_executor.RayExecutor)
    return {
        "horovod": root,
        "horovod.torch": torch_api,
        "horovod.torch.mpi_ops": torch_api,
        "horovod.torch.optimizer": optimizer,
        "horovod.torch.compression": compression,
        "horovod.torch.functions": functions,
        "horovod.torch.sync_batch_norm": sync_batch_norm,
        "horovod.torch.elastic": elastic,
        "horovod.common": common,
        "horovod.common.exceptions": exceptions,
        "horovod.common.process_sets": process_sets,
        "horovod.runner": runner,
        "horovod.runner.util": runner_util,
        "horovod.runner.util.threads": threads,
        "horovod.spark": on_spark,
        "horovod.ray": on_ray,
    }


class _Loader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class HorovodFinder(importlib.abc.MetaPathFinder):
    """Horovod's names: the API's modules, or a one-line refusal."""

    def __init__(self, offered: Dict[str, types.ModuleType]) -> None:
        self.offered = offered

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != "horovod" and not fullname.startswith("horovod."):
            return None
        module = self.offered.get(fullname)
        if module is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} in the Horovod API on torch.distributed (python -m "
                f"ddp_train.horovod_api), which offers {', '.join(sorted(self.offered))}", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _Loader(module), is_package=hasattr(module, "__path__"))


def install() -> None:
    """Make Horovod's module names in this process resolve to the API (idempotent)."""
    if any(isinstance(finder, HorovodFinder) for finder in sys.meta_path):
        return
    offered = _modules()
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        del sys.modules[name]  # a Horovod imported before: its modules must not be found again
    for name, module in offered.items():
        sys.modules[name] = module
    for name, module in offered.items():  # `import horovod.torch` then reaches it as an attribute too
        parent, _, child = name.rpartition(".")
        if parent and not hasattr(offered[parent], child):
            setattr(offered[parent], child, module)
    sys.meta_path.insert(0, HorovodFinder(offered))
