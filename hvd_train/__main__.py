"""python -m hvd_train: the shared training loop on Horovod."""

from typing import NoReturn

from common.entry import main as train_main

DESCRIPTION = ("Train with Horovod ring-allreduce. Launch with horovodrun (--gloo or --mpi), mpirun, "
               "srun under Slurm, or alone for one process.")


def _start():
    from .backend import HorovodBackend

    backend = HorovodBackend()
    if not backend.elastic:
        return backend, None
    from .elastic import fit_elastic  # horovodrun --min-np/--max-np: the job's members may change

    return backend, fit_elastic


def main(argv=None) -> NoReturn:
    """Train with Horovod; ends the process with its exit code."""
    train_main(argv, "hvd_train", DESCRIPTION, _start)


if __name__ == "__main__":
    main()
