"""The rules for what the script does with its optimizer and model once DDP wraps the model:
`optimizer.synchronize()` (port.statements), `with optimizer.skip_synchronize():` and the model's own attributes,
read through `.module` after the wrap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import libcst as cst

from .bindings import Bindings
from .context import Context
from .names import dotted
from .plan import Plan, Wrap
from .rule import Through, Unwrap

#: what a DDP object answers itself; any other attribute of the wrapped model is the model's (`.module`)
DDP_SURFACE = frozenset({
    "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules", "zero_grad", "to", "cuda", "cpu", "apply", "requires_grad_", "training", "module",
    "no_sync", "join", "register_comm_hook", "forward", "float", "half", "double", "bfloat16", "type",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook", "register_backward_hook",
    "get_submodule", "get_parameter", "get_buffer", "share_memory",
})


def skip_synchronize(node: cst.With, line: int, plan: Plan, port: Context) -> Optional[Unwrap]:
    """`with optimizer.skip_synchronize():` on a wrapped optimizer: its body alone (DDP has nothing to skip)."""
    if len(node.items) != 1 or not isinstance(node.body, cst.IndentedBlock):
        return None
    item = node.items[0].item
    if not (isinstance(item, cst.Call) and isinstance(item.func, cst.Attribute) and
            item.func.attr.value == "skip_synchronize" and
            dotted(item.func.value) in {w.target for w in plan.wraps if w.model}):
        return None
    port.change(line, "optimizer.skip_synchronize()", "unwrapped: DDP's optimizer has no synchronize() to skip")
    return Unwrap()


@dataclass(frozen=True)
class Reading:
    """An attribute of the script as it reads it: the attribute, its line, the functions and classes around it
    (outermost first) and the module."""

    attribute: cst.Attribute
    line: int
    functions: Tuple[cst.FunctionDef, ...]
    classes: Tuple[cst.ClassDef, ...]
    module: cst.Module


def model_attribute(reading: Reading, plan: Plan, bindings: Bindings, port: Context) -> Optional[Through]:
    """`model.attr` after the DDP wrap, for an attribute DDP does not answer itself: `model.module.attr`; in a
    function that holds a model wrapped in another file (port.follow), the same for its parameter."""
    wrap = _wrapped(reading, plan, bindings)
    model = wrap.model if wrap is not None else _handed_model(reading, port)
    if model is None:
        return None
    attr = reading.attribute.attr.value
    checkpoint = " (checkpoints keep the model's own keys, without 'module.')" \
        if attr in ("state_dict", "load_state_dict") else ""
    port.change(reading.line, "the model after the DDP wrap",
                f"{model}.{attr} -> {model}.module.{attr}: DDP holds the model as .module" + checkpoint)
    return Through("module")


def _handed_model(reading: Reading, port: Context) -> Optional[str]:
    """The parameter that holds a model wrapped in another file, where the attribute reads it: in the module-level
    function it was handed to (or a function inside it that does not bind the name itself)."""
    if not reading.functions or reading.attribute.attr.value in DDP_SURFACE:
        return None
    model = port.handed_models.get(reading.functions[0].name.value)
    return model if model is not None and dotted(reading.attribute.value) == model else None


def _wrapped(reading: Reading, plan: Plan, bindings: Bindings) -> Optional[Wrap]:
    """The wrap whose model the attribute reads after the wrap, for an attribute DDP does not answer itself."""
    attribute = reading.attribute
    if attribute.attr.value in DDP_SURFACE:
        return None
    base = dotted(attribute.value)
    functions = reading.functions
    scope = functions[-1] if functions else reading.module
    for wrap in plan.wraps:
        if wrap.model is None or wrap.model != base:
            continue
        if scope is wrap.at.scope:
            if reading.line > wrap.at.line:
                return wrap
            continue
        if base.startswith("self."):
            if reading.classes and any(s is wrap.at.scope for s in _methods(reading.classes[-1])):
                return wrap
            continue
        if isinstance(wrap.at.scope, cst.Module):
            inner = functions
        elif any(f is wrap.at.scope for f in functions):
            inner = functions[[id(f) for f in functions].index(id(wrap.at.scope)) + 1:]
        else:
            continue
        # a function that binds the model's name itself reads its own variable, not the wrapped model
        if not any(base.split(".")[0] in bindings.locals_of(f) for f in inner):
            return wrap
    return None


def _methods(cls: cst.ClassDef) -> List[cst.CSTNode]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef)]
