"""How a ported script's processes end: the port of a Horovod script run many times under torchrun, its exit codes
and its aborts counted.

    python -m benchmarks.port_exit --runs 50 --np 2 --endings port,no-end --out benchmarks/results

Python finalizing right after a script's last collective can abort a rank whose training is done ("terminate called
without an active exception", SIGABRT, exit code -6: it ends a Gloo thread still letting go of that collective's
tensors), and torchrun then reports the job failed. The port registers, where the process group starts,
destroy_process_group_at_exit(), which lets the DDP models go and destroys the process group before Python finalizes
(ddp_train/port/ending.py). This benchmark writes three Horovod scripts in the style of Horovod's examples into a
temporary folder, ports each with `python -m ddp_train.port`, and runs each port --runs times at --np ranks, as a
user starts it:

    torchrun --rdzv-backend loopback --nproc-per-node=NP PORT

- main:   main() builds the model and trains it (Horovod's pytorch_mnist.py); it returns: exit code 0
- module: the code at module level, the model a global (Horovod's pytorch_synthetic_benchmark.py): exit code 0
- fails:  main() raises after training, on every rank: exit code 1, with the script's traceback

each as the port writes it (`port`) and, with --endings port,no-end, as the port was before it wrote its end (`no-end`:
the same port, the helper's call replaced by `pass`). A run aborted when a rank was killed by SIGABRT (torchrun's
"exitcode: -6") or printed "terminate called". The runs of the cases alternate, every other round backwards, so that
the machine's drift falls on all alike. Writes DIR/port_exit.json and prints a table; the target is no abort.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Sequence

from common import launch
from common.compare.arguments import csv_list

from .jobs import add_out, add_timeout, job_env, parser, refuse, run_cli, schedule
from .machine import Record

HELPER_CALL = "destroy_process_group_at_exit()"
ABORTED = re.compile(r"terminate called|exitcode\s*:\s*-6\b|SIGABRT")
ENDINGS = ("port", "no-end")
DEFINITIONS = {"aborts": "runs in which a rank was killed by SIGABRT or printed \"terminate called\"",
               "expected_exit": "the exit code the script means to end with (0; 1 for the script that fails)",
               "as_expected": "runs that exited with expected_exit, without an abort (and, for `fails`, printed the "
                              "script's own error)",
               "exits": "torchrun's exit codes, with the number of runs that ended with each",
               "target_aborts": "aborts allowed in the runs of a port as it is written"}

COMMON = '''import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd
'''

#: main(): the model is a local of the function that trains it (Horovod's examples/pytorch/pytorch_mnist.py)
MAIN = COMMON + '''
parser = argparse.ArgumentParser(description='a small Horovod script (benchmarks/port_exit.py)')
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--fail', action='store_true', help='raise after training')


def main(args):
    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    inputs = torch.randn(512, 12)
    labels = (inputs[:, :3].sum(1) > 0).long()
    dataset = torch.utils.data.TensorDataset(inputs, labels)
    # Horovod: use DistributedSampler to partition the training data.
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)

    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
    # Horovod: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        # Horovod: average metric values across workers.
        loss = hvd.allreduce(loss.detach(), name='avg_loss')
        if hvd.rank() == 0:
            print('epoch {} loss {:.6f}'.format(epoch, loss.item()), flush=True)
    if args.fail:
        raise RuntimeError('failed after training')


if __name__ == '__main__':
    main(parser.parse_args())
'''

#: code at module level, the model a global (Horovod's examples/pytorch/pytorch_synthetic_benchmark.py)
MODULE = COMMON + '''
parser = argparse.ArgumentParser(description='a small Horovod benchmark (benchmarks/port_exit.py)')
parser.add_argument('--num-iters', type=int, default=30)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(16, 12)
target = (data[:, :3].sum(1) > 0).long()


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(args.num_iters):
    loss = benchmark_step()
loss = hvd.allreduce(loss.detach(), name='loss')
if hvd.rank() == 0:
    print('loss {:.6f}'.format(loss.item()), flush=True)
'''

#: variant -> (Horovod script, its arguments, the exit code it means to end with)
VARIANTS = {"main": (MAIN, [], 0), "module": (MODULE, [], 0), "fails": (MAIN, ["--fail"], 1)}
FAILED_WITH = "RuntimeError: failed after training"


def ported(script: Path, ending: str, log: Path) -> Path:
    """The port of `script` (`no-end`: without the call that ends it); RuntimeError when the port fails or wrote no
    end."""
    out = script.with_name(f"{script.stem.replace('horovod', 'ddp')}.py")
    done = launch.run([sys.executable, "-m", "ddp_train.port", str(script), "-o", str(out)], 120, env=job_env(),
                      log=log)
    if done.returncode != 0 or HELPER_CALL not in out.read_text():
        raise RuntimeError(f"python -m ddp_train.port {script.name} exited {done.returncode} or wrote no "
                           f"{HELPER_CALL}: {done.output.strip()[-300:]}")
    if ending == "no-end":
        bare = out.with_name(f"{out.stem}_no_end.py")
        bare.write_text(re.sub(rf"^(\s*){re.escape(HELPER_CALL)}$", r"\1pass", out.read_text(), flags=re.M))
        return bare
    return out


def command(np: int, program: Path, args: Sequence[str]) -> list[str]:
    """torchrun's command for `program` on `np` ranks, as a user starts a script (the launcher's `-m MODULE`
    replaced by the script)."""
    cmd = launch.get("torchrun").command(np, list(args), python=sys.executable)
    at = cmd.index("-m")
    return [*cmd[:at], str(program), *cmd[at + 2:]]


def ended(result: launch.Result, expected: int, fails: bool) -> str:
    """How a run ended: "aborted", "as expected" or "otherwise"."""
    if ABORTED.search(result.output):
        return "aborted"
    if result.returncode == expected and not result.timed_out and (not fails or FAILED_WITH in result.output):
        return "as expected"
    return "otherwise"


def main(argv: Sequence[str] | None = None) -> int:
    """Run every case --runs times; 0 when every run of the port as written ended as expected, else 1; 2 on bad
    input."""
    p = parser("port_exit", __doc__)
    p.add_argument("--runs", type=int, default=50, help="runs of each case")
    p.add_argument("--np", type=int, default=2, help="ranks of every run")
    p.add_argument("--variants", type=csv_list(str, tuple(VARIANTS)), default=",".join(VARIANTS),
                   help=f"which of {', '.join(VARIANTS)}")
    p.add_argument("--endings", type=csv_list(str, ENDINGS), default="port",
                   help="port (as the port writes it), no-end (the port without its end, for comparison), or both")
    add_timeout(p, 300.0)
    add_out(p, "where port_exit.json goes")
    args = p.parse_args(argv)
    if args.runs < 1 or args.np < 1:
        return refuse("port_exit", "--runs and --np must be at least 1")
    record = Record("port_exit", argv)
    cases = [(variant, ending) for variant in args.variants for ending in args.endings]
    ends: dict[tuple[str, str], list[str]] = {case: [] for case in cases}
    exits: dict[tuple[str, str], Counter] = {case: Counter() for case in cases}
    seconds: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    first_abort: dict[tuple[str, str], str] = {}
    commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="port_exit-") as work:
        programs = {}
        for variant, ending in cases:
            script = Path(work) / f"horovod_{variant}.py"
            script.write_text(VARIANTS[variant][0])
            try:
                programs[variant, ending] = ported(script, ending, Path(work) / f"port-{variant}.log")
            except RuntimeError as exc:
                return refuse("port_exit", str(exc))
        for run, (variant, ending) in schedule(cases, args.runs):
            _, script_args, expected = VARIANTS[variant]
            cmd = command(args.np, programs[variant, ending], script_args)
            options = cmd[1:cmd.index(str(programs[variant, ending]))]
            commands[f"{variant}/{ending}"] = " ".join(["torchrun", *options, programs[variant, ending].name,
                                                        *script_args])
            result = launch.run(cmd, args.timeout, env=job_env(), cwd=Path(work))
            how = ended(result, expected, variant == "fails")
            ends[variant, ending].append(how)
            exits[variant, ending]["timed out" if result.timed_out else str(result.returncode)] += 1
            seconds[variant, ending].append(result.seconds)
            if how == "aborted" and (variant, ending) not in first_abort:
                first_abort[variant, ending] = result.output[-1500:]
            print(f"port_exit: {variant}/{ending} run {run + 1}: exit {result.returncode}, {how} "
                  f"({result.seconds:.1f} s)", flush=True)
    rows = [{"variant": variant, "ending": ending, "runs": len(ends[variant, ending]),
             "expected_exit": VARIANTS[variant][2], "exits": dict(exits[variant, ending]),
             "aborts": ends[variant, ending].count("aborted"),
             "as_expected": ends[variant, ending].count("as expected"),
             "median_s": statistics.median(seconds[variant, ending]),
             "first_abort_output": first_abort.get((variant, ending))} for variant, ending in cases]
    code = record.publish(args.out, settings={"runs": args.runs, "np": args.np, "variants": list(args.variants),
                                              "endings": list(args.endings)},
                          definitions=DEFINITIONS, target_aborts=0, commands=commands, rows=rows, failures=[])
    missed = [r for r in rows if r["ending"] == "port" and r["as_expected"] != r["runs"]]
    return code or (1 if missed else 0)


if __name__ == "__main__":
    sys.exit(run_cli(main, "port_exit"))
