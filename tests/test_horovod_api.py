"""The Horovod API (python -m ddp_train.horovod_api) under real launchers: one script in Horovod's style at 3 ranks
under torchrun exercises every collective, the optimizer, SyncBatchNorm, the timeline, re-initialization and the
errors, and writes what each rank got; the tests read it. Then: bad input ends every rank in one line; under mpirun's
placement a collective works and a rank that stops taking part ends the job with Horovod's stall error in bounded
time."""

from __future__ import annotations

import json
import re
import socket
import textwrap
import time
from typing import Dict, List

import numpy as np
import pytest

from common import launch as launch_layer
from launched import PY, Result, run_cmd

WORLD = 3
API = "ddp_train.horovod_api"

#: optimizer steps with nothing else between them, at the end of the script's timeline
STEADY_STEPS = 8
#: a Horovod script: every collective, the optimizer, the errors; each rank writes OUT/rank<R>.json
COLLECTIVES = textwrap.dedent('''
    import copy, json, os, sys, time, warnings
    import torch
    import torch.nn.functional as F
    import horovod
    import horovod.torch as hvd

    out_dir, STEADY_STEPS = sys.argv[1], int(sys.argv[2])
    got = {}
    hvd.init(process_sets="dynamic")  # process sets may be added and removed later
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    got["identity"] = [r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
    got["module"] = [hvd.__name__, horovod.__version__, hvd.mpi_built(), hvd.gloo_built(), hvd.is_initialized()]
    got["env"] = [os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"]]

    def errors(call):
        started = time.monotonic()
        try:
            call()
        except Exception as exc:
            return [type(exc).__name__, str(exc), round(time.monotonic() - started, 2)]
        return None

    # allreduce: ops, Horovod's scaling, types, in place, asynchronous
    x = torch.tensor([1.0, 2.0, 5.0, 7.0]) * (r + 1) + (1.0 if r == 0 else 0.0)  # sums 7, 13, 31, 43
    got["average"] = hvd.allreduce(x).tolist()
    got["sum"] = hvd.allreduce(x, op=hvd.Sum).tolist()
    got["min"] = hvd.allreduce(x, op=hvd.Min).tolist()
    got["max"] = hvd.allreduce(x, op=hvd.Max).tolist()
    got["product"] = hvd.allreduce(x, op=hvd.Product).tolist()
    got["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.25, postscale_factor=0.1).tolist()
    got["int_average"] = hvd.allreduce(torch.tensor([5, -5, 7, 100], dtype=torch.int32) + r).tolist()
    got["half_sum"] = hvd.allreduce(torch.ones(3, dtype=torch.float16) * 0.5, op=hvd.Sum).tolist()
    y = torch.ones(5) * r
    got["in_place"] = [hvd.allreduce_(y, op=hvd.Sum) is y, y.tolist()]
    handle = hvd.allreduce_async(torch.ones(1000) * r, name="async", op=hvd.Sum)
    got["async"] = [hvd.poll(handle) in (True, False), hvd.synchronize(handle)[:2].tolist()]
    got["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3) * 2 * r],
                                                                   op=hvd.Sum)]
    # allgather with different first dimensions, broadcast (int16 too), alltoall with splits, reducescatter
    got["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r))).tolist()
    got["grouped_allgather"] = [t.tolist() for t in hvd.grouped_allgather([torch.tensor([r]), torch.tensor([r, r])])]
    got["broadcast"] = hvd.broadcast(torch.tensor([10 * r, 1]), root_rank=1).tolist()
    z = torch.tensor([r, r], dtype=torch.int16)
    hvd.broadcast_(z, root_rank=2)
    got["broadcast_int16"] = z.tolist()
    rows = torch.cat([torch.full((i + 1, 2), float(10 * r + i)) for i in range(n)])
    received, splits = hvd.alltoall(rows, splits=[i + 1 for i in range(n)])
    got["alltoall"] = [received.tolist(), splits.tolist()]
    got["alltoall_equal"] = hvd.alltoall(torch.arange(n * 2) + 100 * r).tolist()
    ramp = torch.arange(2 * n + 1, dtype=torch.float32) * (r + 1)
    got["reducescatter"] = hvd.reducescatter(ramp, op=hvd.Sum).tolist()
    got["reducescatter_average"] = hvd.reducescatter(torch.ones(n, 2) * (r + 1)).tolist()
    got["grouped_reducescatter"] = [t.tolist() for t in hvd.grouped_reducescatter(
        [torch.ones(n) * r, torch.ones(n, 2)], op=hvd.Sum)]
    # gradients through the collectives
    leaf = torch.ones(3, requires_grad=True)
    hvd.allreduce(leaf, op=hvd.Sum).sum().backward()
    got["allreduce_grad"] = leaf.grad.tolist()
    leaf = torch.ones(r + 1, 2, requires_grad=True)
    (hvd.allgather(leaf) * 2).sum().backward()
    got["allgather_grad"] = leaf.grad.tolist()
    leaf = torch.ones(2, requires_grad=True)
    hvd.broadcast(leaf, root_rank=0).sum().backward()
    got["broadcast_grad"] = leaf.grad.tolist()
    leaves = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]  # fused in one buffer
    sum(t.sum() for t in hvd.grouped_allreduce(leaves, op=hvd.Sum)).backward()
    got["grouped_allreduce_grad"] = [t.grad.tolist() for t in leaves]
    # objects
    got["broadcast_object"] = hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=2)
    got["allgather_object"] = hvd.allgather_object({"rank": r})
    # errors: Horovod's, on every rank, at once
    got["shape_error"] = errors(lambda: hvd.allreduce(torch.ones(3 + r)))
    got["type_error"] = errors(lambda: hvd.allreduce(torch.ones(3, dtype=torch.float64 if r else torch.float32)))
    got["root_error"] = errors(lambda: hvd.broadcast(torch.ones(2), root_rank=r))
    got["gather_error"] = errors(lambda: hvd.allgather(torch.ones(2, 3 + r)))
    if r == n - 1:  # the others' "twice" stays in flight until the last rank asks: their second ask is a duplicate
        time.sleep(1.0)
    first = hvd.allreduce_async(torch.ones(2), name="twice")
    got["duplicate_error"] = errors(lambda: hvd.allreduce_async(torch.ones(2), name="twice"))
    hvd.synchronize(first)
    got["splits_error"] = errors(lambda: hvd.alltoall(torch.ones(n + 1)))
    got["adasum_error"] = errors(lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum))
    got["reducescatter_op_error"] = errors(lambda: hvd.reducescatter(torch.ones(n), op=hvd.Min))
    got["type_refused"] = errors(lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)))
    got["import_refused"] = errors(lambda: __import__("horovod.tensorflow"))
    got["after_errors"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).tolist()

    # DistributedOptimizer: gradients averaged during backward, rank 0's start, options
    def model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    net = model()
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    alone = copy.deepcopy(net)  # the same weights without the optimizer's hooks: this rank's own gradients
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters())
    torch.manual_seed(100 + r)
    data, target = torch.randn(8, 4), torch.randn(8, 2)
    F.mse_loss(net(data), target).backward()  # the allreduces start here and write the gradients in place
    F.mse_loss(alone(data), target).backward()
    local = [p.grad for p in alone.parameters()]
    opt.synchronize()
    averaged = [p.grad.clone() for p in net.parameters()]
    every = [hvd.allgather(g.unsqueeze(0)) for g in local]
    got["optimizer_average"] = max(float((a.double() - e.double().mean(0)).abs().max())
                                   for a, e in zip(averaged, every))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    got["step_warning"] = [str(w.message) for w in caught]
    got["weights_agree"] = [float(t.double().std(0).max()) for t in
                            [hvd.allgather(p.detach().unsqueeze(0)) for p in net.parameters()]]
    opt.zero_grad()
    F.mse_loss(net(data), target).backward()
    got["zero_grad_refused"] = errors(lambda: opt.zero_grad())
    opt.step()
    # accumulation over two backward passes, a parameter one rank does not use, groups, fp16, predivide
    net2 = model()
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(net2.parameters(), lr=0.1),
                                    named_parameters=net2.named_parameters(), backward_passes_per_step=2, groups=2,
                                    compression=hvd.Compression.fp16)
    for _ in range(2):
        out = net2[0](data) if r == 1 else net2(data)
        out.sum().backward()
    opt2.step()
    got["accumulated_ok"] = [float(t.double().std(0).max()) for t in
                             [hvd.allgather(p.detach().unsqueeze(0)) for p in net2.parameters()]]
    net3 = model()
    opt3 = hvd.DistributedOptimizer(torch.optim.SGD(net3.parameters(), lr=0.1),
                                    named_parameters=net3.named_parameters(), gradient_predivide_factor=2.0)
    F.mse_loss(net3(data), target).backward()
    opt3.synchronize()
    got["predivide"] = max(float((p.grad.double() - a.double()).abs().max())
                           for p, a in zip(net3.parameters(), averaged))
    with opt3.skip_synchronize():
        opt3.step()
    got["duplicate_names"] = errors(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=[("w", p) for p in net.parameters()]))
    got["missing_names"] = errors(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=list(net.named_parameters())[:1]))
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    for dense in (False, True):
        sparse_opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(embedding.parameters()), lr=0.1),
                                              sparse_as_dense=dense)
        embedding(torch.tensor([[1, 2, r + 3]])).sum().backward()
        sparse_opt.step()
        sparse_opt.zero_grad()
    got["sparse_weights_agree"] = float(hvd.allgather(embedding.weight.detach().unsqueeze(0)).double().std(0).max())
    # broadcast_optimizer_state: a fresh Adam takes Horovod's zero-gradient step; rank 0's options win
    net4 = model()
    before = [p.detach().clone() for p in net4.parameters()]
    adam = torch.optim.AdamW(net4.parameters(), lr=0.01 * (r + 1), weight_decay=0.1)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    got["zero_step_moved"] = any(not torch.equal(a, p) for a, p in zip(before, net4.parameters()))
    got["adam_state"] = [adam.param_groups[0]["lr"], float(adam.state_dict()["state"][0]["step"])]
    # SyncBatchNorm on CPU: what BatchNorm gives on every rank's batch together
    torch.manual_seed(7)
    batches = [torch.randn(4, 3, 5) * (i + 1) + i for i in range(n)]
    mine = batches[r].clone().requires_grad_()
    sync_bn, bn = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    out = sync_bn(mine)
    (out * (r + 1)).sum().backward()
    whole = torch.cat(batches).requires_grad_()
    reference = bn(whole)
    (reference * torch.cat([torch.full((4, 1, 1), float(i + 1)) for i in range(n)])).sum().backward()
    got["sync_bn"] = [float((out - reference[4 * r:4 * r + 4]).detach().abs().max()),
                      float((sync_bn.running_var - bn.running_var).abs().max()),
                      float((mine.grad - whole.grad[4 * r:4 * r + 4]).abs().max())]
    # process sets and join last: their ranks make different numbers of calls, after which unnamed collectives
    # would no longer match (as in Horovod); shutdown() starts the numbering again
    even = hvd.add_process_set([0, 2])
    if r in (0, 2):
        got["set"] = [even.rank(), even.size(), hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum,
                                                               process_set=even).tolist()]
        hvd.barrier(process_set=even)
    got["set_removed"] = hvd.remove_process_set(even)
    # join: rank 2 runs out of data first; the others' allreduces get its zeros
    if r == 2:
        got["join"] = hvd.join()
    else:
        got["joined_average"] = hvd.allreduce(torch.tensor([3.0, 6.0]) * (r + 1), name="uneven").tolist()
        got["join"] = hvd.join()
    hvd.barrier()
    # the timeline (rank 0 writes it), then shutdown and init again
    hvd.start_timeline(os.path.join(out_dir, "timeline.json"), mark_cycles=True)
    hvd.barrier()  # no rank asks for "timed" before rank 0 records
    # buckets: from its second step on, a DistributedOptimizer asks for its gradients by bucket; at the last step
    # rank 1 computes no gradient for the second layer (zeros stand in). Named collectives only, after the join.
    net5 = model()
    opt5 = hvd.DistributedOptimizer(torch.optim.SGD(net5.parameters(), lr=0.1),
                                    named_parameters=net5.named_parameters())
    got["bucket_average"] = []
    for step in range(3):
        alone5 = model()  # this rank's own gradients, from a copy without the optimizer's hooks
        alone5.load_state_dict(net5.state_dict())
        torch.manual_seed(200 + 10 * step + r)
        x5, t5 = torch.randn(8, 4), torch.randn(8, 2)

        def loss5(m):
            return m[0](x5).sum() if r == 1 and step == 2 else F.mse_loss(m(x5), t5)
        loss5(alone5).backward()
        opt5.zero_grad()
        loss5(net5).backward()
        opt5.synchronize()
        every5 = [hvd.allgather((q.grad if q.grad is not None else torch.zeros_like(q)).unsqueeze(0),
                                name=f"local.{step}.{i}") for i, q in enumerate(alone5.parameters())]
        got["bucket_average"].append(max(float((p.grad.double() - e.double().mean(0)).abs().max())
                                         for p, e in zip(net5.parameters(), every5)))
        with opt5.skip_synchronize():
            opt5.step()
    # its last bucket (here its only one) is read when the backward that reached all of its gradients ends: a
    # change after backward is overwritten by the average; where that backward left some out (a checkpoint's inner
    # backward, which leaves the first layer to the outer one), it is read at synchronize() and the change counts
    got["bucket_read"] = []
    for inner in (False, True):
        opt5.zero_grad()
        if inner:
            head = torch.utils.checkpoint.checkpoint(net5[2], net5[1](net5[0](x5)), use_reentrant=True)
            F.mse_loss(head, t5).backward()
        else:
            F.mse_loss(net5(x5), t5).backward()
        for q in net5.parameters():
            q.grad.add_(1000.0)
        opt5.synchronize()
        sizes = [q.grad.abs() for q in net5.parameters()]
        got["bucket_read"].append([max(float(g.max()) for g in sizes), min(float(g.min()) for g in sizes)])
        with opt5.skip_synchronize():
            opt5.step()
    opt5.zero_grad()
    F.mse_loss(net5(x5), t5).backward()
    got["bucket_zero_grad_refused"] = errors(lambda: opt5.zero_grad())
    got["bucket_twice"] = errors(lambda: F.mse_loss(net5(x5), t5).backward())
    opt5.synchronize()
    # steady steps: nothing but the optimizer's one bucket, step after step; from the third on, the guess answers
    net6 = model()
    opt6 = hvd.DistributedOptimizer(torch.optim.SGD(net6.parameters(), lr=0.1),
                                    named_parameters=net6.named_parameters())
    for step in range(STEADY_STEPS):
        opt6.zero_grad()
        F.mse_loss(net6(x5), t5).backward()
        opt6.step()
    hvd.allreduce(torch.ones(2), name="timed")
    hvd.stop_timeline()
    hvd.shutdown()
    got["after_shutdown"] = [hvd.is_initialized(), errors(lambda: hvd.allreduce(torch.ones(1)))]
    hvd.init()
    got["reinit"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).tolist()
    # never the real Horovod: no module from its installation, no library of its mapped
    files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
    maps = open("/proc/self/maps").read()
    got["real_horovod"] = [f for f in files if "site-packages/horovod" in f] + \\
        sorted({line.split()[-1] for line in maps.splitlines() if "site-packages/horovod" in line})
    with open(os.path.join(out_dir, "rank%d.json" % r), "w") as f:
        json.dump(got, f)
''')

