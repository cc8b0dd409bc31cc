"""A user's own modules, written into a folder of a test's: a token-sequence dataset, a small transformer, and
factories that are bad in every way open_inputs refuses (test_plugins launches them, tests/unit/test_user_factories
checks each refusal's line in process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

TOKENS = '''
    """A token-sequence task: the class is the marker token that fills half of each sequence."""
    import torch
    from torch.utils.data import TensorDataset


    def build(data_dir=None, seed=0, samples=192, length=12, vocab=24, classes=4):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randint(classes, vocab, (samples, length), generator=gen)
        y = torch.randint(classes, (samples,), generator=gen)
        for i in range(samples):
            x[i, torch.randperm(length, generator=gen)[:length // 3]] = y[i]
        n_val = samples // 4
        return TensorDataset(x[n_val:], y[n_val:]), TensorDataset(x[:n_val], y[:n_val])
'''
TRANSFORMER = '''
    """A small transformer-style classifier over token sequences: embedding, encoder layers (attention,
    LayerNorm, dropout), mean pooling, a linear head."""
    import torch
    from torch import nn


    class Classifier(nn.Module):
        def __init__(self, num_classes, length, vocab=24, width=32, heads=4, depth=1, dropout=0.1):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.zeros(length, width))
            layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=dropout, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, num_classes)

        def forward(self, tokens):
            return self.head(self.norm(self.encoder(self.embed(tokens) + self.position).mean(dim=1)))


    def build(num_classes, channels, image_size, **model_args):
        return Classifier(num_classes, length=image_size, **model_args)
'''
BAD = '''
    import torch
    from torch import nn


    def raises(**kwargs):
        raise ValueError("depth must be positive")


    def not_a_module(**kwargs):
        return 3


    def one_set(data_dir=None, seed=0):
        return [torch.zeros(3)]


    def float_labels(data_dir=None, seed=0):
        data = [(torch.zeros(4), 0.5)] * 8
        return data, data


    class Sparse(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.embed = nn.Embedding(10, 8, sparse=True)
            self.head = nn.Linear(8, num_classes)

        def forward(self, x):
            return self.head(self.embed(x.flatten(1).long().clamp(0, 9)).mean(1))


    def sparse(num_classes, channels, image_size):
        return Sparse(num_classes)


    class Spare(nn.Module):
        def __init__(self, num_classes, size):
            super().__init__()
            self.head = nn.Linear(size, num_classes)
            self.spare = nn.Linear(size, num_classes)

        def forward(self, x):
            return self.head(x.flatten(1))


    def unused(num_classes, channels, image_size):
        return Spare(num_classes, channels * image_size * image_size)
'''
#: case -> (arguments, what its one line says)
BAD_FACTORIES = {
    "module-missing": (["--model", "nosuch_module:build"], "cannot import 'nosuch_module': ModuleNotFoundError"),
    "import-fails": (["--model", "broken:build"], "cannot import 'broken': ModuleNotFoundError: No module named "
                                                  "'nonexistent_dependency' (at broken.py:1"),
    "attribute-missing": (["--model", "transformer:biuld"], "has no 'biuld'; did you mean build?"),
    "raises": (["--model", "bad:raises"], "raised ValueError: depth must be positive (at bad.py:6 in raises)"),
    "not-a-module": (["--model", "bad:not_a_module"], "returned an int, not a torch.nn.Module"),
    "not-two-datasets": (["--dataset", "bad:one_set"], "returned a list of 1; return (train, val)"),
    "bad-sample": (["--dataset", "bad:float_labels"], "train[0]'s label is 0.5 (float); make it an int"),
    "sparse-gradients": (["--model", "bad:sparse"], "get sparse gradients"),
    "unused-parameters": (["--model", "bad:unused"], "parameters spare.weight, spare.bias get no gradient"),
}
#: Every bad factory is refused by open_inputs in Trainer.prepare, which each rank runs before any collective, through
#: its one fail_usage. These two show that under torchrun, on every rank at once: the first refusal open_inputs makes
#: (importing the model's factory) and the last (after the model's trial step); every case's line is checked in
#: process (tests/unit/test_user_factories.py).
ON_EVERY_RANK = ("module-missing", "unused-parameters")


def write_modules(path: Path) -> Path:
    """The modules above, and broken.py (whose import fails), written into `path`."""
    for name, text in (("tokens", TOKENS), ("transformer", TRANSFORMER), ("bad", BAD)):
        (path / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    (path / "broken.py").write_text("import nonexistent_dependency\n")
    return path
