"""The rewrite pass: the porter walks the statements that name Horovod or a wrapped model, asks the rules
(port.statements, port.expressions, port.wrapped) what to write where their idiom is, and applies their edits;
the script's own code stays as it is, and what names Horovod but no rule ports is marked (port.unported)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple, TypeVar, Union, cast

import libcst as cst
from libcst.metadata import PositionProvider

from . import accumulation, expressions, statements, wrapped
from .accumulation import Site
from .bindings import Bindings
from .context import Context, above, code, with_above
from .names import horovod_import, label
from .plan import Plan, Wrap, called, single
from .rule import StatementRule, StatementSite
from .unported import comment_line, reason, references, with_comment

Node = TypeVar("Node", bound=cst.CSTNode)
Statements = Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement], cst.RemovalSentinel]


class Porter(cst.CSTTransformer):
    """Applies the rules (through a MetadataWrapper, for the source's lines)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, ctx: Context, plan: Plan, bindings: Bindings, sites: Dict[int, tuple[Site, Wrap]],
                 config: cst.PartialParserConfig, horovod_lines: Set[int], model_lines: Set[int]) -> None:
        super().__init__()
        #: the lines that name Horovod, and those that name a wrapped model or its optimizer: no other
        #: statement has anything to port, and the rewrite does not walk through it
        self.horovod_lines = horovod_lines
        self.relevant = horovod_lines | model_lines
        self.ctx = ctx
        self.plan = plan
        self.bindings = bindings
        self.sites = sites
        self.config = config
        self.functions: List[cst.FunctionDef] = []
        self.classes: List[cst.ClassDef] = []
        self.owned: Dict[int, Tuple[StatementRule, StatementSite]] = {}  # statements a rule ports whole
        self.removed: Dict[int, cst.CSTNode] = {}  # markers of removed statements (held: their ids stay theirs)
        self.imports: Dict[str, int] = {}  # a Horovod import statement's code -> its line
        self.used: Set[str] = set()  # Horovod names what is left unported still uses
        #: the statements of the blocks that hold a no_sync site, and what the rewrite made of each
        self.watched = {id(s) for site, _ in sites.values() for s in site.placed.block.body}
        self.produced: Dict[int, Union[cst.CSTNode, cst.FlattenSentinel, cst.RemovalSentinel]] = {}
        self.module: Optional[cst.Module] = None

    # -- helpers ------------------------------------------------------------------------------------------------

    def line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def parse(self, text: str) -> cst.BaseStatement:
        return cst.parse_statement(text + "\n", config=self.config)

    def marker(self, updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """A statement to remove: taken out of its block, keeping the blank lines above it."""
        gone = updated.with_changes(body=[cst.Pass()], trailing_whitespace=cst.TrailingWhitespace())
        self.removed[id(gone)] = gone
        return gone

    def replaced(self, updated: cst.BaseStatement, texts: Sequence[str],
                 comments: Sequence[str] = ()) -> Statements:
        """Statements `texts` in place of `updated`, under its comments (and any `# port:` ones): a rule's
        `Replace` applied."""
        if not texts:
            assert isinstance(updated, cst.SimpleStatementLine)
            return self.marker(updated)
        new = [self.parse(t) for t in texts]
        first: cst.BaseStatement = with_above(new[0], above(updated))
        for text in comments:
            first = cast(cst.BaseStatement, with_comment(first, text))
        return cst.FlattenSentinel([first, *new[1:]])

    def _column(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.column

    def _span(self, node: cst.CSTNode) -> range:
        where = self.get_metadata(PositionProvider, node)
        return range(where.start.line, where.end.line + 1)

    def on_visit(self, node: cst.CSTNode) -> bool:
        walk = super().on_visit(node)
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return walk and any(line in self.relevant for line in self._span(node))
        return walk

    def on_leave(self, original_node: Node, updated_node: Node
                 ) -> Union[Node, cst.RemovalSentinel, cst.FlattenSentinel[Node]]:
        result = super().on_leave(original_node, updated_node)
        if id(original_node) in self.watched:
            self.produced[id(original_node)] = result
        return result

    def _leave_unported(self, original: cst.CSTNode, updated: cst.CSTNode, parts: Sequence[cst.CSTNode]) -> cst.CSTNode:
        """Mark and record what of `parts` still names Horovod."""
        if not any(line in self.horovod_lines for line in self._span(original)):
            return updated
        scope = self.bindings.scope_of(original)
        left = references(self.ctx.names, parts, scope)
        if not left:
            return updated
        self.used |= {code(node).split(".")[0] for node in left}
        api = self.ctx.names.api(left[0], scope) or code(left[0])
        why = reason(api)
        self.ctx.leave(self.line(original), original, why)
        return with_comment(updated, comment_line(code(left[0]), why, self._column(original)))

    # -- scopes --------------------------------------------------------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> Statements:
        self.functions.pop()
        return self._statement_left(original_node, updated_node,
                                    [*updated_node.decorators, updated_node.params])

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> Statements:
        self.classes.pop()
        return self._statement_left(original_node, updated_node,
                                    [*updated_node.decorators, *updated_node.bases, *updated_node.keywords])

    # -- statements ----------------------------------------------------------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        call = called(node)
        if call is None:
            return True
        site = StatementSite(node, call, self.ctx.names.api(call.func), self.line(node), self.scope(), self.ctx,
                             self.plan)
        rule = statements.rule_for(site)
        if rule is None:
            return True
        self.owned[id(node)] = (rule, site)
        return False

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> Statements:
        if id(original_node) in self.owned:
            rule, site = self.owned[id(original_node)]
            edit = rule.port(site)
            if edit is None:
                return self._statement_left(original_node, updated_node, [updated_node])
            return self.replaced(updated_node, edit.texts, edit.comments)
        small = single(original_node)
        if small is not None and horovod_import(small):
            self.imports.setdefault(code(small), self.line(original_node))
            return updated_node
        return self._statement_left(original_node, updated_node, [updated_node])

    def scope(self) -> Union[cst.Module, cst.FunctionDef]:
        """The function the rewrite is in, else the module."""
        if self.functions:
            return self.functions[-1]
        assert self.module is not None
        return self.module

    def _made(self, statement: cst.BaseStatement) -> List[cst.BaseStatement]:
        """What the rewrite made of an original statement of a watched block."""
        made = self.produced.get(id(statement), statement)
        if isinstance(made, cst.RemovalSentinel):
            return []
        if isinstance(made, cst.FlattenSentinel):
            return list(made.nodes)
        return [cast(cst.BaseStatement, made)]

    def _with_no_sync(self, block: cst.IndentedBlock) -> List[cst.BaseStatement]:
        """The block's statements as the rewrite made them, each no_sync site's passes wrapped as its rule says
        (port.accumulation)."""
        starts = {site.first: (site, wrap) for site, wrap in self.sites.values() if site.placed.block is block}
        body: List[cst.BaseStatement] = []
        index = 0
        while index < len(block.body):
            if index not in starts:
                body += self._made(block.body[index])
                index += 1
                continue
            edit = accumulation.under_no_sync(*starts[index], self.ctx)
            inner = [s for i in range(edit.first, edit.last + 1) for s in self._made(block.body[i])]
            inner = self._without_removed(inner)
            header = self.parse(f"{edit.header}\n    pass")
            assert isinstance(header, cst.BaseCompoundStatement) and isinstance(header.body, cst.IndentedBlock)
            body.append(header.with_changes(leading_lines=above(inner[0]), body=header.body.with_changes(
                body=[with_above(inner[0], []), *inner[1:]])))
            index = edit.last + 1
        return body

    # -- compound statements ---------------------------------------------------------------------------------------

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> Statements:
        if wrapped.skip_synchronize(updated_node, self.line(original_node), self.plan, self.ctx) is not None:
            assert isinstance(updated_node.body, cst.IndentedBlock)
            body: List[cst.BaseStatement] = list(updated_node.body.body)
            body[0] = with_above(body[0], [*updated_node.leading_lines, *above(body[0])])
            return cst.FlattenSentinel(body)
        return self._statement_left(original_node, updated_node, [i.item for i in updated_node.items])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Statements:
        return self._statement_left(original_node, updated_node, [updated_node.test])

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> Statements:
        return self._statement_left(original_node, updated_node, [updated_node.test])

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> Statements:
        return self._statement_left(original_node, updated_node, [updated_node.target, updated_node.iter])

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler,
                            updated_node: cst.ExceptHandler) -> cst.ExceptHandler:
        return cast(cst.ExceptHandler, self._leave_unported(
            original_node, updated_node, [updated_node.type] if updated_node.type is not None else []))

    def _statement_left(self, original: cst.CSTNode, updated: cst.CSTNode, parts: Sequence[cst.CSTNode]) -> Statements:
        return cast(cst.BaseStatement, self._leave_unported(original, updated, parts))

    # -- expressions -------------------------------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        api = self.ctx.names.api(original_node.func)
        rule = expressions.CALLS.get(api) if api is not None else None
        if api is None or rule is None:
            return updated_node
        found = rule(self.ctx, api, updated_node, self.bindings.scope_of(original_node))
        if found is None:
            return updated_node
        text = f"{code(original_node.func)}(...)" if original_node.args else code(original_node)
        self.ctx.change(self.line(original_node), label(api), f"{text} -> {found.text}: {found.does}")
        return cst.parse_expression(found.text, config=self.config)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        api = self.ctx.names.api(original_node)
        if api is not None:
            return self._constant(original_node, updated_node, api)
        if original_node.attr.value in wrapped.DDP_SURFACE:
            return updated_node
        assert self.module is not None
        reading = wrapped.Reading(original_node, self.line(original_node), tuple(self.functions),
                                  tuple(self.classes), self.module)
        through = wrapped.model_attribute(reading, self.plan, self.bindings, self.ctx)
        if through is None:
            return updated_node
        return updated_node.with_changes(value=cst.Attribute(value=updated_node.value, attr=cst.Name(through.via)))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        api = self.ctx.names.api(original_node)
        return updated_node if api is None else self._constant(original_node, updated_node, api)

    def _constant(self, original: cst.BaseExpression, updated: cst.BaseExpression, api: str) -> cst.BaseExpression:
        found = expressions.constant(self.ctx, api)
        if found is None:
            return updated
        self.ctx.change(self.line(original), label(api), f"{code(original)} -> {found.text}: {found.does}",
                        changes_training=found.effect is not None, effect=found.effect)
        return cst.parse_expression(found.text, config=self.config)

    # -- blocks: removed statements leave their blank lines, and no block is left empty -------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        statements = self._with_no_sync(original_node) if any(
            site.placed.block is original_node for site, _ in self.sites.values()) else updated_node.body
        body = self._without_removed(statements)
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine(body=[cst.Pass()])])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._without_removed(updated_node.body))

    def _without_removed(self, body: Sequence[cst.BaseStatement]) -> List[cst.BaseStatement]:
        kept: List[cst.BaseStatement] = []
        carried: List[cst.EmptyLine] = []
        for statement in body:
            if id(statement) in self.removed:
                lines = above(statement)
                while lines and lines[-1].comment is not None:
                    lines.pop()  # the comment that says what the removed statement did goes with it
                carried += lines
                continue
            if carried:
                statement = with_above(statement, _merged(carried, above(statement)))
                carried = []
            kept.append(statement)
        return kept


def _blank_runs(lines: Sequence[cst.EmptyLine]) -> int:
    """The longest run of blank lines in `lines`."""
    longest = run = 0
    for line in lines:
        run = run + 1 if line.comment is None else 0
        longest = max(longest, run)
    return longest


def _merged(carried: Sequence[cst.EmptyLine], own: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
    """The lines above a removed statement followed by those above the next one, with no longer run of blank
    lines than either had."""
    limit = max(_blank_runs(carried), _blank_runs(own))
    merged: List[cst.EmptyLine] = []
    run = 0
    for line in [*carried, *own]:
        run = run + 1 if line.comment is None else 0
        if run <= limit:
            merged.append(line)
    return merged
