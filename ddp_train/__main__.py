"""python -m ddp_train: the shared training loop on PyTorch DistributedDataParallel."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn, Optional, Sequence, Tuple

from common.entry import main as train_main

if TYPE_CHECKING:
    from .backend import DDPBackend

DESCRIPTION = ("Train with PyTorch DistributedDataParallel. Launch with torchrun (one node or many), "
               "srun under Slurm, or alone for one process.")


def _start() -> Tuple[DDPBackend, None]:
    from .backend import DDPBackend

    return DDPBackend(), None


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Train with DDP; ends the process with its exit code."""
    train_main(argv, "ddp_train", DESCRIPTION, _start)


if __name__ == "__main__":
    main()
