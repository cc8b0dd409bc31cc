"""Ranks that found bad input end together.

Every rank of a job finds the same bad input and says so; then each must end on its own, with exit code 2,
before its launcher stops it: horovodrun reaps a rank it stops racily and may report it as exit 0, and a
rank stopped in the middle of its start-up never prints its line. So a rank lingers until a moment every
rank on its host computes alike: each writes the time it would leave (SIBLING_GRACE_S after its own
start) into a marker shared by the job's ranks on this host, and once every local rank has written one,
all leave at the latest of those times. A rank whose siblings never all arrive (one died, or the job
spans hosts and a host is slow) leaves at its own time, as before.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional

from .placement import Placement

#: variables that name one job (run) on a host: a rendezvous, a PMIx namespace, a Slurm step
JOB_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "PMIX_NAMESPACE",
            "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_STEP_ID")
POLL_S = 0.02
#: a marker older than this is a leftover of an earlier job that used the same rendezvous
STALE_S = 30.0


def job_folder(env: Mapping[str, str]) -> Optional[Path]:
    """This host's meeting folder for the job's ranks, or None when no variable names the job."""
    named = [f"{name}={env[name]}" for name in JOB_VARS if env.get(name)]
    if not named:
        return None
    digest = hashlib.sha256("\n".join(named).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"hvd-ddp-compare-{os.getuid()}-exit-{digest}"


def _write(path: Path, text: str) -> None:
    partial = path.with_suffix(".part")
    partial.write_text(text)
    partial.replace(path)  # a reader sees the whole time or nothing


def _times(folder: Path) -> list:
    """The leave times this job's ranks on this host wrote so far."""
    found = []
    for marker in folder.glob("*.at"):
        try:
            found.append(float(marker.read_text()))
        except (OSError, ValueError):
            pass
    return [at for at in found if at > time.time() - STALE_S]


def leave_together(placement: Placement, own_leave_at: float, env: Mapping[str, str] = os.environ) -> None:
    """Sleep until the moment this host's ranks of the job agree on (wall-clock `own_leave_at` at the
    earliest); alone, or when the siblings do not all arrive by then, until `own_leave_at`."""
    folder = job_folder(env) if placement.family is not None else None
    leave_at = own_leave_at
    if folder is not None and placement.local_world_size > 1:
        try:
            folder.mkdir(exist_ok=True)
            marker = folder / f"{placement.local_rank}.at"
            _write(marker, repr(own_leave_at))
        except OSError:
            folder = None
        while folder is not None and time.time() < own_leave_at:
            times = _times(folder)
            if len(times) >= placement.local_world_size:
                leave_at = max(times)
                break
            time.sleep(POLL_S)
    time.sleep(max(0.0, leave_at - time.time()))
    if folder is not None:
        (folder / f"{placement.local_rank}.at").unlink(missing_ok=True)
        try:
            folder.rmdir()  # the last rank out removes it
        except OSError:
            pass
