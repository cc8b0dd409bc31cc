"""Read-only walks of a LibCST module that make no nodes. A LibCST visitor rebuilds every node it passes (a walk
costs about half the parse; reading the fields, a twentieth), so the port's looks at code it does not rewrite
(the survey, the imports, the folder's other modules) read the nodes' fields instead."""

from __future__ import annotations

from dataclasses import fields
from typing import AbstractSet, Dict, Iterator, List, Sequence, Tuple, Union

import libcst as cst

#: fields that hold only layout (whitespace, comments, punctuation): no walk of the code goes into them
LAYOUT = frozenset({
    "lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "leading_lines", "lines_after_decorators", "header",
    "footer", "newline", "trailing_whitespace", "comma", "trailing_comma", "semicolon", "colon", "dot", "equal",
    "operator", "asynchronous", "relative", "whitespace_between"})
#: the fields of the nodes whose dataclass does not list them as the source writes them
SOURCE_ORDER: Dict[type, Tuple[str, ...]] = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
}
_FIELDS: Dict[type, Tuple[str, ...]] = {}

Field = Tuple[type, str]


def _fields(kind: type) -> Tuple[str, ...]:
    """The fields of a node type that can hold code, in the order the source writes them."""
    found = _FIELDS.get(kind)
    if found is None:
        found = SOURCE_ORDER.get(kind) or tuple(
            f.name for f in fields(kind) if f.name not in LAYOUT and not f.name.startswith("whitespace"))
        _FIELDS[kind] = found
    return found


def nodes(root: cst.CSTNode, passing: AbstractSet[Field] = frozenset()) -> Iterator[cst.CSTNode]:
    """`root` and every node of code under it, each before its children, in the order of the source; the fields
    in `passing` ((node type, field name)) are not gone into."""
    stack: List[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        yield node
        kind = type(node)
        children: List[cst.CSTNode] = []
        for name in _fields(kind):
            if (kind, name) in passing:
                continue
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                children.append(value)
            elif isinstance(value, (tuple, list)):
                children += [item for item in value if isinstance(item, cst.CSTNode)]
        stack += reversed(children)


def _suite(part: object) -> Sequence[cst.CSTNode]:
    """The statements of a block (an indented one, one after a colon, an else or a finally)."""
    if isinstance(part, (cst.Else, cst.Finally)):
        part = part.body
    if isinstance(part, (cst.IndentedBlock, cst.SimpleStatementSuite)):
        return part.body
    return ()


def statements(root: cst.CSTNode, depth: int = 1) -> Iterator[Tuple[int, cst.CSTNode]]:
    """Every statement inside `root` (a module or a compound statement), those of a line one by one, in the order
    of the source, each with its depth in Python's own syntax tree (a module's statements: 1), by which ast.walk
    orders them."""
    inside: List[Tuple[int, cst.CSTNode]] = []
    if isinstance(root, cst.Module):
        inside = [(depth, s) for s in root.body]
    else:
        inside = [(depth, s) for s in _suite(getattr(root, "body", None))]
        inside += [(depth, h) for h in (*getattr(root, "handlers", ()), *getattr(root, "cases", ()))]
        orelse = getattr(root, "orelse", None)
        inside += [(depth, orelse)] if isinstance(orelse, cst.If) else [(depth, s) for s in _suite(orelse)]
        inside += [(depth, s) for s in _suite(getattr(root, "finalbody", None))]
    for level, statement in inside:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from ((level, small) for small in statement.body)
        elif isinstance(statement, (cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)):
            yield from statements(statement, level + 1)  # a handler is a level of ast's tree of its own
        else:
            yield level, statement
            if isinstance(statement, cst.BaseCompoundStatement):
                yield from statements(statement, level + 1)


def imports(module: cst.Module) -> List[Union[cst.Import, cst.ImportFrom]]:
    """The module's imports at any depth, in the order Python's ast.walk meets them (by depth, then as written)."""
    found = sorted(statements(module), key=lambda item: item[0])
    return [s for _, s in found if isinstance(s, (cst.Import, cst.ImportFrom))]
