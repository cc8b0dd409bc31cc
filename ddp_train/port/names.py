"""What the script calls Horovod: the names its imports bind, and the Horovod API an expression names."""

from __future__ import annotations

from dataclasses import dataclass, field
import ast
from typing import Dict, Iterable, Optional, Set

import libcst as cst

#: Horovod's torch modules whose names horovod.torch re-exports: horovod.torch.mpi_ops.allreduce is hvd.allreduce
SUBMODULES = ("mpi_ops", "functions", "optimizer", "compression", "sync_batch_norm")

def dotted(node: cst.BaseExpression) -> Optional[str]:
    """"a.b.c" for a Name or a chain of attributes on one, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _module_name(node: cst.BaseExpression) -> str:
    return dotted(node) or ""


def is_horovod(module: str) -> bool:
    return module == "horovod" or module.startswith("horovod.")


@dataclass
class HorovodNames:
    """Local names bound to Horovod: {"hvd": "horovod.torch", "horovod": "horovod", "allreduce":
    "horovod.torch.allreduce"}."""

    aliases: Dict[str, str] = field(default_factory=dict)

    def api(self, node: cst.BaseExpression) -> Optional[str]:
        """The Horovod API `node` names, without the "horovod.torch." prefix ("rank", "Compression.fp16",
        "horovod.run" for what is not under horovod.torch), or None when it names no Horovod object."""
        name = dotted(node)
        if not name:
            return None
        head, _, rest = name.partition(".")
        if head not in self.aliases:
            return None
        full = self.aliases[head] + (f".{rest}" if rest else "")
        for sub in SUBMODULES:
            full = full.replace(f"horovod.torch.{sub}.", "horovod.torch.")
        if full.startswith("horovod.torch."):
            return full[len("horovod.torch."):]
        return full


def horovod_import(small: cst.CSTNode) -> bool:
    """An import statement that imports something of Horovod."""
    if isinstance(small, cst.Import):
        return any(is_horovod(_module_name(alias.name)) for alias in small.names)
    if isinstance(small, cst.ImportFrom):
        return small.module is not None and not small.relative and is_horovod(_module_name(small.module))
    return False


@dataclass
class Survey:
    """What one walk of Python's own syntax tree tells before the rewrite (fast: ast is C): the Horovod names,
    every name the script binds, and what it calls load_state_dict on."""

    names: HorovodNames
    bound: Set[str]
    loads_state: Set[str]
    #: the lines each name, and each dotted name an attribute is taken of, appears on
    lines: Dict[str, Set[int]]
    #: the quote most of the script's strings are written with
    quote: str

    def lines_of(self, names: Iterable[str]) -> Set[int]:
        """Every line any of `names` appears on."""
        found: Set[int] = set()
        for name in names:
            found |= self.lines.get(name, set())
        return found


def _ast_dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _ast_dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def survey(tree: ast.Module, text: str) -> Survey:
    """Survey a parsed script (`text` its source)."""
    names = HorovodNames()
    bound: Set[str] = set()
    loads: Set[str] = set()
    lines: Dict[str, Set[int]] = {}
    quotes = {"'": 0, '"': 0}
    source = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else _ast_dotted(node.value)
            if name:
                lines.setdefault(name, set()).update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno <= len(source):
            start = source[node.lineno - 1][node.col_offset:].lstrip("rbuRBU")
            if start[:1] in quotes and not start.startswith(start[:1] * 3):
                quotes[start[:1]] += 1
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound.add(alias.asname or alias.name.split(".")[0])
                if is_horovod(alias.name):
                    names.aliases[alias.asname or "horovod"] = alias.name if alias.asname else "horovod"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if node.module and not node.level and is_horovod(node.module) and alias.name != "*":
                    names.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "load_state_dict":
            receiver = _ast_dotted(node.func.value)
            if receiver:
                loads.add(receiver)
    return Survey(names, bound, loads, lines, "'" if quotes["'"] > quotes['"'] else '"')


class _BindingFinder(cst.CSTVisitor):
    """Every name the module binds anywhere: assignments, parameters, imports, definitions, loop targets."""

    def __init__(self) -> None:
        self.bound: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        pass

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.bound |= _target_names(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.bound |= _target_names(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bound |= _target_names(node.target)

    def visit_For(self, node: cst.For) -> None:
        self.bound |= _target_names(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.bound |= _target_names(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self.bound |= _target_names(node.name)

    def visit_Param(self, node: cst.Param) -> None:
        self.bound.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bound.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bound.add(node.name.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bound |= _target_names(node.target)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is None:
            self.bound.add(_module_name(node.name).split(".")[0])


def _target_names(node: cst.BaseExpression) -> Set[str]:
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, (cst.Tuple, cst.List)):
        found: Set[str] = set()
        for element in node.elements:
            found |= _target_names(element.value)
        return found
    if isinstance(node, cst.StarredElement):
        return _target_names(node.value)
    return set()


def bound_names(node: cst.CSTNode) -> Set[str]:
    """Every name bound anywhere in `node`."""
    finder = _BindingFinder()
    node.visit(finder)
    return finder.bound


def target_names(node: cst.BaseExpression) -> Set[str]:
    """The names an assignment target binds."""
    return _target_names(node)
