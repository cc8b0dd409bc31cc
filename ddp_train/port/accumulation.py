"""backward_passes_per_step=K -> DDP's no_sync: where a loop's structure shows which backward pass is the last
before the optimizer's step, every other pass runs under `model.no_sync()`, so that DDP averages the gradients
once per step, on the pass Horovod averaged them on. DDP decides in the forward pass whether the backward pass
reduces, so `no_sync` holds both: the statements from the first that calls the model (else from the top of the
loop's body) to the backward pass. Two structures qualify:

- the step inside the loop, under a condition: `loss.backward()` then `if COND: optimizer.step()`: the pass
  syncs when COND holds;
- the passes in an inner `for i in range(...)` loop, the step after it: the pass syncs on the last `i`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from .bindings import Bindings
from .context import Context, code
from .names import dotted
from .plan import Placed, Wrap, single
from .rule import WrapIn

ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)


@dataclass(frozen=True)
class Site:
    """A forward and backward pass to run under no_sync unless `condition` holds (the last pass before the
    step): the statements of `placed.block` from index `first` to the backward pass's."""

    placed: Placed
    condition: str
    first: int


def pure(node: cst.BaseExpression, arithmetic_only: bool = False) -> bool:
    """An expression that can be evaluated again with the same result: names, attributes, numbers, arithmetic,
    comparisons and len(...) of those."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.Attribute):
        return pure(node.value, arithmetic_only)
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, (cst.Minus, cst.Plus, cst.Not)) and pure(node.expression, arithmetic_only)
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, ARITHMETIC) and pure(node.left, arithmetic_only) and \
            pure(node.right, arithmetic_only)
    if isinstance(node, cst.Call):
        return dotted(node.func) == "len" and len(node.args) == 1 and not node.args[0].keyword and \
            not node.args[0].star and pure(node.args[0].value, arithmetic_only)
    if arithmetic_only:
        return False
    if isinstance(node, cst.Comparison):
        return pure(node.left) and all(pure(t.comparator) for t in node.comparisons)
    if isinstance(node, cst.BooleanOperation):
        return pure(node.left) and pure(node.right)
    return False


def _names(node: cst.CSTNode) -> Set[str]:
    found: Set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False

    node.visit(Names())
    return found


def steps(statement: cst.CSTNode, optimizer: str) -> bool:
    """`optimizer.step(...)`, or `scaler.step(optimizer)`."""
    small = single(statement)
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    call = small.value
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"):
        return False
    return dotted(call.func.value) == optimizer or (bool(call.args) and dotted(call.args[0].value) == optimizer)


def _steps_under(statement: cst.CSTNode, optimizer: str) -> bool:
    """`statement` steps, or is an `if` whose body steps."""
    if steps(statement, optimizer):
        return True
    return isinstance(statement, cst.If) and isinstance(statement.body, cst.IndentedBlock) and \
        any(steps(s, optimizer) for s in statement.body.body)


def _owner(placed: Placed) -> Tuple[Optional[cst.CSTNode], Optional[cst.CSTNode]]:
    """The statement whose body holds the backward pass directly, and the block that holds that statement."""
    ancestors = placed.ancestors
    if len(ancestors) < 3 or not isinstance(ancestors[-1], cst.IndentedBlock):
        return None, None
    return ancestors[-2], ancestors[-3]


def _calls(statement: cst.CSTNode, model: str) -> bool:
    """`statement` calls `model(...)` (its forward pass)."""
    found: List[cst.Call] = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if dotted(node.func) == model:
                found.append(node)

    statement.visit(Calls())
    return bool(found)


def _first(placed: Placed, model: str) -> int:
    """Where no_sync starts: the first statement before the backward pass that calls the model, else the top of
    the block."""
    body = placed.block.body
    return next((i for i in range(placed.index + 1) if _calls(body[i], model)), 0)


def _conditional_step(placed: Placed, optimizer: str, first: int, bindings: Bindings) -> Tuple[bool, Optional[str]]:
    """(found, condition) for a backward pass followed in its loop by `if COND: optimizer.step()`; (True, None)
    when a step follows unconditionally (every pass syncs, as under Horovod)."""
    owner, _ = _owner(placed)
    if not isinstance(owner, (cst.For, cst.While)):
        return False, None
    after = placed.block.body[placed.index + 1:]
    for position, statement in enumerate(after):
        if steps(statement, optimizer):
            return True, None
        if _steps_under(statement, optimizer):
            assert isinstance(statement, cst.If)
            # COND is read before the forward pass now, where the script read it after the backward pass
            before = placed.block.body[first:placed.index + 1 + position]
            between = bindings.bound_in(before)
            if pure(statement.test) and not (_names(statement.test) & between) and statement.orelse is None:
                return True, code(statement.test)
            return False, None
    return False, None


def _last_of_range(placed: Placed, optimizer: str, bindings: Bindings) -> Optional[str]:
    """The condition of the last iteration of the inner `for i in range(...)` loop holding the backward pass,
    when the optimizer steps after that loop."""
    owner, block = _owner(placed)
    if not (isinstance(owner, cst.For) and isinstance(owner.target, cst.Name) and owner.orelse is None
            and isinstance(block, (cst.IndentedBlock, cst.Module))):
        return None
    index = next(i for i, s in enumerate(block.body) if s is owner)
    if not any(_steps_under(s, optimizer) for s in block.body[index + 1:]):
        return None
    iterable = owner.iter
    if not (isinstance(iterable, cst.Call) and dotted(iterable.func) == "range" and 1 <= len(iterable.args) <= 3
            and all(a.keyword is None and not a.star and pure(a.value, arithmetic_only=True)
                    for a in iterable.args)):
        return None
    args = [a.value for a in iterable.args]
    stop = args[0] if len(args) == 1 else args[1]
    step = args[2] if len(args) == 3 else None
    if isinstance(step, cst.UnaryOperation) or (isinstance(step, cst.Integer) and int(step.value, 0) <= 0):
        return None  # a loop that counts down: its last value is not where this condition puts it
    assigned = bindings.bound_in([owner.body])
    if any(_names(a) & assigned for a in args):
        return None
    return f"{owner.target.value} + {code(step) if step is not None else 1} >= {code(stop)}"


def sites(backwards: Sequence[Placed], optimizer: str, model: str,
          bindings: Bindings) -> Tuple[List[Site], List[Placed]]:
    """The passes to run under no_sync, and the backward passes whose loop shows no last pass (left syncing at
    every pass); `bindings` tells what the statements between assign."""
    found: List[Site] = []
    unclear: List[Placed] = []
    for placed in backwards:
        first = _first(placed, model)
        known, condition = _conditional_step(placed, optimizer, first, bindings)
        if known and condition is None:
            continue
        condition = condition or _last_of_range(placed, optimizer, bindings)
        if condition:
            found.append(Site(placed, condition, first))
        else:
            unclear.append(placed)
    return found, unclear


def under_no_sync(site: Site, wrap: Wrap, port: Context) -> WrapIn:
    """The rule of a site: its passes under `with contextlib.nullcontext() if COND else model.no_sync():`."""
    port.imports.add("contextlib")
    passes = code(wrap.options["backward_passes_per_step"])
    origin = f" (backward_passes_per_step={passes} at {wrap.origin})" if wrap.origin else ""
    port.change(site.placed.line, "backward_passes_per_step",
                f"the forward and backward passes run under {wrap.model}.no_sync() unless {site.condition}: DDP "
                f"averages the gradients on the last pass before {wrap.target}.step() only, as Horovod did every "
                f"{passes} passes{origin}")
    return WrapIn(site.first, site.placed.index,
                  f"with contextlib.nullcontext() if {site.condition} else {wrap.model}.no_sync():")
