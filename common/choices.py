"""The built-in names of the registries: what --dataset, --model and --optimizer offer besides a factory.

Imports nothing, so `common.config`, whose parser and docs offer these names, stays cheap to import. The
registries that build them (`common.inputs.data`, `common.inputs.models`, `common.loop.optim`) are made with
`registry()` from these names, so no name is offered without a builder, nor built without being offered.
"""

from __future__ import annotations

from typing import Dict, Sequence, TypeVar

T = TypeVar("T")

#: --dataset's built-ins, in the order --help shows them
DATASETS = ("digits", "synthetic", "mnist", "cifar10", "imagefolder")
#: the built-in datasets read from the files under --data-dir
FILE_DATASETS = ("mnist", "cifar10", "imagefolder")
#: --model's built-ins, in the order --help shows them
MODELS = ("mlp", "convnet", "mnist_net", "resnet18", "resnet50")
#: the built-in models torchvision has pretrained weights of (--pretrained)
PRETRAINABLE_MODELS = ("resnet18", "resnet50")
#: --optimizer's choices
OPTIMIZERS = ("sgd", "adam", "adadelta")


def registry(names: Sequence[str], entries: Dict[str, T], what: str) -> Dict[str, T]:
    """`entries` in the order of `names`; ValueError when the two do not name the same things (an option's
    choices and the registry behind them must not drift apart)."""
    missing = [name for name in names if name not in entries]
    unoffered = [name for name in entries if name not in names]
    if missing or unoffered:
        raise ValueError(f"the {what} registry does not match common.choices: no entry for {missing}, "
                         f"not offered {unoffered}")
    return {name: entries[name] for name in names}
