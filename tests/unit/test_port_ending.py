"""The end of the port's main path (ddp_train.port.ending): where the port starts the process group, else where it
wraps a model in DDP, it registers destroy_process_group_at_exit(), once, for a main() function, for code at module
level or in the `if __name__ == "__main__":` block, and beside the script's own shutdown; nothing for a file that does
neither; porting a port changes nothing (tests/test_port_exit.py runs the helper at work)."""

from __future__ import annotations

import textwrap

from ddp_train.port import port
from ddp_train.port.ending import HELPER, RULE

CALL = f"{HELPER}()"


def ported(source: str) -> tuple[str, list]:
    result = port(textwrap.dedent(source), "train.py", "train_ddp.py")
    return result.code, result.report.changes


def line_after(code: str, first: str) -> str:
    """The line after the first line of `code` that holds `first`."""
    lines = code.splitlines()
    return next(lines[i + 1] for i, line in enumerate(lines) if first in line)


MAIN = """\
    import argparse
    import torch
    import horovod.torch as hvd


    def main(args):
        hvd.init()
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        if args.fail:
            raise RuntimeError('failed after training')


    if __name__ == '__main__':
        main(argparse.Namespace(fail=False))
    """


def test_main_registers_the_end_after_the_process_group_starts_and_reports_it():
    code, changes = ported(MAIN)
    assert line_after(code, "dist.init_process_group(") == f"    {CALL}"
    assert code.count(CALL + "\n") == 1 and code.count(f"def {HELPER}():") == 1
    (change,) = [c for c in changes if c.rule == RULE]
    assert change.line == 7 and not change.changes_training and change.text.startswith(CALL)
    # the helper comes after the imports with the others, and the script's own lines stay as they were
    assert code.index(f"def {HELPER}") < code.index("def main(args):")
    assert code.endswith("if __name__ == '__main__':\n    main(argparse.Namespace(fail=False))\n")


def test_code_at_module_level_and_in_the_main_block_with_the_model_a_global():
    module, _ = ported("""\
        import torch
        import horovod.torch as hvd

        hvd.init()
        model = torch.nn.Linear(4, 2)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
        """)
    assert line_after(module, "dist.init_process_group(") == CALL and module.count(CALL + "\n") == 1
    block, _ = ported("""\
        import torch
        import horovod.torch as hvd

        if __name__ == '__main__':
            hvd.init()
            model = torch.nn.Linear(4, 2)
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                 named_parameters=model.named_parameters())
        """)
    assert line_after(block, "dist.init_process_group(") == f"    {CALL}" and block.count(CALL + "\n") == 1


def test_a_script_that_shuts_down_itself_is_not_destroyed_twice():
    code, _ = ported(MAIN.replace("        if args.fail:", "        hvd.shutdown()\n        if args.fail:"))
    assert "    dist.destroy_process_group()\n" in code and code.count(CALL + "\n") == 1
    assert "        if dist.is_initialized():\n            dist.destroy_process_group()\n" in code


def test_the_wrap_when_the_process_group_starts_elsewhere_and_nothing_where_neither():
    code, changes = ported("""\
        import torch
        import horovod.torch as hvd


        def build(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            return model, optimizer
        """)
    assert line_after(code, "torch.optim.SGD(") == f"    {CALL}"
    assert line_after(code, f"    {CALL}") == "    model = DDP(model, forward_sync_buffers=False)"
    assert [c.line for c in changes if c.rule == RULE] == [7]
    code, changes = ported("""\
        import torch
        import horovod.torch as hvd


        def average(value):
            return hvd.allreduce(torch.tensor(value)).item()
        """)
    assert HELPER not in code and RULE not in [c.rule for c in changes]


def test_a_name_the_script_holds_is_left_to_it_and_porting_a_port_changes_nothing():
    own = MAIN.replace("    def main(args):", f"    def {HELPER}():\n        pass\n\n\n    def main(args):")
    code, _ = ported(own.replace("        if args.fail:", f"        {CALL}\n        if args.fail:"))
    assert line_after(code, "dist.init_process_group(") == f"    {HELPER}_ddp()"
    assert f"def {HELPER}_ddp():" in code and f"\n    {CALL}\n" in code
    # something left unported keeps Horovod's import: the port of the port goes through the rules again
    first, _ = ported(MAIN.replace("        if args.fail:",
                                   "        hvd.alltoall(torch.ones(2))\n        if args.fail:"))
    assert "# port: not ported" in first and first.count(CALL + "\n") == 1
    again = port(first, "train_ddp.py", "train_ddp_ddp.py")
    assert again.code == first and RULE not in [c.rule for c in again.report.changes]
