"""hvd.DistributedOptimizer -> the model wrapped in DDP; what its options become (compression -> a comm hook,
op, gradient_predivide_factor, backward_passes_per_step); and what hvd.broadcast_optimizer_state's zero step
on a fresh optimizer did, for the report."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from .context import Context, code
from .names import dotted

#: what Horovod's zero step does to a fresh optimizer of each class (docs/migrating-from-horovod.md, the trap)
ZERO_STEP = {
    "Adam": "Horovod's zero step leaves Adam's step count at 1, so its first real step is bias-corrected as a "
            "second one (0.744x the step of a fresh Adam with the default betas): the updates differ from the "
            "first step",
    "AdamW": "Horovod's zero step leaves AdamW's step count at 1, so its first real step is bias-corrected as a "
             "second one: the updates differ from the first step",
}
TORCH_OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop",
                              "ASGD", "Rprop", "SparseAdam", "LBFGS"})
#: weight decay of the optimizers whose default is not zero
DEFAULT_DECAY = {"AdamW": "0.01 (AdamW's default)"}
CAUSE_ZERO_STEP = "optimizer steps before training"


def _literal_zero(node: Optional[cst.BaseExpression]) -> bool:
    if node is None:
        return True
    if isinstance(node, cst.Integer):
        return int(node.value, 0) == 0
    if isinstance(node, cst.Float):
        return float(node.value) == 0.0
    return False


def _keywords(call: cst.Call) -> Dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in call.args if a.keyword is not None}


def _decay(kind: str, options: Dict[str, cst.BaseExpression]) -> Optional[str]:
    """The optimizer's weight decay as written (its default when not given), None when it is zero."""
    given = options.get("weight_decay")
    if given is None:
        return DEFAULT_DECAY.get(kind)
    return None if _literal_zero(given) else code(given)


def zero_step_effect(built: Optional[cst.Call], state_survives: bool) -> Tuple[bool, str]:
    """(changes training, how or why not) when Horovod's zero step on a fresh optimizer built by `built` is not
    reproduced. `state_survives` is False when hvd.DistributedOptimizer wraps the optimizer after the call: the
    wrapper is a new optimizer built from the param groups, so only what the step did to the weights stays."""
    if built is None:
        return True, ("the optimizer's constructor is not in the script: Horovod's zero step on a fresh optimizer "
                      "moves the weights under weight decay and starts Adam-like step counts")
    kind = (dotted(built.func) or "optimizer").split(".")[-1]
    options = _keywords(built)
    if kind not in TORCH_OPTIMIZERS:
        return True, (f"{kind}(...) is not one of torch's optimizers: Horovod's zero step can have moved the "
                      "weights (weight decay) or started its state; the port does neither")
    if sum(1 for a in built.args if a.keyword is None) > 2:
        return True, f"{kind}'s options are positional here: whether its weight decay is zero cannot be read"
    decay = _decay(kind, options)
    how = "by lr x weight decay" if kind in ("SGD", "AdamW") else "with the decay as its gradient"
    moved = (f"the zero optimizer step under weight decay {decay} is not reproduced: Horovod's moves every weight "
             f"before training ({how}), so the weights differ from the first step")
    if not state_survives:
        if decay is None:
            return False, (f"{kind} without weight decay: Horovod's zero step moves no weight, and "
                           "hvd.DistributedOptimizer, built after it from the param groups, starts without the state "
                           "it made")
        return True, moved
    if decay is not None:
        return True, moved + (f", and {kind}'s step count starts at 1" if kind in ZERO_STEP else "")
    if kind == "SGD":
        if _literal_zero(options.get("dampening")):
            return False, ("SGD without weight decay: Horovod's zero step moves no weight and leaves zero momentum "
                           "buffers, which the first step replaces with the same bits")
        return True, (f"under dampening {code(options['dampening'])} Horovod's zero step starts the momentum "
                      "buffers at zero: the first real step's momentum differs")
    if kind in ZERO_STEP:
        return True, ZERO_STEP[kind]
    return True, (f"Horovod's zero step starts {kind}'s state before training (its step counts): the updates "
                  "differ from the first step")


