"""Which committed results are still current. A result is stale when a file it depends on changed since the revision
it records (its benchmark module and the project files that imports or starts, the training every run launches:
ddp_train, hvd_train and what they import, and the set-up), when it measured uncommitted code, or when its step in
benchmarks/run_all.sh runs another command now. It needs the project's git history.

    python -m benchmarks.stale            # every result: current, or why not
    benchmarks/run_all.sh $(python -m benchmarks.stale --names)   # measure the stale ones again
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from .jobs import parser, refuse
from .machine import REPO

RESULTS = REPO / "benchmarks" / "results"
RUN_ALL = REPO / "benchmarks" / "run_all.sh"
PACKAGES = ("benchmarks", "common", "ddp_train", "hvd_train")
SET_UP = ("pyproject.toml", "scripts/setup.sh", "scripts/build_horovod.sh")
#: what a result shows, not what it measures: changing them leaves every result current
SHOWING = {"benchmarks.sections", "benchmarks.targets", "benchmarks.render"}
#: a project module named in a string (started with -m, or as a job's module)
STARTED_MODULE = re.compile(r"""["'](?:-m )?((?:%s)(?:\.\w+)*)\b""" % "|".join(PACKAGES))
#: the Horovod checkout run_all.sh's Horovod steps read (its HOROVOD_SRC), as their commands record it
HOROVOD_SRC = "runs/horovod"


def module_file(module: str) -> Path | None:
    """The project file of a dotted module name (a package's __init__.py), or None outside the project."""
    base = REPO.joinpath(*module.split("."))
    found = [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return found[0] if found and module.split(".")[0] in PACKAGES and module not in SHOWING else None


def imported(path: Path) -> list[str]:
    """The dotted names a project file imports anywhere in it, and the project modules it names in a string."""
    package = path.relative_to(REPO).parts[:-1]
    names = [f"{started}{tail}" for started in STARTED_MODULE.findall(path.read_text()) for tail in ("", ".__main__")]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1 if node.level else 0], *[node.module or ""]])
            names += [base.strip(".")] + [f"{base.strip('.')}.{alias.name}" for alias in node.names]
    return names


@lru_cache(maxsize=None)
def closure(*modules: str) -> frozenset[str]:
    """The project files (relative to the repository) that `modules` import, through each other, with their
    packages' __init__.py."""
    seen: set = set()
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for path in (module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)):
            if path is not None and path not in seen:
                seen.add(path)
                todo += imported(path)
    return frozenset(str(p.relative_to(REPO)) for p in seen)


def training_inputs() -> list[str]:
    """Every file a run's training depends on: what ddp_train and hvd_train import, and the set-up."""
    return sorted(closure("ddp_train.__main__", "hvd_train.__main__")) + list(SET_UP)


def run_all_steps(mode: str = "full") -> dict[str, str]:
    """The steps of one mode ("full" or "quick") of run_all.sh by the result each writes (relative to OUT, as
    run_all.sh names them): "python -m benchmarks.X ...", with $OUT as benchmarks/results."""
    text = RUN_ALL.read_text().replace("\\\n", " ")
    block = text.split(f"\n{mode}_steps() {{\n", 1)[1].split("\n}\n", 1)[0]
    steps = {}
    for match in re.finditer(r"^\s*(?:horovod_)?step (-m benchmarks\.(\w+)\b.*)$", block, re.MULTILINE):
        words = shlex.split(match[1].replace("$OUT", "benchmarks/results").replace("$HOROVOD_SRC", HOROVOD_SRC))
        out = Path(words[words.index("--out") + 1]).relative_to("benchmarks/results")
        steps[str(out / f"{match[2]}.json")] = " ".join(["python", *words])
    return steps


def known(revision: str) -> bool:
    """Whether `revision` is a commit of this checkout's history. A shallow clone cannot tell: it refuses."""
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{revision}^{{commit}}"],
                           capture_output=True, text=True, timeout=30)
    if found.returncode == 0:
        return True
    shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True, timeout=30)
    if shallow.stdout.strip() != "false":
        raise RuntimeError(f"git cannot find {revision[:12]} in this checkout; "
                           "the check needs the project's git history (a full clone)")
    return False


def changed_since(revision: str, paths: Sequence[str]) -> list[str]:
    """Which of `paths` differ between `revision` and the files here now (committed or not)."""
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "--name-only", revision, "--", *paths],
                          capture_output=True, text=True, timeout=30)
    if diff.returncode != 0:
        raise RuntimeError(f"git cannot compare {revision[:12]} with this checkout ({diff.stderr.strip()}); "
                           "the check needs the project's git history (a full clone)")
    return diff.stdout.split()


def why_stale(name: str, result: dict[str, Any], commands: dict[str, str]) -> str | None:
    """Why the result `name` (relative to the results folder) is stale; None when it is current: its benchmark's
    module, what that imports or starts, and the training are the files it depends on."""
    revision = ((result.get("machine") or {}).get("versions") or {}).get("project_git")
    if not revision or revision.endswith("-dirty"):
        return "it was measured on uncommitted code" if revision else "it records no revision"
    if name not in commands:
        return "no step of run_all.sh writes it"
    if result.get("command") != commands[name]:
        return "its step in run_all.sh runs another command now"
    if not known(revision):
        return "it was measured at a revision this history does not hold"
    changed = changed_since(revision, sorted(closure(f"benchmarks.{Path(name).stem}") | set(training_inputs())))
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"changed since: {', '.join(changed[:3])}{more}" if changed else None


def statuses(folder: Path) -> list[tuple[str, str | None, str | None]]:
    """(result, the revision it records, why it is stale or None) of every step's result, then of any other result
    in `folder`."""
    steps = run_all_steps()
    found = {str(p.relative_to(folder)): json.loads(p.read_text()) for p in sorted(folder.rglob("*.json"))}
    return [(name, ((found.get(name) or {}).get("machine") or {}).get("versions", {}).get("project_git"),
             why_stale(name, found[name], steps) if name in found else "not measured yet")
            for name in [*steps, *(n for n in found if n not in steps and "benchmark" in found[n])]]


def main(argv: Sequence[str] | None = None) -> int:
    """Print every result's status (or only the stale ones' names); 1 when git cannot tell."""
    p = parser("stale", __doc__)
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    p.add_argument("--names", action="store_true", help="print only the stale results' names, one line")
    args = p.parse_args(argv)
    try:
        found = statuses(args.results)
    except RuntimeError as exc:
        refuse("stale", str(exc))
        return 1
    stale = [name for name, _, why in found if why]
    if args.names:
        print(" ".join(stale))
        return 0
    for name, revision, why in found:
        at = f" (measured at {revision[:12]})" if revision else ""
        print(f"{name}: {'stale, ' + why if why else 'current'}{at}")
    print(f"{len(found) - len(stale)} of {len(found)} current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
