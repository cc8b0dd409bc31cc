"""The training followed across the folder's modules: where a file hands its wrapped model and its
DistributedOptimizer to a function of another module (`engine.train_epoch(model, optimizer, ...)`), under which
parameter names that function holds them, and whether the model's class can skip parameters in a step (a branch of
its forward that calls a submodule only under a condition), which DDP must be told about."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .project import Found, Resolver, SourceFile

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


def _dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _function(tree: ast.Module, name: Optional[str]) -> Optional[ast.AST]:
    """The module-level function `name` of `tree` (None: the module itself)."""
    if name is None:
        return tree
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> List[str]:
    return [a.arg for a in (*function.args.posonlyargs, *function.args.args)]


def _received(call: ast.Call, function: ast.FunctionDef | ast.AsyncFunctionDef, held: Dict[str, str]
              ) -> Dict[str, str]:
    """Which of `held` (name in the caller -> "model" or "optimizer") `call` hands to `function`, by the name of
    the parameter it arrives in: {"model": "net", "optimizer": "opt"}."""
    parameters = _parameters(function)
    keywords = {a.arg for a in function.args.kwonlyargs} | set(parameters)
    found: Dict[str, str] = {}
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        name = _dotted(arg)
        if name in held and position < len(parameters):
            found[held[name]] = parameters[position]
    for keyword in call.keywords:
        name = _dotted(keyword.value) if keyword.arg else None
        if name in held and keyword.arg in keywords:
            found[held[name]] = keyword.arg
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
            for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
                callee = _dotted(call.func)
                target = resolver.definition(file, callee) if callee else None
                if target is None or not isinstance(target.definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                received = _received(call, target.definition, names)
                if not received:
                    continue
                key = (target.file.path, target.definition.name)
                if target.file.path != fact.path and key not in found:
                    found[key] = Handed(target.file.path, target.definition.name, received.get("model"),
                                        received.get("optimizer"), fact.passes, fact.origin)
                    queue.append((target.file, target.definition.name,
                                  {v: k for k, v in received.items()}, depth + 1))
    return list(found.values())


def _conditional_calls(forward: ast.FunctionDef | ast.AsyncFunctionDef) -> List[Tuple[int, str, str]]:
    """(line, submodule, condition) for each call of `self.X(...)` in `forward` that runs only under a condition
    (`if`, a conditional expression, a loop that can stop early)."""
    found: List[Tuple[int, str, str]] = []
    for node in ast.walk(forward):
        branches: List[ast.AST] = []
        if isinstance(node, ast.If):
            branches = [*node.body, *node.orelse]
        elif isinstance(node, ast.IfExp):
            branches = [node.body, node.orelse]
        else:
            continue
        condition = ast.unparse(node.test)
        for branch in branches:
            for inner in ast.walk(branch):
                if isinstance(inner, ast.Call):
                    name = _dotted(inner.func) or ""
                    if name.startswith("self.") and name.count(".") == 1:
                        found.append((inner.lineno, name, condition))
    return found


def _classes_built(definition: Found, resolver: Resolver, depth: int) -> List[Found]:
    """The folder's classes a callable builds: the class itself, or the classes a factory function returns."""
    if isinstance(definition.definition, ast.ClassDef):
        return [definition]
    if depth > 3:
        return []
    built: List[Found] = []
    for node in ast.walk(definition.definition):
        value = node.value if isinstance(node, (ast.Return, ast.Assign)) else None
        if isinstance(value, ast.Call):
            name = _dotted(value.func)
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
        if id(found.definition) in seen or not isinstance(found.definition, ast.ClassDef):
            continue
        seen.add(id(found.definition))
        cls = found.definition
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        forward = methods.get("forward")
        if forward is not None:
            for line, call, condition in _conditional_calls(forward):
                return Skipping(f"{found.file.path}:{line}",
                                f"{cls.name}.forward calls {call} only when {condition}")
        for base in cls.bases:  # a base class of the folder's with the forward
            name = _dotted(base)
            parent = resolver.definition(found.file, name) if name else None
            if parent is not None:
                queue.append(parent)
        init = methods.get("__init__")
        for node in ast.walk(init) if init is not None else []:  # self.head = Head(...): a submodule's forward
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                name = _dotted(node.value.func)
                inner = resolver.definition(found.file, name) if name else None
                if inner is not None:
                    queue += _classes_built(inner, resolver, 0)
    return None
