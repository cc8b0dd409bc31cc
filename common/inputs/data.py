"""Dataset registry and the loaders both backends share.

Every dataset is opened before the process group exists, so a missing or unreadable file is a
one-line error on every rank instead of a hang. Nothing is ever downloaded.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler,
                              Subset, TensorDataset)

from common.choices import DATASETS, registry
from common.config import Config, check_data_dir
from common.errors import UsageError
from .factories import article, describe_exception, is_factory, load

VAL_FRACTION = 0.2
#: a synthetic set of at most this many bytes is generated once and kept in memory
SYNTHETIC_KEEP_BYTES = 128 * 2**20


def samples_in(dataset: Dataset) -> int:
    """How many samples a map-style dataset holds (open_datasets refuses one without a length)."""
    return len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__; map-style ones define it


@dataclass(frozen=True)
class DataInfo:
    """Shape of the samples a dataset yields, which the model adapts to; for a dataset made by a factory,
    where it came from (import path, source file, SHA-256)."""

    channels: int
    image_size: int
    num_classes: int
    factory: Optional[Dict] = None


def _seeded_split(dataset: Dataset, seed: int) -> Tuple[Subset, Subset]:
    """Split into train/validation with a permutation drawn from `seed` (same on every rank)."""
    n = samples_in(dataset)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, int(round(n * VAL_FRACTION)))
    return Subset(dataset, order[n_val:]), Subset(dataset, order[:n_val])


def digits_arrays():
    """(images (1797, 64) float64, labels (1797,) int64): scikit-learn's handwritten digits, read from the
    file inside its wheel that `sklearn.datasets.load_digits` reads, the same values, without importing
    scikit-learn (which costs every training process about a second)."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("--dataset digits needs scikit-learn (it ships the digits); pip install scikit-learn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def _digits(config: Config):
    images, labels = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = (x - x.mean()) / x.std()
    data = TensorDataset(x, torch.tensor(labels, dtype=torch.long))
    train, val = _seeded_split(data, config.seed)
    return train, val, DataInfo(1, 8, 10)



class SyntheticImages(Dataset):
    """A learnable task of any image shape: a fixed random prototype per class plus noise.

    Each sample is a function of (seed, index), so every rank sees the same sample for the same
    index. A set of at most `keep_bytes` is generated once, when it is opened, and then only
    indexed (generating the noise would otherwise be a visible share of a small model's step);
    a larger one is generated on access, so any size fits in memory. A list of indices gives the
    whole batch at once. Both ways give the same values.
    """

    def __init__(self, samples: int, channels: int, image_size: int, num_classes: int, seed: int,
                 keep_bytes: int = SYNTHETIC_KEEP_BYTES):
        self.samples, self.seed = samples, seed
        self.shape = (channels, image_size, image_size)
        gen = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randn((num_classes, *self.shape), generator=gen)
        self.labels = torch.randint(num_classes, (samples,), generator=gen)
        self.images = None
        if samples * channels * image_size * image_size * 4 <= keep_bytes:
            self.images = self._generate(list(range(samples)))

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index):
        if isinstance(index, list):
            images = self.images[index] if self.images is not None else self._generate(index)
            return images, self.labels[index]
        images = self.images[index] if self.images is not None else self._generate([index])[0]
        return images, int(self.labels[index])

    def _generate(self, indices: List[int]) -> torch.Tensor:
        noise = torch.stack([torch.randn(self.shape, generator=torch.Generator().manual_seed(
            self.seed * 1_000_003 + i)) for i in indices])
        return self.prototypes[self.labels[indices]] + 1.5 * noise


def _synthetic(config: Config, natural_image_size: int):
    size = config.image_size or natural_image_size
    data = SyntheticImages(config.synthetic_samples, 3, size, 10, config.seed)
    train, val = _seeded_split(data, config.seed)
    return train, val, DataInfo(3, size, 10)


def _require_dir(config: Config) -> str:
    """--data-dir, checked to be a readable directory."""
    check_data_dir(config)
    assert config.data_dir is not None  # check_data_dir refuses a file dataset without one
    return config.data_dir


def _mnist(config: Config):
    from torchvision import datasets, transforms

    root = _require_dir(config)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    try:
        train = datasets.MNIST(root, train=True, download=False, transform=tf)
        val = datasets.MNIST(root, train=False, download=False, transform=tf)
    except Exception as exc:  # any reader failure (short file, bad header) is bad data
        raise UsageError(f"cannot read MNIST under --data-dir {root!r} ({exc}); it needs "
                         f"MNIST/raw/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte") from None
    return train, val, DataInfo(1, 28, 10)


