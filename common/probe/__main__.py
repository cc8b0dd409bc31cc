"""python -m common.probe --run-dir DIR [--perturb-ulp N --perturb-pattern P] SCRIPT [ARGS...]

Runs a user's training script unmodified, as `python SCRIPT ARGS` would (as __main__, from the folder it is
started in, with the script's folder first on sys.path), with the probe's hooks in place (common.probe.hooks),
under any launcher:

    torchrun --nproc-per-node 2 -m common.probe --run-dir runs/ddp train_ddp.py --epochs 1
    horovodrun -np 2 -H localhost:2 python -m common.probe --run-dir runs/hvd train_horovod.py --epochs 1

Every rank records its steps; when the script ends, rank 0 writes the run directory (common.probe.assemble).
What the probe cannot follow ends the run with one line and exit code 2; a script that fails shows its own
traceback and exit code.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import sys
from typing import List, NoReturn, Optional

from ..errors import print_error
from ..launch.placement import detect
from ..launch.startup import pause_collector, resume_collector

PROG = "probe"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m common.{PROG}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="the run directory rank 0 writes")
    p.add_argument("--perturb-ulp", type=int, default=0, metavar="N",
                   help="move the model's nonzero initial weights N units in the last place before its first step "
                        "(the noise floor's disturbance)")
    p.add_argument("--perturb-pattern", type=int, default=1, metavar="P", help="which way each tensor moves")
    p.add_argument("script", help="the training script, as you would give it to python")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def refuse(message: str) -> NoReturn:
    """What the probe cannot follow: one line, on every rank that finds it, and exit code 2."""
    print_error(PROG, message)
    sys.stdout.flush()
    os._exit(2)


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    script = args.script
    if not os.path.isfile(script):
        refuse(f"{script}: no such file; give the training script's path from this folder")
    placement = detect()
    pause_collector()  # the probe's own start-up; the script runs with the collector as python gives it
    from .session import Session  # imports torch: after the arguments are known to be good

    session = Session(os.path.abspath(args.run_dir), script, list(args.args), placement, args.perturb_ulp,
                      args.perturb_pattern, refuse)
    session.start()
    resume_collector()
    atexit.register(session.finish)
    sys.argv = [script, *args.args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as leaving:
        session.failed = leaving.code not in (None, 0)
        raise
    except BaseException:
        session.failed = True
        raise


if __name__ == "__main__":
    main()
