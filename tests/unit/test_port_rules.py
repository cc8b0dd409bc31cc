"""The port's rewrite rules on small Horovod sources: each idiom's DDP idiom, what the report says of it, what is
left unported and how, idempotence, and the script's own lines kept byte for byte (no process launched)."""

from __future__ import annotations

import textwrap

import pytest

from ddp_train.port import Options, PortError, helpers, port

HEADER = "import torch\nimport horovod.torch as hvd\n"


def ported(body: str, header: str = HEADER, **options):
    """The port of HEADER + `body` (dedented): (code, report)."""
    result = port(header + textwrap.dedent(body), "train.py", "train_ddp.py", Options(**options))
    return result.code, result.report


def rules(report) -> list:
    return [c.rule for c in report.changes]


def test_a_script_without_horovod_is_left_byte_for_byte():
    source = "import torch.distributed as dist\n\n\n# keep me\nx = dist.get_rank()  # and me\n"
    result = port(source, "train_ddp.py", "out.py")
    assert result.code == source and not result.report.changes and result.report.exit_code == 0


def test_ranks_sizes_init_and_the_device_come_from_torch_distributed_and_torchrun():
    code, report = ported("""
        hvd.init()
        torch.cuda.set_device(hvd.local_rank())
        print(hvd.rank(), hvd.size(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
        if hvd.rank() == 0:  # rank-0 guard
            print("hello")
    """)
    assert code == textwrap.dedent("""\
        import os
        import torch
        import torch.distributed as dist


        {ending}


        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        destroy_process_group_at_exit()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        print(dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_WORLD_SIZE"]), {cross})
        if dist.get_rank() == 0:  # rank-0 guard
            print("hello")
    """).format(cross='int(os.environ["GROUP_RANK"]), int(os.environ["GROUP_WORLD_SIZE"])',
                ending=helpers.source("destroy_process_group_at_exit", lambda key: key, '"'))
    assert report.exit_code == 0 and not report.changes_training
    assert rules(report)[0] == "import" and "hvd.init" in rules(report) and "hvd.local_rank" in rules(report)


def test_the_script_quotes_and_formatting_are_kept():
    code, _ = ported("""
        x = {'a':1}    # odd   spacing stays
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset,   num_replicas=hvd.size(),
            rank=hvd.rank())
    """)
    assert "x = {'a':1}    # odd   spacing stays\n" in code
    assert "    dataset,   num_replicas=dist.get_world_size(),\n    rank=dist.get_rank())\n" in code


MNIST_STYLE = """
import torch
import torch.optim as optim

import horovod.torch as hvd


def main():
    hvd.init()
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.5)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
    train(model, optimizer)
"""


def test_distributed_optimizer_becomes_the_model_wrapped_in_ddp_and_the_broadcasts_go():
    result = port(MNIST_STYLE, "train.py", "out.py")
    assert result.code.endswith(textwrap.dedent("""\
        def main():
            dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
            destroy_process_group_at_exit()
            model = Net()
            optimizer = optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size(), momentum=0.5)

            # Horovod: wrap optimizer with DistributedOptimizer.
            model = DDP(model, forward_sync_buffers=False)
            keep_model_keys(model)
            train(model, optimizer)
    """))
    assert "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n" \
        in result.code and "horovod" not in result.code
    report = result.report
    assert report.exit_code == 0 and not report.changes_training and report.zero_step == "dropped"
    zero = next(c for c in report.changes if c.rule == "hvd.broadcast_optimizer_state")
    assert not zero.changes_training and zero.effect is None and "SGD without weight decay" in zero.text


def test_the_model_comes_from_the_optimizer_when_named_parameters_is_not_given():
    code, _ = ported("""
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dist_opt = hvd.DistributedOptimizer(opt)
    """)
    assert code.endswith("opt = torch.optim.SGD(net.parameters(), lr=0.1)\ndist_opt = opt\n"
                         "destroy_process_group_at_exit()\nnet = DDP(net, forward_sync_buffers=False)\n"
                         "keep_model_keys(net)\n")


def test_an_optimizer_of_unknown_parameters_is_left_with_a_comment_and_listed():
    code, report = ported("optimizer = hvd.DistributedOptimizer(make_optimizer())\n")
    assert report.exit_code == 1 and report.unported[0].line == 3
    assert "# port: not ported: hvd.DistributedOptimizer" in code and "import horovod.torch as hvd" in code


