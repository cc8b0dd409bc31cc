"""python -m ddp_train.horovod_api SCRIPT [ARGS...] | -m MODULE [ARGS...]

Runs a Horovod script unchanged on torch.distributed, as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would run
it, with `import horovod.torch as hvd` giving the API (docs/horovod-api.md); Horovod itself is never imported.
Under any launcher of the project:

    torchrun --nproc-per-node 2 -m ddp_train.horovod_api train_horovod.py --epochs 1
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node0:29500 -m ddp_train.horovod_api ...
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m ddp_train.horovod_api train_horovod.py
    torchrun --nproc-per-node 2 -m ddp_train.horovod_api -m pytest test_torch.py

A script that returns (or exits with code 0) ends the process without the interpreter's teardown; a failing script
keeps its traceback and exit code. What cannot start (no such script) ends every rank with one line and exit code 2.
"""

import os
import sys

# python -m put the folder this was started from first on sys.path; a folder with a `common` of its own (Horovod's
# test utilities are test/utils/common.py) would then shadow the project's package before it is even imported.
if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from common.errors import fail_usage
from common.launch import userscript
from common.launch.startup import pause_collector, resume_collector

PROG = "horovod_api"


def refuse(message: str) -> None:
    """What cannot start: one line on every rank (each lingers for its siblings to print theirs before the launcher
    stops them: common.errors.fail_usage), exit code 2."""
    sys.stdout.flush()
    fail_usage(PROG, message)


def main(argv=None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in ("-h", "--help"):
        print(__doc__)
        return
    try:
        code = userscript.parse_target(words)
    except ValueError as exc:
        refuse(str(exc))
        return
    problem = userscript.check(code)
    if problem:
        refuse(problem)
    pause_collector()  # the API's imports (torch); the script runs with the collector as python gives it
    from ddp_train.horovod_api import install

    install()
    resume_collector()
    try:
        userscript.run(code)
    except SystemExit as leaving:
        if userscript.exit_code(leaving) != 0:
            raise
    userscript.leave(0)


if __name__ == "__main__":
    main()
