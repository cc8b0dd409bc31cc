"""The shape of the code: `common` imports no backend, each package imports only what docs/architecture.md
allows it, no modules import each other in a cycle, and the run directory's file names are spelled only in
`common/rundir/`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "ddp_train", "hvd_train", "benchmarks")

#: what each part of the project may import of the project besides itself (docs/architecture.md draws it)
ALLOWED = {
    "common.launch": set(),
    "common.choices": set(),
    "common.errors": {"common.launch"},
    "common.config": {"common.choices", "common.errors"},
    "common.inputs": {"common.choices", "common.config", "common.errors"},
    "common.loop": {"common.choices", "common.config", "common.errors", "common.inputs", "common.launch"},
    "common.exact": {"common.config", "common.loop"},
    "common.checkpoints": {"common.config", "common.loop"},
    "common.faults": {"common.errors", "common.loop"},
    "common.rundir": {"common.checkpoints", "common.config", "common.inputs", "common.launch", "common.loop"},
    "common.trainer": {"common.checkpoints", "common.config", "common.errors", "common.exact", "common.faults",
                       "common.inputs", "common.loop", "common.rundir"},
    "common.doctor": {"common.errors", "common.launch"},
    "common.compare": {"common.config", "common.doctor", "common.errors", "common.launch", "common.rundir"},
    "common.probe": {"common.checkpoints", "common.errors", "common.inputs", "common.launch", "common.rundir"},
    "common.entry": {"common.config", "common.faults", "common.launch", "common.trainer"},
    # common.rundir: the port of a folder skips run directories, told by their names
    "ddp_train": {"common.config", "common.entry", "common.errors", "common.launch", "common.loop", "common.rundir"},
    "hvd_train": {"common.checkpoints", "common.config", "common.doctor", "common.entry", "common.errors",
                  "common.launch", "common.loop"},
    "benchmarks": {"common.compare", "common.config", "common.errors", "common.exact", "common.faults",
                   "common.inputs", "common.launch", "common.loop", "common.rundir", "hvd_train"},
}
#: a benchmark that runs a backend's own code in its process, by name: benchmarks.negotiation simulates hundreds of
#: the Horovod API's ranks with the API's negotiation and cycle code (no launch could start that many)
RUNS_BACKEND_CODE = {"benchmarks.negotiation": "ddp_train.horovod_api"}
#: modules that may import only these modules of the project: what other parts build on stays small
ONLY = {
    "common.rundir.names": set(),
    "common.rundir.reader": {"common.rundir.names"},
    "common.checkpoints.format": set(),
    "common.exact.fixedpoint": set(),
    "common.exact.shardstats": set(),
}
#: the run directory's files, named only in common/rundir/names.py
RUN_FILES = ("config.json", "summary.json", "metrics.jsonl", "model.pt")


def _modules():
    """{dotted module name: path} of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known, typing_too: bool = False) -> set:
    """The project modules `name` imports (module level and inside functions alike; those under TYPE_CHECKING
    only with `typing_too`)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets = set()
    tree = ast.parse(path.read_text())
    for block in ast.walk(tree):  # imports for the type checker only run no code: no dependency at run time
        if not typing_too and isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets.add(base)
            targets |= {f"{base}.{alias.name}" for alias in node.names}
    return {t for t in targets if t in known and t != name}


def test_common_imports_no_backend():
    offenders = []
    for path in (REPO / "common").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"^\s*(import|from)\s+(horovod|hvd_train|ddp_train)\b", line) or \
                    re.search(r"\b(hvd_train|ddp_train)\.\w+", line) and "import" in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "common/ must not import a backend:\n" + "\n".join(offenders)


def _part(name: str) -> str:
    """The part of the project a module belongs to: common's package (or top-level module), or a top package."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "common" and len(parts) > 1 else parts[0]


def _runs_backend_code(name: str, target: str) -> bool:
    allowed = RUNS_BACKEND_CODE.get(name)
    return allowed is not None and (target == allowed or target.startswith(allowed + "."))


def test_each_part_imports_only_what_it_may():
    modules = _modules()
    offenders = []
    for name, path in sorted(modules.items()):
        part = _part(name)
        allowed = ALLOWED.get(part, set())
        for target in sorted(_imports(name, path, modules)):
            if target == "common" or _part(target) == part or _runs_backend_code(name, target):
                continue
            if _part(target) not in allowed:
                offenders.append(f"{name} imports {target}: {part} may import only {sorted(ALLOWED.get(part, ()))}")
    assert not offenders, "imports across the layout's rules (tests/test_architecture.py ALLOWED):\n" + \
        "\n".join(offenders)


def test_small_modules_stay_small():
    modules = _modules()
    offenders = [f"{name} imports {target}" for name, only in ONLY.items()
                 for target in sorted(_imports(name, modules[name], modules) - only)]
    assert not offenders, "\n".join(offenders)


def test_only_the_entry_point_runs_the_trainer():
    modules = _modules()
    importers = sorted(name for name, path in modules.items() if "common.trainer" in _imports(name, path, modules))
    assert importers == ["common.entry"], importers


def test_backends_and_benchmarks_keep_apart():
    modules = _modules()
    offenders = [f"{name} imports {target}" for name, path in sorted(modules.items())
                 for target in _imports(name, path, modules)
                 if {_part(name), _part(target)} == {"ddp_train", "hvd_train"}
                 or (_part(name) == "benchmarks" and _part(target) == "ddp_train"
                     and not _runs_backend_code(name, target))]
    assert not offenders, "\n".join(offenders)