def test_the_wrap_waits_for_a_later_broadcast_of_the_weights_rank_0_loaded():
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        if resume and hvd.rank() == 0:
            model.load_state_dict(torch.load(path)['model'])
            optimizer.load_state_dict(torch.load(path)['optimizer'])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        torch.save(model.state_dict(), 'last.pt')
    """)
    assert code.endswith(textwrap.dedent("""\
        if resume and dist.get_rank() == 0:
            model.load_state_dict(torch.load(path)['model'])
            optimizer.load_state_dict(torch.load(path)['optimizer'])
        destroy_process_group_at_exit()
        model = DDP(model, forward_sync_buffers=False)
        keep_model_keys(model)
        optimizer.load_state_dict(broadcasted_object(optimizer.state_dict()))
        torch.save(model.module.state_dict(), 'last.pt')
    """))
    assert "def broadcasted_object(obj, src=0):" in code
    assert "the model after the DDP wrap" in rules(report)


def test_the_model_in_functions_after_the_wrap_is_its_module_unless_it_is_their_own():
    code, _ = ported('''
        def save():
            torch.save({'model': model.state_dict()}, 'ckpt.pt')
            model.train()


        def digest(model):
            return model.state_dict()


        model = Net()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        print(model.fc.weight)
    ''')
    assert "torch.save({'model': model.module.state_dict()}, 'ckpt.pt')\n    model.train()\n" in code
    assert "def digest(model):\n    return model.state_dict()\n" in code
    assert "print(model.module.fc.weight)" in code


def test_fp16_compression_becomes_ddps_hook_and_is_reported_as_rounding():
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=hvd.Compression.fp16)
    """)
    assert code.endswith("model = DDP(model, forward_sync_buffers=False)\nkeep_model_keys(model)\n"
                         "model.register_comm_hook(None, default_hooks.fp16_compress_hook)\n")
    assert "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n" in code
    change = next(c for c in report.changes if c.rule == "compression")
    assert not change.changes_training and "float16" in change.effect and change.cause == "gradients"


def test_a_compression_variable_registers_the_hook_it_holds():
    code, _ = ported("""
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    """)
    assert "compression = default_hooks.fp16_compress_hook if args.fp16_allreduce else None\n" in code
    assert code.endswith("if compression is not None:\n    model.register_comm_hook(None, compression)\n")


def test_op_sum_registers_a_summing_hook_and_a_conditional_adasum_is_refused_at_run_time_at_its_line():
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Sum)
    """)
    assert "model.register_comm_hook(None, sum_gradients)" in code and "def sum_gradients(state, bucket):" in code
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             op=hvd.Adasum if args.use_adasum else hvd.Average,
                                             gradient_predivide_factor=args.gradient_predivide_factor)
    """)
    assert code.endswith('if args.use_adasum:\n    raise SystemExit("DDP has no Adasum (op=hvd.Adasum): run without '
                         'it; DDP averages the gradients")\ndestroy_process_group_at_exit()\n'
                         'model = DDP(model, forward_sync_buffers=False)\n'
                         'keep_model_keys(model)\n')
    # ported, not left: the port averages, as the script does without the flag, and stops with it; said at op's line
    assert report.exit_code == 0 and not report.unported and "horovod" not in code
    (wrap,) = [c for c in report.changes if c.rule == "hvd.DistributedOptimizer"]
    (op,) = [c for c in report.changes if c.rule == "op"]
    assert op.line == wrap.line + 1 and "Adasum" in op.text and "args.use_adasum" in op.text
    assert not op.changes_training
    assert "gradient_predivide_factor" in rules(report)


def test_backward_passes_per_step_puts_the_other_passes_under_no_sync_when_the_step_is_conditional():
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=2)
        for i, (x, y) in enumerate(loader):
            x = x.to(device)
            # forward
            loss = loss_fn(model(x), y) / 2
            loss.backward()  # accumulate
            if (i + 1) % 2 == 0:
                optimizer.step()
                optimizer.zero_grad()
    """)
    # DDP decides in the forward pass whether the backward pass reduces: no_sync holds both
    assert textwrap.indent(textwrap.dedent("""\
        x = x.to(device)
        # forward
        with contextlib.nullcontext() if (i + 1) % 2 == 0 else model.no_sync():
            loss = loss_fn(model(x), y) / 2
            loss.backward()  # accumulate
        if (i + 1) % 2 == 0:
    """), "    ") in code and "import contextlib\n" in code
    assert not report.changes_training and "backward_passes_per_step" in rules(report)


def test_backward_passes_per_step_in_an_inner_range_loop_syncs_on_its_last_pass():
    code, _ = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=args.batches_per_allreduce)
        for data, target in loader:
            optimizer.zero_grad()
            for i in range(0, len(data), args.batch_size):
                loss = loss_fn(model(data[i:i + args.batch_size]), target[i:i + args.batch_size])
                loss.backward()
            optimizer.step()
    """)
    assert "        with contextlib.nullcontext() if i + args.batch_size >= len(data) else model.no_sync():\n" \
           "            loss = loss_fn(model(data[i:i + args.batch_size]), target[i:i + args.batch_size])\n" \
           "            loss.backward()\n    optimizer.step()\n" in code