#: under mpirun: one allreduce, then rank 1 stops taking part; rank 0's next allreduce must end
STALL = textwrap.dedent('''
    import sys, time
    import torch
    import horovod.torch as hvd
    hvd.init()
    print(f"rank {hvd.rank()} of {hvd.size()} sum {hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()}", flush=True)
    if hvd.rank() == 1:
        time.sleep(600)
    hvd.allreduce(torch.ones(2), name="never")
''')


@pytest.fixture(scope="module")
def collectives(tmp_path_factory) -> Dict:
    """One 3-rank run of COLLECTIVES under torchrun: {"ranks": [what each rank got], "result", "out"}."""
    folder = tmp_path_factory.mktemp("horovod_api")
    script = folder / "collectives.py"
    script.write_text(COLLECTIVES)
    result = run_cmd(api_command("torchrun", WORLD, [str(script), str(folder), str(STEADY_STEPS)]), timeout=240,
                     cwd=folder).check()
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"ranks": ranks, "result": result, "out": folder}


def api_command(launcher: str, np: int, words: List[str]) -> List[str]:
    """The registered launcher's command running `python -m ddp_train.horovod_api WORDS` on `np` processes."""
    return launch_layer.get(launcher).command(np, words, module=API, python=PY)


def each(collectives, key: str) -> List:
    return [rank[key] for rank in collectives["ranks"]]


