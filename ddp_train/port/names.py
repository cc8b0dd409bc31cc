"""What the script calls Horovod: the names its imports bind, and the Horovod API an expression names."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Set

import libcst as cst
from libcst.metadata import ImportAssignment, Scope

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
    "horovod.torch.allreduce"}, and each node's scope (LibCST's ScopeProvider, once the module is parsed), so
    that a parameter or local variable of the same name in a function is not taken for Horovod."""

    aliases: Dict[str, str] = field(default_factory=dict)
    scopes: Mapping[cst.CSTNode, Optional[Scope]] = field(default_factory=dict)

    def module_of(self, name: str, scope: Optional[Scope]) -> Optional[str]:
        """The Horovod module `name` stands for in `scope` (None: the module's scope), or None where it is not
        Horovod there: bound in that scope only by something other than a Horovod import."""
        module = self.aliases.get(name)
        if module is None or scope is None:
            return module
        # The name looked up in its scope, as QualifiedNameProvider does; not that provider itself: it names every
        # expression of the module up front (as long again as the rest of the port), and the rewrite asks about
        # nodes it has just made, which have no metadata, with the scope of the statement they came from.
        assignments = scope[name]
        # unbound in the scope's chain (imported in another function): still the script's Horovod name
        if assignments and not any(isinstance(a, ImportAssignment) and horovod_import(a.node) for a in assignments):
            return None
        return module

    def api(self, node: cst.BaseExpression, scope: Optional[Scope] = None) -> Optional[str]:
        """The Horovod API `node` names, without the "horovod.torch." prefix ("rank", "Compression.fp16",
        "horovod.run" for what is not under horovod.torch), or None when it names no Horovod object. `scope`
        is where `node` is read; without it, the scope the parsed module gives `node` (a node the rewrite
        made has none: pass the scope of the statement it came from)."""
        name = dotted(node)
        if not name:
            return None
        head, _, rest = name.partition(".")
        if head not in self.aliases:
            return None
        module = self.module_of(head, scope if scope is not None else self.scopes.get(node))
        if module is None:
            return None
        full = module + (f".{rest}" if rest else "")
        for sub in SUBMODULES:
            full = full.replace(f"horovod.torch.{sub}.", "horovod.torch.")
        if full.startswith("horovod.torch."):
            return full[len("horovod.torch."):]
        return full


def label(api: str) -> str:
    """How the report names an API: "hvd.rank" for horovod.torch's, the full name ("horovod.spark.run") otherwise."""
    return api if api.startswith("horovod.") else f"hvd.{api}"


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
    the lines names appear on, and what it calls load_state_dict on. (Which names the script binds, and where,
    is LibCST's ScopeProvider's: port.bindings.)"""

    names: HorovodNames
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
                if is_horovod(alias.name):
                    names.aliases[alias.asname or "horovod"] = alias.name if alias.asname else "horovod"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if node.module and not node.level and is_horovod(node.module) and alias.name != "*":
                    names.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "load_state_dict":
            receiver = _ast_dotted(node.func.value)
            if receiver:
                loads.add(receiver)
    return Survey(names, loads, lines, "'" if quotes["'"] > quotes['"'] else '"')
