"""Train the MNIST example net on the handwritten digits with DistributedDataParallel: the line-by-line
translation of train_horovod.py (Horovod's examples/pytorch/pytorch_mnist.py style); diff the two.

    torchrun --standalone --nproc-per-node 2 examples/migrating/train_ddp.py --epochs 1
"""

import argparse
import gc
import hashlib
import os
import sys

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

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
        # DDP: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()

    def metric_average(val):
        tensor = torch.tensor(val)
        dist.all_reduce(tensor)  # sums in place (Horovod's allreduce averages)
        return (tensor / dist.get_world_size()).item()

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

        # DDP: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)

        # DDP: average metric values across workers.
        test_loss = metric_average(test_loss)
        test_accuracy = metric_average(test_accuracy)

        # DDP: print output only on first rank (the loss with every bit of its float32).
        if dist.get_rank() == 0:
            print('Epoch {} test set: Average loss: {:.9g}, Accuracy: {:.2f}%'.format(
                epoch, test_loss, 100. * test_accuracy), flush=True)

    # DDP: join the process group; torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
    dist.init_process_group('gloo')
    rank, size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ['LOCAL_RANK'])
    print('rank {} of {}, local rank {}'.format(rank, size, local_rank), flush=True)
    torch.manual_seed(args.seed)

    # DDP: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset, test_dataset = build_datasets(seed=args.seed)

    # DDP: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    # DDP: use DistributedSampler to partition the test data.
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000,
                                              sampler=test_sampler)

    image, _ = train_dataset[0]
    model = build_model(num_classes=10, channels=image.shape[0], image_size=image.shape[-1])

    # DDP: wrap the model; the constructor broadcasts rank 0's parameters and buffers, and
    # backward() averages the gradients (a fresh optimizer has no state to broadcast).
    model = DDP(model)

    # DDP: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size(),
                          momentum=args.momentum)

    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test(epoch)

    if dist.get_rank() == 0:
        print('Final weights sha256: {}'.format(weights_sha256(model.module)), flush=True)
    # DDP: free the model before the process group: its reducer holds the group's work, and left to the
    # interpreter's exit, gloo's threads can abort the process ("terminate called") at 3 ranks or more.
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == '__main__':
    main(parser.parse_args())
