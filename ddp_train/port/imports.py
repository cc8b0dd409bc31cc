"""The port's imports and helpers: Horovod's imports go (unless something left unported still uses them),
torch.distributed's and DDP's come in their place, the standard library's among the script's own, and the
helpers the rules used follow the last import."""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from . import helpers
from .context import Context, above, code, with_above
from .names import HorovodNames, horovod_import, is_horovod

STDLIB = frozenset(sys.stdlib_module_names)
#: the order new imports are written in
ORDER = ("os", "contextlib", "torch", "dist", "DDP", "default_hooks")


def _statement(key: str, name: Callable[[str], str]) -> Tuple[str, str]:
    """(module it imports, import statement) for an import key."""
    if key == "dist":
        return "torch.distributed", f"import torch.distributed as {name('dist')}"
    if key == "DDP":
        alias = "" if name("DDP") == "DistributedDataParallel" else f" as {name('DDP')}"
        return "torch.nn.parallel", f"from torch.nn.parallel import DistributedDataParallel{alias}"
    if key == "default_hooks":
        alias = "" if name("default_hooks") == "default_hooks" else f" as {name('default_hooks')}"
        return ("torch.distributed.algorithms.ddp_comm_hooks",
                f"from torch.distributed.algorithms.ddp_comm_hooks import default_hooks{alias}")
    return key, f"import {key}"


