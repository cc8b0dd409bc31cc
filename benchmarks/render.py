"""BENCHMARKS.md from its template and the committed results.

The prose lives in benchmarks/BENCHMARKS.template.md and holds no measured number. Each placeholder is replaced:
`{{FILE [OPTION]}}` by that result file's section (benchmarks.sections, chosen by the file's "benchmark" field),
`{{machines}}` by the machines the results ran on, `{{targets}}` by the targets table and
`{{target NAME}}` by one target's value. The document is a function of the template and the result files alone:
which results are no longer current is what `python -m benchmarks.stale` says.

    python -m benchmarks.render              # rewrite BENCHMARKS.md
    python -m benchmarks.render --check      # exit 1 when BENCHMARKS.md is not what the results give
    python -m benchmarks.render --out /tmp/B.md --results /tmp/results
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from .jobs import parser, refuse
from .machine import REPO
from .sections import Results, framed
from .stale import RESULTS
from .targets import target, targets

TEMPLATE = REPO / "benchmarks" / "BENCHMARKS.template.md"
DOCUMENT = REPO / "BENCHMARKS.md"
PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")


def machines(results: Results) -> str:
    """The machines the results ran on, each with the results measured on it."""
    described: dict[str, list[str]] = {}
    for file in results.all_files():
        m = (results.get(file) or {})["machine"]
        v = m["versions"]
        software = [v.get("platform"), f"Python {v.get('python')}", f"torch {v.get('torch')}",
                    f"torchvision {v.get('torchvision')}", f"Horovod {v.get('horovod')}", v.get("mpi")]
        described.setdefault(f"{m['cpu_model']} (model name in `/proc/cpuinfo`), {m['cores']} cores, "
                             f"{m['memory_gib']} GiB, {', '.join(m['gpus']) or 'no GPU'}; "
                             + ", ".join(s for s in software if s), []).append(file)
    every = len(described) == 1
    return "\n".join(f"- {line} (" + ("every result below" if every else ", ".join(f"`{n}`" for n in files)) + ")."
                     for line, files in described.items())


#: placeholders that are not a result file
BLOCKS: dict[str, Callable[..., str]] = {"machines": machines, "targets": targets,
                                         "target": lambda results, which: target(which)}


def render(template: str, results: Results) -> str:
    """The document: `template` with every placeholder replaced (ValueError naming one that cannot be drawn from
    the results); a placeholder inside a list item keeps the item's indentation on every line it adds."""
    def replace(match: re.Match) -> str:
        word, *options = match[1].split()
        try:
            text = BLOCKS[word](results, *options) if word in BLOCKS else framed(results, word, *options)
        except (KeyError, TypeError, ValueError, StopIteration) as exc:
            raise ValueError(f"{{{{{match[1]}}}}}: {exc!r}") from None
        line = match.string[match.string.rfind("\n", 0, match.start()) + 1:match.start()]
        indent = line[:len(line) - len(line.lstrip())]
        return "\n".join(part if not part or i == 0 else indent + part for i, part in enumerate(text.split("\n")))

    return PLACEHOLDER.sub(replace, template)


def main(argv: Sequence[str] | None = None) -> int:
    """Render (or check) the document: 0 when written or up to date, 1 when --check finds it out of date, 2 on bad
    input."""
    p = parser("render", __doc__)
    p.add_argument("--template", type=Path, default=TEMPLATE, help="the prose with placeholders")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    p.add_argument("--out", type=Path, default=DOCUMENT, help="the document to write")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs from the render")
    args = p.parse_args(argv)
    if not args.template.is_file() or not args.results.is_dir():
        return refuse("render", f"no template at {args.template} or no results folder at {args.results}")
    try:
        text = render(args.template.read_text(), Results(args.results))
    except ValueError as exc:
        return refuse("render", str(exc))
    if not args.check:
        args.out.write_text(text)
        print(f"render: wrote {args.out}")
    elif not args.out.is_file() or args.out.read_text() != text:
        print(f"render: {args.out} is not what the results give; run python -m benchmarks.render", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
