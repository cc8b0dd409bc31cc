"""Who this process is in its job, read from the variables its launcher set (no collective, no torch).

torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, horovodrun --gloo HOROVOD_RANK/SIZE/...,
Open MPI's mpirun OMPI_COMM_WORLD_*, MPICH-style launchers and srun --mpi=pmi2 PMI_*, srun alone
SLURM_*. Earlier families win: torchrun started by srun is torchrun, mpirun inside a Slurm batch
script is mpirun.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

#: (family, rank, world size, local rank, local world size) variables, in order of precedence
FAMILIES = (
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("ompi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("pmix", "PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


@dataclass(frozen=True)
class Placement:
    """This process's place in the job as its launcher described it."""

    launcher: str          # torchrun, horovodrun, mpirun, srun, or none
    family: Optional[str]  # which variables said so (see FAMILIES), None for a lone process
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def single_host(self) -> bool:
        """Every rank runs on this host."""
        return self.local_world_size == self.world_size


def _int(env: Mapping[str, str], name: Optional[str]) -> Optional[int]:
    value = env.get(name, "") if name else ""
    return int(value) if value.strip().isdigit() else None


def slurm_counts(spec: str) -> List[int]:
    """Slurm's per-node counts, '2(x3),1' -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE)."""
    counts: List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def slurm_tasks_on_this_node(env: Mapping[str, str]) -> int:
    """This node's entry of SLURM_STEP_TASKS_PER_NODE ('2(x3),1' is 2, 2, 2, 1), at SLURM_NODEID."""
    counts = slurm_counts(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")
    node = _int(env, "SLURM_NODEID") or 0
    return counts[node] if node < len(counts) else (counts[0] if counts else 1)


def launcher_name(env: Mapping[str, str]) -> str:
    """Which launcher started this process, from the variables each one sets."""
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or "HOROVOD_HOSTNAME" in env:
        return "horovodrun"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env or "PMIX_RANK" in env:
        return "srun" if "SLURM_JOB_ID" in env and "OMPI_COMM_WORLD_SIZE" not in env else "mpirun"
    if "SLURM_PROCID" in env:
        return "srun"
    return "none"


def detect(env: Optional[Mapping[str, str]] = None) -> Placement:
    """This process's placement: the first family of variables that gives a rank, else a lone process."""
    env = os.environ if env is None else env
    for family, rank_var, size_var, local_var, local_size_var in FAMILIES:
        rank = _int(env, rank_var)
        if rank is None:
            continue
        world = _int(env, size_var) or 1
        local_world = _int(env, local_size_var)
        if local_world is None:
            local_world = slurm_tasks_on_this_node(env) if family in ("slurm", "pmix") else world
        return Placement(launcher_name(env), family, rank, world, _int(env, local_var) or 0, local_world)
    return Placement(launcher_name(env), None, 0, 1, 0, 1)


def rank_hint() -> Optional[int]:
    """The rank a launcher gave this process, or None when it runs alone."""
    placement = detect()
    return placement.rank if placement.family is not None else None


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(local_world_size: int) -> int:
    """Cores this process may use divided among the job's processes on this host (at least 1).

    Set explicitly on every backend: torchrun exports OMP_NUM_THREADS=1 and horovodrun does not,
    and the thread count can change both speed and the floating-point result.
    """
    return max(1, cores() // max(local_world_size, 1))
