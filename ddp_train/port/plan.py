"""The read-only pass before the rewrite: where the script wraps its optimizer (hvd.DistributedOptimizer) and
which model that optimizer trains, where DDP must wrap the model, every assignment (to find an optimizer's
constructor) and every backward pass with the loops around it (for no_sync)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import PositionProvider

from .context import arguments, code
from .names import HorovodNames, dotted

Scope = Union[cst.Module, cst.FunctionDef]
Block = Union[cst.Module, cst.IndentedBlock]


@dataclass
class Assignment:
    """`name = value` at a line of a scope."""

    name: str
    value: cst.BaseExpression
    line: int
    scope: Scope


@dataclass
class Placed:
    """A statement with where it is: the block holding it, its index there, its scope, its line, and every
    node above it (outermost first)."""

    statement: cst.SimpleStatementLine
    block: Block
    index: int
    scope: Scope
    line: int
    ancestors: Sequence[cst.CSTNode]


@dataclass
class Wrap:
    """An hvd.DistributedOptimizer to replace by DDP: `target = hvd.DistributedOptimizer(optimizer, **options)`,
    the model it trains (None when the script does not say) and the statement the DDP wrap replaces: the
    DistributedOptimizer's, or a later hvd.broadcast_parameters of the same model in the same block (the
    model's weights are final there: a rank-0 checkpoint may be loaded in between)."""

    placed: Placed
    target: str
    options: Dict[str, cst.BaseExpression]
    model: Optional[str]
    at: Placed
    #: the backward passes the port runs under no_sync for this wrap (backward_passes_per_step; port.accumulation)
    no_sync_sites: int = 0
    #: the line each option is written on (a call over several lines reports an option where it is)
    option_lines: Dict[str, int] = field(default_factory=dict)
    #: for a model and optimizer wrapped in another file and handed to a function here: that wrap's `file:line`
    origin: Optional[str] = None


@dataclass
class Plan:
    """What the rewrite needs to know before it starts."""

    wraps: List[Wrap] = field(default_factory=list)
    broadcasts: List[Placed] = field(default_factory=list)
    assignments: List[Assignment] = field(default_factory=list)
    backwards: List[Placed] = field(default_factory=list)

    def wrap_at(self, statement: cst.CSTNode) -> Optional[Wrap]:
        """The wrap that replaces `statement`, if one does."""
        return next((w for w in self.wraps if w.at.statement is statement), None)

    def wrap_of(self, statement: cst.CSTNode) -> Optional[Wrap]:
        """The wrap of the hvd.DistributedOptimizer `statement`, if it is one."""
        return next((w for w in self.wraps if w.placed.statement is statement), None)

    def assigned(self, name: str, scope: Scope, before: int) -> Optional[Assignment]:
        """The last assignment to `name` before line `before`, in `scope` or else at module level."""
        for wanted in (scope, None):
            found = [a for a in self.assignments if a.name == name and a.line < before
                     and (a.scope is scope if wanted is not None else isinstance(a.scope, cst.Module))]
            if found:
                return max(found, key=lambda a: a.line)
        return None


