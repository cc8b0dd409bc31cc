"""Train the MNIST example net on the handwritten digits with Horovod, in the style of Horovod's
examples/pytorch/pytorch_mnist.py. train_ddp.py is its line-by-line DDP translation; diff the two.

    horovodrun -np 2 -H localhost:2 --gloo python examples/migrating/train_horovod.py --epochs 1
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import build as build_datasets  # noqa: E402  (examples/migrating/data.py)
from net import build as build_model  # noqa: E402  (examples/migrating/net.py)

parser = argparse.ArgumentParser(description='MNIST example net on the digits')
parser.add_argument('--epochs', type=int, default=10, help='passes over the training set (default: 10)')
parser.add_argument('--batch-size', type=int, default=32, help='samples per process per step (default: 32)')
parser.add_argument('--lr', type=float, default=0.05, help='learning rate, times the world size (default: 0.05)')
parser.add_argument('--momentum', type=float, default=0.5, help='SGD momentum (default: 0.5)')
parser.add_argument('--seed', type=int, default=42, help='random seed (default: 42)')


def weights_sha256(model):
    """SHA-256 of every parameter and buffer, in order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(args):
    def train_epoch(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test(epoch):
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                # sum up batch loss
                test_loss += F.nll_loss(output, target, reduction='sum').item()
                # get the index of the max log-probability
                pred = output.max(1, keepdim=True)[1]
                test_accuracy += pred.eq(target.view_as(pred)).float().sum().item()

        # Horovod: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)

        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, 'avg_loss')
        test_accuracy = metric_average(test_accuracy, 'avg_accuracy')

        # Horovod: print output only on first rank (the loss with every bit of its float32).
        if hvd.rank() == 0:
            print('Epoch {} test set: Average loss: {:.9g}, Accuracy: {:.2f}%'.format(
                epoch, test_loss, 100. * test_accuracy), flush=True)

    # Horovod: initialize library.
    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    print('rank {} of {}, local rank {}'.format(rank, size, local_rank), flush=True)
    torch.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset, test_dataset = build_datasets(seed=args.seed)

    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    # Horovod: use DistributedSampler to partition the test data.
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000,
                                              sampler=test_sampler)

    image, _ = train_dataset[0]
    model = build_model(num_classes=10, channels=image.shape[0], image_size=image.shape[-1])

    # Horovod: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                          momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         op=hvd.Average)

    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test(epoch)

    if hvd.rank() == 0:
        print('Final weights sha256: {}'.format(weights_sha256(model)), flush=True)


if __name__ == '__main__':
    main(parser.parse_args())
