"""Small functions a port writes into the script where a Horovod call returns what a torch.distributed call
changes in place, or does more than one call: each written once, after the imports, only when used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple


@dataclass(frozen=True)
class Helper:
    """A function the port can add: its source (placeholders: {name} its own name, {dist}, {torch} and the
    names of the helpers it calls) and what it uses (helpers and imports, by key)."""

    source: str
    uses: Tuple[str, ...]


HELPERS: Dict[str, Helper] = {
    "all_reduced": Helper('''
def {name}(tensor, op={dist}.ReduceOp.SUM):
    """`tensor` reduced over every rank with `op`, in a new tensor (hvd.allreduce returns one, dist.all_reduce
    reduces in place); no gradient flows back through it."""
    reduced = tensor.detach().clone()
    {dist}.all_reduce(reduced, op=op)
    return reduced
''', ("dist",)),
    "all_averaged": Helper('''
def {name}(tensor):
    """The sum of `tensor` over every rank divided by the number of ranks, in a new tensor: hvd.allreduce with
    its default op=hvd.Average, which sums and then divides."""
    return {all_reduced}(tensor) / {dist}.get_world_size()
''', ("all_reduced", "dist")),
    "all_gathered": Helper('''
def {name}(tensor):
    """Every rank's `tensor` concatenated along the first dimension in rank order, as hvd.allgather returns it;
    the first dimension may differ between ranks (each is padded to the longest for dist.all_gather)."""
    tensor = tensor.detach()
    rows = {torch}.tensor([tensor.shape[0]], device=tensor.device)
    counts = [{torch}.zeros_like(rows) for _ in range({dist}.get_world_size())]
    {dist}.all_gather(counts, rows)
    padded = tensor.new_zeros((max(int(count) for count in counts), *tensor.shape[1:]))
    padded[:tensor.shape[0]] = tensor
    pieces = [{torch}.empty_like(padded) for _ in counts]
    {dist}.all_gather(pieces, padded)
    return {torch}.cat([piece[:int(count)] for piece, count in zip(pieces, counts)])
''', ("dist", "torch")),
    "all_gathered_objects": Helper('''
def {name}(obj):
    """Every rank's picklable `obj` in a list, in rank order (hvd.allgather_object)."""
    gathered = [None] * {dist}.get_world_size()
    {dist}.all_gather_object(gathered, obj)
    return gathered
''', ("dist",)),
    "broadcasted": Helper('''
def {name}(tensor, src):
    """Rank `src`'s `tensor` on every rank, in a new tensor (hvd.broadcast returns one, dist.broadcast
    works in place)."""
    copy = tensor.detach().clone()
    {dist}.broadcast(copy, src=src)
    return copy
''', ("dist",)),
    "broadcasted_object": Helper('''
def {name}(obj, src=0):
    """Rank `src`'s picklable `obj` on every rank (hvd.broadcast_object)."""
    box = [obj]
    {dist}.broadcast_object_list(box, src=src)
    return box[0]
''', ("dist",)),
    "sum_gradients": Helper('''
def {name}(state, bucket):
    """DDP communication hook: the gradients summed over the ranks, not averaged (Horovod's op=hvd.Sum)."""
    work = {dist}.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])
''', ("dist",)),
    "keep_model_keys": Helper('''
def {name}(wrapped):
    """The DDP-wrapped model's state_dict() and load_state_dict() with the model's own keys (no {q}module.{q}), as
    under Horovod, wherever the script calls them (a helper function, a method): its checkpoints load into the
    model, and into the Horovod script's, and the Horovod script's load into it."""
    def drop_prefix(module, state_dict, prefix, local_metadata):
        for key in [key for key in state_dict if key.startswith(prefix + {q}module.{q})]:
            state_dict[prefix + key[len(prefix) + len({q}module.{q}):]] = state_dict.pop(key)

    def add_prefix(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        for key in [key for key in state_dict if key.startswith(prefix)
                    and not key.startswith(prefix + {q}module.{q})]:
            state_dict[prefix + {q}module.{q} + key[len(prefix):]] = state_dict.pop(key)

    wrapped.register_state_dict_post_hook(drop_prefix)
    wrapped.register_load_state_dict_pre_hook(add_prefix)
''', ()),
    "zero_missing_gradients": Helper('''
def {name}(optimizer):
    """Before each optimizer.step(), a zero gradient for every parameter it trains that has none, as Horovod's
    DistributedOptimizer gave one in synchronize() (a parameter a step skipped on every rank: DDP with
    find_unused_parameters=True leaves its gradient None, and torch's optimizers would skip it, where under
    Horovod momentum and weight decay moved it)."""
    def fill(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for param in group[{q}params{q}]:
                if param.requires_grad and param.grad is None:
                    param.grad = {torch}.zeros_like(param)

    optimizer.register_step_pre_hook(fill)
''', ("torch",)),
    "step_on_zero_gradients": Helper('''
def {name}(optimizer, keep_state=True):
    """What hvd.broadcast_optimizer_state did to a fresh optimizer: one step() with every gradient zero. It
    moves the weights under weight decay and starts Adam's step count; kept so that the port trains the same.
    keep_state=False: hvd.DistributedOptimizer wrapped the optimizer afterwards, a new one without that state."""
    if optimizer.state_dict()[{q}state{q}]:
        return
    for group in optimizer.param_groups:
        for param in group[{q}params{q}]:
            if param.requires_grad:
                param.grad = {torch}.zeros_like(param)
    optimizer.step()
    if not keep_state:
        optimizer.state.clear()
''', ("torch",)),
    "destroy_process_group_at_exit": Helper('''
def {name}():
    """Once the script has ended, returned or failed (its traceback printed), and before Python finalizes: its DDP
    models let go (the module's globals that hold one, the frames of the exception it failed with), then the process
    group destroyed unless the script did. Python finalizing right after the last collective can abort a rank whose
    work is done ("terminate called without an active exception"): it ends a thread of the process group that is
    still letting go of that collective's tensors."""
    import atexit
    import gc
    import sys
    import traceback

    if getattr({name}, {q}registered{q}, False):  # once a process, however often the group starts
        return
    {name}.registered = True

    def end():
        namespace = globals()
        for key, value in list(namespace.items()):  # the script's globals that hold a DDP model
            if isinstance(value, {torch}.nn.Module) and any(
                    isinstance(module, {torch}.nn.parallel.DistributedDataParallel) for module in value.modules()):
                namespace[key] = None
        error = getattr(sys, {q}last_exc{q}, None) or getattr(sys, {q}last_value{q}, None)  # what it failed with
        seen = set()
        while error is not None and id(error) not in seen:  # its frames, and those of its causes
            seen.add(id(error))
            traceback.clear_frames(error.__traceback__)
            error = error.__cause__ or error.__context__
        gc.collect()
        if {dist}.is_initialized():
            {dist}.destroy_process_group()

    atexit.register(end)
''', ("dist", "torch")),
}


def source(key: str, name_of: Callable[[str], str], quote: str) -> str:
    """Helper `key`'s source with the port's names, in the script's quotes."""
    helper = HELPERS[key]
    names = {other: name_of(other) for other in HELPERS}
    return helper.source.format(name=name_of(key), dist=name_of("dist"), torch="torch", q=quote,
                                **names).strip("\n")