def _compression(ctx: Context, value: cst.BaseExpression, model: str, line: int) -> Optional[List[str]]:
    """The statements that register the DDP hook a Horovod compression names; None when it cannot be read."""
    api = ctx.names.api(value)
    register = f"{model}.register_comm_hook(None, {{}})"
    fp16 = f"{ctx.name('default_hooks')}.fp16_compress_hook"
    effect = ("DDP's hook divides each gradient by the world size in float16 before the sum, Horovod sums in "
              "float16 and divides after: they round differently, at float16's precision, from the first step")
    if api == "Compression.none":
        return []
    if api == "Compression.fp16":
        ctx.imports.add("default_hooks")
        ctx.change(line, "compression", f"hvd.Compression.fp16 -> {register.format(fp16)}", False, effect,
                   "gradients")
        return [register.format(fp16)]
    if isinstance(value, cst.IfExp):
        branches = [ctx.names.api(value.body), ctx.names.api(value.orelse)]
        if sorted(map(str, branches)) == ["Compression.fp16", "Compression.none"]:
            ctx.imports.add("default_hooks")
            test = code(value.test)
            condition = test if branches[0] == "Compression.fp16" else f"not ({test})"
            ctx.change(line, "compression", f"fp16 compression when {condition} -> DDP's fp16_compress_hook",
                       False, f"when {condition}: {effect}", "gradients")
            return [f"if {condition}:\n    {register.format(fp16)}"]
        return None
    name = dotted(value)
    if name is None or ctx.names.api(value) is not None:
        return None
    compressions = ctx.compressions.get(name)
    if not compressions:
        return None
    ctx.change(line, "compression", f"{name} -> DDP's fp16_compress_hook when it is fp16 (the variable holds "
               f"DDP's hook or None)", False, f"when {name} is fp16: {effect}", "gradients")
    return [f"if {name} is not None:\n    {register.format(name)}"]


def wrap_statements(ctx: Context, options: Dict[str, cst.BaseExpression], model: str, line: int,
                    backward_sites: int, option_lines: Dict[str, int], optimizer_name: str = "optimizer"
                    ) -> Tuple[List[str], List[str]]:
    """The statements that replace hvd.DistributedOptimizer(...) for `model` (the DDP wrap first), and the
    `# port:` comments for what of its options cannot be ported; what is said of `op` is said at its line
    (`option_lines`)."""
    ddp = ctx.name("DDP")
    ctx.imports.add("DDP")
    skipping = ctx.skipping.get(model)
    unused = ", find_unused_parameters=True" if skipping is not None else ""
    statements = [f"{model} = {ddp}({model}, forward_sync_buffers=False{unused})",
                  f"{ctx.helper('keep_model_keys')}({model})"]
    comments: List[str] = []
    ctx.change(line, "hvd.DistributedOptimizer",
               f"{statements[0]}: broadcasts rank 0's parameters and buffers, then averages the gradients in "
               "backward(); the optimizer stays torch's; after that each rank keeps its own buffers (BatchNorm "
               "statistics), as under Horovod")
    if skipping is not None:
        statements.append(f"{ctx.helper('zero_missing_gradients')}({optimizer_name})")
        ctx.change(line, "parameters without a gradient",
                   f"find_unused_parameters=True and {statements[-1]}: {skipping.what} ({skipping.where}), so some "
                   "steps leave parameters without a gradient; DDP then finds them after each forward pass (a walk "
                   "of the autograd graph every step, and one more round of communication when a step skips some), "
                   "and before each step() the parameters that have none get zeros, as Horovod's synchronize() "
                   "gave them: momentum and weight decay move them as under Horovod")
    ctx.change(line, "the model after the DDP wrap",
               f"{statements[1]}: {model}.state_dict() and load_state_dict() keep the model's own keys (without "
               "'module.') wherever they are called, in the script's helper functions too: checkpoints load both "
               "ways between the port and the Horovod script")
    hooks: List[str] = []
    if "compression" in options:
        hook = _compression(ctx, options["compression"], model, line)
        if hook is None:
            ctx.leave(line, options["compression"], "a compression other than hvd.Compression.none/fp16: write it "
                      "as a DDP communication hook (model.register_comm_hook)")
            comments.append("# port: not ported: compression=...: write it as a DDP communication hook")
        else:
            hooks += hook
    if "op" in options:
        guards, op_hooks = _op(ctx, options["op"], model, option_lines.get("op", line), comments)
        if op_hooks and hooks:
            ctx.leave(line, options["op"], "op=hvd.Sum with compression: DDP takes one communication hook; write "
                      "one that compresses and sums")
            comments.append("# port: not ported: op=hvd.Sum with compression: DDP takes one communication hook")
        else:
            hooks += op_hooks
        statements = guards + statements
    statements += hooks
    _predivide(ctx, options, line)
    _others(ctx, options, line, comments)
    passes = options.get("backward_passes_per_step")
    if passes is not None and not (isinstance(passes, cst.Integer) and passes.value == "1") and not backward_sites:
        ctx.change(line, "backward_passes_per_step",
                   f"backward_passes_per_step={code(passes)}: no loop shows the last backward pass before the step, "
                   f"so DDP averages at every pass; to average once per step, run the other passes under "
                   f"`with {model}.no_sync():`", False,
                   f"averaging at every backward pass gives the same average, rounded differently (not bitwise), "
                   f"with {code(passes)} times the communication", "gradients")
    return statements, comments


