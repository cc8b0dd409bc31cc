"""The rules that port whole statements: hvd.DistributedOptimizer (the DDP wrap), the broadcasts of parameters
and optimizer state, join, horovod.run, the timeline, the in-place collectives and optimizer.synchronize(). Each
reads a `StatementSite` and returns what replaces the statement (None: left as written); `RULES` lists them."""

from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst

from . import expressions, optimizer
from .context import arguments, code
from .names import dotted, label
from .plan import Wrap, broadcast_model, constructor, single
from .rule import Replace, StatementRule, StatementSite

Result = Optional[Replace]


def wrap_of(site: StatementSite, wrap: Wrap) -> tuple[List[str], List[str]]:
    """The statements of the DDP wrap that replaces `wrap`, and the `# port:` comments above them."""
    assert wrap.model is not None
    return optimizer.wrap_statements(site.port, wrap.options, wrap.model, site.line, wrap.no_sync_sites,
                                     wrap.option_lines, wrap.target)


def distributed_optimizer(site: StatementSite) -> Result:
    """hvd.DistributedOptimizer(optimizer, ...): the DDP wrap here, or only `target = optimizer` when the wrap
    goes to a later hvd.broadcast_parameters."""
    wrap = site.plan.wrap_of(site.statement)
    if wrap is None or wrap.model is None:
        return None
    texts: List[str] = []
    inner = code(wrap.options["optimizer"])
    if inner != wrap.target:
        texts.append(f"{wrap.target} = {inner}")
    comments: List[str] = []
    if wrap.at.statement is site.statement:
        statements, comments = wrap_of(site, wrap)
        texts += statements
    else:
        site.port.change(site.line, "hvd.DistributedOptimizer", f"the DDP wrap of {wrap.model} moves to line "
                         f"{wrap.at.line}, where hvd.broadcast_parameters made the weights final")
    return Replace(tuple(texts), tuple(comments))


def broadcast_parameters(site: StatementSite) -> Result:
    """hvd.broadcast_parameters: the DDP wrap where it is the wrap's place, else removed when a wrap follows."""
    wrap = site.plan.wrap_at(site.statement)
    if wrap is not None:
        site.port.change(site.line, "hvd.broadcast_parameters", f"the DDP wrap of {wrap.model}: DDP broadcasts "
                         "rank 0's parameters and buffers when it wraps the model")
        statements, comments = wrap_of(site, wrap)
        return Replace(tuple(statements), tuple(comments))
    model = broadcast_model(next(b for b in site.plan.broadcasts if b.statement is site.statement))
    options = arguments(site.call, "broadcast_parameters") or {}
    before = [w for w in site.plan.wraps if w.model == model and w.at.scope is site.scope
              and w.at.line > site.line]
    if not before or code(options.get("root_rank", cst.Integer("0"))) != "0":
        return None
    site.port.change(site.line, "hvd.broadcast_parameters", f"removed: DDP broadcasts rank 0's parameters and "
                     f"buffers when it wraps {model} (line {before[0].at.line})")
    return Replace()


def broadcast_optimizer_state(site: StatementSite) -> Result:
    """hvd.broadcast_optimizer_state: its zero step dropped (and its effect reported) or made explicit; the state
    broadcast when the script loads one."""
    options = arguments(site.call, "broadcast_optimizer_state")
    if not options or "optimizer" not in options:
        return None
    port, line = site.port, site.line
    name = code(options["optimizer"])
    built = constructor(site.plan, port.names, options["optimizer"], site.scope, line)
    # hvd.DistributedOptimizer(optimizer) after this call is a new optimizer, without the step's state
    survives = not any(dotted(w.options["optimizer"]) == name and w.placed.scope is site.scope
                       and w.placed.line > line for w in site.plan.wraps)
    texts: List[str] = []
    if port.options.zero_step == "keep":
        helper = port.helper("step_on_zero_gradients")
        texts.append(f"{helper}({name})" if survives else f"{helper}({name}, keep_state=False)")
        port.zero_step = "kept"
        port.change(line, "hvd.broadcast_optimizer_state", f"Horovod's zero step made explicit: {texts[-1]} "
                    "steps a fresh optimizer once on zero gradients, as Horovod did" +
                    ("" if survives else ", and drops the state it made, as hvd.DistributedOptimizer did"))
    else:
        port.zero_step = "dropped"
        changes, effect = optimizer.zero_step_effect(built, survives)
        text = "removed with Horovod's zero step (a fresh optimizer has no state to broadcast; port with " \
            "--zero-step keep to make the step explicit)" + ("" if changes else f": {effect}")
        port.change(line, "hvd.broadcast_optimizer_state", text, changes, effect if changes else None,
                    optimizer.CAUSE_ZERO_STEP if changes else None)
    if name in port.loads_state:
        box = port.helper("broadcasted_object")
        texts.append(f"{name}.load_state_dict({box}({name}.state_dict()))")
        port.change(line, "hvd.broadcast_optimizer_state", f"rank 0's optimizer state (the script loads one "
                    f"from a checkpoint) loaded on every rank: {box}({name}.state_dict())")
    return Replace(tuple(texts))


