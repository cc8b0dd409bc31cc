"""Model registry: the built-ins, torchvision:NAME and package.module:function. Every model adapts to the
dataset's channels, image size and classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from common.choices import MODELS, registry
from common.errors import UsageError
from .factories import TORCHVISION, Factory, article, is_factory, load, torchvision_factory


class MLP(nn.Module):
    """A tiny two-layer perceptron: fast enough for multi-process tests."""

    def __init__(self, channels: int, image_size: int, num_classes: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * image_size * image_size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    """The seed tutorial's MNIST ConvNet: two conv-BatchNorm-ReLU-maxpool blocks, then a linear layer."""

    def __init__(self, channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.layer1 = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2))
        self.layer2 = nn.Sequential(
            nn.Conv2d(16, 32, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2))
        side = image_size // 4
        self.fc = nn.Linear(side * side * 32, num_classes)

    def forward(self, x):
        out = self.layer2(self.layer1(x))
        return self.fc(out.reshape(out.size(0), -1))


class MnistNet(nn.Module):
    """PyTorch's MNIST example net: conv, conv, maxpool, dropout, fc, dropout, fc (log-softmax)."""

    def __init__(self, channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        side = (image_size - 4) // 2
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        # log-softmax as in the example; cross-entropy on it equals NLL, so one loss serves all models
        return F.log_softmax(self.fc2(x), dim=1)


def _resnet(name: str) -> Callable[[int, int, int], nn.Module]:
    def build(channels: int, image_size: int, num_classes: int) -> nn.Module:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
        if channels != 3:
            model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return model

    return build


MODEL_BUILDERS: Dict[str, Callable[[int, int, int], nn.Module]] = registry(MODELS, {
    "mlp": MLP,
    "convnet": ConvNet,
    "mnist_net": MnistNet,
    "resnet18": _resnet("resnet18"),
    "resnet50": _resnet("resnet50"),
}, "model")

#: smallest input side each model accepts
MIN_IMAGE_SIZE = registry(MODELS, {"mlp": 1, "convnet": 4, "mnist_net": 6, "resnet18": 32, "resnet50": 32},
                          "smallest image side")
#: the input side --dataset synthetic takes when --image-size is not given: ImageNet's for ImageNet models (as
#: Horovod's synthetic benchmark and pytorch/examples' --dummy do), the embedded digits' for the small ones
NATURAL_IMAGE_SIZE = registry(MODELS, {"mlp": 8, "convnet": 8, "mnist_net": 8, "resnet18": 224, "resnet50": 224},
                              "natural image side")
TORCHVISION_IMAGE_SIZE = 224
USER_IMAGE_SIZE = 8


@dataclass(frozen=True)
class ModelChoice:
    """What --model names: a built-in or a factory (torchvision's or the user's), ready to build."""

    name: str
    build: Callable[..., nn.Module]  # (num_classes=, channels=, image_size=, **model_args) -> Module
    factory: Optional[Factory]  # None for a built-in
    natural_image_size: int

    def record(self) -> Optional[Dict]:
        """Import path, source file and SHA-256 of a factory; None for a built-in."""
        return self.factory.record() if self.factory else None


def choose_model(name: str) -> ModelChoice:
    """Resolve --model: a built-in name, torchvision:NAME or package.module:function (imported now);
    UsageError naming the problem."""
    if name in MODEL_BUILDERS:
        builder = MODEL_BUILDERS[name]

        def build(num_classes: int, channels: int, image_size: int, **model_args) -> nn.Module:
            try:
                return builder(channels, image_size, num_classes, **model_args)
            except TypeError as exc:
                if not model_args:
                    raise
                raise UsageError(f"--model-arg {', '.join(model_args)}: --model {name} does not take it ({exc}); "
                                 "drop it") from None

        return ModelChoice(name, build, None, NATURAL_IMAGE_SIZE[name])
    if not is_factory(name):
        raise UsageError(f"unknown model {name!r}; choose one of {', '.join(MODEL_BUILDERS)}, torchvision:NAME or "
                         "package.module:function")
    module, _, attribute = name.partition(":")
    if module == TORCHVISION:
        factory = torchvision_factory(attribute)
        return ModelChoice(name, factory.call, factory, TORCHVISION_IMAGE_SIZE)
    factory = load(name, "--model")
    return ModelChoice(name, factory.call, factory, USER_IMAGE_SIZE)


def check_model_fits(name: str, image_size: int) -> None:
    """Raise ValueError (with the fix) when a built-in model cannot take images of this size (a factory's
    model is checked by running it, see common.inputs.modelcheck)."""
    if name not in MIN_IMAGE_SIZE:
        return
    if image_size < MIN_IMAGE_SIZE[name]:
        raise ValueError(f"--model {name} needs images of at least {MIN_IMAGE_SIZE[name]}x"
                         f"{MIN_IMAGE_SIZE[name]}, the dataset gives {image_size}x{image_size}; "
                         f"pass --image-size or pick another model")


def build_model(model: Union[str, ModelChoice], channels: int, image_size: int, num_classes: int, seed: int,
                model_args: Optional[Dict[str, Any]] = None) -> nn.Module:
    """Build a model with weights drawn from `seed`, identical on every rank and backend. A factory that
    raises or returns something other than a Module is a UsageError."""
    choice = choose_model(model) if isinstance(model, str) else model
    check_model_fits(choice.name, image_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = choice.build(num_classes=num_classes, channels=channels, image_size=image_size, **(model_args or {}))
    if not isinstance(built, nn.Module):
        raise UsageError(f"--model {choice.name} returned {article(built)}, not a torch.nn.Module; return "
                         "the model itself")
    return built


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradients one step produces and the backends reduce: the trainable parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
