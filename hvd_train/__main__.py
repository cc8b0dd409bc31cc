"""python -m hvd_train: the shared training loop on Horovod."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NoReturn, Optional, Sequence, Tuple

from common.entry import main as train_main

if TYPE_CHECKING:
    from common.trainer import Trainer

    from .backend import HorovodBackend

DESCRIPTION = ("Train with Horovod ring-allreduce. Launch with horovodrun (--gloo or --mpi), mpirun, "
               "srun under Slurm, or alone for one process.")


def _start() -> Tuple[HorovodBackend, Optional[Callable[[Trainer], int]]]:
    from .backend import HorovodBackend

    backend = HorovodBackend()
    if not backend.elastic:
        return backend, None
    from .elastic import fit_elastic  # horovodrun --min-np/--max-np: the job's members may change

    return backend, fit_elastic


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Train with Horovod; ends the process with its exit code."""
    train_main(argv, "hvd_train", DESCRIPTION, _start)


if __name__ == "__main__":
    main()
