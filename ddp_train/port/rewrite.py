"""One port: parse the script (LibCST keeps every comment and space), plan, rewrite, fix the imports, report."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from . import accumulation
from .bindings import Bindings, bindings
from .context import Context, Options
from .ending import end_cleanly
from .imports import finish
from .follow import Handed, Skipping
from .names import HorovodNames, horovod_names, survey
from .plan import Assignment, Plan, Wrap, plan
from .project import SourceFile
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


@dataclass(frozen=True)
class Links:
    """What the port of one file learns from the rest of its folder (port.follow): the functions of this file that
    hold a model and optimizer wrapped elsewhere, where other files run a wrap's passes under no_sync (by the
    wrap's optimizer name), and why a wrapped model can skip parameters in a step (by the model's name)."""

    handed: Tuple[Handed, ...] = ()
    synced_elsewhere: Tuple[Tuple[str, str], ...] = ()
    skipping: Tuple[Tuple[str, Skipping], ...] = ()


@dataclass
class Prepared:
    """A file parsed for the port: its text, Horovod names and, where there is something to port, its LibCST
    module (in its MetadataWrapper), bindings and plan."""

    text: str
    source: str
    names: HorovodNames
    wrapper: Optional[cst.MetadataWrapper] = None
    bound: Optional[Bindings] = None
    plan: Optional[Plan] = None


def refusal(source: str, text: str, error: Optional[Exception]) -> PortError:
    """The one line that refuses `text` (read from `source`), which LibCST could not parse (`error`): Python's own
    account of its syntax error, the line, column and message the user knows (LibCST's points past it, at the
    token it could not take), else LibCST's."""
    line, column, what = 1, 1, str(error)
    if isinstance(error, cst.ParserSyntaxError):
        line, column, what = error.editor_line, error.editor_column, error.message.strip().splitlines()[0]
    elif isinstance(error, UnicodeEncodeError):  # a byte that is not UTF-8, read with surrogateescape
        line = text.count("\n", 0, error.start) + 1
        column = error.start - text.rfind("\n", 0, error.start)
        return PortError(_unreadable(source, line, column, "a byte that is not UTF-8"))
    try:  # compiled only because it is refused: Python tells where its syntax error is
        compile(text, source, "exec", dont_inherit=True)
    except SyntaxError as syntax:
        return PortError(_unreadable(source, syntax.lineno or line, syntax.offset or 1, syntax.msg))
    return PortError(_unreadable(source, line, column, what))


def prepare(text: str, source: str, parse_always: bool = False) -> Prepared:
    """Parse `text` (read from `source`); its LibCST plan too where it uses Horovod or `parse_always`."""
    return prepare_file(SourceFile(source, None, text), source, parse_always)


def prepare_file(file: SourceFile, source: Optional[str] = None, parse_always: bool = False) -> Prepared:
    """Prepare a file from its module, parsed once (a PortError naming `source`, else its path, where it cannot
    be parsed); its plan too where it uses Horovod or `parse_always`."""
    source = source or file.path
    if file.tree is None:
        raise refusal(source, file.text, file.error)
    names = horovod_names(file.tree)
    prepared = Prepared(file.text, source, names)
    if not names.aliases and not parse_always:
        return prepared
    prepared.wrapper = file.wrapper
    prepared.bound = bindings(prepared.wrapper)
    prepared.names = replace(names, scopes=prepared.bound.scopes)  # each Horovod name read in its scope from here
    prepared.plan = plan(prepared.wrapper, prepared.names)
    return prepared


def handed_sites(prepared: Prepared, handed: Handed) -> List[accumulation.Site]:
    """The passes of a function that holds a model and optimizer wrapped elsewhere to run under no_sync."""
    if prepared.plan is None or prepared.bound is None or handed.model is None or handed.optimizer is None \
            or handed.passes is None:
        return []
    inside = [b for b in prepared.plan.backwards
              if isinstance(b.scope, cst.FunctionDef) and b.scope.name.value == handed.function]
    found, _ = accumulation.sites(inside, handed.optimizer, handed.model, prepared.bound)
    return found


def port(text: str, source: str, output: str | None, options: Optional[Options] = None) -> Ported:
    """Port the Horovod script `text` (read from `source`, to be written to `output`)."""
    return port_prepared(prepare(text, source), output, options)


def port_prepared(prepared: Prepared, output: str | None, options: Optional[Options] = None,
                  links: Optional[Links] = None) -> Ported:
    """Port a prepared file, with what the rest of its folder tells (`links`)."""
    links = links or Links()
    started = time.perf_counter()
    report = PortReport(source=prepared.source, output=output)
    names, the_plan, bound, wrapper = prepared.names, prepared.plan, prepared.bound, prepared.wrapper
    has_handed = bool(links.handed)
    if (not names.aliases and not has_handed) or the_plan is None or bound is None or wrapper is None:
        report.seconds = time.perf_counter() - started  # no Horovod: a DDP script stays as it is
        return Ported(prepared.text, report)
    module = wrapper.module
    models = {w.model for w in the_plan.wraps if w.model} | {w.target for w in the_plan.wraps} | \
        {name for h in links.handed for name in (h.model, h.optimizer) if name}
    found = survey(module, bound.positions, set(names.aliases) | models)
    ctx = Context(names, bound.bound, found.quote, options or Options())
    ctx.loads_state = found.loads_state
    ctx.compressions = _compressions(ctx, the_plan.assignments)
    ctx.skipping = dict(links.skipping)
    ctx.handed_models = {h.function: h.model for h in links.handed if h.model}
    sites: Dict[int, tuple[accumulation.Site, Wrap]] = {}
    elsewhere = dict(links.synced_elsewhere)
    for wrap in the_plan.wraps:
        passes = wrap.options.get("backward_passes_per_step")
        if wrap.model is None or passes is None or (isinstance(passes, cst.Integer) and passes.value == "1"):
            continue
        wrapped, _ = accumulation.sites(the_plan.backwards, wrap.target, wrap.model, bound)
        for site in wrapped:
            sites[id(site.placed.statement)] = (site, wrap)
            wrap.no_sync_sites += 1
        wrap.no_sync_sites += 1 if wrap.target in elsewhere else 0
    for handed in links.handed:
        for site in handed_sites(prepared, handed):
            assert handed.model is not None and handed.optimizer is not None and handed.passes is not None
            held = Wrap(site.placed, handed.optimizer, {"backward_passes_per_step": cst.parse_expression(
                handed.passes)}, handed.model, site.placed, origin=handed.origin)
            sites[id(site.placed.statement)] = (site, held)
    porter = Porter(ctx, the_plan, bound, sites, module.config_for_parsing,
                    found.lines_of(names.aliases), found.lines_of(models))
    rewritten = wrapper.visit(porter)
    rewritten = end_cleanly(rewritten, ctx, models)  # before finish(), which writes the helper it uses
    rewritten = finish(rewritten, ctx, porter.imports, porter.used)
    report.changes = sorted(ctx.changes, key=lambda c: c.line)
    report.unported = sorted(ctx.unported, key=lambda u: u.line)
    report.zero_step = ctx.zero_step
    report.seconds = time.perf_counter() - started
    return Ported(rewritten.code, report)