def test_run_directory_names_are_spelled_in_one_place():
    literal = re.compile(r"""["'/](%s)["']""" % "|".join(re.escape(n) for n in RUN_FILES))
    offenders = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.is_relative_to(REPO / "common" / "rundir"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if literal.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "use common.rundir.names, not the file names:\n" + "\n".join(offenders)


def test_the_packages_of_common_import_each_other_without_a_cycle():
    """Package by package (loop, faults, rundir, ...), not only module by module: a part builds on the parts below
    it, and the composition root (common.trainer) on all of them."""
    modules = _modules()
    graph: dict = {}
    for name, path in modules.items():
        if name.startswith("common."):
            graph.setdefault(_part(name), set()).update(
                _part(t) for t in _imports(name, path, modules) if t.startswith("common.") and _part(t) != _part(name))
    order, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            assert state.get(target) != "open", "package cycle: " + " -> ".join(stack + [target])
            if target not in state:
                visit(target, stack + [target])
        state[node] = "done"
        order.append(node)

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert "common.trainer" in order and "common.loop" in order


#: where a command line of the project may be parsed
PARSER_PACKAGES = (*PACKAGES, "scripts")


def _argparse_names(tree: ast.AST) -> tuple:
    """The names a module binds to the argparse module and to argparse.ArgumentParser, however it imports them."""
    modules, classes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "argparse"}
        elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
            classes |= {a.asname or a.name for a in node.names if a.name == "ArgumentParser"}
    return modules, classes


def _is_argument_parser(node: ast.expr, modules: set, classes: set) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "ArgumentParser" and isinstance(node.value, ast.Name)
            and node.value.id in modules) or (isinstance(node, ast.Name) and node.id in classes)


def parser_classes(sources: dict) -> dict:
    """{class name: whether it refuses abbreviations} of the classes that subclass argparse.ArgumentParser in
    `sources` ({name: source}): one refuses them when its own code sets allow_abbrev to False."""
    found = {}
    for text in sources.values():
        tree = ast.parse(text)
        modules, classes = _argparse_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(_is_argument_parser(b, modules, classes) for b in node.bases):
                found[node.name] = re.search(r"allow_abbrev[\"']?\s*[,=:]\s*False", ast.unparse(node)) is not None
    return found


def abbreviating_parsers(text: str, subclasses: dict) -> list:
    """The lines of `text` that build a parser taking abbreviations: argparse.ArgumentParser however imported, or a
    subclass of it that does not refuse them, called without allow_abbrev=False."""
    tree = ast.parse(text)
    modules, classes = _argparse_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        builds = _is_argument_parser(node.func, modules, classes)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not builds and subclasses.get(name) is False:
            builds = True
        keywords = {k.arg: k.value for k in node.keywords}
        refused = isinstance(keywords.get("allow_abbrev"), ast.Constant) and keywords["allow_abbrev"].value is False
        if builds and not refused:
            lines.append(node.lineno)
    return lines


def test_the_parser_finder_sees_parsers_however_they_are_built():
    """The rule below is only as good as what finds the parsers: an alias, a from-import, a subclass."""
    sources = {
        "plain": "import argparse\np = argparse.ArgumentParser()\nq = argparse.ArgumentParser(allow_abbrev=False)\n",
        "alias": "import argparse as ap\np = ap.ArgumentParser(prog='x')\n",
        "from": "from argparse import ArgumentParser as P\np = P()\n",
        "sub": "import argparse\nclass Mine(argparse.ArgumentParser):\n    pass\np = Mine()\n",
        "kept": "import argparse\nclass Kept(argparse.ArgumentParser):\n    def __init__(self, **kw):\n"
                "        kw.setdefault('allow_abbrev', False)\n        super().__init__(**kw)\np = Kept()\n",
        "other": "class ArgumentParser:\n    pass\np = ArgumentParser()\n",
    }
    subclasses = parser_classes(sources)
    assert subclasses == {"Mine": False, "Kept": True}
    found = {name: abbreviating_parsers(text, subclasses) for name, text in sources.items()}
    assert found == {"plain": [2], "alias": [2], "from": [2], "sub": [4], "kept": [], "other": []}


def test_every_parser_refuses_abbreviations():
    """argparse takes --batch for --batch-size unless told not to: every command line of the project is parsed by
    common.errors.OneLineParser (which refuses them) or by a parser given allow_abbrev=False, however it is built."""
    sources = {path: path.read_text() for package in PARSER_PACKAGES for path in sorted((REPO / package).rglob("*.py"))}
    subclasses = parser_classes(sources)
    assert subclasses.get("OneLineParser") is True, subclasses
    offenders = [f"{path.relative_to(REPO)}:{line}" for path, text in sources.items()
                 for line in abbreviating_parsers(text, subclasses)]
    assert not offenders, "parsers that take abbreviations (use OneLineParser):\n" + "\n".join(offenders)


def test_no_import_cycles():
    """No modules import each other in a cycle, counting imports for the type checker too: two modules that need
    each other's types are one concern, or one of them should hand the other a narrower object."""
    modules = _modules()
    graph = {name: _imports(name, path, modules, typing_too=True) for name, path in modules.items()}
    # A package's __init__ re-exporting its own submodules is not a cycle between modules.
    graph = {name: {t for t in targets if not name.startswith(t + ".") and not t.startswith(name + ".")}
             for name, targets in graph.items()}
    cycles = []
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
