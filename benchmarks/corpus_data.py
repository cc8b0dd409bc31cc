"""A dataset factory for the verdict corpus (benchmarks.verdicts): the embedded digits, the same samples and the
same validation set, the training samples in another order. A run on it differs from a run on `--dataset digits`
in the order its samples come in and in nothing else.

    --dataset benchmarks.corpus_data:reordered
"""

from __future__ import annotations

from torch.utils.data import Subset

from common.config import Config
from common.inputs.data import open_datasets


def reordered(data_dir=None, seed: int = 42):
    """(train, val) of --dataset digits at `seed`, the training set reversed."""
    train, val, _ = open_datasets(Config(dataset="digits", seed=seed))
    return Subset(train, list(range(len(train)))[::-1]), val
