"""The Horovod the check builds, and the one installed in the check's python."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from ..context import Context
from ..settings import ROOT

HOROVOD_VERSION = "0.28.1"


@dataclass(frozen=True)
class HorovodFound:
    """A Horovod that imports, and what it was built with."""

    version: str
    nccl_built: int
    gloo_built: bool
    mpi_built: bool


def installed(ctx: Context) -> HorovodFound | None:
    """The Horovod that `import horovod.torch` finds in the check's python; None where there is none."""
    code = ("import json, horovod, horovod.torch as hvd; print(json.dumps({'version': horovod.__version__, "
            "'nccl_built': int(hvd.nccl_built()), 'gloo_built': bool(hvd.gloo_built()), "
            "'mpi_built': bool(hvd.mpi_built())}))")
    found = subprocess.run([ctx.settings.python, "-c", code], capture_output=True, text=True, env=ctx.env, cwd=ROOT,
                           timeout=120)
    if found.returncode != 0:
        return None
    return HorovodFound(**json.loads(found.stdout.strip().splitlines()[-1]))
