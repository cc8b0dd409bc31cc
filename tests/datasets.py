"""Write small dataset files in the real on-disk formats (MNIST idx, CIFAR-10 pickles, ImageFolder)."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def _idx(path: Path, array: np.ndarray) -> None:
    code = 0x08  # unsigned byte
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, train: int = 64, test: int = 32, seed: int = 0) -> Path:
    """root/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte, as torchvision reads them."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", train), ("t10k", test)):
        _idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        _idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    return root


def write_cifar10(root: Path, per_batch: int = 16, seed: int = 0) -> Path:
    """root/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} in the python pickle format."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, per_batch).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    return root


def write_imagefolder(root: Path, classes: int = 3, per_class: int = 4, size: int = 40, seed: int = 0) -> Path:
    """root/{train,val}/<class>/<i>.png: the ImageNet folder layout."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root
