"""python -m hvd_train: the shared training loop on Horovod."""

import sys

from common.config import parse_config

DESCRIPTION = ("Train with Horovod ring-allreduce. Launch with horovodrun (--gloo or --mpi), mpirun, "
               "srun under Slurm, or alone for one process.")


def main(argv=None) -> int:
    """Parse the shared options, build the Horovod backend and run the loop."""
    config = parse_config(argv, prog="hvd_train", description=DESCRIPTION)
    # torch and the backend are imported only now: bad options fail in a fraction of a second.
    from common.train import run

    from .backend import HorovodBackend

    return run(config, HorovodBackend(), prog="hvd_train")


if __name__ == "__main__":
    sys.exit(main())
