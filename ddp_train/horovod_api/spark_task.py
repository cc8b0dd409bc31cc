"""One rank of `horovod.spark.run`, inside the process TorchDistributor's torchrun started (on the driver's host in
local mode, in a barrier task's host on a cluster): the API installed, the job's environment applied, the user's
function run, and its outcome reported to the driver (collector.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict

from .collector import Address, report
from .outcomes import Outcome, RemoteError


@dataclass(frozen=True)
class TaskSpec:
    """What every rank is handed: the function with its arguments (cloudpickled here, so that they are unpickled only
    once the API is installed), the `env` of horovod.spark.run, and where to report."""

    function: bytes
    report_to: Address
    env: Dict[str, str] = field(default_factory=dict)


def run_rank(spec: TaskSpec) -> None:
    """Run the function on this rank and report its return value, or its error (which is then raised again, so that
    torchrun stops the other ranks and TorchDistributor fails). Returns None: the value travels by the report."""
    from pyspark import cloudpickle

    from . import install

    install()
    os.environ.update(spec.env)
    rank = int(os.environ.get("RANK", "0"))
    try:
        fn, args, kwargs = cloudpickle.loads(spec.function)
        value = fn(*args, **kwargs)
    except BaseException as exc:
        report(spec.report_to, Outcome(rank, error=RemoteError.of(rank, exc)))
        raise
    report(spec.report_to, Outcome(rank, value=value))
