"""BENCHMARKS.md from its template and the committed results.

The prose lives in benchmarks/BENCHMARKS.template.md and holds no measured number; every number comes
from a result file under benchmarks/results/ that a step of benchmarks/run_all.sh writes. Each
placeholder `{{block FILE... [OPTION]}}` in the template is replaced by that block of
benchmarks.sections, drawn from those files, with the command that wrote them and the file's name.

    python -m benchmarks.render              # rewrite BENCHMARKS.md
    python -m benchmarks.render --check      # exit 1 when BENCHMARKS.md is not what the results give
    python -m benchmarks.render --out /tmp/B.md --results /tmp/results
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from common.errors import print_error

from .machine import REPO
from .sections import BLOCKS, Results
from .stale import RESULTS

TEMPLATE = REPO / "benchmarks" / "BENCHMARKS.template.md"
DOCUMENT = REPO / "BENCHMARKS.md"
PLACEHOLDER = re.compile(r"\{\{(?P<call>[^{}]+)\}\}")


class TemplateError(ValueError):
    """A placeholder names no block, or its block cannot be drawn from the results."""


def _expand(match: re.Match, results: Results) -> str:
    name, *args = match["call"].split()
    block = BLOCKS.get(name)
    if block is None:
        raise TemplateError(f"{{{{{match['call']}}}}} names no block; use one of {', '.join(sorted(BLOCKS))}")
    try:
        text = block(results, *args)
    except (KeyError, TypeError, ValueError) as exc:
        raise TemplateError(f"{{{{{match['call']}}}}}: {exc!r}") from None
    # A block inside a list item keeps the item's indentation on every line it adds (blank lines stay blank).
    line = match.string[match.string.rfind("\n", 0, match.start()) + 1:match.start()]
    indent = line[:len(line) - len(line.lstrip())]
    return "\n".join(part if not part or i == 0 else indent + part for i, part in enumerate(text.split("\n")))


def render(template: str, results: Results) -> str:
    """The document: `template` with every placeholder replaced by its block."""
    return PLACEHOLDER.sub(lambda m: _expand(m, results), template)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--template", type=Path, default=TEMPLATE, help="the prose with placeholders")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    p.add_argument("--out", type=Path, default=DOCUMENT, help="the document to write")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs from the render")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Render (or check) the document; 0 when written or up to date, 1 when --check finds it stale, 2 on bad input."""
    args = build_parser().parse_args(argv)
    if not args.template.is_file():
        print_error("render", f"no template at {args.template}; pass --template", ranked=False)
        return 2
    if not args.results.is_dir():
        print_error("render", f"no results folder at {args.results}; pass --results", ranked=False)
        return 2
    try:
        text = render(args.template.read_text(), Results(args.results))
    except ValueError as exc:
        print_error("render", str(exc), ranked=False)
        return 2
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"render: {args.out} is not what the results give; run python -m benchmarks.render", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"render: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