def join(site: StatementSite) -> Result:
    """hvd.join() -> dist.barrier()."""
    dist = site.port.dist
    site.port.change(site.line, "hvd.join", f"hvd.join() -> {dist}.barrier(): the same where every rank takes "
                     "the same number of steps (DistributedSampler pads the shards); for uneven inputs run the "
                     "loop under `with model.join():`")
    return Replace((f"{dist}.barrier()",))


def run(site: StatementSite) -> Result:
    """horovod.run(...) -> a message naming torchrun: the launcher starts the workers."""
    message = site.port.string("horovod.run has no DDP counterpart: start this script with torchrun "
                               "--nproc-per-node N")
    site.port.change(site.line, "horovod.run", "horovodrun-only: horovod.run starts the workers itself; under "
                     "torchrun the launcher does, so this path now stops with that message")
    return Replace((f"raise SystemExit({message})",))


def timeline(site: StatementSite) -> Result:
    """hvd.start_timeline / stop_timeline: removed."""
    site.port.change(site.line, "hvd.start_timeline", "removed: DDP has no timeline; torch.profiler records a "
                     "trace")
    return Replace()


def in_place(site: StatementSite) -> Result:
    """hvd.allreduce_ / hvd.broadcast_ as statements: torch.distributed's in-place calls."""
    api = str(site.api)
    found = expressions.in_place_statement(site.port, api, site.call)
    if found is None:
        return None
    site.port.change(site.line, label(api), f"{code(site.call.func)}(...) -> {found.text}: {found.does}")
    return Replace((found.text,))


def synchronize(site: StatementSite) -> Result:
    """optimizer.synchronize() on a wrapped optimizer: removed (DDP has averaged when backward() returns)."""
    site.port.change(site.line, "optimizer.synchronize()", "removed: DDP has averaged the gradients when "
                     "backward() returns")
    return Replace()


def _alone(site: StatementSite) -> bool:
    """The call is the whole statement (its value unused)."""
    return isinstance(single(site.statement), cst.Expr)


def _anywhere(site: StatementSite) -> bool:
    return True


def _in_place_claims(site: StatementSite) -> bool:
    """What in_place ports; the rest of hvd.allreduce_ / broadcast_ is ported as an expression."""
    return _alone(site) and expressions.in_place_portable(site.port.names, str(site.api), site.call)


def _synchronizes(site: StatementSite) -> bool:
    """`optimizer.synchronize()` alone, on an optimizer the port wraps."""
    call = site.call
    return site.api is None and _alone(site) and isinstance(call.func, cst.Attribute) and \
        call.func.attr.value == "synchronize" and not call.args and \
        dotted(call.func.value) in {w.target for w in site.plan.wraps if w.model}


#: the rules of the statements the port rewrites whole, one per idiom
RULES = (
    StatementRule("hvd.DistributedOptimizer", ("DistributedOptimizer",), _anywhere, distributed_optimizer),
    StatementRule("hvd.broadcast_parameters", ("broadcast_parameters",), _alone, broadcast_parameters),
    StatementRule("hvd.broadcast_optimizer_state", ("broadcast_optimizer_state",), _alone,
                  broadcast_optimizer_state),
    StatementRule("hvd.join", ("join",), _alone, join),
    StatementRule("horovod.run", ("horovod.run",), _alone, run),
    StatementRule("hvd.start_timeline", ("start_timeline", "stop_timeline"), _alone, timeline),
    StatementRule("hvd.allreduce_", ("allreduce_", "broadcast_"), _in_place_claims, in_place),
    StatementRule("optimizer.synchronize()", (), _synchronizes, synchronize),
)
#: the rule of each Horovod call ported as a whole statement
BY_API: Dict[str, StatementRule] = {api: rule for rule in RULES for api in rule.apis}
#: the rules that look at statements that call no Horovod API
OTHERS = tuple(rule for rule in RULES if not rule.apis)


def rule_for(site: StatementSite) -> Optional[StatementRule]:
    """The rule that claims the statement of `site`, if one does."""
    rule = BY_API.get(str(site.api)) if site.api is not None else None
    if rule is not None:
        return rule if rule.claims(site) else None
    return next((r for r in OTHERS if r.claims(site)), None)

