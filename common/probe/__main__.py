"""python -m common.probe --run-dir DIR [--perturb-ulp N --perturb-pattern P] SCRIPT [ARGS...]

Runs a user's training script unmodified, as `python SCRIPT ARGS` would (as __main__, from the folder it is
started in, with the script's folder first on sys.path, its own modules found first even where one is called
`common`: common.launch.userscript), with the probe's hooks in place (common.probe.hooks), under any launcher:

    torchrun --nproc-per-node 2 -m common.probe --run-dir runs/ddp train_ddp.py --epochs 1
    horovodrun -np 2 -H localhost:2 python -m common.probe --run-dir runs/hvd train_horovod.py --epochs 1

From a folder that holds its own `common.py` or `common/`, start it with PYTHONSAFEPATH=1 (as the comparison
does) or `python -P`, so that python finds the probe and not the folder's module.

Every rank records its steps; when the script ends (or, with --max-steps N, after its N-th step), rank 0 writes the
run directory (common.probe.assemble). A script that returns (or exits with code 0) ends the process without the
interpreter's teardown, so an abort there (a DDP model kept past destroy_process_group) cannot turn a complete run
into a failed one. What the probe cannot follow ends the run with one line and exit code 2; a script that fails
shows its own traceback and exit code.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from importlib.metadata import entry_points
from typing import Any, Dict, List, NoReturn, Optional

from ..errors import OneLineParser, print_error
from ..launch import userscript
from ..launch.placement import detect
from ..launch.startup import pause_collector, resume_collector

PROG = "probe"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"python -m common.{PROG}", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="the run directory rank 0 writes")
    p.add_argument("--perturb-ulp", type=int, default=0, metavar="N",
                   help="move the model's nonzero initial weights N units in the last place before its first step, "
                        "and, where the script's gradients are exchanged at a lower precision, each reduced "
                        "gradient one unit of that precision at every step (the noise floor's disturbance)")
    p.add_argument("--perturb-pattern", type=int, default=1, metavar="P", help="which way each tensor moves")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="end the script after its N-th training step, as if it ended there: every rank stops at the "
                        "same step and rank 0 writes the complete run directory (a run of N steps of a script whose "
                        "epochs are longer)")
    p.add_argument("--api", choices=sorted(apis()), default=None,
                   help="run the script on this project's implementation of a library's API (horovod: Horovod's torch "
                        "API on torch.distributed, as python -m ddp_train.horovod_api does)")
    p.add_argument("script", help="the training script, as you would give it to python")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="the script's own arguments; {run_dir} in them is replaced by the run directory")
    return p


#: the entry-point group of the APIs a script can run on (found by name, never imported by name)
API_GROUP = "hvd_ddp_compare.apis"


def apis() -> Dict[str, Any]:
    """The installers of the APIs a script can run on, by name (the backends register them)."""
    return {entry.name: entry for entry in entry_points(group=API_GROUP)}


def refuse(message: str) -> NoReturn:
    """What the probe cannot follow: one line, on every rank that finds it, and exit code 2."""
    print_error(PROG, message)
    sys.stdout.flush()
    os._exit(2)


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"argument --max-steps: must be a positive integer, got {args.max_steps}")
    run_dir = os.path.abspath(args.run_dir)
    # {run_dir} in the script's arguments is this run's directory; the records keep the arguments as given, the same
    # for every run of a comparison
    code = userscript.UserCode(args.script, userscript.fill_run_dir(args.args, run_dir))
    problem = userscript.check(code)
    if problem:
        refuse(problem)
    placement = detect()
    pause_collector()  # the probe's own start-up; the script runs with the collector as python gives it
    from .session import Session  # imports torch: after the arguments are known to be good

    session = Session(run_dir, args.script, list(args.args), placement, args.perturb_ulp,
                      args.perturb_pattern, refuse, args.max_steps)
    session.start()
    if args.api:  # before the script's `import horovod`: the API, never the real library
        apis()[args.api].load()()
    resume_collector()
    atexit.register(session.finish)
    try:
        userscript.run(code)
    except SystemExit as leaving:
        if userscript.exit_code(leaving) != 0:
            session.failed = True
            raise
    except BaseException:
        session.failed = True
        raise
    userscript.leave(0)  # the script's atexit handlers, then the probe's (session.finish), then no teardown


if __name__ == "__main__":
    main()
