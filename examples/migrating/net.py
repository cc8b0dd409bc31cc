"""The network of Horovod's PyTorch MNIST example (examples/pytorch/pytorch_mnist.py), for any image size.

conv 5x5 -> max-pool -> conv 5x5 -> dropout2d -> max-pool -> fc 50 -> dropout -> fc -> log_softmax.
The convolutions are padded (padding=2) so that they keep the image size; the two poolings halve it,
so the flattened size is 20 x (image_size // 4)^2 and an 8x8 image works (the original, unpadded, needs
28x28). Used by train_horovod.py, train_ddp.py and, as `--model examples.migrating.net:build`, by
compare-backends.
"""

import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """Horovod's MNIST example net with padded convolutions; returns log-probabilities."""

    def __init__(self, num_classes=10, channels=1, image_size=28):
        super().__init__()
        if image_size < 4:
            raise ValueError(f"Net needs images of at least 4x4, not {image_size}x{image_size}")
        side = image_size // 4
        self.conv1 = nn.Conv2d(channels, 10, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5, padding=2)
        self.conv2_drop = nn.Dropout2d()
        self.flat = 20 * side * side
        self.fc1 = nn.Linear(self.flat, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, self.flat)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def build(num_classes, channels, image_size):
    """A randomly initialised Net for `channels` x `image_size` x `image_size` images and `num_classes` classes."""
    return Net(num_classes=num_classes, channels=channels, image_size=image_size)
