"""python -m hvd_train: the shared training loop on Horovod."""

import sys

from common.config import parse_config
from common.train import run

from .backend import HorovodBackend

DESCRIPTION = ("Train with Horovod ring-allreduce. Launch with horovodrun (--gloo or --mpi), mpirun, "
               "srun under Slurm, or alone for one process.")


def main(argv=None) -> int:
    """Parse the shared options, build the Horovod backend and run the loop."""
    config = parse_config(argv, prog="hvd_train", description=DESCRIPTION)
    return run(config, HorovodBackend(), prog="hvd_train")


if __name__ == "__main__":
    sys.exit(main())
