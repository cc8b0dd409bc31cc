"""One port: parse the script (LibCST keeps every comment and space), plan, rewrite, fix the imports, report."""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence

import libcst as cst

from . import accumulation
from .bindings import bindings
from .context import Context, Options
from .imports import finish
from .names import survey
from .plan import Assignment, Wrap, plan
from .report import PortReport
from .transform import Porter


class PortError(ValueError):
    """A script the port cannot read: one line, naming where and what."""


@dataclass(frozen=True)
class Ported:
    """The port's source and its report."""

    code: str
    report: PortReport


def _unreadable(source: str, line: object, column: object, what: str) -> str:
    """The one line that refuses a script."""
    return f"{source}:{line}:{column}: not Python the port can read ({what}); fix the syntax and run the port again"


def _compressions(ctx: Context, assignments: Sequence[Assignment]) -> Dict[str, bool]:
    """Variables every assignment of which is a Horovod compression (or a choice between two)."""
    kinds: Dict[str, bool] = {}
    for assignment in assignments:
        value = assignment.value
        parts = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        ok = all(str(ctx.names.api(p)).startswith("Compression.") for p in parts)
        kinds[assignment.name] = kinds.get(assignment.name, True) and ok
    return {name: True for name, ok in kinds.items() if ok and "." not in name}


def port(text: str, source: str, output: str | None, options: Optional[Options] = None) -> Ported:
    """Port the Horovod script `text` (read from `source`, to be written to `output`)."""
    started = time.perf_counter()
    try:
        found = survey(ast.parse(text, filename=source), text)
    except SyntaxError as syntax:  # Python's own account: the line and message the user knows
        raise PortError(_unreadable(source, syntax.lineno, syntax.offset or 1, syntax.msg)) from None
    report = PortReport(source=source, output=output)
    if not found.names.aliases:  # no Horovod: a DDP script stays as it is
        report.seconds = time.perf_counter() - started
        return Ported(text, report)
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise PortError(_unreadable(source, exc.editor_line, exc.editor_column,
                                    exc.message.strip().splitlines()[0])) from None
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    bound = bindings(wrapper)
    names = replace(found.names, scopes=bound.scopes)  # Horovod's names, each resolved in its scope from here on
    the_plan = plan(wrapper, names)
    ctx = Context(names, bound.bound, found.quote, options or Options())
    ctx.loads_state = found.loads_state
    ctx.compressions = _compressions(ctx, the_plan.assignments)
    sites: Dict[int, tuple[accumulation.Site, Wrap]] = {}
    for wrap in the_plan.wraps:
        passes = wrap.options.get("backward_passes_per_step")
        if wrap.model is None or passes is None or (isinstance(passes, cst.Integer) and passes.value == "1"):
            continue
        wrapped, _ = accumulation.sites(the_plan.backwards, wrap.target, wrap.model, bound)
        for site in wrapped:
            sites[id(site.placed.statement)] = (site, wrap)
            wrap.no_sync_sites += 1
    models = {w.model for w in the_plan.wraps if w.model} | {w.target for w in the_plan.wraps}
    porter = Porter(ctx, the_plan, bound, sites, module.config_for_parsing,
                    found.lines_of(found.names.aliases), found.lines_of(models))
    rewritten = wrapper.visit(porter)
    rewritten = finish(rewritten, ctx, porter.imports, porter.used)
    report.changes = sorted(ctx.changes, key=lambda c: c.line)
    report.unported = sorted(ctx.unported, key=lambda u: u.line)
    report.zero_step = ctx.zero_step
    report.seconds = time.perf_counter() - started
    return Ported(rewritten.code, report)