def _binds(statement: cst.BaseStatement) -> Set[str]:
    """What an import statement makes available: "import torch.distributed as dist" for `dist`,
    "import torch" for any `import torch[.x]`, "from m import n [as a]" for names."""
    found: Set[str] = set()
    if not isinstance(statement, cst.SimpleStatementLine):
        return found
    for small in statement.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                module = code(alias.name)
                if alias.asname is None:
                    found.add(f"import {module.split('.')[0]}")
                    found.add(f"import {module}")
                else:
                    found.add(f"import {module} as {code(alias.asname.name)}")
        elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative \
                and not isinstance(small.names, cst.ImportStar):
            module = code(small.module)
            for alias in small.names:
                asname = f" as {code(alias.asname.name)}" if alias.asname is not None else ""
                found.add(f"from {module} import {code(alias.name)}{asname}")
    return found


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and \
        all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def _root(statement: cst.BaseStatement) -> Optional[str]:
    """The top-level module a one-module import statement imports ("os" for `import os`)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Import) and len(small.names) == 1:
        return code(small.names[0].name).split(".")[0]
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return code(small.module).split(".")[0]
    return None


class _Trim(cst.CSTTransformer):
    """Horovod's names that nothing uses any more taken out of the import statements (nested ones included)."""

    def __init__(self, names: HorovodNames, used: Set[str], lines: Dict[str, int], ctx: Context) -> None:
        self.names = names
        self.used = used
        self.lines = lines
        self.ctx = ctx
        self.gone: List[cst.SimpleStatementLine] = []  # top-level ones emptied (markers kept in place)
        self.depth = 0

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        self.depth -= 1
        if not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
        return updated_node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        small = updated_node.body[0]
        if len(updated_node.body) != 1 or not horovod_import(small):
            return updated_node
        kept: List[cst.ImportAlias] = []
        assert isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar)
        for alias in small.names:
            if isinstance(small, cst.Import):
                module = code(alias.name)
                local = code(alias.asname.name) if alias.asname is not None else module.split(".")[0]
                horovod = is_horovod(module)
            else:
                local = code(alias.asname.name) if alias.asname is not None else code(alias.name)
                horovod = True
            if not horovod or local in self.used:
                kept.append(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        line = self.lines.get(code(small), 0)
        if kept == list(small.names) or (kept and len(kept) == len(small.names)):
            return updated_node
        if kept:
            self.ctx.change(line, "import", f"{code(small)} -> {code(small.with_changes(names=kept))}")
            return updated_node.with_changes(body=[small.with_changes(names=kept)])
        self.ctx.change(line, "import", f"{code(small)} removed: the port imports torch.distributed instead")
        if self.depth:
            return cst.RemovalSentinel.REMOVE
        self.gone.append(updated_node)
        return updated_node


def _helpers_source(ctx: Context) -> List[str]:
    """The helpers the rules used, in the order HELPERS lists them."""
    return [helpers.source(key, ctx.name, ctx.quote) for key in helpers.HELPERS if key in ctx.helpers]


# LibCST's RemoveImportsVisitor and AddImportsVisitor do not fit here. The first removes a whole statement (its
# blank lines and its place go with it) after its own scope analysis of the rewritten module, where the port knows
# which Horovod names are still used and keeps the emptied statement's place for torch.distributed's imports; the
# second writes every new import after the module's first import block, where the port puts the third-party ones
# in Horovod's place and the standard library's in order among the script's own, so that the port reads like a
# script written for DDP (and a second port changes nothing).


def finish(module: cst.Module, ctx: Context, lines: Dict[str, int], used: Set[str]) -> cst.Module:
    """`module` with its imports fixed and the helpers added; `lines` holds the Horovod import statements (their
    code, with their lines in the script), `used` the Horovod names still used."""
    module, gone = _trimmed(module, ctx, lines, used)
    body: List[cst.BaseStatement] = list(module.body)
    stdlib, others = _needed(ctx, body)
    config = module.config_for_parsing
    parsed = {t: cst.parse_statement(t + "\n", config=config) for _, t in [*stdlib, *others]}
    out, placed = _in_horovods_place(body, gone, [parsed[t] for _, t in others])
    if others and not placed:
        at = _after_imports(out)
        out[at:at] = [parsed[t] for _, t in others]
    for module_name, text in stdlib:
        _insert_stdlib(out, module_name, parsed[text])
    _add_helpers(out, _helpers_source(ctx), config)
    return module.with_changes(body=out)


def _trimmed(module: cst.Module, ctx: Context, lines: Dict[str, int], used: Set[str]) -> Tuple[cst.Module, Set[int]]:
    """`module` with Horovod's unused names out of its imports, and the top-level import statements emptied (kept
    in place as markers, by id)."""
    trim = _Trim(ctx.names, used, lines, ctx)
    top = [s for s in module.body if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
           and horovod_import(s.body[0])]
    if len(top) == len(lines):  # imports at the top only (the usual): no walk of the whole module
        kept_body: List[cst.BaseStatement] = []
        for line in module.body:
            if any(line is t for t in top):
                assert isinstance(line, cst.SimpleStatementLine)
                kept = trim.leave_SimpleStatementLine(line, line)
                if isinstance(kept, cst.SimpleStatementLine):
                    kept_body.append(kept)
            else:
                kept_body.append(line)
        module = module.with_changes(body=kept_body)
    else:
        module = module.visit(trim)
    return module, {id(s) for s in trim.gone}


def _needed(ctx: Context, body: Sequence[cst.BaseStatement]) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """The import statements the rewrites need that the module does not have, as (module, statement): the
    standard library's, and the others, in ORDER."""
    present = set().union(*(_binds(s) for s in body)) if body else set()
    new: List[Tuple[str, str]] = []
    for key in (key for key in ORDER if key in ctx.imports):
        module_name, text = _statement(key, ctx.name)
        if key == "torch" and "import torch" in present:
            continue
        if text not in present:
            new.append((module_name, text))
    return [(m, t) for m, t in new if m in STDLIB], [(m, t) for m, t in new if m not in STDLIB]


def _in_horovods_place(body: Sequence[cst.BaseStatement], gone: Set[int],
                       others: Sequence[cst.BaseStatement]) -> Tuple[List[cst.BaseStatement], bool]:
    """`body` without the emptied Horovod imports, the first of which gives its place (and the lines above it) to
    `others`; whether they were placed."""
    out: List[cst.BaseStatement] = []
    carried: List[cst.EmptyLine] = []
    placed = False
    for statement in body:
        if id(statement) in gone:
            if not placed and others:
                first, *rest = others
                out += [with_above(first, above(statement)), *rest]
                placed = True
            else:
                carried += [line for line in above(statement) if line.comment is None][:1]
            continue
        if carried:
            if not above(statement):
                statement = with_above(statement, carried[:1])
            carried = []
        out.append(statement)
    return out, placed


def _after_imports(out: Sequence[cst.BaseStatement]) -> int:
    """Where a statement goes after the last import (after the docstring when there is none)."""
    imports_at = [i for i, s in enumerate(out) if _is_import(s)]
    return imports_at[-1] + 1 if imports_at else _after_docstring(out)


def _add_helpers(out: List[cst.BaseStatement], texts: Sequence[str], config: cst.PartialParserConfig) -> None:
    """The helpers' functions after the last import, two blank lines around each, as PEP 8 has them."""
    if not texts:
        return
    at = _after_imports(out)
    blank = cst.EmptyLine(indent=False)
    functions = [cst.parse_statement(text + "\n", config=config).with_changes(leading_lines=[blank, blank])
                 for text in texts]
    if at < len(out):
        follower = above(out[at])
        leading_blanks = next((i for i, line in enumerate(follower) if line.comment is not None), len(follower))
        if leading_blanks < 2:
            out[at] = with_above(out[at], [blank] * (2 - leading_blanks) + follower)
    out[at:at] = functions


def _after_docstring(body: Sequence[cst.BaseStatement]) -> int:
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) and \
            isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        return 1
    return 0


def _insert_stdlib(out: List[cst.BaseStatement], module_name: str, statement: cst.BaseStatement) -> None:
    """Among the script's standard-library imports, in alphabetical order where they are."""
    ours = [(i, _root(s)) for i, s in enumerate(out) if _is_import(s) and _root(s) in STDLIB]
    after = [i for i, root in ours if root is not None and root > module_name]
    if after:
        _insert_before(out, after[0], statement)
        return
    if ours:
        out.insert(ours[-1][0] + 1, statement)
        return
    imports_at = [i for i, s in enumerate(out) if _is_import(s)]
    at = imports_at[0] if imports_at else _after_docstring(out)
    if at < len(out):
        _insert_before(out, at, statement)
    else:
        out.insert(at, statement)


def _insert_before(out: List[cst.BaseStatement], at: int, statement: cst.BaseStatement) -> None:
    """`statement` before out[at], taking the lines above it."""
    lines = above(out[at])
    out[at] = with_above(out[at], [])
    out.insert(at, with_above(statement, lines))