def test_every_rank_knows_its_place(collectives):
    assert each(collectives, "identity") == [[r, WORLD, r, WORLD, 0, 1] for r in range(WORLD)]
    assert each(collectives, "env") == [[str(r), str(WORLD)] for r in range(WORLD)]
    for module in each(collectives, "module"):
        assert module == ["ddp_train.horovod_api.torch_api", "0.28.1", False, True, True]


def test_the_real_horovod_is_never_imported(collectives):
    assert each(collectives, "real_horovod") == [[]] * WORLD


def test_allreduce_follows_horovods_arithmetic(collectives):
    x = np.array([1, 2, 5, 7], dtype=np.float32)
    per_rank = [x * (r + 1) + (1 if r == 0 else 0) for r in range(WORLD)]
    total = np.sum(per_rank, axis=0, dtype=np.float32)
    for got in collectives["ranks"]:
        # Average: the sum, then a multiplication by float32(1/3) (not a division by 3), as Horovod.
        assert got["average"] == (total * np.float32(1 / WORLD)).tolist()
        assert got["average"] != (total / np.float32(WORLD)).tolist()
        assert got["sum"] == total.tolist()
        assert got["min"] == np.min(per_rank, axis=0).tolist() and got["max"] == np.max(per_rank, axis=0).tolist()
        assert got["product"] == np.prod(per_rank, axis=0).tolist()
        assert got["scaled"] == ((total * np.float32(0.25)) * np.float32(0.1)).tolist()  # pre, sum, post
        sums = [sum(v + r for r in range(WORLD)) for v in (5, -5, 7, 100)]
        assert got["int_average"] == [int(s * (1 / WORLD)) for s in sums]  # truncated toward zero
        assert got["half_sum"] == [1.5] * 3
        assert got["in_place"] == [True, [3.0] * 5]
        assert got["async"][1] == [3.0, 3.0]
        assert got["grouped"] == [[3.0] * 2, [6.0] * 3]


