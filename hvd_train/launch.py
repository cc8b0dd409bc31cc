"""The launchers of Horovod jobs, as a user types them (registered through the
`hvd_ddp_compare.launchers` entry point; see common.launch)."""

from __future__ import annotations

import os
from typing import List

from common.launch.registry import Launcher, Shape, script, srun_shape

#: mpirun's odls_base_sigkill_timeout T. Whenever mpirun ends a job (Ctrl-C, SIGTERM, a rank that failed) it
#: sends SIGCONT to the ranks still running, sleeps T, sends SIGTERM, sleeps T and kills them: the sleeps are
#: unconditional, so a failed job lingers 2T after its first failed rank however fast the others end. 5 gives
#: a final checkpoint 10 s after Ctrl-C at the terminal (5 s after a SIGTERM to mpirun alone) and ends a job
#: with a frozen or dead rank within --timeout + 15 s.
SIGKILL_GRACE_S = 5


def mpi_flags() -> List[str]:
    """Open MPI refuses to start as root without --allow-run-as-root; oversubscribing lets a host run
    more ranks than it has cores (tests and small machines); after Ctrl-C or SIGTERM mpirun waits
    odls_base_sigkill_timeout seconds (1 by default), passes SIGTERM to the ranks, waits as long again
    and kills them: 1 s is too soon for the ranks' final checkpoint."""
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return root + ["--oversubscribe", "--mca", "odls_base_sigkill_timeout", str(SIGKILL_GRACE_S)]


def _hosts(shape: Shape) -> str:
    return shape.hosts or f"localhost:{shape.np}"


def _alone(shape: Shape, python: str, program: List[str]) -> List[str]:
    return [python, *program]


def _horovodrun(controller: str):
    def build(shape: Shape, python: str, program: List[str]) -> List[str]:
        cmd = [script("horovodrun", python), "-np", str(shape.np), "-H", _hosts(shape), f"--{controller}"]
        if controller == "mpi":
            cmd.append("--mpi-args=" + " ".join(mpi_flags()))
        return cmd + [python, *program]
    return build


def _mpirun(shape: Shape, python: str, program: List[str]) -> List[str]:
    cmd = [script("mpirun", python), *mpi_flags()]
    if shape.hosts:
        # Remote ranks find the venv's python only through PATH, which mpirun exports only when told.
        cmd += ["--bind-to", "none", "--host", shape.hosts, "-x", "PATH", "-x", "PYTHONUNBUFFERED"]
    return cmd + ["-np", str(shape.np), python, *program]


def _srun(shape: Shape, python: str, program: List[str]) -> List[str]:
    # Slurm wires the tasks up through PMI (SRUN_MPI: the plugin Slurm and Open MPI share, as in
    # slurm/hvd_srun.sbatch); Horovod then runs its MPI controller without horovodrun or ssh.
    return ["srun", f"--mpi={os.environ.get('SRUN_MPI', 'pmix')}", "--kill-on-bad-exit=1", *srun_shape(shape), python,
            *program]


LAUNCHERS = [
    Launcher("none-hvd", "horovod", "hvd_train", "horovod", _alone, single_process=True,
             description="python -m hvd_train: one process, no launcher"),
    Launcher("horovodrun-gloo", "horovod", "hvd_train", "horovod-gloo", _horovodrun("gloo"), controller="gloo",
             description="horovodrun --gloo: Horovod's Gloo controller, ranks started over ssh across hosts"),
    Launcher("horovodrun-mpi", "horovod", "hvd_train", "horovod-mpi", _horovodrun("mpi"), controller="mpi",
             description="horovodrun --mpi: Horovod's MPI controller through Open MPI's mpirun"),
    Launcher("mpirun", "horovod", "hvd_train", "horovod-mpi", _mpirun, controller="mpi",
             description="mpirun directly: Horovod's MPI controller"),
    Launcher("srun-mpi", "horovod", "hvd_train", "horovod-mpi", _srun, controller="mpi", slurm=True,
             description="srun --mpi=pmix inside a Slurm allocation: Horovod's MPI controller wired up by PMI"),
]
