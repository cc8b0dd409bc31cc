"""Which committed results are still current: a result is measured again when its script, the code it
measures or the way it is built changed since the revision it records, or when its step in
benchmarks/run_all.sh now runs another command.

    python -m benchmarks.stale            # every result: current, or why not
    python -m benchmarks.stale --names    # only the stale ones, as run_all.sh takes them:
    benchmarks/run_all.sh $(python -m benchmarks.stale --names)

A result's inputs are the project files its benchmark module imports (directly or through others, or starts
as `-m benchmarks.NAME`), the training every run launches (ddp_train, hvd_train and everything they import), and
the set-up that builds the environment (pyproject.toml, scripts/setup.sh, scripts/build_horovod.sh). The
comparison of a revision with today's files needs the project's git history."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence

from common.errors import print_error

from .machine import REPO
from .result_files import Results

RESULTS = REPO / "benchmarks" / "results"
RUN_ALL = REPO / "benchmarks" / "run_all.sh"
PACKAGES = ("benchmarks", "common", "ddp_train", "hvd_train")
#: what every run launches, whatever the benchmark
TRAINING = ("ddp_train", "hvd_train")
#: how the environment is built: the pins and the Horovod build
SET_UP = ("pyproject.toml", "scripts/setup.sh", "scripts/build_horovod.sh")
#: a project module named in a string (started with -m, or as a job's module); its package's __main__ runs then
STARTED_MODULE = re.compile(r"""["'](?:-m )?((?:%s)(?:\.\w+)*)\b""" % "|".join(PACKAGES))


@dataclass(frozen=True)
class Status:
    """Whether one result is current, and why not."""

    name: str
    revision: Optional[str]
    reason: Optional[str]  # None: current

    @property
    def current(self) -> bool:
        return self.reason is None


def module_file(module: str) -> Optional[Path]:
    """The project file of a dotted module name (a package's __init__.py), or None outside the project."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path) -> List[str]:
    """The dotted names a project file imports anywhere in it (inside functions too), and the project
    modules it names in a string (the ones its jobs start)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    for started in STARTED_MODULE.findall(path.read_text()):
        names += [started, f"{started}.__main__"]
    return names


@lru_cache(maxsize=None)
def closure(*modules: str) -> FrozenSet[str]:
    """The project files (relative to the repository) that `modules` import, through each other, and their
    packages' __init__.py."""
    seen: set = set()
    todo = [m for m in modules]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__.py and a/b/__init__.py too
            path = module_file(".".join(parts[:i]))
            if path is None or path in seen:
                continue
            seen.add(path)
            todo += _imports(path)
    return frozenset(str(p.relative_to(REPO)) for p in seen)


def training_inputs() -> List[str]:
    """Every file a run's training depends on: what ddp_train and hvd_train import, and the set-up."""
    return sorted(closure(*(f"{m}.__main__" for m in TRAINING))) + list(SET_UP)


def inputs(benchmark: str) -> List[str]:
    """Every file a result of `benchmarks.<benchmark>` depends on."""
    return sorted(set(closure(f"benchmarks.{benchmark}")) | set(training_inputs()))


def run_all_steps(mode: str = "full") -> Dict[str, str]:
    """The steps of one mode ("full" or "quick") of run_all.sh, by the result each writes (relative to OUT, as
    run_all.sh takes their names): "python -m benchmarks.X ...", with $OUT written as benchmarks/results."""
    text = RUN_ALL.read_text().replace("\\\n", " ")
    block = text.split(f"\n{mode}_steps() {{\n", 1)[1].split("\n}\n", 1)[0]
    steps = {}
    for line in block.splitlines():
        match = re.match(r"\s*step (-m benchmarks\.(\w+)\b.*)", line)
        if not match:
            continue
        words = shlex.split(match[1].replace("$OUT", "benchmarks/results"))
        out = Path(words[words.index("--out") + 1]).relative_to("benchmarks/results")
        steps[str(out / f"{match[2]}.json")] = " ".join(["python", *words])
    return steps


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)


def changed_since(revision: str, paths: Sequence[str]) -> List[str]:
    """Which of `paths` differ between `revision` and the files here now (committed or not)."""
    result = _git("diff", "--name-only", revision, "--", *paths)
    if result.returncode != 0:
        raise RuntimeError(f"git cannot compare {revision[:12]} with this checkout ({result.stderr.strip()}); "
                           "the check needs the project's git history (a full clone)")
    return result.stdout.split()


def status(name: str, result: Dict, commands: Dict[str, str]) -> Status:
    """Whether the result `name` (relative to the results folder) is current."""
    revision = (result.get("machine", {}).get("versions") or {}).get("project_git")
    if not revision:
        return Status(name, None, "it records no revision")
    if revision.endswith("-dirty"):
        return Status(name, revision, "it was measured on uncommitted code")
    if name not in commands:
        return Status(name, revision, "no step of run_all.sh writes it")
    if result.get("command") != commands[name]:
        return Status(name, revision, "its step in run_all.sh runs another command now")
    changed = changed_since(revision, inputs(Path(name).stem))
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        return Status(name, revision, f"changed since: {shown}")
    return Status(name, revision, None)


def statuses(results: Results) -> List[Status]:
    """The status of every step's result in `results` (a missing one is stale), then of any other result there."""
    steps = run_all_steps()
    found = results.all_files()
    return ([status(name, results.get(name), steps) if name in found else Status(name, None, "not measured yet")
             for name in steps] + [status(name, results.get(name), steps) for name in found if name not in steps])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    p.add_argument("--names", action="store_true", help="print only the stale results' names, one line")
    args = p.parse_args(argv)
    try:
        found = statuses(Results(args.results))
    except RuntimeError as exc:
        print_error("python -m benchmarks.stale", str(exc), ranked=False)
        return 1
    stale = [s for s in found if not s.current]
    if args.names:
        print(" ".join(s.name for s in stale))
        return 0
    for s in found:
        print(f"{s.name}: " + ("current" if s.current else "stale, " + s.reason)
              + (f" (measured at {s.revision[:12]})" if s.revision else ""))
    print(f"{len(found) - len(stale)} of {len(found)} current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