def test_gathers_broadcasts_alltoall_reducescatter(collectives):
    for r, got in enumerate(collectives["ranks"]):
        assert got["allgather"] == [[float(i)] * 2 for i in range(WORLD) for _ in range(i + 1)]
        assert got["grouped_allgather"] == [[0, 1, 2], [0, 0, 1, 1, 2, 2]]
        assert got["broadcast"] == [10, 1] and got["broadcast_int16"] == [2, 2]
        received, splits = got["alltoall"]
        assert splits == [r + 1] * WORLD
        assert received == [[float(10 * s + r)] * 2 for s in range(WORLD) for _ in range(r + 1)]
        assert got["alltoall_equal"] == [100 * s + 2 * r + k for s in range(WORLD) for k in range(2)]
        rows = [3, 2, 2][r]  # 7 rows over 3 ranks: the first rank takes the extra one
        start = [0, 3, 5][r]
        assert got["reducescatter"] == [6.0 * v for v in range(start, start + rows)]
        assert got["reducescatter_average"] == [[2.0, 2.0]]
        assert got["grouped_reducescatter"] == [[3.0], [[3.0, 3.0]]]


def test_collectives_backpropagate(collectives):
    for r, got in enumerate(collectives["ranks"]):
        assert got["allreduce_grad"] == [3.0] * 3
        assert got["allgather_grad"] == [[2.0, 2.0]] * (r + 1)
        assert got["broadcast_grad"] == ([1.0, 1.0] if r == 0 else [0.0, 0.0])
        assert got["grouped_allreduce_grad"] == [[3.0] * 2, [3.0] * 3]


