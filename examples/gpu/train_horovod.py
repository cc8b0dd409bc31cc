"""A Horovod training script, written as Horovod's examples/pytorch/pytorch_synthetic_benchmark.py writes one:
a torchvision model on synthetic data, the learning rate scaled by the number of workers, Horovod's
DistributedOptimizer, the weights and optimizer state broadcast from rank 0, images per second per worker.
Every Horovod-specific line is marked `# Horovod:`.

It runs unchanged under Horovod and under this project's Horovod API on torch.distributed:

    horovodrun -np 2 -H localhost:2 --gloo python examples/gpu/train_horovod.py
    torchrun --rdzv-backend loopback --nproc-per-node 2 -m ddp_train.horovod_api examples/gpu/train_horovod.py

scripts/gpu_check.sh runs it under the API on every GPU of a machine (NCCL) and reads what rank 0 writes to
--result: the workers and their devices, whether Horovod's allreduce summed and every worker ended with the same
weights, the losses and the speed.
"""

import argparse
import json
import math
import timeit

import torch
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark, Horovod style")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="resnet18", help="torchvision model to benchmark")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
parser.add_argument("--image-size", type=int, default=224, help="side of the synthetic images")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="number of warm-up batches that don't count")
parser.add_argument("--num-batches-per-iter", type=int, default=2, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate for a single worker")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--result", type=str, default=None, help="rank 0 writes what it measured to this JSON file")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

# Horovod: initialize library.
hvd.init()
torch.manual_seed(args.seed)

if args.cuda:
    # Horovod: pin GPU to local rank.
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda", torch.cuda.current_device()) if args.cuda else torch.device("cpu")

model = getattr(models, args.model)(num_classes=10).to(device)

# Horovod: scale learning rate by the number of workers.
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Each worker its own synthetic batch.
generator = torch.Generator().manual_seed(args.seed + hvd.rank())
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator).to(device)
target = torch.randint(0, 10, (args.batch_size,), generator=generator).to(device)
losses = []


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log(f"Model: {args.model}, batch size: {args.batch_size}, workers: {hvd.size()}, device: {device}")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for x in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{x}: {img_sec:.1f} img/sec per worker")
    img_secs.append(img_sec)
img_sec_mean = sum(img_secs) / len(img_secs)
log(f"Img/sec per worker: {img_sec_mean:.1f}")

# Horovod: the sum of every worker's rank, and every worker's weights against rank 0's.
rank_sum = hvd.allreduce(torch.tensor([float(hvd.rank())], device=device), op=hvd.Sum).item()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
weights_as_rank0 = bool(torch.equal(hvd.broadcast(flat, root_rank=0), flat))
# Horovod: what every worker saw.
workers = hvd.allgather_object({"rank": hvd.rank(), "local_rank": hvd.local_rank(), "device": str(device),
                                "img_sec": img_sec_mean, "weights_as_rank0": weights_as_rank0})
total = sum(w["img_sec"] for w in workers)
log(f"Total img/sec on {hvd.size()} worker(s): {total:.1f}")

if hvd.rank() == 0 and args.result:
    with open(args.result, "w") as f:
        json.dump({"size": hvd.size(), "local_size": hvd.local_size(), "workers": workers,
                   "nccl_built": int(hvd.nccl_built()), "cuda": args.cuda, "model": args.model,
                   "batch_size": args.batch_size, "image_size": args.image_size,
                   "batches": args.num_warmup_batches + args.num_iters * args.num_batches_per_iter,
                   "allreduce_sum": rank_sum, "allreduce_sum_expected": hvd.size() * (hvd.size() - 1) / 2,
                   "weights_equal": all(w["weights_as_rank0"] for w in workers),
                   "first_loss": losses[0], "last_loss": losses[-1],
                   "losses_finite": all(math.isfinite(v) for v in losses),
                   "img_sec_per_worker": img_sec_mean, "img_sec_total": total}, f, indent=2)