def _cifar_class():
    from torchvision import datasets

    class LocalCIFAR10(datasets.CIFAR10):
        """torchvision's CIFAR-10 reader that checks the files are present, not their MD5
        (so a subset or a re-packed copy of the batches can be used)."""

        def _check_integrity(self) -> bool:
            names = [n for n, _ in self.train_list + self.test_list]
            return all(os.path.isfile(os.path.join(self.root, self.base_folder, n)) for n in names)

        def _load_meta(self) -> None:
            import pickle

            path = os.path.join(self.root, self.base_folder, self.meta["filename"])
            if not os.path.isfile(path):
                raise RuntimeError(f"missing {path}")
            with open(path, "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return LocalCIFAR10


def _cifar10(config: Config):
    from torchvision import transforms

    root = _require_dir(config)
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])
    reader = _cifar_class()
    try:
        train = reader(root, train=True, download=False, transform=tf)
        val = reader(root, train=False, download=False, transform=tf)
    except Exception as exc:  # any reader failure (pickle, shape, missing key) is bad data
        raise UsageError(f"cannot read CIFAR-10 under --data-dir {root!r} ({exc}); it needs "
                         "cifar-10-batches-py/ with data_batch_1..5, test_batch, batches.meta") from None
    return train, val, DataInfo(3, 32, 10)


def _imagefolder(config: Config):
    from torchvision import datasets, transforms

    root = _require_dir(config)
    size = config.image_size or 224
    tf = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    try:
        train = datasets.ImageFolder(os.path.join(root, "train"), transform=tf)
        val = datasets.ImageFolder(os.path.join(root, "val"), transform=tf)
    except (FileNotFoundError, OSError) as exc:
        raise UsageError(f"cannot read an ImageNet-style folder at --data-dir {root!r} ({exc}); "
                         "it needs train/<class>/*.jpg and val/<class>/*.jpg") from None
    if train.classes != val.classes:
        raise UsageError(f"train/ and val/ under {root!r} have different class folders; make them match")
    return train, val, DataInfo(3, size, len(train.classes))


DATASET_BUILDERS: Dict[str, Callable] = registry(DATASETS, {
    "digits": _digits,
    "synthetic": _synthetic,
    "mnist": _mnist,
    "cifar10": _cifar10,
    "imagefolder": _imagefolder,
}, "dataset")


def open_datasets(config: Config, natural_image_size: int = 8):
    """(train, validation, DataInfo) for the configured dataset; UsageError when unusable.
    `natural_image_size` is the side synthetic images take without --image-size (the model's)."""
    if is_factory(config.dataset):
        return _from_factory(config)
    if config.dataset not in DATASET_BUILDERS:
        raise UsageError(f"unknown dataset {config.dataset!r}; choose one of {', '.join(DATASET_BUILDERS)} or "
                         "package.module:function")
    builder = DATASET_BUILDERS[config.dataset]
    train, val, info = builder(config, natural_image_size) if builder is _synthetic else builder(config)
    if len(train) == 0 or len(val) == 0:
        raise UsageError(f"dataset {config.dataset} has an empty train or validation split; add samples")
    return train, val, info


def _from_factory(config: Config):
    """--dataset package.module:function: called as function(data_dir=, seed=), it returns (train, val), two
    map-style datasets of (input tensor, int label) of one fixed input shape."""
    factory = load(config.dataset, "--dataset")
    made = factory.call(data_dir=config.data_dir, seed=config.seed)
    name = f"--dataset {config.dataset}"
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise UsageError(f"{name} returned {_kind(made)}; return (train, val), two map-style datasets")
    shapes = []
    for split, dataset in zip(("train", "val"), made, strict=True):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise UsageError(f"{name}: its {split} set is {_kind(dataset)}, not a map-style dataset (__getitem__ "
                             "and __len__)")
        if len(dataset) == 0:
            raise UsageError(f"{name}: its {split} set is empty; add samples")
        shapes.append(_sample_shape(name, split, dataset))
    if shapes[0] != shapes[1]:
        raise UsageError(f"{name}: train inputs have shape {tuple(shapes[0])}, val inputs {tuple(shapes[1])}; "
                         "give both one shape")
    train, val = made
    shape = shapes[0]
    channels = shape[0] if len(shape) >= 2 else 1
    image_size = shape[-1] if len(shape) >= 1 else 1
    return train, val, DataInfo(channels, image_size, _num_classes(name, train), factory.record())


def _kind(value) -> str:
    """'an int', 'a list of 3': what a factory gave instead of what it should."""
    return article(value) + (f" of {len(value)}" if isinstance(value, (tuple, list)) else "")


def _sample_shape(name: str, split: str, dataset) -> torch.Size:
    """The input shape of a dataset's first sample, after checking the sample is (tensor, int label)."""
    try:
        sample = dataset[0]
    except Exception as exc:  # reading a sample is the user's code
        raise UsageError(f"{name}: reading {split}[0] raised {describe_exception(exc)}") from None
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        raise UsageError(f"{name}: {split}[0] is {_kind(sample)}; each sample must be (input tensor, int label)")
    inputs, label = sample
    if not isinstance(inputs, torch.Tensor):
        raise UsageError(f"{name}: {split}[0]'s input is a {type(inputs).__name__}; make it a torch.Tensor")
    if not _is_label(label):
        raise UsageError(f"{name}: {split}[0]'s label is {label!r} ({type(label).__name__}); make it an int class "
                         "index")
    return inputs.shape