def test_backward_passes_per_step_without_a_loop_it_can_read_is_reported_as_rounding():
    code, report = ported("""
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=4)
        for batch in loader:
            for micro in split(batch):
                loss(micro).backward()
            optimizer.step()
    """)
    assert "no_sync" not in code
    change = next(c for c in report.changes if c.rule == "backward_passes_per_step")
    assert not change.changes_training and "not bitwise" in change.effect and "no_sync" in change.text


@pytest.mark.parametrize("constructor, wrapped_first, changes, words", [
    ("optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", True, False, []),
    ("optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)", False, True,
     ["the zero optimizer step under weight decay 5e-4 is not reproduced", "weights differ from the first step"]),
    ("optim.Adam(model.parameters(), lr=1e-3)", True, True, ["Adam's step count", "0.744"]),
    # hvd.DistributedOptimizer after the call is a new optimizer, without the state the zero step made
    ("optim.Adam(model.parameters(), lr=1e-3)", False, False, []),
    ("optim.AdamW(model.parameters(), lr=1e-3)", False, True, ["weight decay 0.01 (AdamW's default)"]),
    ("make_optimizer(model)", False, True, ["not one of torch's optimizers"]),
])
def test_the_zero_step_of_broadcast_optimizer_state_is_dropped_and_its_effect_named(constructor, wrapped_first,
                                                                                    changes, words):
    wrap = "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())"
    broadcast = "hvd.broadcast_optimizer_state(optimizer, root_rank=0)"
    code, report = ported(f"optimizer = {constructor}\n" + (f"{wrap}\n{broadcast}\n" if wrapped_first
                                                             else f"{broadcast}\n{wrap}\n"))
    assert "broadcast_optimizer_state" not in code and report.zero_step == "dropped"
    change = next(c for c in report.changes if c.rule == "hvd.broadcast_optimizer_state")
    assert change.changes_training is changes
    assert change.cause == ("optimizer steps before training" if changes else None)
    assert all(w in (change.effect or "") for w in words), change.effect


def test_the_zero_step_kept_is_made_explicit():
    code, report = ported("""
        optimizer = optim.Adam(model.parameters(), lr=1e-3)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """, zero_step="keep")
    assert "optimizer = optim.Adam(model.parameters(), lr=1e-3)\nstep_on_zero_gradients(optimizer)\n" in code
    assert "def step_on_zero_gradients(optimizer, keep_state=True):" in code
    assert "param.grad = torch.zeros_like(param)" in code
    assert report.zero_step == "kept" and not report.changes_training
    code, _ = ported("""
        optimizer = optim.Adam(model.parameters(), lr=1e-3)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    """, zero_step="keep")
    assert "step_on_zero_gradients(optimizer, keep_state=False)\n" in code


def test_metric_allreduce_averages_as_sum_then_divide_and_keeps_op_sum():
    code, report = ported("""
        avg = hvd.allreduce(torch.tensor(val), name='avg_loss')
        total = hvd.allreduce(count, op=hvd.Sum)
        old = hvd.allreduce(count, average=False)
        worst = hvd.allreduce(loss, op=hvd.Max)
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        both = hvd.grouped_allreduce([a, b])
    """)
    assert textwrap.dedent("""\
        avg = all_averaged(torch.tensor(val))
        total = all_reduced(count)
        old = all_reduced(count)
        worst = all_reduced(loss, dist.ReduceOp.MAX)
        self.sum += all_averaged(val.detach().cpu())
        both = [all_averaged(tensor) for tensor in [a, b]]
    """) in code
    assert "    return all_reduced(tensor) / dist.get_world_size()\n" in code
    assert "name dropped" in report.changes[1].text


def test_in_place_collectives_as_statements_and_as_values():
    code, _ = ported("""
        hvd.allreduce_(grad, op=hvd.Sum)
        hvd.allreduce_(grad)
        hvd.broadcast_(weights, root_rank=1)
        y = hvd.broadcast_(weights, 0)
    """)
    assert textwrap.dedent("""\
        dist.all_reduce(grad)
        grad.copy_(all_averaged(grad))
        dist.broadcast(weights, src=1)
        y = weights.copy_(broadcasted(weights, 0))
    """) in code


def test_allgather_broadcast_and_objects():
    code, _ = ported("""
        everything = hvd.allgather(torch.ones(hvd.rank() + 1, 2), name='rows')
        per_rank = hvd.allgather_object((hvd.rank(), hvd.local_rank()))
        first = hvd.broadcast(t, root_rank=0)
        settings = hvd.broadcast_object(settings, root_rank=0)
        other = hvd.broadcast_object(settings, 2)
    """)
    assert textwrap.dedent("""\
        everything = all_gathered(torch.ones(dist.get_rank() + 1, 2))
        per_rank = all_gathered_objects((dist.get_rank(), int(os.environ['LOCAL_RANK'])))
        first = broadcasted(t, 0)
        settings = broadcasted_object(settings)
        other = broadcasted_object(settings, 2)
    """) in code
    for helper in ("all_gathered", "all_gathered_objects", "broadcasted", "broadcasted_object"):
        assert f"\ndef {helper}(" in code


