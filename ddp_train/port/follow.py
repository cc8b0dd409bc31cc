"""The training followed across the folder's modules: where a file hands its wrapped model and its
DistributedOptimizer to a function of another module (`engine.train_epoch(model, optimizer, ...)`), under which
parameter names that function holds them, and whether the model's class can skip parameters in a step (a branch of
its forward that calls a submodule only under a condition), which DDP must be told about."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union, cast

import libcst as cst

from .context import code
from .names import dotted
from .project import Found, Resolver, SourceFile
from .walk import nodes

#: how deep a chain of calls (train.py -> engine.train_epoch -> engine.train_step) is followed
DEPTH = 4


@dataclass(frozen=True)
class WrapFact:
    """An hvd.DistributedOptimizer of a file, as the port of that file planned it: where, the optimizer's and the
    model's names, its backward_passes_per_step (code; None when not given), the function it is in (None: module
    level) and the callable that built the model (dotted; None when the file does not show it)."""

    path: str
    line: int
    optimizer: str
    model: Optional[str]
    passes: Optional[str]
    function: Optional[str]
    model_factory: Optional[str]

    @property
    def origin(self) -> str:
        """`file:line` of the DistributedOptimizer."""
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Handed:
    """A function of the folder that holds a wrapped model and its optimizer under its own parameter names: its
    file, its name, those names (None where it does not take that one), the wrap's backward_passes_per_step and
    where the wrap is."""

    path: str
    function: str
    model: Optional[str]
    optimizer: Optional[str]
    passes: Optional[str]
    origin: str


@dataclass(frozen=True)
class Skipping:
    """Why a model can leave parameters without a gradient in a step: where, and what."""

    where: str
    what: str


def _function(tree: cst.Module, name: Optional[str]) -> Union[cst.Module, cst.FunctionDef, None]:
    """The module-level function `name` of `tree` (None: the module itself)."""
    if name is None:
        return tree
    return next((n for n in tree.body if isinstance(n, cst.FunctionDef) and n.name.value == name), None)


def _calls(root: cst.CSTNode) -> Iterator[cst.Call]:
    """Every call under `root`, in the order of the source."""
    return (node for node in nodes(root) if isinstance(node, cst.Call))


def _received(call: cst.Call, function: cst.FunctionDef, held: Dict[str, str]) -> Dict[str, str]:
    """Which of `held` (name in the caller -> "model" or "optimizer") `call` hands to `function`, by the name of
    the parameter it arrives in: {"model": "net", "optimizer": "opt"}."""
    parameters = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    keywords = {p.name.value for p in function.params.kwonly_params} | set(parameters)
    found: Dict[str, str] = {}
    positional = [arg for arg in call.args if arg.keyword is None and arg.star != "**"]
    for position, arg in enumerate(positional):
        if arg.star:
            break
        name = dotted(arg.value)
        if name in held and position < len(parameters):
            found[held[name]] = parameters[position]
    for arg in call.args:
        name = dotted(arg.value)
        if arg.keyword is not None and name in held and arg.keyword.value in keywords:
            found[held[name]] = arg.keyword.value
    return found


def handed(facts: Sequence[WrapFact], files: Dict[str, SourceFile], resolver: Resolver) -> List[Handed]:
    """Every function of another file than the wrap's that receives the wrapped model or its optimizer, followed
    through calls up to DEPTH deep."""
    found: Dict[Tuple[str, str], Handed] = {}
    for fact in facts:
        held = {fact.optimizer: "optimizer", **({fact.model: "model"} if fact.model else {})}
        queue: List[Tuple[SourceFile, Optional[str], Dict[str, str], int]] = [
            (files[fact.path], fact.function, held, 0)]
        while queue:
            file, function, names, depth = queue.pop()
            scope = _function(file.tree, function) if file.tree else None
            if scope is None or depth >= DEPTH:
                continue
            for call in _calls(scope):
                callee = dotted(call.func)
                target = resolver.definition(file, callee) if callee else None
                if target is None or not isinstance(target.definition, cst.FunctionDef):
                    continue
                received = _received(call, target.definition, names)
                if not received:
                    continue
                function = target.definition.name.value
                key = (target.file.path, function)
                if target.file.path != fact.path and key not in found:
                    found[key] = Handed(target.file.path, function, received.get("model"),
                                        received.get("optimizer"), fact.passes, fact.origin)
                    queue.append((target.file, function, {v: k for k, v in received.items()}, depth + 1))
    return list(found.values())


class _OneLine(cst.CSTTransformer):
    """An expression made one line, as ast.unparse writes its strings and numbers: each line break (with the
    comments on it) or run of spaces one space, `"train"` 'train', `0x10` 16."""

    def leave_ParenthesizedWhitespace(self, original_node: cst.ParenthesizedWhitespace,
                                      updated_node: cst.ParenthesizedWhitespace) -> cst.BaseParenthesizableWhitespace:
        return cst.SimpleWhitespace(" ")

    def leave_SimpleWhitespace(self, original_node: cst.SimpleWhitespace, updated_node: cst.SimpleWhitespace
                               ) -> cst.SimpleWhitespace:
        return cst.SimpleWhitespace(" ") if updated_node.value else updated_node

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString
                           ) -> cst.SimpleString:
        return cst.SimpleString(repr(updated_node.evaluated_value))

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.Integer:
        return cst.Integer(repr(updated_node.evaluated_value))

    def leave_Float(self, original_node: cst.Float, updated_node: cst.Float) -> cst.Float:
        return cst.Float(repr(updated_node.evaluated_value))


def _condition(test: cst.BaseExpression) -> str:
    """A condition as the report writes it: on one line, without the parentheses around it."""
    bare = test.with_changes(lpar=[], rpar=[]) if test.lpar else test
    return code(cast(cst.BaseExpression, bare.visit(_OneLine())))


def _conditional_calls(file: SourceFile, forward: cst.FunctionDef) -> List[Tuple[int, str, str]]:
    """(line, submodule, condition) for each call of `self.X(...)` in `forward` (of `file`) that runs only under a
    condition (`if`, a conditional expression, a loop that can stop early)."""
    found: List[Tuple[int, str, str]] = []
    for node in nodes(forward):
        if isinstance(node, (cst.If, cst.IfExp)):
            condition = _condition(node.test)
            for branch in (node.body, node.orelse):
                for call in _calls(branch) if branch is not None else ():
                    name = dotted(call.func) or ""
                    if name.startswith("self.") and name.count(".") == 1:
                        found.append((file.positions[call].start.line, name, condition))
    return found


def _classes_built(definition: Found, resolver: Resolver, depth: int) -> List[Found]:
    """The folder's classes a callable builds: the class itself, or the classes a factory function returns."""
    if isinstance(definition.definition, cst.ClassDef):
        return [definition]
    if depth > 3:
        return []
    built: List[Found] = []
    for node in nodes(definition.definition):
        value = node.value if isinstance(node, (cst.Return, cst.Assign)) else None
        if isinstance(value, cst.Call):
            name = dotted(value.func)
            inner = resolver.definition(definition.file, name) if name else None
            if inner is not None and inner.definition is not definition.definition:
                built += _classes_built(inner, resolver, depth + 1)
    return built


