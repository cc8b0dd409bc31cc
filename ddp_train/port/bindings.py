"""Every name the script binds, and where: one walk of LibCST's ScopeProvider, which the rest of the port asks
instead of collecting bindings itself (which names the port must not take, what a function binds locally, what
a run of statements assigns, and whether a name in a scope is the script's Horovod import or a local of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import Assignment, CodeRange, PositionProvider, Scope, ScopeProvider


@dataclass(frozen=True)
class Bindings:
    """The script's bindings, by scope: `scopes` maps each node of the parsed module to its scope."""

    scopes: Mapping[cst.CSTNode, Optional[Scope]]
    #: every name bound anywhere in the script (the port takes other names for what it adds)
    bound: Set[str]
    #: (line, name) of every binding, in the order of the lines
    lines: Tuple[Tuple[int, str], ...]
    positions: Mapping[cst.CSTNode, CodeRange]

    def scope_of(self, node: cst.CSTNode) -> Optional[Scope]:
        """The scope `node` (a node of the parsed module) is evaluated in."""
        return self.scopes.get(node)

    def locals_of(self, function: cst.FunctionDef) -> Set[str]:
        """The names `function` binds in its own scope (parameters, assignments, loops, imports, definitions)."""
        scope = self.scopes.get(function.body)
        if scope is None or scope is self.scopes.get(function):
            return set()
        return {_head(a.name) for a in scope.assignments}

    def bound_in(self, nodes: Iterable[cst.CSTNode]) -> Set[str]:
        """The names bound anywhere inside `nodes` (statements of the parsed module), nested scopes included."""
        found: Set[str] = set()
        for node in nodes:
            where = self.positions[node]
            first, last = where.start.line, where.end.line
            found |= {name for line, name in self.lines if first <= line <= last}
        return found


def bindings(wrapper: cst.MetadataWrapper) -> Bindings:
    """The bindings of the module `wrapper` holds (ScopeProvider resolved once, for every walk of the port)."""
    scopes = wrapper.resolve(ScopeProvider)
    positions = wrapper.resolve(PositionProvider)
    bound: Set[str] = set()
    lines: List[Tuple[int, str]] = []
    seen: Dict[int, Scope] = {}
    for scope in scopes.values():
        if scope is None or id(scope) in seen:
            continue
        seen[id(scope)] = scope
        for assignment in scope.assignments:
            name = _head(assignment.name)
            bound.add(name)
            if isinstance(assignment, Assignment) and assignment.node in positions:
                lines.append((positions[assignment.node].start.line, name))
    return Bindings(scopes, bound, tuple(sorted(lines)), positions)


def _head(name: str) -> str:
    """What `import a.b` binds: `a` (ScopeProvider names the assignment "a.b")."""
    return name.split(".")[0]
