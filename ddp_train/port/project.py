"""A user's folder as the port sees it: its Python files by the module name they are imported by (the folder is the
first entry of sys.path, as for `python train.py` run there), the other files to copy, what is skipped and why
(version control, virtual environments, caches, run output), and where a name a file imports is defined."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from common.rundir.names import LAUNCH_LOG, METRICS_FILE

from .report import Skipped

#: folders never ported nor copied, by name: why
SKIPPED_NAMES = {
    ".git": "version control", ".hg": "version control", ".svn": "version control",
    "__pycache__": "Python's bytecode cache", ".mypy_cache": "a tool's cache", ".pytest_cache": "a tool's cache",
    ".ruff_cache": "a tool's cache", ".tox": "a tool's environments", ".nox": "a tool's environments",
    ".ipynb_checkpoints": "a notebook's autosaves", "site-packages": "installed packages",
    "node_modules": "installed packages", "wandb": "run output", "mlruns": "run output",
    "lightning_logs": "run output", "runs": "run output (TensorBoard's and this project's default folder)",
}
#: a file that makes its folder a run's output: this project's run directories, TensorBoard's event files
RUN_OUTPUT_FILES = (METRICS_FILE, LAUNCH_LOG)
EVENTS_PREFIX = "events.out.tfevents."

Definition = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]


@dataclass
class SourceFile:
    """A Python file of the folder: its path from the folder's root, the module name it is imported by (None for a
    file no import reaches, e.g. in a folder whose name is not an identifier), its text and syntax tree."""

    path: str
    module: Optional[str]
    text: str
    tree: Optional[ast.Module]

    @property
    def uses_horovod(self) -> bool:
        """The file imports something of Horovod."""
        return self.tree is not None and any(_is_horovod(name) for name in _imported_modules(self.tree))

    def package(self) -> str:
        """The package its relative imports start from."""
        if self.module is None:
            return ""
        return self.module if self.path.endswith("__init__.py") else self.module.rpartition(".")[0]


@dataclass
class Folder:
    """A folder to port: its Python files, the other files (relative paths) and what was skipped."""

    root: Path
    files: List[SourceFile] = field(default_factory=list)
    others: List[str] = field(default_factory=list)
    skipped: List[Skipped] = field(default_factory=list)

    def by_module(self) -> Dict[str, SourceFile]:
        """The files by the module name they are imported by."""
        return {f.module: f for f in self.files if f.module}

    def file(self, path: str) -> Optional[SourceFile]:
        """The file at `path` (relative to the root)."""
        return next((f for f in self.files if f.path == path), None)


def _is_horovod(module: str) -> bool:
    return module == "horovod" or module.startswith("horovod.")


def _imported_modules(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def _why_skipped(folder: Path, names: Sequence[str]) -> Optional[str]:
    """Why a folder (whose entries are `names`) is skipped, else None."""
    if folder.name in SKIPPED_NAMES:
        return SKIPPED_NAMES[folder.name]
    if "pyvenv.cfg" in names:
        return "a virtual environment"
    if any(name in RUN_OUTPUT_FILES or name.startswith(EVENTS_PREFIX) for name in names):
        return "run output"
    if "report.md" in names and "report.html" in names:
        return "a comparison's output"
    return None


def module_name(path: str) -> Optional[str]:
    """`a/b.py` -> "a.b", `a/__init__.py` -> "a"; None where a part is not an identifier."""
    parts = list(Path(path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def read_folder(root: Path, leave_out: Sequence[Path] = ()) -> Folder:
    """The folder under `root` (its Python files parsed; a file that is not valid Python keeps tree None), without
    the folders of SKIPPED_NAMES, virtual environments, run output and `leave_out` (the port's own output folder when
    it lies inside)."""
    folder = Folder(root)
    excluded = {p.resolve() for p in leave_out}
    for here, dirs, names in os.walk(root, followlinks=False):
        current = Path(here)
        kept = []
        for name in sorted(dirs):
            path = current / name
            relative = path.relative_to(root).as_posix()
            if path.resolve() in excluded:
                folder.skipped.append(Skipped(relative, "the port's output"))
                continue
            try:
                inside = os.listdir(path)
            except OSError:
                inside = []
            why = _why_skipped(path, inside)
            if why:
                folder.skipped.append(Skipped(relative, why))
            elif path.is_symlink():
                folder.others.append(relative)  # copied as a link, not followed
            else:
                kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            relative = (current / name).relative_to(root).as_posix()
            if name.endswith(".py") and not (current / name).is_symlink():
                folder.files.append(_source(root, relative))
            else:
                folder.others.append(relative)
    return folder


def import_closure(script: Path, text: str) -> Folder:
    """The script and the modules of its folder that it imports, at any depth (its folder is sys.path[0]): what
    the port of one script reads of its folder, however large the folder is."""
    root = script.parent.resolve()
    folder = Folder(root)
    queue = [_parsed(script.name, text)]
    seen = {script.name}
    while queue:
        file = queue.pop()
        folder.files.append(file)
        for node in ast.walk(file.tree) if file.tree else []:
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = resolve_relative(file, node.level, node.module) if node.level else node.module
                names = [module, *(f"{module}.{a.name}" for a in node.names)] if module else []
            for name in names:
                parts = name.split(".")
                for end in range(1, len(parts) + 1):
                    for candidate in ("/".join(parts[:end]) + ".py", "/".join(parts[:end]) + "/__init__.py"):
                        if candidate not in seen and (root / candidate).is_file():
                            seen.add(candidate)
                            queue.append(_source(root, candidate))
    return folder


def _source(root: Path, relative: str) -> SourceFile:
    return _parsed(relative, (root / relative).read_text(encoding="utf-8", errors="surrogateescape"))


def _parsed(relative: str, text: str) -> SourceFile:
    try:
        tree: Optional[ast.Module] = ast.parse(text, filename=relative)
    except (SyntaxError, ValueError):
        tree = None
    return SourceFile(relative, module_name(relative), text, tree)


def resolve_relative(importer: SourceFile, level: int, module: Optional[str]) -> Optional[str]:
    """The absolute module a relative import (`from ..x import y`: level 2, module "x") of `importer` names."""
    base = importer.package().split(".") if importer.package() else []
    if level - 1 > len(base):
        return None
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])]) or None


@dataclass(frozen=True)
class Found:
    """Where a name is defined in the folder: the file and its definition."""

    file: SourceFile
    definition: Definition


class Resolver:
    """Finds the folder's own definitions of what a file names: `Net`, `models.Net`, `trainkit.models.Net`, through
    the file's imports of the folder's modules (absolute and relative)."""

    def __init__(self, folder: Folder) -> None:
        self.modules = folder.by_module()
        self._bindings: Dict[str, Dict[str, Tuple[str, Optional[str]]]] = {}

    def bindings(self, file: SourceFile) -> Dict[str, Tuple[str, Optional[str]]]:
        """What the file's module-level imports bind: name -> (module, attribute) (attribute None: the module
        itself)."""
        if file.path in self._bindings:
            return self._bindings[file.path]
        found: Dict[str, Tuple[str, Optional[str]]] = {}
        for node in file.tree.body if file.tree else []:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        found[alias.asname] = (alias.name, None)
                    else:
                        found[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                module = resolve_relative(file, node.level, node.module) if node.level else node.module
                if module is None:
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    submodule = f"{module}.{alias.name}"
                    found[alias.asname or alias.name] = (submodule, None) if submodule in self.modules \
                        else (module, alias.name)
        self._bindings[file.path] = found
        return found

    def imported_files(self, file: SourceFile) -> List[SourceFile]:
        """The folder's files that `file` imports (at any depth of its code), each once."""
        seen: Dict[str, SourceFile] = {}
        for node in ast.walk(file.tree) if file.tree else []:
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = resolve_relative(file, node.level, node.module) if node.level else node.module
                if module:
                    names = [module, *(f"{module}.{a.name}" for a in node.names)]
            for name in names:
                parts = name.split(".")
                for end in range(1, len(parts) + 1):  # importing a.b.c imports a and a.b too
                    target = self.modules.get(".".join(parts[:end]))
                    if target is not None and target.path != file.path:
                        seen.setdefault(target.path, target)
        return list(seen.values())

    def definition(self, file: SourceFile, dotted: str, depth: int = 0) -> Optional[Found]:
        """The folder's definition that `dotted`, read at module level of `file`, names; None where it is not
        the folder's (torch's, a local variable's) or cannot be told."""
        if depth > 8 or file.tree is None:
            return None
        head, _, rest = dotted.partition(".")
        if not rest:
            own = _top_definition(file.tree, head)
            if own is not None:
                return Found(file, own)
        bound = self.bindings(file).get(head)
        if bound is None:
            return None
        module, attribute = bound
        target_name = ".".join(p for p in (attribute, rest) if p)
        # the longest module of the folder the dotted name starts with
        parts = [module, *target_name.split(".")] if target_name else [module]
        joined = ".".join(parts).split(".")
        for end in range(len(joined) - 1, 0, -1):
            target = self.modules.get(".".join(joined[:end]))
            if target is not None:
                remaining = ".".join(joined[end:])
                return self.definition(target, remaining, depth + 1) if remaining else None
        return None


def _top_definition(tree: ast.Module, name: str) -> Optional[Definition]:
    found: Optional[Definition] = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node  # the last definition wins, as when the module runs
    return found