def skipping(file: SourceFile, factory: Optional[str], resolver: Resolver) -> Optional[Skipping]:
    """Whether the model that `factory` (read in `file`) builds can skip parameters in a step: the first
    forward, of its class or of a submodule class of the folder, that calls a submodule only under a condition."""
    if factory is None:
        return None
    start = resolver.definition(file, factory)
    if start is None:
        return None
    seen: Set[int] = set()
    queue = _classes_built(start, resolver, 0)
    while queue:
        found = queue.pop(0)
        if id(found.definition) in seen or not isinstance(found.definition, cst.ClassDef):
            continue
        seen.add(id(found.definition))
        cls = found.definition
        methods = {n.name.value: n for n in cls.body.body if isinstance(n, cst.FunctionDef)}
        forward = methods.get("forward")
        if forward is not None:
            for line, call, condition in _conditional_calls(found.file, forward):
                return Skipping(f"{found.file.path}:{line}",
                                f"{cls.name.value}.forward calls {call} only when {condition}")
        for base in (arg.value for arg in cls.bases if not arg.star):  # a base class of the folder's with the forward
            name = dotted(base)
            parent = resolver.definition(found.file, name) if name else None
            if parent is not None:
                queue.append(parent)
        init = methods.get("__init__")
        for node in nodes(init) if init is not None else ():  # self.head = Head(...): a submodule's forward
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                name = dotted(node.value.func)
                inner = resolver.definition(found.file, name) if name else None
                if inner is not None:
                    queue += _classes_built(inner, resolver, 0)
    return None