def _op(ctx: Context, op: cst.BaseExpression, model: str, line: int,
        comments: List[str]) -> Tuple[List[str], List[str]]:
    """What op=... becomes: (statements before the wrap, statements after it): nothing for Average, a hook for
    Sum, a guard that stops the port for a conditional Adasum."""
    api = ctx.names.api(op)
    if api == "Average":
        return [], []
    if api == "Sum":
        hook = ctx.helper("sum_gradients")
        ctx.change(line, "op", f"op=hvd.Sum -> {model}.register_comm_hook(None, {hook}): the gradients summed, "
                   "not averaged")
        return [], [f"{model}.register_comm_hook(None, {hook})"]
    if isinstance(op, cst.IfExp):
        branches = [ctx.names.api(op.body), ctx.names.api(op.orelse)]
        if sorted(map(str, branches)) == ["Adasum", "Average"]:
            test = code(op.test)
            condition = test if branches[0] == "Adasum" else f"not ({test})"
            message = ctx.string("DDP has no Adasum (op=hvd.Adasum): run without it; DDP averages the gradients")
            # Ported, not left: the port averages, as the script does unless asked for Adasum, and refuses that
            ctx.change(line, "op", f"op={code(op)} -> DDP's average, and a stop with a message when {condition}: "
                       "DDP has no Adasum")
            return [f"if {condition}:\n    raise SystemExit({message})"], []
    reason = "DDP has no Adasum: the port averages the gradients (retune the learning rate)" \
        if api == "Adasum" else "an op other than hvd.Average or hvd.Sum: DDP averages the gradients"
    ctx.leave(line, op, reason)
    comments.append(f"# port: not ported: op={code(op)}: DDP averages the gradients")
    return [], []


def _predivide(ctx: Context, options: Dict[str, cst.BaseExpression], line: int) -> None:
    factor = options.get("gradient_predivide_factor")
    if factor is None:
        return
    ctx.change(line, "gradient_predivide_factor",
               f"gradient_predivide_factor={code(factor)} dropped: DDP divides every gradient by the world size "
               "before the sum (Horovod's factor = world size); Horovod's factor changes where it rounds, not the "
               "average")


def _others(ctx: Context, options: Dict[str, cst.BaseExpression], line: int, comments: List[str]) -> None:
    if "sparse_as_dense" in options:
        ctx.change(line, "sparse_as_dense", "sparse_as_dense dropped: DDP has no switch; build embeddings dense "
                   "(nn.Embedding(..., sparse=False)) and DDP averages their gradients dense")
    for grouping in ("groups", "num_groups"):
        if grouping in options:
            ctx.change(line, grouping, f"{grouping} dropped: DDP groups gradients into buckets itself "
                       "(bucket_cap_mb); the grouping changes no sum")
    if "process_set" in options:
        ctx.leave(line, options["process_set"], "process sets: build DDP with process_group=dist.new_group(ranks)")
        comments.append("# port: not ported: process_set: pass process_group=dist.new_group(ranks) to DDP")
