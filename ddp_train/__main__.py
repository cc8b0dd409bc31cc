"""python -m ddp_train: the shared training loop on PyTorch DistributedDataParallel."""

import sys

from common.config import parse_config

DESCRIPTION = ("Train with PyTorch DistributedDataParallel. Launch with torchrun (one node or many), "
               "srun under Slurm, or alone for one process.")


def main(argv=None) -> int:
    """Parse the shared options, build the DDP backend and run the loop."""
    config = parse_config(argv, prog="ddp_train", description=DESCRIPTION)
    # torch and the backend are imported only now: bad options fail in a fraction of a second.
    from common.train import run

    from .backend import DDPBackend

    return run(config, DDPBackend(), prog="ddp_train")


if __name__ == "__main__":
    sys.exit(main())
