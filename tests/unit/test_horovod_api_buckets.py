"""How the Horovod API's DistributedOptimizer forms its buckets, and a bucket's round trip (no launch)."""

from __future__ import annotations

import torch

from ddp_train.horovod_api.buckets import BUCKET_BYTES, FIRST_BUCKET_BYTES, Bucket, Slot, digest, layout

F32 = (torch.float32, "cpu")
F16 = (torch.float16, "cpu")


def test_a_small_first_bucket_then_buckets_closed_at_the_cap_in_backwards_order():
    mib = 2 ** 20
    slots = [Slot(i, mib // 2, F32) for i in range(8)]
    assert layout(slots, cap=2 * mib, first_cap=mib) == [[0, 1], [2, 3, 4, 5], [6, 7]]
    # As DDP's reducer: the gradient that reaches the size goes in, so only the last bucket is smaller. (resnet18's
    # fc.bias, fc.weight: 4 KB then 2 MB make a first bucket of 2 MB, not fc.bias alone.)
    uneven = [Slot(0, 4096, F32), Slot(1, 2 * mib, F32), Slot(2, mib, F32), Slot(3, 3 * mib, F32), Slot(4, mib, F32)]
    assert layout(uneven, cap=3 * mib, first_cap=mib) == [[0, 1], [2, 3], [4]]
    # DDP's defaults: 1 MiB first, 25 MiB after
    assert FIRST_BUCKET_BYTES == mib and BUCKET_BYTES == 25 * mib


def test_a_gradient_larger_than_the_cap_closes_its_bucket_and_a_type_change_starts_a_bucket():
    slots = [Slot(0, 10, F32), Slot(1, 500, F32), Slot(2, 10, F32), Slot(3, 10, F16), Slot(4, 10, F16)]
    assert layout(slots, cap=100, first_cap=100) == [[0, 1], [2], [3, 4]]
    assert layout([Slot(0, 500, F32), Slot(1, 10, F32)], cap=100, first_cap=100) == [[0], [1]]
    assert layout([], cap=100) == []


def test_the_digest_tells_layouts_apart():
    one = digest([["a", "b"], ["c"]])
    assert 1 <= one < 2 ** 62
    assert one == digest([["a", "b"], ["c"]])
    assert one != digest([["a"], ["b", "c"]])
    assert one != digest([["b", "a"], ["c"]])


def test_a_bucket_flattens_its_gradients_with_zeros_for_a_missing_one_and_writes_back_in_place():
    weight = torch.nn.Parameter(torch.zeros(2, 3))
    bias = torch.nn.Parameter(torch.zeros(3))
    strided = torch.nn.Parameter(torch.zeros(3, 2))
    weight.grad = torch.arange(6.0).view(2, 3)
    strided.grad = torch.arange(6.0).view(2, 3).t()  # not contiguous
    bucket = Bucket("bucket.w..s", [weight, bias, strided], passes=1)
    grads = [weight.grad, strided.grad]
    flat = bucket.flat()
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 3, 1, 4, 2, 5]
    assert bias.grad is not None and bias.grad.tolist() == [0, 0, 0]
    bucket.scatter(flat * 2)  # a new tensor (float16's round trip gives one)
    assert weight.grad is grads[0] and strided.grad is grads[1]  # the same tensors, written in place
    assert weight.grad.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert strided.grad.tolist() == [[0, 6], [2, 8], [4, 10]]
    assert bias.grad.tolist() == [0, 0, 0]
    # the next step: the same buffer, reduced in place and written back from it
    assert bucket.flat() is flat
    flat.mul_(0.5)
    bucket.scatter(flat)
    assert weight.grad.tolist() == [[0, 1, 2], [3, 4, 5]] and strided.grad.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_a_bucket_counts_every_members_passes_again_at_each_step():
    bucket = Bucket("b", [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))], passes=2)
    assert bucket.delays == [2, 2] and bucket.arrived == 0
    bucket.delays[0], bucket.arrived = 0, 1
    bucket.restart(3)
    assert bucket.delays == [3, 3] and bucket.arrived == 0 and bucket.passes == 3