def test_objects_process_sets_and_join(collectives):
    for r, got in enumerate(collectives["ranks"]):
        assert got["broadcast_object"] == {"from": 2, "list": [1, 2]}
        assert got["allgather_object"] == [{"rank": i} for i in range(WORLD)]
        if r in (0, 2):
            assert got["set"] == [r // 2, 2, [2.0]]
        assert got["set_removed"] is True
        assert got["join"] in (0, 1)  # the last rank to join, the same on every rank
        if r != 2:
            # the joined rank added zeros; Average still divides by the world size
            assert got["joined_average"] == (np.array([3.0, 6.0], dtype=np.float32) * 3 * np.float32(1 / 3)).tolist()
    assert len(set(each(collectives, "join"))) == 1


def test_mismatched_shapes_fail_on_every_rank_with_horovods_message(collectives):
    for r, got in enumerate(collectives["ranks"]):
        kind, message, seconds = got["shape_error"]
        assert kind == "HorovodInternalError" and message.startswith("Mismatched ALLREDUCE tensor shapes: One rank "
                                                                     "sent a tensor of shape [3]")
        assert seconds < 10, f"rank {r} waited {seconds} s for its error"
        assert got["type_error"][1].startswith("Mismatched data types:")
        assert got["root_error"][1].startswith("Mismatched BROADCAST root ranks:")
        assert got["gather_error"][1].startswith("Mismatched ALLGATHER tensor shapes:")
        assert got["after_errors"] == [3.0]  # the job goes on after errors


def test_local_errors_are_horovods(collectives):
    for got in collectives["ranks"][:-1]:  # the last rank's first ask may complete before its second
        assert got["duplicate_error"][0] == "ValueError" and "same name" in got["duplicate_error"][1]
    for got in collectives["ranks"]:
        assert got["splits_error"][0] == "ValueError" and "not an even multiple" in got["splits_error"][1]
        assert got["adasum_error"][0] == "NotImplementedError" and "op=hvd.Average" in got["adasum_error"][1]
        assert got["reducescatter_op_error"][0] == "HorovodInternalError"
        assert got["type_refused"] == ["ValueError", "Tensor type torch.BoolTensor is not supported.",
                                       got["type_refused"][2]]
        kind, message, _ = got["import_refused"]
        assert kind == "ModuleNotFoundError" and "horovod.tensorflow" in message and "horovod.torch" in message
        assert "\n" not in message


def test_distributed_optimizer(collectives):
    for got in collectives["ranks"]:
        assert got["optimizer_average"] < 1e-6
        assert len(got["step_warning"]) == 1 and "skip_synchronize" in got["step_warning"][0]
        assert max(got["weights_agree"]) == 0.0
        assert "zero_grad() was called after loss.backward()" in got["zero_grad_refused"][1]
        assert max(got["accumulated_ok"]) == 0.0
        assert got["predivide"] < 1e-6
        assert got["duplicate_names"][0] == "ValueError" and "unique" in got["duplicate_names"][1]
        assert got["missing_names"][0] == "ValueError" and "not named" in got["missing_names"][1]
        assert got["sparse_weights_agree"] == 0.0
        # by bucket: the same averages, zeros where a rank computed no gradient, the same refusals
        assert max(got["bucket_average"]) < 1e-6
        at_backward_end, at_synchronize = got["bucket_read"]
        assert at_backward_end[0] < 100 and at_synchronize[1] > 900
        assert "zero_grad() was called after loss.backward()" in got["bucket_zero_grad_refused"][1]
        assert got["bucket_twice"][0] == "AssertionError"
        assert "more than backward_passes_per_step times" in got["bucket_twice"][1]


def test_broadcast_optimizer_state_takes_horovods_zero_step(collectives):
    for got in collectives["ranks"]:
        assert got["zero_step_moved"] is True  # AdamW's decay moved the weights, as in Horovod
        assert got["adam_state"] == [0.01, 1.0]  # rank 0's learning rate, one step taken


def test_sync_batch_norm_on_cpu_is_batch_norm_of_the_whole_batch(collectives):
    for got in collectives["ranks"]:
        assert max(got["sync_bn"]) < 1e-5


def test_timeline_and_reinit(collectives):
    events = json.loads((collectives["out"] / "timeline.json").read_text())
    names = {e.get("name") for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= names
    assert any(e.get("args", {}).get("name") == "allreduce.timed" for e in events)
    # the bucketed optimizer: its first step one request per gradient, then the layout agreed, then one bucket
    timed = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"allreduce.0.weight", "allreduce.2.bias", "allreduce.horovod_api.buckets"} <= timed
    assert "allreduce.bucket.2.bias..0.weight" in timed
    # the steady steps took the one-round path: rank 0's engine marks each cycle the guess answered, naming the
    # bucket it reduced (the first steps of the last optimizer agree on it first, and any cycle may miss on a
    # machine busy enough to split a step's requests over two cycles)
    guessed = [e for e in events if e.get("name") == "CYCLE_GUESSED"]
    assert len(guessed) >= STEADY_STEPS // 2
    assert all(e["args"]["collectives"] == "allreduce.bucket.2.bias..0.weight" for e in guessed)
    assert any(e.get("name") == "CYCLE_AGREED" for e in events)
    for got in collectives["ranks"]:
        initialized, error = got["after_shutdown"]
        assert initialized is False and error[0] == "ValueError" and "hvd.init()" in error[1]
        assert got["reinit"] == [3.0]


def test_bad_input_is_one_line_on_every_rank(tmp_path):
    started = time.monotonic()
    result = run_cmd(api_command("torchrun", 2, [str(tmp_path / "missing.py")]), timeout=60)
    assert result.returncode != 0 and time.monotonic() - started < 45
    lines = [line for line in result.output.splitlines() if "horovod_api: error:" in line]
    assert sorted(lines) == [f"[rank {r}] horovod_api: error: {tmp_path / 'missing.py'}: no such file; give the "
                             "script's path from this folder" for r in range(2)]


@pytest.fixture(scope="module")
def stalled(tmp_path_factory) -> Result:
    """Under mpirun (MASTER_ADDR/MASTER_PORT exported, as ddp_train's rendezvous needs without torchrun): a collective,
    then rank 1 stops taking part while rank 0 waits in its next one."""
    folder = tmp_path_factory.mktemp("horovod_api_stall")
    script = folder / "stall.py"
    script.write_text(STALL)
    mpirun = api_command("mpirun", 2, [str(script)])
    at = mpirun.index("-np")
    exported = ["MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_port()}", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=4"]
    return run_cmd(mpirun[:at] + [word for value in exported for word in ("-x", value)] + mpirun[at:], timeout=120,
                   cwd=folder)


def free_port() -> int:
    """A port nothing listens on now (the rendezvous binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mpirun_placement_runs_collectives(stalled):
    assert "rank 0 of 2 sum [2.0, 2.0]" in stalled.output and "rank 1 of 2 sum [2.0, 2.0]" in stalled.output


def test_a_rank_that_stops_taking_part_ends_the_job_with_horovods_stall_error(stalled):
    assert stalled.returncode != 0
    assert "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks" in \
        stalled.output
    assert re.search(r"Missing ranks:\s*\n1!: \[allreduce\.never\]", stalled.output)
    assert "HorovodInternalError" in stalled.output
    assert stalled.seconds < 60  # 4 s of stall, then mpirun ends the stopped rank