def test_join_barrier_shutdown_timeline_and_sync_batch_norm():
    code, report = ported("""
        hvd.start_timeline('t.json')
        layer = hvd.SyncBatchNorm(8)
        hvd.join()
        hvd.barrier()
        hvd.shutdown()
    """)
    assert code.endswith("layer = torch.nn.SyncBatchNorm(8)\ndist.barrier()\ndist.barrier()\n"
                         "dist.destroy_process_group()\n")
    assert "uneven inputs" in next(c for c in report.changes if c.rule == "hvd.join").text
    # torch's SyncBatchNorm runs on CUDA only: the port says it can train otherwise (on CPU it stops)
    sync = next(c for c in report.changes if c.rule == "hvd.SyncBatchNorm")
    assert sync.changes_training and "CUDA only" in sync.effect and "BatchNorm" in sync.effect
    # the compression constants train as Horovod's do
    _, compressed = ported("compression = hvd.Compression.fp16\n")
    assert not next(c for c in compressed.changes if c.rule == "hvd.Compression.fp16").changes_training


def test_horovod_run_and_the_optimizer_s_synchronize_are_horovod_only():
    code, report = ported('''
        import horovod
        scaler.scale(loss).backward()
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        if args.num_proc:
            horovod.run(main, np=args.num_proc)
    ''')
    assert "scaler.scale(loss).backward()\nscaler.step(optimizer)\n" in code
    assert "    raise SystemExit(\"horovod.run has no DDP counterpart: start this script with torchrun " \
           "--nproc-per-node N\")\n" in code
    assert "import horovod" not in code and report.exit_code == 0


def test_what_has_no_rule_is_left_in_place_with_one_comment_and_the_import_kept():
    source = HEADER + "def f(t):\n    out = hvd.alltoall(t)  # exchange\n    return out\n"
    first = port(source, "train.py", "out.py")
    assert first.report.exit_code == 1
    (left,) = first.report.unported
    assert (left.line, left.code) == (4, "out = hvd.alltoall(t)  # exchange")
    assert "dist.all_to_all_single" in left.reason
    assert "    # port: not ported: hvd.alltoall: use dist.all_to_all_single" in first.code
    assert "import horovod.torch as hvd" in first.code and all(len(line) <= 120 for line in first.code.splitlines())
    again = port(first.code, "out.py", "again.py")
    assert again.code == first.code and again.report.exit_code == 1


@pytest.mark.parametrize("source", [MNIST_STYLE, HEADER + "hvd.init()\nprint(hvd.allreduce(x, op=hvd.Sum))\n"])
def test_porting_a_port_changes_nothing(source):
    once = port(source, "a.py", "b.py").code
    twice = port(once, "b.py", "c.py")
    assert twice.code == once and not twice.report.changes


def test_a_local_named_like_horovod_is_the_scripts_own_and_stays():
    source = """
        class Helper:
            def rank(self):
                return 0


        def by_parameter(hvd):
            return hvd.rank()


        def by_assignment():
            hvd = Helper()
            return hvd.rank()


        def by_lambda():
            return (lambda hvd: hvd.rank())(Helper())


        def reads_horovod():
            return hvd.rank()


        hvd.init()
    """
    code, report = ported(source)
    kept = textwrap.dedent(source).split("def reads_horovod")[0]
    assert kept in code and "import horovod" not in code
    assert "def reads_horovod():\n    return dist.get_rank()" in code
    assert report.exit_code == 0 and [c.line for c in report.changes if c.rule == "hvd.rank"] == [23]


def test_a_name_the_script_already_binds_is_not_reused():
    code, _ = ported("dist = 3\nprint(hvd.rank(), dist)\n")
    assert "import torch.distributed as torch_dist\n" in code and "print(torch_dist.get_rank(), dist)" in code


@pytest.mark.parametrize("source, where", [
    ("import horovod.torch as hvd\ndef f(:\n    pass\n", "train.py:2:"),
    ("import horovod.torch as hvd\nx = (1,\n", "train.py:"),
])
def test_what_cannot_be_parsed_is_refused_in_one_line_naming_where(source, where):
    with pytest.raises(PortError) as refused:
        port(source, "train.py", "out.py")
    message = str(refused.value)
    assert message.startswith(where) and "\n" not in message and "fix the syntax" in message
