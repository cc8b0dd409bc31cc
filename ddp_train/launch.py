"""The launchers of DistributedDataParallel jobs, as a user types them (registered through the
`hvd_ddp_compare.launchers` entry point; see common.launch)."""

from __future__ import annotations

from typing import List

from common.launch.hosts import DEFAULT_PORT
from common.launch.registry import Launcher, Shape, script, srun_shape


def _alone(shape: Shape, python: str, program: List[str]) -> List[str]:
    return [python, *program]


def _torchrun(shape: Shape, python: str, program: List[str]) -> List[str]:
    hosts = shape.host_slots()
    if len(hosts) <= 1:
        # One host: the rendezvous store on loopback only (ddp_train/rendezvous.py), not --standalone's
        # store on every interface.
        return [script("torchrun", python), "--rdzv-backend", "loopback", f"--nproc-per-node={shape.np}", *program]
    # Across hosts: the same command on every host; the first host holds the c10d rendezvous.
    per_host = {slots for _, slots in hosts}
    if len(per_host) != 1 or sum(slots for _, slots in hosts) != shape.np:
        raise ValueError(f"torchrun starts the same number of processes on every host; -H {shape.hosts} "
                         f"does not give {shape.np} that way")
    port = shape.port or DEFAULT_PORT
    return [script("torchrun", python), "--nnodes", str(len(hosts)), "--nproc-per-node", str(per_host.pop()),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts[0][0]}:{port}", "--rdzv-id", f"job-{port}",
            *program]


def _srun(shape: Shape, python: str, program: List[str]) -> List[str]:
    # One task per process; ddp_train reads Slurm's variables and meets the others at MASTER_ADDR:MASTER_PORT,
    # the first node of the placement (exported by the user in an sbatch script; set here when it is known).
    hosts = shape.host_slots()
    store = ["env", f"MASTER_ADDR={hosts[0][0]}", f"MASTER_PORT={shape.port or DEFAULT_PORT}"] if hosts else []
    # --kill-on-bad-exit: a rank that fails ends the step (else srun waits for the others until their timeout)
    return [*store, "srun", "--kill-on-bad-exit=1", *srun_shape(shape), python, *program]


LAUNCHERS = [
    Launcher("none-ddp", "ddp", "ddp_train", "ddp", _alone, single_process=True,
             description="python -m ddp_train: one process, no launcher"),
    Launcher("torchrun", "ddp", "ddp_train", "ddp", _torchrun, per_host=True,
             description="torchrun on one host (its store on loopback: --rdzv-backend loopback); --nnodes N with "
                         "a c10d rendezvous across hosts"),
    Launcher("srun", "ddp", "ddp_train", "ddp", _srun, slurm=True,
             description="srun without torchrun: one Slurm task per process"),
    Launcher("torchrun-horovod-api", "horovod-api", "ddp_train.horovod_api", "horovod-api", _torchrun, per_host=True,
             api="horovod", description="torchrun running a Horovod script on the Horovod API "
                                        "(python -m ddp_train.horovod_api)"),
]
