"""The command line of the port (the module docstring of ddp_train.port is its manual)."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Optional, Sequence, TextIO

from common.errors import OneLineParser
from common.errors import print_error as common_print_error

from . import __doc__ as MANUAL
from .context import Options
from .folder import FolderPorted, port_folder, port_script
from .report import BAD_INPUT, PortReport, render
from .rewrite import PortError, Ported

PROG = "python -m ddp_train.port"


def print_error(prog: str, message: str) -> None:
    """The project's one error line, `PROG: error: message` (the port is never a rank of a job)."""
    common_print_error(prog, message, ranked=False)


def parser() -> argparse.ArgumentParser:
    """The port's options (one line for a bad one, exit 2, no abbreviations: the project's OneLineParser)."""
    p = OneLineParser(prog=PROG, description=MANUAL, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", type=Path, metavar="SCRIPT_OR_FOLDER",
                   help="the Horovod training script, or the folder of a codebase to port whole")
    p.add_argument("-o", "--output", help="where to write the port: a file for a script (- for stdout; a folder, "
                   "ending in /, ports the script's whole folder there), a new folder for a folder; default for a "
                   "script: beside it, 'horovod' or 'hvd' in its name replaced by 'ddp'")
    p.add_argument("--in-place", action="store_true", help="rewrite the files where they stand (review the port "
                   "as a diff in your version control)")
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
    """Port a script or a folder; the exit code (0 all ported, 1 some left, 2 bad input)."""
    args = parser().parse_args(argv)
    source: Path = args.script
    options = Options(zero_step=args.zero_step)
    if args.in_place and (args.output or args.diff):
        print_error(PROG, f"--in-place rewrites {source} where it stands: drop {'-o' if args.output else '--diff'}")
        return BAD_INPUT
    if source.is_dir():
        return _port_folder(source, args, options)
    if args.output and (args.output.endswith(("/", os.sep)) or Path(args.output).is_dir()):
        return _port_folder(source.parent, args, options, script=source)
    return _port_script(source, args, options)


def _port_script(script: Path, args: argparse.Namespace, options: Options) -> int:
    try:
        text = script.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        print_error(PROG, f"{script}: cannot be read ({why}); give the path of a Horovod training script or of "
                    "a folder")
        return BAD_INPUT
    output = None if args.diff else (str(script) if args.in_place else (args.output or str(default_output(script))))
    try:
        # the script's folder tells more: a loop or a model class in a module of its own that the script imports
        code, report, left = port_script(script, text, options)
        ported = Ported(code if code is not None else text, replace(report, output=output))
        if left:
            here = script.parent
            target = os.path.relpath(here.resolve().parent / f"{here.resolve().name}_ddp")
            command = f"{PROG} {here} -o {target}/ (or --in-place)"
            ported.report.unported += [replace(u, reason=f"{u.reason}: port the folder: {command}")
                                       for u in left]
            if not args.diff and output != "-":
                print(f"{PROG}: {script.name} imports {len(left)} module{'s' if len(left) != 1 else ''} of "
                      f"{here} that need{'s' if len(left) == 1 else ''} the port too "
                      f"({', '.join(u.file or '' for u in left)}): {command}", file=sys.stderr)
    except PortError as exc:
        print_error(PROG, str(exc))
        return BAD_INPUT
    notes: TextIO = sys.stderr if args.diff or output == "-" else sys.stdout
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
    return _finish(ported.report, args, notes)


def _port_folder(root: Path, args: argparse.Namespace, options: Options, script: Optional[Path] = None) -> int:
    out = None if args.diff or args.in_place else Path(args.output or f"{root.resolve()}_ddp")
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        print_error(PROG, f"-o {out}: exists and is not an empty folder; give a new folder for the port of {root} "
                    "(or --in-place to rewrite the files where they stand)")
        return BAD_INPUT
    if args.output == "-":
        print_error(PROG, f"{root} is a folder: -o - prints one script; give a folder (-o OUT) or --diff")
        return BAD_INPUT
    try:
        done = port_folder(root.resolve(), options, leave_out=[out] if out is not None else [],
                           output=str(out) if out is not None else (str(root) if args.in_place else None))
    except PortError as exc:
        print_error(PROG, str(exc))
        return BAD_INPUT
    done.report.source = str(root)
    if script is not None:  # the script's own changes first
        first = [c for c in done.report.changes if c.file == script.name]
        done.report.changes = first + [c for c in done.report.changes if c.file != script.name]
    if args.diff:
        for path, text in done.texts.items():
            before = next(f.text for f in done.folder.files if f.path == path)
            sys.stdout.writelines(_diff(before, text, path))
        return _finish(done.report, args, sys.stderr)
    try:
        if out is None:
            for path, text in done.texts.items():
                (root / path).write_text(text)
        else:
            done.report.copied = write_tree(done, out)
    except OSError as exc:
        print_error(PROG, f"-o {out or root}: cannot be written ({exc.strerror or exc}); choose another folder")
        return BAD_INPUT
    return _finish(done.report, args, sys.stdout)


def write_tree(done: FolderPorted, out: Path) -> int:
    """The folder's port into `out`: each ported file's new text, every other file copied (links as links);
    the number copied."""
    root = done.folder.root
    out.mkdir(parents=True, exist_ok=True)
    copied = 0
    for file in done.folder.files:
        target = out / file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if file.path in done.texts:
            target.write_text(done.texts[file.path])
        else:
            shutil.copy2(root / file.path, target)
            copied += 1
    for other in done.folder.others:
        source, target = root / other, out / other
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
        copied += 1
    return copied


def _finish(report: PortReport, args: argparse.Namespace, notes: TextIO) -> int:
    if args.report_json:
        try:
            args.report_json.write_text(report.to_json())
        except OSError as exc:
            print_error(PROG, f"--report-json {args.report_json}: cannot be written ({exc.strerror or exc}); "
                        "choose another path")
            return BAD_INPUT
    print(render(report), file=notes)
    return report.exit_code


def _diff(before: str, after: str, name: str) -> List[str]:
    return list(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}"))


if __name__ == "__main__":
    sys.exit(main())