def single(statement: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
    """The one small statement of a simple statement line, else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def called(statement: cst.CSTNode) -> Optional[cst.Call]:
    """The call a statement consists of (`f(...)` or `x = f(...)`), else None."""
    small = single(statement)
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return small.value
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call):
        return small.value
    return None


def _model_of_parameters(node: Optional[cst.BaseExpression], method: Sequence[str]) -> Optional[str]:
    """"model" for `model.parameters()` (or another of `method`), else None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in method \
            and not node.args:
        return dotted(node.func.value)
    return None


class Planner(cst.CSTVisitor):
    """Collects a Plan (run through a MetadataWrapper, for lines)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, names: HorovodNames) -> None:
        self.names = names
        self.plan = Plan()
        self.stack: List[cst.CSTNode] = []
        self._distopts: List[Placed] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.stack.append(node)
        if isinstance(node, cst.SimpleStatementLine):
            self._statement(node)
        # no statement is inside an expression: what this pass needs of one it reads from its statement
        return super().on_visit(node) and not isinstance(node, cst.BaseExpression)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.stack.pop()

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _placed(self, statement: cst.SimpleStatementLine) -> Placed:
        ancestors = self.stack[:-1]
        block = next(n for n in reversed(ancestors) if isinstance(n, (cst.Module, cst.IndentedBlock)))
        scope = next((n for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), ancestors[0])
        index = next(i for i, s in enumerate(block.body) if s is statement)
        return Placed(statement, block, index, scope, self._line(statement), list(ancestors))  # type: ignore[arg-type]

    def _statement(self, statement: cst.SimpleStatementLine) -> None:
        small = single(statement)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            name = dotted(small.targets[0].target)
            if name:
                placed = self._placed(statement)
                self.plan.assignments.append(Assignment(name, small.value, placed.line, placed.scope))
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
                isinstance(small.value.func, cst.Attribute) and small.value.func.attr.value == "backward":
            self.plan.backwards.append(self._placed(statement))
        call = called(statement)
        if call is None:
            return
        api = self.names.api(call.func)
        if api == "DistributedOptimizer" and isinstance(small, cst.Assign):
            self._distopts.append(self._placed(statement))
        elif api == "broadcast_parameters" and isinstance(small, cst.Expr):
            self.plan.broadcasts.append(self._placed(statement))

    def leave_Module(self, original_node: cst.Module) -> None:
        for placed in self._distopts:
            small = single(placed.statement)
            assert isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)
            options = arguments(small.value, "DistributedOptimizer")
            if options is None or "optimizer" not in options:
                continue
            model = _model_of_parameters(options.get("named_parameters"), ("named_parameters",)) or \
                self._model_of_optimizer(options["optimizer"], placed)
            where = {key: self.get_metadata(PositionProvider, value, None) for key, value in options.items()}
            lines = {key: found.start.line for key, found in where.items() if found is not None}
            self.plan.wraps.append(Wrap(placed, code(small.targets[0].target), options, model,
                                        self._wrap_place(placed, model), option_lines=lines))

    def _model_of_optimizer(self, optimizer: cst.BaseExpression, placed: Placed) -> Optional[str]:
        """The model whose parameters() the optimizer was built with."""
        built = constructor(self.plan, self.names, optimizer, placed.scope, placed.line)
        if built is None or not built.args:
            return None
        return _model_of_parameters(built.args[0].value, ("parameters", "named_parameters"))

    def _wrap_place(self, placed: Placed, model: Optional[str]) -> Placed:
        later = [b for b in self.plan.broadcasts if b.block is placed.block and b.index > placed.index
                 and model is not None and broadcast_model(b) == model]
        return later[0] if later else placed


def broadcast_model(placed: Placed) -> Optional[str]:
    """"model" for hvd.broadcast_parameters(model.state_dict() | model.parameters() | ..., root_rank=0)."""
    call = called(placed.statement)
    if call is None or not call.args:
        return None
    return _model_of_parameters(call.args[0].value, ("state_dict", "parameters", "named_parameters"))


def constructor(plan: Plan, names: HorovodNames, optimizer: cst.BaseExpression, scope: Scope,
                line: int) -> Optional[cst.Call]:
    """The call that built `optimizer` (through hvd.DistributedOptimizer), if the script shows it."""
    for _ in range(8):  # optimizer = hvd.DistributedOptimizer(optimizer, ...) chains are short
        if isinstance(optimizer, cst.Call):
            if names.api(optimizer.func) != "DistributedOptimizer":
                return optimizer
            options = arguments(optimizer, "DistributedOptimizer") or {}
            if "optimizer" not in options:
                return None
            optimizer = options["optimizer"]
            continue
        name = dotted(optimizer)
        assignment = plan.assigned(name, scope, line) if name else None
        if assignment is None:
            return None
        optimizer, line, scope = assignment.value, assignment.line, assignment.scope
    return None


def plan(wrapper: cst.MetadataWrapper, names: HorovodNames) -> Plan:
    """The plan of the module `wrapper` holds."""
    planner = Planner(names)
    wrapper.visit(planner)
    return planner.plan
