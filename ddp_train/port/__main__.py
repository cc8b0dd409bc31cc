"""The command line of the port (the module docstring of ddp_train.port is its manual)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence, TextIO

from common.errors import OneLineParser
from common.errors import print_error as common_print_error

from . import __doc__ as MANUAL
from .context import Options
from .report import BAD_INPUT, render
from .rewrite import PortError, port

PROG = "python -m ddp_train.port"


def print_error(prog: str, message: str) -> None:
    """The project's one error line, `PROG: error: message` (the port is never a rank of a job)."""
    common_print_error(prog, message, ranked=False)


def parser() -> argparse.ArgumentParser:
    """The port's options (one line for a bad one, exit 2, no abbreviations: the project's OneLineParser)."""
    p = OneLineParser(prog=PROG, description=MANUAL, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", type=Path, help="the Horovod training script")
    p.add_argument("-o", "--output", help="where to write the port (- for stdout); default: beside the script, "
                   "'horovod' or 'hvd' in its name replaced by 'ddp'")
    p.add_argument("--diff", action="store_true", help="print a unified diff of the port instead of writing it")
    p.add_argument("--report-json", type=Path, metavar="PATH", help="write the report as JSON")
    p.add_argument("--zero-step", choices=("drop", "keep"), default="drop",
                   help="hvd.broadcast_optimizer_state's step on a fresh optimizer: drop it (DDP's idiom; the "
                        "report says what that changes) or keep it, made explicit, so that the port trains the same")
    return p


def default_output(script: Path) -> Path:
    """train_horovod.py -> train_ddp.py, hvd_train.py -> ddp_train.py, train.py -> train_ddp.py."""
    stem = re.sub(r"horovod|hvd", "ddp", script.stem, flags=re.IGNORECASE)
    return script.with_name((stem if stem != script.stem else f"{script.stem}_ddp") + script.suffix)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Port one script; the exit code (0 all ported, 1 some left, 2 bad input)."""
    args = parser().parse_args(argv)
    script: Path = args.script
    try:
        text = script.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        print_error(PROG, f"{script}: cannot be read ({why}); give the path of a Horovod training script")
        return BAD_INPUT
    output = None if args.diff else (args.output or str(default_output(script)))
    try:
        ported = port(text, str(script), output, Options(zero_step=args.zero_step))
    except PortError as exc:
        print_error(PROG, str(exc))
        return BAD_INPUT
    to_stdout = args.diff or output == "-"
    notes: TextIO = sys.stderr if to_stdout else sys.stdout
    if args.diff:
        sys.stdout.writelines(_diff(text, ported.code, str(script)))
    elif output == "-":
        sys.stdout.write(ported.code)
    else:
        try:
            Path(output).write_text(ported.code)  # type: ignore[arg-type]
        except OSError as exc:
            print_error(PROG, f"-o {output}: cannot be written ({exc.strerror or exc}); choose another path")
            return BAD_INPUT
    if args.report_json:
        try:
            args.report_json.write_text(ported.report.to_json())
        except OSError as exc:
            print_error(PROG, f"--report-json {args.report_json}: cannot be written ({exc.strerror or exc}); "
                        "choose another path")
            return BAD_INPUT
    print(render(ported.report), file=notes)
    return ported.report.exit_code


def _diff(before: str, after: str, name: str) -> List[str]:
    return list(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}"))


if __name__ == "__main__":
    sys.exit(main())
