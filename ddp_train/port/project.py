"""A user's folder as the port sees it: its Python files by the module name they are imported by (the folder is the
first entry of sys.path, as for `python train.py` run there), the other files to copy, what is skipped and why
(version control, virtual environments, caches, run output), and where a name a file imports is defined."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import libcst as cst
from libcst.metadata import CodeRange, PositionProvider

from common.rundir.names import LAUNCH_LOG, METRICS_FILE

from .names import dotted, is_horovod
from .report import Skipped
from .walk import imports

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
#: what the text of an import of Horovod holds (`import horovod`, `import os, horovod.torch`, `from horovod.torch
#: import`, split by a backslash or not): a file without it is not parsed to look for one
HOROVOD_IMPORT = re.compile(r"(?:\bimport|\bfrom|,)[ \t\f]*(?:\\\n[ \t\f]*)*horovod\b")

Definition = Union[cst.FunctionDef, cst.ClassDef]


@dataclass
class SourceFile:
    """A Python file of the folder: its path from the folder's root, the module name it is imported by (None for a
    file no import reaches, e.g. in a folder whose name is not an identifier), its text and, parsed the first time
    it is asked for and only then (a file the port never reads into is never parsed), its LibCST module."""

    path: str
    module: Optional[str]
    text: str
    _parsed: Union[cst.Module, Exception, None] = field(default=None, init=False, repr=False, compare=False)
    _wrapper: Optional[cst.MetadataWrapper] = field(default=None, init=False, repr=False, compare=False)

    @property
    def tree(self) -> Optional[cst.Module]:
        """Its module; None where LibCST cannot parse it (`error` says why)."""
        if self._parsed is None:
            try:
                self._parsed = cst.parse_module(self.text)
            except (cst.ParserSyntaxError, UnicodeError) as exc:  # a file read with surrogateescape: not UTF-8
                self._parsed = exc
        return self._parsed if isinstance(self._parsed, cst.Module) else None

    @property
    def error(self) -> Optional[Exception]:
        """Why its text cannot be parsed, else None."""
        return None if self.tree is not None else cast(Exception, self._parsed)

    @property
    def wrapper(self) -> cst.MetadataWrapper:
        """Its module's MetadataWrapper, made once: what is resolved through it (positions, scopes) is kept for
        every later use, the port's of this file included."""
        assert self.tree is not None, "a file that cannot be parsed has no metadata"
        if self._wrapper is None:
            self._wrapper = cst.MetadataWrapper(self.tree, unsafe_skip_copy=True)
        return self._wrapper

    @property
    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        """Where each node of its module is."""
        return self.wrapper.resolve(PositionProvider)

    @property
    def may_use_horovod(self) -> bool:
        """Its text holds what an import of Horovod does (HOROVOD_IMPORT; a comment or string can too)."""
        return "horovod" in self.text and HOROVOD_IMPORT.search(self.text) is not None  # the word first: quicker

    @property
    def uses_horovod(self) -> bool:
        """The file imports something of Horovod."""
        return self.may_use_horovod and self.tree is not None and \
            any(is_horovod(name) for name in _imported_modules(self.tree))

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


def _imported_modules(tree: cst.Module) -> List[str]:
    """The modules the module's absolute imports name, at any depth."""
    found: List[str] = []
    for node in imports(tree):
        if isinstance(node, cst.Import):
            found += [alias.evaluated_name for alias in node.names]
        elif node.module is not None and not node.relative:
            found.append(dotted(node.module) or "")
    return found


def _imported_names(file: SourceFile, node: Union[cst.Import, cst.ImportFrom]) -> List[str]:
    """The modules an import of `file` can name: `import a.b`'s a.b, `from .m import x`'s m and m.x (absolute)."""
    if isinstance(node, cst.Import):
        return [alias.evaluated_name for alias in node.names]
    module = _from_module(file, node)
    if module is None:
        return []
    names = () if isinstance(node.names, cst.ImportStar) else node.names
    return [module, *(f"{module}.{alias.evaluated_name}" for alias in names)]


def _from_module(file: SourceFile, node: cst.ImportFrom) -> Optional[str]:
    """The absolute module `from ... import` names in `file`."""
    module = dotted(node.module) if node.module is not None else None
    return resolve_relative(file, len(node.relative), module) if node.relative else module


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
    """The folder under `root` (its Python files read, each parsed when first needed), without
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
    queue = [SourceFile(script.name, module_name(script.name), text)]
    seen = {script.name}
    while queue:
        file = queue.pop()
        folder.files.append(file)
        for node in imports(file.tree) if file.tree else []:
            for name in _imported_names(file, node):
                parts = name.split(".")
                for end in range(1, len(parts) + 1):
                    for candidate in ("/".join(parts[:end]) + ".py", "/".join(parts[:end]) + "/__init__.py"):
                        if candidate not in seen and (root / candidate).is_file():
                            seen.add(candidate)
                            queue.append(_source(root, candidate))
    return folder


def _source(root: Path, relative: str) -> SourceFile:
    text = (root / relative).read_text(encoding="utf-8", errors="surrogateescape")
    return SourceFile(relative, module_name(relative), text)


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
        for line in file.tree.body if file.tree else []:
            for node in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                if isinstance(node, cst.Import):
                    for alias in node.names:
                        name = alias.evaluated_name
                        if alias.evaluated_alias:
                            found[alias.evaluated_alias] = (name, None)
                        else:
                            found[name.split(".")[0]] = (name.split(".")[0], None)
                elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                    module = _from_module(file, node)
                    if module is None:
                        continue
                    for alias in node.names:
                        submodule = f"{module}.{alias.evaluated_name}"
                        found[alias.evaluated_alias or alias.evaluated_name] = (submodule, None) \
                            if submodule in self.modules else (module, alias.evaluated_name)
        self._bindings[file.path] = found
        return found

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


def _top_definition(tree: cst.Module, name: str) -> Optional[Definition]:
    found: Optional[Definition] = None
    for node in tree.body:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.name.value == name:
            found = node  # the last definition wins, as when the module runs
    return found
