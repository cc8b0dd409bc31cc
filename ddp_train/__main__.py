"""python -m ddp_train: the shared training loop on PyTorch DistributedDataParallel."""

from typing import NoReturn

from common.entry import main as train_main

DESCRIPTION = ("Train with PyTorch DistributedDataParallel. Launch with torchrun (one node or many), "
               "srun under Slurm, or alone for one process.")


def _start():
    from .backend import DDPBackend

    return DDPBackend(), None


def main(argv=None) -> NoReturn:
    """Train with DDP; ends the process with its exit code."""
    train_main(argv, "ddp_train", DESCRIPTION, _start)


if __name__ == "__main__":
    main()
