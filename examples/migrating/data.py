"""scikit-learn's handwritten digits as (train, val) tensors: 1797 images of 1x8x8, 10 classes.

The digits ship inside scikit-learn's wheel: nothing is downloaded. Used by train_horovod.py,
train_ddp.py and, as `--dataset examples.migrating.data:build`, by compare-backends.
"""

import torch
from torch.utils.data import TensorDataset

VAL_FRACTION = 0.2


def build(data_dir=None, seed=0):
    """(train, val) TensorDatasets of (1x8x8 float32 image, int64 label): pixels scaled by 1/16 and
    normalised to mean 0 and standard deviation 1, split 80/20 by a permutation drawn from `seed`.
    `data_dir` is not used (the digits need no files)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(len(labels) * VAL_FRACTION)))
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])
