"""Open MPI's settings that every process of the project sets alike, whoever trains in it (hvd_train, a user's
script under the probe, a benchmark worker)."""

from __future__ import annotations

import os

#: Open MPI busy-polls while it waits for a message unless it believes the host is oversubscribed, and it counts
#: processes, not threads: each Horovod rank's background thread then spins on a core that the rank's compute and
#: the other ranks need (measured: benchmarks/results/mpi-yield/throughput.json). Read by MPI_Init (inside
#: hvd.init()); the Gloo controller and other MPIs ignore it.
MPI_YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"


def yield_mpi_when_idle(on_cpu: bool, who: str) -> str:
    """Set OMPI_MCA_mpi_yield_when_idle=1 in a process whose ranks compute on CPU, unless it is already set
    (`mpirun --mca mpi_yield_when_idle N` reaches the rank as that variable); `who` says which program set it.
    Returns where the value came from: "environment", "Open MPI's default" (on a GPU) or `who`."""
    if os.environ.get(MPI_YIELD_VARIABLE):
        return "environment"
    if not on_cpu:
        return "Open MPI's default"
    os.environ[MPI_YIELD_VARIABLE] = "1"
    return who