def _is_label(label) -> bool:
    """An int class index: a Python int or a 0-d integer tensor (TensorDataset's), not a bool or a float."""
    if isinstance(label, torch.Tensor):
        return label.dim() == 0 and not label.is_floating_point() and not label.is_complex() \
            and label.dtype != torch.bool
    return isinstance(label, int) and not isinstance(label, bool)


def _num_classes(name: str, train) -> int:
    """The number of classes: len(train.classes) or train.num_classes when the dataset says, else the largest
    training label + 1 (read through every sample once)."""
    if getattr(train, "classes", None) is not None:
        return len(train.classes)
    if isinstance(getattr(train, "num_classes", None), int):
        return train.num_classes
    if fetches_whole_batches(train):
        labels = train[list(range(len(train)))][1]
    else:
        labels = torch.tensor([int(train[i][1]) for i in range(len(train))])
    if int(labels.min()) < 0:
        raise UsageError(f"{name}: a training label is {int(labels.min())}; labels are class indices 0..C-1")
    return int(labels.max()) + 1


class ShardedValidation(Subset):
    """Rank r evaluates samples r, r+W, r+2W, ...: every sample exactly once across ranks,
    no padding, so reduced sums and counts give the exact metric."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int):
        super().__init__(dataset, list(range(rank, samples_in(dataset), world_size)))


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way: the first `skip` samples of this
    rank's epoch order are left out, so a resumed run sees exactly the samples it had not seen."""

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


class GlobalBatchSampler(Sampler):
    """--reduction exact: per step, this rank's contiguous block of the step's global batch.

    The epoch's order is one permutation of the training set drawn from (seed, epoch), as
    DistributedSampler draws it, and step t takes its samples [t*G, (t+1)*G): neither depends on the
    world size, so every world size trains on the same global batches. The last incomplete global
    batch is dropped. `skip` leaves out the epoch's first steps (resuming mid-epoch, at any world size).
    """

    skip = 0

    def __init__(self, samples: int, global_batch: int, rank: int, world_size: int, seed: int) -> None:
        self.samples, self.global_batch, self.seed = samples, global_batch, seed
        self.per_rank = global_batch // world_size
        self.offset = rank * self.per_rank
        self.steps = samples // global_batch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order to draw."""
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        for step in range(self.skip, self.steps):
            start = step * self.global_batch + self.offset
            yield order[start:start + self.per_rank].tolist()

    def __len__(self) -> int:
        return self.steps - self.skip


def fetches_whole_batches(dataset: Dataset) -> bool:
    """True when `dataset[list_of_indices]` returns the batch itself: in-memory tensors and
    synthetic images, under any number of Subsets."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return isinstance(dataset, (TensorDataset, SyntheticImages))


def _loader(dataset: Dataset, sampler, batch_size: int, **options) -> DataLoader:
    """A DataLoader yielding (images, labels) batches of `batch_size` in `sampler`'s order.

    Datasets that fetch whole batches get each batch's index list in one call, instead of one
    call per sample and a collate: the same tensors, without a per-sample cost that would
    otherwise be a visible share of a small model's step."""
    if fetches_whole_batches(dataset):
        return DataLoader(dataset, batch_size=None, sampler=BatchSampler(sampler, batch_size, drop_last=False),
                          **options)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=False, **options)


def make_loaders(config: Config, train: Dataset, val: Dataset, rank: int, world_size: int,
                 pin_memory: bool, batch_size: Optional[int] = None, global_batch: Optional[int] = None
                 ) -> Tuple[DataLoader, DataLoader, Union[ResumableSampler, GlobalBatchSampler]]:
    """Train loader over a DistributedSampler (seeded, padded so every rank has the same number of
    steps) in batches of `batch_size` (default --batch-size), or, given `global_batch` (--reduction
    exact), over a GlobalBatchSampler; and a validation loader over this rank's exact shard."""
    batch_size = batch_size or config.batch_size
    options: Dict[str, Any] = dict(num_workers=config.workers, pin_memory=pin_memory,
                                   persistent_workers=config.workers > 0)
    sampler: Union[ResumableSampler, GlobalBatchSampler]
    if global_batch is None:
        sampler = ResumableSampler(train, num_replicas=world_size, rank=rank, shuffle=True,
                                   seed=config.seed, drop_last=False)
        train_loader = _loader(train, sampler, batch_size, **options)
    else:
        sampler = GlobalBatchSampler(samples_in(train), global_batch, rank, world_size, config.seed)
        train_loader = (DataLoader(train, batch_size=None, sampler=sampler, **options) if fetches_whole_batches(train)
                        else DataLoader(train, batch_sampler=sampler, **options))
    shard = ShardedValidation(val, rank, world_size)
    val_loader = _loader(shard, SequentialSampler(shard), batch_size, **options)
    return train_loader, val_loader, sampler
