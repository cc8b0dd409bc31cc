"""The rules that port whole statements: hvd.DistributedOptimizer (the DDP wrap), the broadcasts of parameters
and optimizer state, join, horovod.run, the timeline and the in-place collectives. Each takes the statement as
the script wrote it and as the rewrite has it so far, and returns what replaces it (None: left unported)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from . import expressions, optimizer
from .context import arguments, code
from .names import dotted
from .plan import Wrap, broadcast_model

if TYPE_CHECKING:
    from .transform import Porter, Statements

Line = cst.SimpleStatementLine
Result = Optional["Statements"]


def wrap_of(porter: "Porter", wrap: Wrap, line: int) -> tuple[List[str], List[str]]:
    """The statements of the DDP wrap that replaces `wrap`, and the `# port:` comments above them."""
    assert wrap.model is not None
    sites = sum(1 for site, w in porter.sites.values() if w is wrap)
    return optimizer.wrap_statements(porter.ctx, wrap.options, wrap.model, line, sites)


def distributed_optimizer(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.DistributedOptimizer(optimizer, ...): the DDP wrap here, or only `target = optimizer` when the wrap
    goes to a later hvd.broadcast_parameters."""
    wrap = porter.plan.wrap_of(original)
    if wrap is None or wrap.model is None:
        return None
    texts: List[str] = []
    inner = code(wrap.options["optimizer"])
    if inner != wrap.target:
        texts.append(f"{wrap.target} = {inner}")
    comments: List[str] = []
    if wrap.at.statement is original:
        statements, comments = wrap_of(porter, wrap, line)
        texts += statements
    else:
        porter.ctx.change(line, "hvd.DistributedOptimizer", f"the DDP wrap of {wrap.model} moves to line "
                          f"{wrap.at.line}, where hvd.broadcast_parameters made the weights final")
    return porter.replaced(updated, texts, comments)


def broadcast_parameters(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.broadcast_parameters: the DDP wrap where it is the wrap's place, else removed when a wrap follows."""
    wrap = porter.plan.wrap_at(original)
    if wrap is not None:
        porter.ctx.change(line, "hvd.broadcast_parameters", f"the DDP wrap of {wrap.model}: DDP broadcasts rank "
                          "0's parameters and buffers when it wraps the model")
        statements, comments = wrap_of(porter, wrap, line)
        return porter.replaced(updated, statements, comments)
    model = broadcast_model(next(b for b in porter.plan.broadcasts if b.statement is original))
    options = arguments(call, "broadcast_parameters") or {}
    before = [w for w in porter.plan.wraps if w.model == model and w.at.scope is porter.scope()
              and w.at.line > line]
    if not before or code(options.get("root_rank", cst.Integer("0"))) != "0":
        return None
    porter.ctx.change(line, "hvd.broadcast_parameters", f"removed: DDP broadcasts rank 0's parameters and "
                      f"buffers when it wraps {model} (line {before[0].at.line})")
    return porter.marker(updated)


def broadcast_optimizer_state(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.broadcast_optimizer_state: its zero step dropped (and its effect reported) or made explicit; the state
    broadcast when the script loads one."""
    options = arguments(call, "broadcast_optimizer_state")
    if not options or "optimizer" not in options:
        return None
    name = code(options["optimizer"])
    built = porter.planner.constructor(options["optimizer"], porter.scope(), line)  # type: ignore[arg-type]
    # hvd.DistributedOptimizer(optimizer) after this call is a new optimizer, without the step's state
    survives = not any(dotted(w.options["optimizer"]) == name and w.placed.scope is porter.scope()
                       and w.placed.line > line for w in porter.plan.wraps)
    texts: List[str] = []
    if porter.ctx.options.zero_step == "keep":
        helper = porter.ctx.helper("step_on_zero_gradients")
        texts.append(f"{helper}({name})" if survives else f"{helper}({name}, keep_state=False)")
        porter.ctx.zero_step = "kept"
        porter.ctx.change(line, "hvd.broadcast_optimizer_state", f"Horovod's zero step made explicit: {texts[-1]} "
                          "steps a fresh optimizer once on zero gradients, as Horovod did" +
                          ("" if survives else ", and drops the state it made, as hvd.DistributedOptimizer did"))
    else:
        porter.ctx.zero_step = "dropped"
        changes, effect = optimizer.zero_step_effect(built, survives)
        text = "removed with Horovod's zero step (a fresh optimizer has no state to broadcast; port with " \
            "--zero-step keep to make the step explicit)" + ("" if changes else f": {effect}")
        porter.ctx.change(line, "hvd.broadcast_optimizer_state", text, changes, effect if changes else None,
                          optimizer.CAUSE_ZERO_STEP if changes else None)
    if loads_state(porter, name):
        box = porter.ctx.helper("broadcasted_object")
        texts.append(f"{name}.load_state_dict({box}({name}.state_dict()))")
        porter.ctx.change(line, "hvd.broadcast_optimizer_state", f"rank 0's optimizer state (the script loads one "
                          f"from a checkpoint) loaded on every rank: {box}({name}.state_dict())")
    return porter.replaced(updated, texts)


def loads_state(porter: "Porter", name: str) -> bool:
    """The script calls `name.load_state_dict(...)` somewhere (rank 0 resuming)."""
    return name in porter.ctx.loads_state


def join(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.join() -> dist.barrier()."""
    porter.ctx.change(line, "hvd.join", f"hvd.join() -> {porter.ctx.dist}.barrier(): the same where every rank "
                      "takes the same number of steps (DistributedSampler pads the shards); for uneven inputs "
                      "run the loop under `with model.join():`")
    return porter.replaced(updated, [f"{porter.ctx.dist}.barrier()"])


def run(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """horovod.run(...) -> a message naming torchrun: the launcher starts the workers."""
    message = porter.ctx.string("horovod.run has no DDP counterpart: start this script with torchrun "
                                "--nproc-per-node N")
    porter.ctx.change(line, "horovod.run", "horovodrun-only: horovod.run starts the workers itself; under torchrun "
                      "the launcher does, so this path now stops with that message")
    return porter.replaced(updated, [f"raise SystemExit({message})"])


def timeline(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.start_timeline / stop_timeline: removed."""
    porter.ctx.change(line, "hvd.start_timeline", "removed: DDP has no timeline; torch.profiler records a trace")
    return porter.marker(updated)


def in_place(porter: "Porter", original: Line, updated: Line, call: cst.Call, line: int) -> Result:
    """hvd.allreduce_ / hvd.broadcast_ as statements: torch.distributed's in-place calls."""
    api = str(porter.ctx.names.api(call.func))
    found = expressions.in_place_statement(porter.ctx, api, call)
    if found is None:
        return None
    text, does = found
    porter.ctx.change(line, f"hvd.{api}", f"{code(call.func)}(...) -> {text}: {does}")
    return porter.replaced(updated, [text])


#: the rule of each Horovod call ported as a whole statement
RULES = {"DistributedOptimizer": distributed_optimizer, "broadcast_parameters": broadcast_parameters,
         "broadcast_optimizer_state": broadcast_optimizer_state, "join": join, "horovod.run": run,
         "start_timeline": timeline, "stop_timeline": timeline, "allreduce_": in_place, "broadcast_": in_place}
