"""A team's Horovod codebase, laid out as teams lay them out, for the tests of the port of a folder: an entry script
(train.py) and a package of its own (trainkit) whose modules use Horovod, with a config it reads by a relative path.

- trainkit/data.py builds a DistributedSampler on hvd.size()/hvd.rank() from `data.json` (read from the working
  directory);
- trainkit/engine.py holds the loop (manual gradient accumulation, `if (i + 1) % accum_steps == 0:
  optimizer.step()`, for a DistributedOptimizer(backward_passes_per_step=...) made in train.py) and a rank-0
  checkpoint helper;
- trainkit/metrics.py has a metric class that reduces with hvd.allreduce_(t, op=hvd.Sum);
- trainkit/models.py has the network: `Net`, whose auxiliary head is used on every other step when `--aux` is given
  (a parameter without a gradient in some steps);
- train.py resumes from the newest `checkpoint-{epoch}.pt` in the working directory, as Horovod's
  pytorch_imagenet_resnet50.py does, and writes `final.json` (rank 0: each epoch's loss and the final weights'
  SHA-256).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Dict

TRAIN = '''\
"""Train trainkit's network with Horovod."""
import argparse
import hashlib
import json
import os

import torch

import horovod.torch as hvd
from trainkit import data, engine
from trainkit.metrics import Mean
from trainkit.models import Net

parser = argparse.ArgumentParser(description='trainkit with Horovod')
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--accum', type=int, default=2)
parser.add_argument('--lr', type=float, default=0.02)
parser.add_argument('--wd', type=float, default=0.0)
parser.add_argument('--aux', action='store_true', help='train the auxiliary head on every other step')
parser.add_argument('--checkpoint-format', default='checkpoint-{epoch}.pt')


def main(args):
    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    loader, sampler = data.build_loader(args.batch_size)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9,
                                weight_decay=args.wd)

    # Horovod: wrap the optimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.accum)

    # Horovod: resume from the newest checkpoint, on rank 0; the others learn the epoch from it.
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                      name='resume_from_epoch').item()
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint_format.format(epoch=resume_from_epoch))
        model.load_state_dict(checkpoint['model'])
        optimizer.load_state_dict(checkpoint['optimizer'])

    # Horovod: broadcast the weights and the optimizer's state from rank 0.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    losses = []
    for epoch in range(resume_from_epoch, args.epochs):
        sampler.set_epoch(epoch)
        losses.append(engine.train_epoch(model, optimizer, loader, args.accum, Mean('loss'), args.aux))
        engine.save_checkpoint(model, optimizer, epoch + 1, args.checkpoint_format)

    if hvd.rank() == 0:
        weights = b''.join(t.detach().numpy().tobytes() for t in model.state_dict().values())
        with open('final.json', 'w') as out:
            json.dump({'resumed_from': resume_from_epoch, 'losses': losses,
                       'sha256': hashlib.sha256(weights).hexdigest()}, out)


if __name__ == '__main__':
    main(parser.parse_args())
'''

PACKAGE: Dict[str, str] = {
    "__init__.py": '"""trainkit: the team\'s training package."""\n',
    "data.py": '''\
"""The training data, partitioned across the workers."""
import json

import torch
import torch.utils.data
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd


def build_loader(batch_size):
    with open('data.json') as config:
        settings = json.load(config)
    generator = torch.Generator().manual_seed(settings['seed'])
    inputs = torch.randn(settings['samples'], 12, generator=generator)
    labels = (inputs[:, :3].sum(1) > 0).long()
    dataset = torch.utils.data.TensorDataset(inputs, labels)
    # Horovod: partition the data among the workers.
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler
''',
    "engine.py": '''\
"""The training loop and the checkpoints."""
import torch
import torch.nn.functional as F

import horovod.torch as hvd


def train_epoch(model, optimizer, loader, accum_steps, meter, aux=False):
    model.train()
    for i, (x, y) in enumerate(loader):
        output = model(x, with_aux=aux and i % 4 < 2)
        loss = F.cross_entropy(output, y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
        meter.update(loss.item() * accum_steps, len(y))
    return meter.average()


def save_checkpoint(model, optimizer, epoch, checkpoint_format):
    # Horovod: only the first worker writes checkpoints.
    if hvd.rank() == 0:
        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()},
                   checkpoint_format.format(epoch=epoch))
''',
    "metrics.py": '''\
"""Metrics averaged over every worker's samples."""
import torch

import horovod.torch as hvd


class Mean:
    def __init__(self, name):
        self.name = name
        self.total = torch.zeros(2, dtype=torch.float64)

    def update(self, value, count):
        self.total += torch.tensor([value * count, count], dtype=torch.float64)

    def average(self):
        reduced = self.total.clone()
        hvd.allreduce_(reduced, op=hvd.Sum, name=self.name)
        return (reduced[0] / reduced[1]).item()
''',
    "models.py": '''\
"""The network: a small MLP with an auxiliary head that some steps use."""
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 2)
        self.aux = nn.Linear(32, 2)

    def forward(self, x, with_aux=False):
        hidden = F.relu(self.fc1(x))
        out = self.fc2(hidden)
        if with_aux:
            out = out + 0.5 * self.aux(hidden)
        return out
''',
}

#: the data's settings, read by a relative path: 192 samples, an even number of passes of 16 per rank and epoch at 2
#: and at 3 ranks (6 and 4), so that backward_passes_per_step=2 ends each epoch on a step
DATA = {"seed": 7, "samples": 192}


def write_project(folder: Path) -> Path:
    """The project in `folder` (made if missing): train.py, trainkit/ and data.json. Returns `folder`."""
    (folder / "trainkit").mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAIN)
    for name, text in PACKAGE.items():
        (folder / "trainkit" / name).write_text(textwrap.dedent(text))
    (folder / "data.json").write_text(json.dumps(DATA) + "\n")
    return folder


def block_horovod(folder: Path) -> Path:
    """A folder to put first on PYTHONPATH so that `import horovod` fails, as where Horovod is not installed."""
    (folder / "horovod").mkdir(parents=True, exist_ok=True)
    (folder / "horovod" / "__init__.py").write_text("raise ImportError('horovod is not installed here')\n")
    return folder
