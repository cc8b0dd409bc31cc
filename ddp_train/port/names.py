"""What the script calls Horovod: the names its imports bind, and the Horovod API an expression names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, Iterable, List, Mapping, Optional, Set, Tuple, cast

import libcst as cst
from libcst.metadata import CodeRange, ImportAssignment, Scope

from .walk import imports, nodes

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
    """A module of Horovod's: horovod, or one under it."""
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
    """What one walk of the parsed script tells the rewrite (port.walk's, which makes no node): the lines the names
    it asks about appear on, what the script calls load_state_dict on, and its quote style. (Which names the
    script binds, and where, is LibCST's ScopeProvider's: port.bindings.)"""

    loads_state: Set[str]
    #: the lines each name asked about, or dotted name an attribute is taken of, appears on
    lines: Dict[str, Set[int]]
    #: the quote most of the script's strings are written with
    quote: str

    def lines_of(self, names: Iterable[str]) -> Set[int]:
        """Every line any of `names` appears on."""
        found: Set[int] = set()
        for name in names:
            found |= self.lines.get(name, set())
        return found


#: the fields whose Name is no name the code reads or binds (Python's own tree holds a string there), and the
#: imports, global and nonlocal statements, whose names are the imports' own (HorovodNames) or not read there
NOT_READ = frozenset({
    (cst.Attribute, "attr"), (cst.FunctionDef, "name"), (cst.ClassDef, "name"), (cst.Param, "name"),
    (cst.Arg, "keyword"), (cst.ExceptHandler, "name"), (cst.ExceptStarHandler, "name"), (cst.MatchAs, "name"),
    (cst.MatchStar, "name"), (cst.MatchMapping, "rest"), (cst.MatchKeywordElement, "key"), (cst.TypeVar, "name"),
    (cst.TypeVarTuple, "name"), (cst.ParamSpec, "name"), (cst.Import, "names"), (cst.ImportFrom, "module"),
    (cst.ImportFrom, "names"), (cst.Global, "names"), (cst.Nonlocal, "names")})


def horovod_names(module: cst.Module) -> HorovodNames:
    """The names the module's imports bind to Horovod, at any depth (a name imported twice: the deeper import, or
    at one depth the later one, the last that ast.walk meets)."""
    names = HorovodNames()
    for node in imports(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                if is_horovod(alias.evaluated_name):
                    names.aliases[alias.evaluated_alias or "horovod"] = \
                        alias.evaluated_name if alias.asname else "horovod"
        elif node.module is not None and not node.relative and is_horovod(_module_name(node.module)) \
                and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                names.aliases[alias.evaluated_alias or alias.evaluated_name] = \
                    f"{_module_name(node.module)}.{alias.evaluated_name}"
    return names


def _quoted(node: cst.BaseString) -> Tuple[Optional[str], int]:
    """A string literal as the quote style counts it: the quote its first part opens with (None: bytes, a triple
    quote or an f-string, not counted) and how many strings it is to Python: one, or for a concatenation with an
    f-string in it, one per run of text between its replacement fields."""
    parts: List[cst.BaseString] = []
    while isinstance(node, cst.ConcatenatedString):
        parts.append(node.left)
        node = node.right
    parts.append(node)
    first = parts[0]
    if not isinstance(first, cst.SimpleString) or "b" in first.prefix.lower() or len(first.quote) != 1:
        return None, 0
    if all(isinstance(part, cst.SimpleString) for part in parts):
        return first.quote, 1
    runs, text = 0, False
    for part in parts:
        if isinstance(part, cst.SimpleString):
            text = text or bool(part.raw_value)
            continue
        for piece in cast(cst.FormattedString, part).parts:
            if isinstance(piece, cst.FormattedStringText):
                text = text or bool(piece.value)
            else:  # a replacement field ends a run of text; f"{x=}" writes "x=" as text before it
                runs += text or cast(cst.FormattedStringExpression, piece).equal is not None
                text = False
    return first.quote, runs + text


def survey(module: cst.Module, positions: Mapping[cst.CSTNode, CodeRange], wanted: AbstractSet[str]) -> Survey:
    """One walk of a parsed script (`positions`: its nodes' ranges): the lines each of `wanted` appears on, what
    the script calls load_state_dict on, and the quote most of its strings are written with."""
    loads: Set[str] = set()
    lines: Dict[str, Set[int]] = {}
    quotes = {"'": 0, '"': 0}
    parts: Set[int] = set()  # the strings of a concatenation, counted with it
    for node in nodes(module, NOT_READ):
        name = node.value if isinstance(node, cst.Name) else \
            dotted(node.value) if isinstance(node, cst.Attribute) else None
        if name in wanted:
            where = positions[node]
            lines.setdefault(cast(str, name), set()).update(range(where.start.line, where.end.line + 1))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value == "load_state_dict":
            receiver = dotted(node.func.value)
            if receiver:
                loads.add(receiver)
        elif isinstance(node, (cst.SimpleString, cst.ConcatenatedString)) and id(node) not in parts:
            quote, count = _quoted(node)
            if quote is not None:
                quotes[quote] += count
        if isinstance(node, cst.ConcatenatedString):
            parts.update((id(node.left), id(node.right)))
    return Survey(loads, lines, "'" if quotes["'"] > quotes['"'] else '"')
